"""Builds the code set: small Python function tasks whose unit tests come from a reference solution.

Each task is a one-sentence request, a canonical solution and a handful of inputs; the expected
outputs are computed by running the canonical solution here, so a test can never disagree with
it. `python -m evalsets.code.generate` rewrites `evalsets/code/data.jsonl` identically.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DATA_PATH = Path(__file__).with_name("data.jsonl")


@dataclass(frozen=True)
class Task:
    signature: str  # "add(a, b)"
    does: str  # completes "Write a Python function `add(a, b)` that ..."
    solution: str  # the canonical solution's body, indented by 4
    cases: tuple[tuple[Any, ...], ...]  # argument tuples; the first one is the prompt's example

    @property
    def entry_point(self) -> str:
        return self.signature.split("(", 1)[0]


def _t(signature: str, does: str, body: str, *cases: tuple[Any, ...]) -> Task:
    return Task(signature, does, body, cases)


TASKS: list[Task] = [
    _t("add(a, b)", "returns the sum of a and b", "return a + b", (2, 3), (-4, 10), (0, 0), (125, 75)),
    _t("subtract(a, b)", "returns a minus b", "return a - b", (9, 4), (3, 10), (0, 0), (-5, -5)),
    _t("multiply(a, b)", "returns a times b", "return a * b", (3, 4), (-2, 8), (0, 7), (12, 12)),
    _t("square(n)", "returns n squared", "return n * n", (4,), (-3,), (0,), (11,)),
    _t("cube(n)", "returns n cubed", "return n ** 3", (2,), (-3,), (0,), (5,)),
    _t("is_even(n)", "returns True if n is even, otherwise False", "return n % 2 == 0",
       (4,), (7,), (0,), (-2,), (13,)),
    _t("is_odd(n)", "returns True if n is odd, otherwise False", "return n % 2 != 0",
       (3,), (8,), (0,), (-5,)),
    _t("absolute(n)", "returns the absolute value of n", "return n if n >= 0 else -n",
       (-7,), (5,), (0,), (-120,)),
    _t("max_of_two(a, b)", "returns the larger of a and b", "return a if a >= b else b",
       (3, 9), (10, 2), (-1, -6), (4, 4)),
    _t("min_of_list(numbers)", "returns the smallest number in the list", "return min(numbers)",
       ([4, 2, 8],), ([5],), ([-1, -9, 3],), ([7, 7, 1, 7],)),
    _t("max_of_list(numbers)", "returns the largest number in the list", "return max(numbers)",
       ([4, 2, 8],), ([5],), ([-1, -9, -3],), ([0, 100, 99],)),
    _t("sum_list(numbers)", "returns the sum of the numbers in the list", "return sum(numbers)",
       ([1, 2, 3],), ([],), ([-5, 5, 10],), ([100],)),
    _t("average(numbers)", "returns the average (mean) of the numbers in the list",
       "return sum(numbers) / len(numbers)", ([1, 2, 3],), ([4],), ([2, 4, 6, 8],), ([-1, 1],)),
    _t("count_items(items)", "returns how many items the list has", "return len(items)",
       (["a", "b", "c"],), ([],), ([1, 1, 1, 1, 1],)),
    _t("reverse_string(s)", "returns the string s reversed", "return s[::-1]",
       ("abc",), ("hello",), ("",), ("racecar",)),
    _t("to_upper(s)", "returns s in upper case", "return s.upper()",
       ("hello",), ("Mixed Case",), ("",), ("abc123",)),
    _t("first_char(s)", "returns the first character of the string s", "return s[0]",
       ("hello",), ("a",), ("Zebra",)),
    _t("last_element(items)", "returns the last element of the list", "return items[-1]",
       ([1, 2, 3],), (["x"],), ([None, 0, "end"],)),
    _t("string_length(s)", "returns the number of characters in s", "return len(s)",
       ("hello",), ("",), ("a b c",)),
    _t("concat(a, b)", "returns the strings a and b joined together", "return a + b",
       ("foo", "bar"), ("", "x"), ("ab", "")),
    _t("is_palindrome(s)", "returns True if the string s reads the same backwards, otherwise False",
       "return s == s[::-1]", ("level",), ("hello",), ("",), ("abba",), ("ab",)),
    _t("count_vowels(s)", "returns the number of vowels (a, e, i, o, u) in the lowercase string s",
       "return sum(1 for ch in s if ch in 'aeiou')", ("hello",), ("sky",), ("aeiou",), ("banana",)),
    _t("factorial(n)", "returns n factorial (n!)",
       "result = 1\n    for k in range(2, n + 1):\n        result *= k\n    return result",
       (5,), (0,), (1,), (10,)),
    _t("fibonacci(n)", "returns the n-th Fibonacci number, where fibonacci(0) is 0 and fibonacci(1) is 1",
       "a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a",
       (6,), (0,), (1,), (10,), (20,)),
    _t("is_prime(n)", "returns True if n is a prime number, otherwise False",
       "if n < 2:\n        return False\n    return all(n % k for k in range(2, int(n ** 0.5) + 1))",
       (7,), (1,), (2,), (9,), (97,), (100,)),
    _t("gcd(a, b)", "returns the greatest common divisor of the positive integers a and b",
       "while b:\n        a, b = b, a % b\n    return a", (12, 18), (7, 5), (100, 10), (21, 14)),
    _t("celsius_to_fahrenheit(c)", "converts c degrees Celsius to Fahrenheit",
       "return c * 9 / 5 + 32", (100,), (0,), (-40,), (37,)),
    _t("double_list(numbers)", "returns a new list with every number doubled",
       "return [2 * x for x in numbers]", ([1, 2, 3],), ([],), ([-1, 0, 5],)),
    _t("filter_even(numbers)", "returns a list of only the even numbers, in order",
       "return [x for x in numbers if x % 2 == 0]", ([1, 2, 3, 4],), ([1, 3],), ([0, -2, 7, 8],)),
    _t("count_words(s)", "returns the number of words in s (words are separated by spaces)",
       "return len(s.split())", ("hello world",), ("one",), ("",), ("a b  c d",)),
    _t("capitalize_words(s)", "returns s with the first letter of every word in upper case",
       "return ' '.join(w.capitalize() for w in s.split(' '))",
       ("hello world",), ("python",), ("a quick test",)),
    _t("remove_spaces(s)", "returns s with all spaces removed", "return s.replace(' ', '')",
       ("a b c",), ("nospace",), ("  lead and trail  ",)),
    _t("sum_digits(n)", "returns the sum of the digits of the non-negative integer n",
       "return sum(int(d) for d in str(n))", (123,), (0,), (9999,), (405,)),
    _t("reverse_list(items)", "returns the list in reverse order", "return items[::-1]",
       ([1, 2, 3],), ([],), (["a", "b"],)),
    _t("contains(items, x)", "returns True if x is in the list items, otherwise False",
       "return x in items", ([1, 2, 3], 2), ([1, 2, 3], 5), ([], 1), (["a"], "a")),
    _t("index_of(items, x)", "returns the index of x in the list, or -1 if x is not there",
       "return items.index(x) if x in items else -1",
       ([5, 6, 7], 7), ([5, 6, 7], 9), ([], 1), ([3, 3], 3)),
    _t("unique(items)", "returns the list without duplicates, keeping the first occurrence order",
       "seen = []\n    for x in items:\n        if x not in seen:\n            seen.append(x)\n"
       "    return seen",
       ([1, 2, 2, 3, 1],), ([],), (["b", "a", "b"],)),
    _t("sort_list(numbers)", "returns the numbers sorted from smallest to largest",
       "return sorted(numbers)", ([3, 1, 2],), ([],), ([5, -1, 5, 0],)),
    _t("second_largest(numbers)", "returns the second largest distinct number in the list",
       "return sorted(set(numbers))[-2]", ([1, 5, 3],), ([10, 10, 9],), ([-1, -2, -3],)),
    _t("count_char(s, c)", "returns how many times the character c appears in s", "return s.count(c)",
       ("banana", "a"), ("hello", "z"), ("", "x"), ("aaa", "a")),
    _t("repeat_string(s, n)", "returns s repeated n times", "return s * n",
       ("ab", 3), ("x", 0), ("hi", 1)),
    _t("is_leap_year(year)", "returns True if year is a leap year in the Gregorian calendar",
       "return year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)",
       (2024,), (2023,), (1900,), (2000,)),
    _t("power(base, exp)", "returns base raised to the power exp", "return base ** exp",
       (2, 10), (5, 0), (3, 3), (-2, 3)),
    _t("clamp(x, low, high)", "returns x limited to the range from low to high",
       "return max(low, min(x, high))", (5, 0, 10), (-3, 0, 10), (42, 0, 10), (0, 0, 0)),
    _t("sign(n)", "returns 1 if n is positive, -1 if n is negative and 0 if n is zero",
       "return (n > 0) - (n < 0)", (5,), (-3,), (0,)),
    _t("list_product(numbers)", "returns the product of all numbers in the list (1 for an empty list)",
       "result = 1\n    for x in numbers:\n        result *= x\n    return result",
       ([2, 3, 4],), ([],), ([5, 0, 2],), ([-1, 7],)),
    _t("count_positive(numbers)", "returns how many numbers in the list are greater than zero",
       "return sum(1 for x in numbers if x > 0)", ([1, -2, 3],), ([],), ([0, -1],)),
    _t("merge_lists(a, b)", "returns a new list with the elements of a followed by those of b",
       "return a + b", ([1, 2], [3]), ([], []), (["x"], ["y", "z"])),
    _t("sorted_keys(d)", "returns the keys of the dictionary d as a sorted list", "return sorted(d)",
       ({"b": 1, "a": 2},), ({},), ({"z": 0, "m": 0, "c": 0},)),
    _t("word_lengths(s)", "returns a list with the length of each word in s (split on spaces)",
       "return [len(w) for w in s.split()]", ("hello big world",), ("",), ("a bb ccc",)),
    _t("is_sorted(numbers)", "returns True if the list is sorted from smallest to largest",
       "return all(a <= b for a, b in zip(numbers, numbers[1:]))",
       ([1, 2, 3],), ([3, 1],), ([],), ([2, 2, 5],)),
    _t("char_frequency(s)", "returns a dictionary mapping each character of s to how often it appears",
       "counts = {}\n    for ch in s:\n        counts[ch] = counts.get(ch, 0) + 1\n    return counts",
       ("aab",), ("",), ("hello",)),
    _t("flatten(lists)", "returns one list with the elements of all the inner lists, in order",
       "return [x for inner in lists for x in inner]", ([[1, 2], [3]],), ([],), ([[], ["a"], [], ["b"]],)),
    _t("numbers_up_to(n)", "returns a list of the numbers from 1 to n", "return list(range(1, n + 1))",
       (3,), (0,), (1,), (6,)),
    _t("starts_with_vowel(s)", "returns True if the word s starts with a vowel (a, e, i, o, u)",
       "return s[:1].lower() in ('a', 'e', 'i', 'o', 'u') and s != ''",
       ("apple",), ("banana",), ("Orange",), ("",)),
    _t("percent(part, whole)", "returns what percent part is of whole",
       "return part / whole * 100", (1, 4), (50, 200), (3, 3), (0, 9)),
    _t("fizzbuzz(n)", "returns 'Fizz' if n is divisible by 3, 'Buzz' if by 5, 'FizzBuzz' if by both, "
       "otherwise str(n)",
       "if n % 15 == 0:\n        return 'FizzBuzz'\n    if n % 3 == 0:\n        return 'Fizz'\n"
       "    if n % 5 == 0:\n        return 'Buzz'\n    return str(n)",
       (15,), (9,), (10,), (7,)),
    _t("to_binary(n)", "returns the binary representation of the non-negative integer n as a string "
       "without a prefix", "return bin(n)[2:]", (5,), (0,), (8,), (255,)),
    _t("format_minutes(minutes)", "returns the minutes as a string 'H:MM' of hours and minutes",
       "return f'{minutes // 60}:{minutes % 60:02d}'", (125,), (0,), (59,), (600,)),
    _t("vowel_positions(s)", "returns the list of indexes of the vowels (a, e, i, o, u) in s",
       "return [i for i, ch in enumerate(s) if ch in 'aeiou']", ("hello",), ("",), ("aei",)),
]


def _call(entry_point: str, args: tuple[Any, ...]) -> str:
    return f"{entry_point}({', '.join(repr(a) for a in args)})"


def canonical_source(task: Task) -> str:
    return f"def {task.signature}:\n    {task.solution}\n"


def build(task: Task, index: int) -> dict[str, str]:
    """One data row: the prompt, the canonical solution and asserts computed from it."""
    scope: dict[str, Any] = {}
    exec(canonical_source(task), scope)  # our own reference code, not model output
    function = scope[task.entry_point]
    example = _call(task.entry_point, task.cases[0])
    prompt = (
        f"Write a Python function `{task.signature}` that {task.does}. "
        f"For example, `{example}` returns `{function(*task.cases[0])!r}`."
    )
    tests = "".join(
        f"assert {_call(task.entry_point, args)} == {function(*args)!r}\n" for args in task.cases
    )
    return {
        "id": f"code-{index:04d}",
        "entry_point": task.entry_point,
        "prompt": prompt,
        "tests": tests,
        "canonical_solution": canonical_source(task),
    }


def generate() -> list[dict[str, str]]:
    return [build(task, index) for index, task in enumerate(TASKS)]


def write(path: Path = DATA_PATH) -> Path:
    with path.open("w") as out:
        for row in generate():
            out.write(json.dumps(row) + "\n")
    return path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DATA_PATH)
    args = parser.parse_args(argv)
    path = write(args.out)
    print(f"wrote {len(TASKS)} tasks to {path}")


if __name__ == "__main__":
    main()
