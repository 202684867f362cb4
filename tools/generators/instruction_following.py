"""Deterministic generator of the strict instruction-following set (IFEval-style, our own prompts).

Ten instruction templates (IFEval's verifiable instructions: word counts, JSON, lowercase, no
commas, bullet counts, keywords, end phrase, title, postscript; the last two templates combine
two instructions) applied to four writing tasks: 40 items. Each row carries IFEval's fields,
`instruction_id_list` and one `kwargs` object per instruction, so the file is also a user set
for the `instructions` scorer as it is.

`python -m tools.generators.instruction_following` rewrites data.jsonl, byte for byte the same.
"""

from __future__ import annotations

from evalsets.jsonl import write_jsonl
from tools.generators import set_folder

DATA_PATH = set_folder("instruction_following") / "data.jsonl"
END_PHRASE = "Is there anything else I can help with?"

# (task, two keywords that fit it)
TASKS = [
    ("Write a short note to your neighbour about the cat you found in your garden.",
     ("collar", "evening")),
    ("Describe a rainy morning at a small fishing harbour.", ("gulls", "lantern")),
    ("Explain to a friend how to make a good cup of tea.", ("kettle", "patience")),
    ("Give some advice to an adult who is starting to learn the piano.", ("practice", "scales")),
]

LOWERCASE = ("Your entire response should be in English, and in all lowercase letters. No "
             "capital letters are allowed.", "change_case:english_lowercase", {})
NO_COMMA = ("In your entire response, refrain from the use of any commas.",
            "punctuation:no_comma", {})
AT_LEAST_40 = ("Answer with at least 40 words.", "length_constraints:number_words",
               {"num_words": 40, "relation": "at least"})
POSTSCRIPT = ("At the end of your response, please explicitly add a postscript starting with "
              "P.S.", "detectable_content:postscript", {"postscript_marker": "P.S."})

# (kind, [(instruction text, instruction id, kwargs)]); "{k1}" / "{k2}": the task's keywords.
TEMPLATES = [
    ("lowercase", [LOWERCASE]),
    ("no_comma", [NO_COMMA]),
    ("word_count", [("Answer with less than 60 words.", "length_constraints:number_words",
                     {"num_words": 60, "relation": "less than"})]),
    ("json", [("Wrap your entire output in JSON format. You can use markdown ticks such as ```.",
               "detectable_format:json_format", {})]),
    ("bullets", [("Your answer must contain exactly 3 bullet points. Use the markdown bullet "
                  "points such as:\n* This is point 1.\n* This is point 2",
                  "detectable_format:number_bullet_lists", {"num_bullets": 3})]),
    ("keywords", [("Include the keywords {k1} and {k2} in the response.", "keywords:existence",
                   {"keywords": ["{k1}", "{k2}"]})]),
    ("end_phrase", [(f"Finish your response with this exact phrase: {END_PHRASE} No other words "
                     "should follow this phrase.", "startend:end_checker",
                     {"end_phrase": END_PHRASE})]),
    ("title", [("Your answer must contain a title, wrapped in double angular brackets, such as "
                "<<poem of joy>>.", "detectable_format:title", {})]),
    ("lowercase_no_comma", [LOWERCASE, NO_COMMA]),
    ("length_postscript", [AT_LEAST_40, POSTSCRIPT]),
]


def _fill(value: object, keywords: tuple[str, str]) -> object:
    if isinstance(value, str):
        return value.format(k1=keywords[0], k2=keywords[1])
    if isinstance(value, list):
        return [_fill(v, keywords) for v in value]
    if isinstance(value, dict):
        return {k: _fill(v, keywords) for k, v in value.items()}
    return value


def generate() -> list[dict]:
    """Every template on every task, task by task (a `limit` of 10 covers every template once)."""
    items = []
    for task_index, (task, keywords) in enumerate(TASKS):
        for kind, instructions in TEMPLATES:
            items.append({
                "id": f"if-{kind}-{task_index}",
                "kind": kind,
                "prompt": " ".join([task, *(_fill(text, keywords) for text, _, _ in instructions)]),
                "instruction_id_list": [name for _, name, _ in instructions],
                "kwargs": [_fill(kwargs, keywords) for _, _, kwargs in instructions],
            })
    return items


def main() -> None:
    path = write_jsonl(DATA_PATH, generate())
    print(f"wrote {len(TASKS) * len(TEMPLATES)} items to {path}")


if __name__ == "__main__":
    main()
