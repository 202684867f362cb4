"""Deterministic generator of small business tasks: fixed-label classification, field extraction
from invoices and emails, and JSON output that must parse and match a schema.

Every row carries its own scorer ('exact', 'contains' or 'json') and reference, so one grader
serves all of them and a user's own JSONL needs no code. Items cycle through the twelve templates
(classify, extract and json interleaved), so any first N items (an eval-set `limit`) hold the
three groups in the pool's proportions; no prompt appears twice. `python -m tools.generators.business`
rewrites `evalsets/business/data.jsonl`; the same seed always gives the same file, byte for byte.
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

from evalsets.jsonl import write_jsonl
from tools.generators import set_folder

DATA_PATH = set_folder("business") / "data.jsonl"
DEFAULT_SEED = 20240611
DEFAULT_COUNT = 300  # 25 rounds of the 12 templates
MAX_REDRAWS = 1000

FIRST = ["Dana", "Omar", "Lena", "Raj", "Sofia", "Tom", "Mei", "Carlos", "Anna", "Kofi", "Nina", "Yusuf"]
LAST = ["Lee", "Haddad", "Novak", "Patel", "Rossi", "Berg", "Chen", "Ortiz", "Kim", "Mensah", "Weber"]
COMPANIES = ["Acme Corp", "Northwind", "Globex", "Initech", "Umbrella Ltd", "Hooli", "Vandelay Inc"]
PRODUCTS = ["desk lamp", "blue mug", "office chair", "laptop stand", "notebook", "water bottle", "headset"]
CITIES = [("Springfield", "62704"), ("Riverton", "82501"), ("Fairview", "37062"), ("Madison", "53703"),
          ("Georgetown", "78626"), ("Salem", "97301"), ("Franklin", "37064"), ("Clinton", "52732")]
STREETS = ["Elm Street", "Oak Avenue", "Main Street", "Maple Road", "Cedar Lane", "Park Drive"]
MONTHS = ["January", "February", "March", "April", "May", "June", "July", "September", "October"]

TICKET_LABELS = ("billing", "shipping", "technical", "account")
TICKETS = {
    "billing": [
        "I was charged twice for my {month} invoice.",
        "Why does my bill show ${amount} when my plan costs less?",
        "Please send me a corrected invoice for {month}, the tax is wrong.",
        "My credit card was billed after I cancelled the plan.",
        "I was billed ${amount} for a {product} I never ordered.",
        "The discount code from {month} was not applied to my invoice.",
        "Can you split my ${amount} payment into two invoices?",
        "My receipt for the {product} shows the wrong tax number.",
    ],
    "shipping": [
        "My {product} has not arrived yet and the tracking has not changed in a week.",
        "The parcel with my {product} was delivered to the wrong address.",
        "Can you ship my order to {city} instead?",
        "The courier says my {product} is lost in transit.",
        "The box with my {product} arrived crushed.",
        "How long does delivery to {city} usually take?",
        "I ordered {count} items but only one parcel arrived.",
        "The tracking number for my {product} does not work.",
    ],
    "technical": [
        "The app crashes every time I open the settings page.",
        "I get error 500 when I upload a file.",
        "My headset will not connect to my computer over Bluetooth.",
        "The dashboard has been loading forever since this morning.",
        "The firmware update for my {product} failed halfway.",
        "Since the {month} update the app logs me out every few minutes.",
        "Exporting a report with {count} rows gives a blank page.",
        "The search bar returns no results, not even for {product}.",
    ],
    "account": [
        "I forgot my password and the reset email never comes.",
        "Please change the email address on my account.",
        "How do I delete my account and all my data?",
        "My account is locked after too many login attempts.",
        "Please add {count} more users to our company account.",
        "I moved to {city}, please update the address on my account.",
        "My two-factor login codes stopped arriving in {month}.",
        "Please merge my two accounts into one.",
    ],
}
SENTIMENT_LABELS = ("positive", "negative")
REVIEWS = {
    "positive": [
        "The {product} arrived early and works perfectly. Great value!",
        "Excellent quality, I love my new {product}.",
        "Friendly support and a sturdy {product}. Would buy again.",
        "Setup took five minutes and the {product} looks great.",
        "Five stars, the {product} is exactly as described.",
        "My second {product} from this shop, and still very happy with it.",
    ],
    "negative": [
        "The {product} broke after two days. Very disappointed.",
        "Terrible quality, the {product} stopped working in a week.",
        "The {product} is cheap plastic and support never answered.",
        "The {product} arrived scratched and the box had been opened.",
        "The {product} looks nothing like the photos. Sending it back.",
        "One star: the {product} leaks and smells odd.",
    ],
}
INTENT_LABELS = ("cancel", "refund", "upgrade")
INTENTS = {
    "cancel": ["Please cancel my subscription at the end of this month.",
               "I want to stop my plan, please close it.",
               "Please end my membership before it renews in {month}.",
               "We are moving to another provider in {month}, cancel our plan then.",
               "Cancel the plan for my team of {count}, we no longer need it."],
    "refund": ["The {product} was faulty, I would like my money back.",
               "Please return the ${amount} you charged me for the {product}.",
               "I sent the {product} back in {month} and I am still waiting for my money.",
               "You charged me ${amount} twice, please pay one of them back."],
    "upgrade": ["I would like to move to the Pro plan with more storage.",
                "Can I get the bigger plan for my team of {count}?",
                "Our team will grow to {count} people in {month}, we need a larger plan.",
                "Please switch me to the yearly Pro plan with priority support."],
}

Row = dict[str, str]
Template = Callable[[random.Random, int], Row]  # (rng, how many times this template ran before)


def _name(rng: random.Random) -> str:
    return f"{rng.choice(FIRST)} {rng.choice(LAST)}"


def _email(name: str, company: str) -> str:
    first, last = name.lower().split()
    domain = company.lower().replace(" inc", "").replace(" ltd", "").replace(" corp", "").replace(" ", "")
    return f"{first}.{last}@{domain}.com"


def _amount(rng: random.Random) -> str:
    return f"{rng.randint(12, 4800):,}.{rng.choice([0, 25, 50, 75, 99]):02d}"


def _fill(text: str, rng: random.Random) -> str:
    return text.format(
        month=rng.choice(MONTHS), amount=_amount(rng), product=rng.choice(PRODUCTS),
        city=rng.choice(CITIES)[0], count=rng.randint(3, 40),
    )


def _label_task(
    question: str, labels: tuple[str, ...], bank: dict[str, list[str]], noun: str
) -> Template:
    def make(rng: random.Random, round_: int) -> Row:
        label = labels[round_ % len(labels)]  # balanced: always answering one label scores low
        text = _fill(rng.choice(bank[label]), rng)
        prompt = (
            f"{question} {', '.join(labels[:-1])} or {labels[-1]}.\n{noun}: \"{text}\"\n"
            f"Answer with the label only."
        )
        return {"group": "classify", "scorer": "exact", "prompt": prompt, "reference": label}

    make.__name__ = f"classify_{noun.lower()}"  # the template's name: its items' cluster
    return make


def _invoice(rng: random.Random) -> tuple[str, str, str, str]:
    number = f"INV-{rng.randint(10000, 99999)}"
    date = f"2024-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"
    total = _amount(rng)
    text = (
        f"Invoice {number} from {rng.choice(COMPANIES)}, dated {date}. "
        f"{rng.randint(1, 9)} x {rng.choice(PRODUCTS)}. Total due: ${total}."
    )
    return text, number, date, total


def _extract_invoice_number(rng: random.Random, round_: int) -> Row:
    text, number, _, _ = _invoice(rng)
    prompt = f"{text}\nWhat is the invoice number? Answer with the number only."
    return {"group": "extract", "scorer": "contains", "prompt": prompt, "reference": number}


def _extract_invoice_total(rng: random.Random, round_: int) -> Row:
    text, _, _, total = _invoice(rng)
    prompt = f"{text}\nWhat is the total due? Answer with the amount only."
    return {"group": "extract", "scorer": "contains", "prompt": prompt, "reference": total}


def _extract_invoice_date(rng: random.Random, round_: int) -> Row:
    text, _, date, _ = _invoice(rng)
    prompt = f"{text}\nWhat is the invoice date? Answer with the date only."
    return {"group": "extract", "scorer": "contains", "prompt": prompt, "reference": date}


def _customer_email(rng: random.Random) -> tuple[str, str, str, str]:
    name, company = _name(rng), rng.choice(COMPANIES)
    address, order = _email(name, company), str(rng.randint(10000, 99999))
    text = (
        f"From: {name} <{address}>\nSubject: Order {order}\n"
        f"Hello, my {rng.choice(PRODUCTS)} from order {order} has not arrived. {name.split()[0]}"
    )
    return text, name, address, order


def _extract_sender_email(rng: random.Random, round_: int) -> Row:
    text, _, address, _ = _customer_email(rng)
    prompt = f"{text}\n\nWhat is the sender's email address? Answer with the address only."
    return {"group": "extract", "scorer": "contains", "prompt": prompt, "reference": address}


def _extract_order_number(rng: random.Random, round_: int) -> Row:
    text, _, _, order = _customer_email(rng)
    prompt = f"{text}\n\nWhat is the order number? Answer with the number only."
    return {"group": "extract", "scorer": "contains", "prompt": prompt, "reference": order}


def _json_row(prompt: str, schema: dict[str, Any], expected: dict[str, Any]) -> Row:
    return {
        "group": "json",
        "scorer": "json",
        "prompt": prompt,
        "reference": json.dumps(expected),
        "schema": json.dumps(schema),
    }


def _object_schema(properties: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": properties,
        "required": list(properties),
        "additionalProperties": False,
    }


def _json_order(rng: random.Random, round_: int) -> Row:
    name, product, quantity = _name(rng), rng.choice(PRODUCTS), rng.randint(2, 12)
    prompt = (
        'Return only JSON with keys "name" (string) and "quantity" (integer).\n'
        f"Text: {name} ordered {quantity} {product}s."
    )
    schema = _object_schema({"name": {"type": "string"}, "quantity": {"type": "integer"}})
    return _json_row(prompt, schema, {"name": name, "quantity": quantity})


def _json_address(rng: random.Random, round_: int) -> Row:
    city, zip_code = rng.choice(CITIES)
    street = f"{rng.randint(1, 250)} {rng.choice(STREETS)}"
    prompt = (
        'Return only JSON with keys "city" and "zip" (both strings).\n'
        f"Address: {street}, {city} {zip_code}"
    )
    schema = _object_schema({"city": {"type": "string"}, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}})
    return _json_row(prompt, schema, {"city": city, "zip": zip_code})


def _json_contact(rng: random.Random, round_: int) -> Row:
    text, name, address, _ = _customer_email(rng)
    prompt = f'Return only JSON with keys "name" and "email" for the sender.\n{text}'
    schema = _object_schema(
        {"name": {"type": "string"}, "email": {"type": "string", "pattern": "^[^@ ]+@[^@ ]+$"}}
    )
    return _json_row(prompt, schema, {"name": name, "email": address})


def _json_ticket(rng: random.Random, round_: int) -> Row:
    label = TICKET_LABELS[round_ % len(TICKET_LABELS)]
    text = _fill(rng.choice(TICKETS[label]), rng)
    prompt = (
        f'Return only JSON with key "category", one of: {", ".join(TICKET_LABELS)}.\n'
        f'Ticket: "{text}"'
    )
    schema = _object_schema({"category": {"type": "string", "enum": list(TICKET_LABELS)}})
    return _json_row(prompt, schema, {"category": label})


TEMPLATES: list[Template] = [
    _label_task("Classify the support ticket as one of:", TICKET_LABELS, TICKETS, "Ticket"),
    _extract_invoice_number,
    _json_order,
    _label_task("Classify the review as", SENTIMENT_LABELS, REVIEWS, "Review"),
    _extract_sender_email,
    _json_address,
    _label_task("Classify what the customer wants:", INTENT_LABELS, INTENTS, "Message"),
    _extract_invoice_total,
    _json_contact,
    _extract_order_number,
    _extract_invoice_date,
    _json_ticket,
]


def _fresh(template: Template, rng: random.Random, round_: int, seen: set[str],
           seed: int, index: int) -> Row:
    """The template's next row; a prompt already in the set is redrawn.

    Redraws use their own generator seeded from (seed, index, attempt), so replacing one repeat
    leaves every other item exactly as the main sequence made it.
    """
    row = template(rng, round_)
    attempt = 0
    while row["prompt"] in seen:
        attempt += 1
        if attempt > MAX_REDRAWS:
            raise ValueError(f"biz-{index:04d}: no new prompt left after {MAX_REDRAWS} draws; "
                             f"ask for fewer items or add texts to the banks")
        row = template(random.Random(f"{seed}:{index}:{attempt}"), round_)
    seen.add(row["prompt"])
    return row


def generate(count: int = DEFAULT_COUNT, seed: int = DEFAULT_SEED) -> list[Row]:
    """`count` distinct items cycling through the templates; same seed, same items."""
    rng = random.Random(seed)
    seen: set[str] = set()
    rows = []
    for index in range(count):
        template = TEMPLATES[index % len(TEMPLATES)]
        row = _fresh(template, rng, index // len(TEMPLATES), seen, seed, index)
        rows.append({"id": f"biz-{index:04d}", **row, "schema": row.get("schema", ""),
                     "template": template.__name__.lstrip("_")})
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
    print(f"wrote {args.count} items to {path}")


if __name__ == "__main__":
    main()
