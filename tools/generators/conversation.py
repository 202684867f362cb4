"""Deterministic generator of short customer-service dialogues whose last question needs an
earlier turn: an order number, a name, a quantity, a date, a city, or two facts combined.

Each dialogue has two to four earlier exchanges (a user turn and a scripted assistant reply)
that state the facts, with distractors (a ticket number, a second product), then a final user
question that does not itself contain the answer. Items cycle through the templates, so any
first N items (an eval-set `limit`) mix recall and combining in the pool's proportions.
`python -m tools.generators.conversation` rewrites `evalsets/conversation/data.jsonl`; the same
seed always gives the same file, byte for byte.
"""

from __future__ import annotations

import argparse
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

from evalsets.jsonl import write_jsonl
from tools.generators import set_folder

DATA_PATH = set_folder("conversation") / "data.jsonl"
DEFAULT_SEED = 20240701
DEFAULT_COUNT = 200  # 20 rounds of the 10 templates
MAX_REDRAWS = 1000

FIRST = ["Dana", "Omar", "Lena", "Raj", "Sofia", "Tom", "Mei", "Carlos", "Anna", "Kofi", "Nina", "Yusuf"]
LAST = ["Lee", "Haddad", "Novak", "Patel", "Rossi", "Berg", "Chen", "Ortiz", "Kim", "Mensah", "Weber"]
PRODUCTS = ["desk lamp", "blue mug", "office chair", "laptop stand", "notebook", "water bottle",
            "headset", "backpack"]
CITIES = ["Springfield", "Riverton", "Fairview", "Madison", "Georgetown", "Salem", "Franklin"]
MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September",
          "October", "November"]

Message = dict[str, str]
Dialogue = tuple[list[Message], str, str, str]  # (messages, scorer, reference, group)


def _user(text: str) -> Message:
    return {"role": "user", "content": text}


def _assistant(text: str) -> Message:
    return {"role": "assistant", "content": text}


class Facts:
    """The facts one dialogue can state, drawn once so the turns agree with each other."""

    def __init__(self, rng: random.Random) -> None:
        self.first, self.last = rng.choice(FIRST), rng.choice(LAST)
        self.name = f"{self.first} {self.last}"
        self.order = f"{rng.randint(100000, 999999)}"
        self.ticket = f"T-{rng.randint(1000, 9999)}"
        self.product, self.other = rng.sample(PRODUCTS, 2)
        self.quantity, self.other_quantity = rng.sample(range(2, 13), 2)
        self.price = rng.randint(3, 60)
        self.date = f"{rng.choice(MONTHS)} {rng.randint(2, 27)}"
        self.new_date = f"{rng.choice(MONTHS)} {rng.randint(2, 27)}"
        while self.new_date == self.date:
            self.new_date = f"{rng.choice(MONTHS)} {rng.randint(2, 27)}"
        self.city = rng.choice(CITIES)

    def opening(self) -> list[Message]:
        return [_user(f"Hi, my name is {self.name}. I have a question about order {self.order}."),
                _assistant(f"Hello {self.first}, I can help with order {self.order}. "
                           "What would you like to know?")]

    def contents(self) -> list[Message]:
        return [_user(f"The order has {self.quantity} {self.product}s in it."),
                _assistant(f"I see {self.quantity} {self.product}s on the order.")]

    def ticket_turns(self) -> list[Message]:
        return [_user(f"I already opened ticket {self.ticket} about the delivery."),
                _assistant(f"Thanks, ticket {self.ticket} is linked to your order now.")]

    def delivery(self) -> list[Message]:
        return [_user(f"The delivery is planned for {self.date} to my address in {self.city}."),
                _assistant(f"Noted: delivery on {self.date} in {self.city}.")]


def _order_number(rng: random.Random) -> Dialogue:
    f = Facts(rng)
    turns = f.opening() + f.ticket_turns() + f.contents()
    question = "Sorry, I lost my note. What was my order number? Answer with the number only."
    return [*turns, _user(question)], "contains", f.order, "recall"


def _customer_name(rng: random.Random) -> Dialogue:
    f = Facts(rng)
    turns = f.opening() + f.delivery()
    question = "Which full name did I give you at the start? Answer with the name only."
    return [*turns, _user(question)], "contains", f.name, "recall"


def _quantity(rng: random.Random) -> Dialogue:
    f = Facts(rng)
    turns = f.opening() + f.contents() + f.ticket_turns()
    question = f"How many {f.product}s are in my order? Answer with the number only."
    return [*turns, _user(question)], "numeric", str(f.quantity), "recall"


def _delivery_date(rng: random.Random) -> Dialogue:
    f = Facts(rng)
    turns = f.opening() + f.delivery() + f.contents()
    question = "On which date is the delivery planned? Answer with the date only."
    return [*turns, _user(question)], "contains", f.date, "recall"


def _delivery_city(rng: random.Random) -> Dialogue:
    f = Facts(rng)
    turns = f.opening() + f.delivery()
    question = "Which city is the order going to? Answer with the city only."
    return [*turns, _user(question)], "exact", f.city, "recall"


def _product(rng: random.Random) -> Dialogue:
    f = Facts(rng)
    turns = f.opening() + f.contents() + [
        _user(f"My colleague wants to order a {f.other} separately."),
        _assistant(f"Sure, a {f.other} can be a separate order."),
    ]
    question = "Which product is in my own order? Answer with the product name only."
    return [*turns, _user(question)], "exact", f.product, "recall"


def _moved_date(rng: random.Random) -> Dialogue:
    f = Facts(rng)
    turns = f.opening() + f.delivery() + [
        _user(f"Could you move the delivery to {f.new_date} instead?"),
        _assistant(f"Done: the delivery is moved to {f.new_date}."),
    ]
    question = "What is the delivery date now? Answer with the date only."
    return [*turns, _user(question)], "contains", f.new_date, "recall"


def _total_items(rng: random.Random) -> Dialogue:
    f = Facts(rng)
    turns = f.opening() + f.contents() + [
        _user(f"I also want to add {f.other_quantity} {f.other}s to it."),
        _assistant(f"Added {f.other_quantity} {f.other}s."),
    ]
    question = "How many items are in my order in total now? Answer with the number only."
    return [*turns, _user(question)], "numeric", str(f.quantity + f.other_quantity), "combine"


def _total_cost(rng: random.Random) -> Dialogue:
    f = Facts(rng)
    turns = f.opening() + f.contents() + [
        _user(f"The shop page says each {f.product} costs {f.price} dollars."),
        _assistant(f"That is right, {f.price} dollars per {f.product}."),
    ]
    question = f"What do the {f.product}s cost together, in dollars? Answer with the number only."
    return [*turns, _user(question)], "numeric", str(f.quantity * f.price), "combine"


def _returned(rng: random.Random) -> Dialogue:
    f = Facts(rng)
    returned = rng.randint(1, f.quantity - 1)
    turns = f.opening() + f.contents() + f.ticket_turns() + [
        _user(f"I want to send back {returned} of the {f.product}s."),
        _assistant(f"A return of {returned} {f.product}s is registered."),
    ]
    question = f"How many {f.product}s will I keep? Answer with the number only."
    return [*turns, _user(question)], "numeric", str(f.quantity - returned), "combine"


TEMPLATES: list[Callable[[random.Random], Dialogue]] = [
    _order_number, _quantity, _total_items, _customer_name, _delivery_date,
    _total_cost, _delivery_city, _product, _returned, _moved_date,
]


def _key(messages: list[Message]) -> str:
    return "\n".join(message["content"] for message in messages)


def _fresh(template: Callable[[random.Random], Dialogue], rng: random.Random, seen: set[str],
           seed: int, index: int) -> Dialogue:
    """The template's next dialogue; one already in the set is redrawn from its own generator
    (seeded from seed, index, attempt), leaving every other item as the main sequence made it."""
    dialogue = template(rng)
    attempt = 0
    while _key(dialogue[0]) in seen:
        attempt += 1
        if attempt > MAX_REDRAWS:
            raise ValueError(f"conv-{index:04d}: template {template.__name__} has no new dialogue "
                             f"left after {MAX_REDRAWS} draws; ask for fewer items")
        dialogue = template(random.Random(f"{seed}:{index}:{attempt}"))
    seen.add(_key(dialogue[0]))
    return dialogue


def generate(count: int = DEFAULT_COUNT, seed: int = DEFAULT_SEED) -> list[dict[str, Any]]:
    """`count` distinct dialogues cycling through the templates; same seed, same dialogues."""
    rng = random.Random(seed)
    seen: set[str] = set()
    rows = []
    for index in range(count):
        template = TEMPLATES[index % len(TEMPLATES)]
        messages, scorer, reference, group = _fresh(template, rng, seen, seed, index)
        rows.append({"id": f"conv-{index:04d}", "group": group, "scorer": scorer,
                     "messages": messages, "reference": reference})
    return rows


def write(path: Path = DATA_PATH, count: int = DEFAULT_COUNT, seed: int = DEFAULT_SEED) -> Path:
    return write_jsonl(path, generate(count, seed))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=DEFAULT_COUNT)
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED)
    parser.add_argument("--out", type=Path, default=DATA_PATH)
    args = parser.parse_args(argv)
    path = write(args.out, args.count, args.seed)
    print(f"wrote {args.count} dialogues to {path}")


if __name__ == "__main__":
    main()
