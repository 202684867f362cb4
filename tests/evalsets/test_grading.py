"""Final-number extraction and exact-match scoring on crafted responses."""

from __future__ import annotations

import pytest

from evalsets.math.grading import extract_number, is_correct, process_results


@pytest.mark.parametrize(
    ("response", "expected"),
    [
        ("2 + 3 = 5", "5"),
        ("She has 31 + 18 = 49, then 49 - 17 = 32. The answer is 32.", "32"),
        ("The answer is 1,200.", "1200"),
        ("The answer is: $12.00", "12"),
        ("#### 42", "42"),
        ("The answer is **7**, not 9", "7"),
        ("The answer is 4. Next question: 10 apples", "4"),  # declared answer wins
        ("x = -3.", "-3"),
        ("2.50 dollars", "2.5"),
        ("I don't know.", None),
        ("", None),
    ],
)
def test_extract_number(response, expected):
    assert extract_number(response) == expected


def test_scoring_is_numeric_exact_match():
    assert is_correct("The answer is 32.", "32")
    assert is_correct("so 32.0 in total", "32")
    assert not is_correct("The answer is 33.", "32")
    assert not is_correct("The answer is 320", "32")
    assert not is_correct("no idea", "32")


def test_lm_eval_hook_returns_primary_metric():
    doc = {"id": "math-0000", "question": "q", "answer": "81"}
    assert process_results(doc, ["9 * 9 = 81"]) == {"exact_match": 1.0}
    assert process_results(doc, ["The answer is 80"]) == {"exact_match": 0.0}
