"""Deterministic generator of small GSM8K-style word problems with computed integer answers.

Three one-step templates with single-digit numbers keep a tiny demo model off the floor (paired
gates need items that can flip); the other ten are one- and two-step problems in GSM8K style.
Items cycle through the thirteen templates, so any first N items (an eval-set `limit`) mix
warm-ups and harder problems in the same proportion as the whole pool. No question appears twice.

`python -m tools.generators.math` rewrites `evalsets/math/data.jsonl`; the same seed always
gives the same file, byte for byte.
"""

from __future__ import annotations

import argparse
import random
from collections.abc import Callable
from pathlib import Path

from evalsets.jsonl import write_jsonl
from tools.generators import set_folder

DATA_PATH = set_folder("math") / "data.jsonl"
DEFAULT_SEED = 20240601
DEFAULT_COUNT = 1040  # 80 rounds of the 13 templates
MAX_REDRAWS = 1000

NAMES = [
    "Ava", "Ben", "Chloe", "Diego", "Emma", "Farid", "Grace", "Hiro", "Ines", "Jonas",
    "Kira", "Liam", "Maya", "Noah", "Olga", "Priya", "Quinn", "Rosa", "Sam", "Tara",
]
ITEMS = ["apples", "pencils", "stickers", "marbles", "cookies", "books", "stamps", "shells"]

Problem = tuple[str, int]


def _buy_and_give(rng: random.Random) -> Problem:
    name = rng.choice(NAMES)
    item = rng.choice(ITEMS)
    start = rng.randint(5, 40)
    bought = rng.randint(3, 30)
    given = rng.randint(1, start + bought - 1)
    question = (
        f"{name} has {start} {item}. {name} buys {bought} more and then gives {given} "
        f"to a friend. How many {item} does {name} have now?"
    )
    return question, start + bought - given


def _boxes(rng: random.Random) -> Problem:
    item = rng.choice(ITEMS)
    boxes = rng.randint(3, 12)
    per_box = rng.randint(4, 15)
    question = (
        f"A shop has {boxes} boxes of {item}. Each box holds {per_box} {item}. "
        f"How many {item} does the shop have in total?"
    )
    return question, boxes * per_box


def _share(rng: random.Random) -> Problem:
    name = rng.choice(NAMES)
    friends = rng.randint(2, 9)
    each = rng.randint(3, 14)
    item = rng.choice(ITEMS)
    question = (
        f"{name} shares {friends * each} {item} equally among {friends} friends. "
        f"How many {item} does each friend get?"
    )
    return question, each


def _wage(rng: random.Random) -> Problem:
    name = rng.choice(NAMES)
    rate = rng.randint(8, 25)
    hours = rng.randint(3, 10)
    days = rng.randint(2, 6)
    question = (
        f"{name} earns {rate} dollars per hour and works {hours} hours a day for {days} days. "
        f"How many dollars does {name} earn in total?"
    )
    return question, rate * hours * days


def _change(rng: random.Random) -> Problem:
    name = rng.choice(NAMES)
    count = rng.randint(2, 8)
    price = rng.randint(2, 12)
    paid = rng.choice([50, 100])
    while count * price > paid:
        count -= 1
    question = (
        f"{name} buys {count} notebooks that cost {price} dollars each and pays with a "
        f"{paid} dollar bill. How many dollars of change does {name} get?"
    )
    return question, paid - count * price


def _distance(rng: random.Random) -> Problem:
    speed = rng.randint(30, 90)
    hours = rng.randint(2, 6)
    extra = rng.randint(5, 60)
    question = (
        f"A train travels at {speed} kilometers per hour for {hours} hours and then another "
        f"{extra} kilometers. How many kilometers does it travel in total?"
    )
    return question, speed * hours + extra


def _ages(rng: random.Random) -> Problem:
    older, younger = rng.sample(NAMES, 2)
    age = rng.randint(4, 20)
    gap = rng.randint(2, 15)
    years = rng.randint(2, 10)
    question = (
        f"{younger} is {age} years old. {older} is {gap} years older than {younger}. "
        f"How old will {older} be in {years} years?"
    )
    return question, age + gap + years


def _pages(rng: random.Random) -> Problem:
    name = rng.choice(NAMES)
    per_day = rng.randint(5, 25)
    days = rng.randint(3, 9)
    left = rng.randint(10, 80)
    question = (
        f"{name} reads {per_day} pages a day for {days} days and still has {left} pages "
        f"left. How many pages does the book have?"
    )
    return question, per_day * days + left


def _double_then_subtract(rng: random.Random) -> Problem:
    name = rng.choice(NAMES)
    item = rng.choice(ITEMS)
    start = rng.randint(6, 30)
    lost = rng.randint(1, 2 * start - 1)
    question = (
        f"{name} had {start} {item}, then doubled the collection, then lost {lost}. "
        f"How many {item} does {name} have left?"
    )
    return question, 2 * start - lost


def _rows(rng: random.Random) -> Problem:
    rows = rng.randint(3, 15)
    seats = rng.randint(6, 20)
    empty = rng.randint(1, rows * seats - 1)
    question = (
        f"A hall has {rows} rows of {seats} chairs. {empty} chairs are empty. "
        f"How many chairs are taken?"
    )
    return question, rows * seats - empty


def _add_small(rng: random.Random) -> Problem:
    name = rng.choice(NAMES)
    item = rng.choice(ITEMS)
    have, more = rng.randint(2, 9), rng.randint(2, 9)
    question = f"{name} has {have} {item} and gets {more} more. How many {item} does {name} have?"
    return question, have + more


def _subtract_small(rng: random.Random) -> Problem:
    name = rng.choice(NAMES)
    item = rng.choice(ITEMS)
    have = rng.randint(6, 20)
    eaten = rng.randint(1, have - 1)
    question = f"{name} has {have} {item} and gives away {eaten}. How many {item} are left?"
    return question, have - eaten


def _times_small(rng: random.Random) -> Problem:
    bags, each = rng.randint(2, 9), rng.randint(2, 9)
    item = rng.choice(ITEMS)
    question = f"There are {bags} bags with {each} {item} in each bag. How many {item} are there?"
    return question, bags * each


TEMPLATES: list[Callable[[random.Random], Problem]] = [
    _add_small, _subtract_small, _times_small,
    _buy_and_give, _boxes, _share, _wage, _change,
    _distance, _ages, _pages, _double_then_subtract, _rows,
]


def _fresh(template: Callable[[random.Random], Problem], rng: random.Random, seen: set[str],
           seed: int, index: int) -> Problem:
    """The template's next problem; a question already in the set is redrawn.

    Redraws use their own generator seeded from (seed, index, attempt), so replacing one repeat
    leaves every other item exactly as the main sequence made it.
    """
    question, answer = template(rng)
    attempt = 0
    while question in seen:
        attempt += 1
        if attempt > MAX_REDRAWS:
            raise ValueError(f"math-{index:04d}: template {template.__name__} has no new question "
                             f"left after {MAX_REDRAWS} draws; ask for fewer items")
        question, answer = template(random.Random(f"{seed}:{index}:{attempt}"))
    seen.add(question)
    return question, answer


def generate(count: int = DEFAULT_COUNT, seed: int = DEFAULT_SEED) -> list[dict[str, str]]:
    """`count` distinct problems cycling through the templates; same seed, same problems."""
    rng = random.Random(seed)
    seen: set[str] = set()
    problems = []
    for index in range(count):
        template = TEMPLATES[index % len(TEMPLATES)]
        question, answer = _fresh(template, rng, seen, seed, index)
        problems.append({"id": f"math-{index:04d}", "question": question, "answer": str(answer),
                         "template": template.__name__.lstrip("_")})
    return problems


def write(path: Path = DATA_PATH, count: int = DEFAULT_COUNT, seed: int = DEFAULT_SEED) -> Path:
    return write_jsonl(path, generate(count, seed))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=DEFAULT_COUNT)
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED)
    parser.add_argument("--out", type=Path, default=DATA_PATH)
    args = parser.parse_args(argv)
    path = write(args.out, args.count, args.seed)
    print(f"wrote {args.count} problems to {path}")


if __name__ == "__main__":
    main()
