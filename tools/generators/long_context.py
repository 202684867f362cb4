"""Deterministic generator of passkey-retrieval items at fixed prompt lengths (token buckets).

Each item hides one or three five-digit pass keys at seeded depths inside original filler prose
(sentences assembled from the word lists below, no downloaded text) and asks for one of them.
The filler is grown sentence by sentence until the prompt, counted with the demo model's own
tokenizer, falls inside its bucket's bounds; the measured count is stored in `prompt_tokens` so
the data contract can check that every bucket holds what it claims.

`python -m tools.generators.long_context` rewrites `evalsets/long_context/data.jsonl`; the same
seed and tokenizer always give the same file, byte for byte.
"""

from __future__ import annotations

import argparse
import random
from collections.abc import Callable
from pathlib import Path

from evalsets.jsonl import write_jsonl
from evalsets.long_context.buckets import Bucket, load_buckets
from tools.generators import set_folder

DATA_PATH = set_folder("long_context") / "data.jsonl"
TOKENIZER_DIR = Path(__file__).resolve().parents[2] / "models" / "smollm2-135m-bf16"
DEFAULT_SEED = 20240611
DEFAULT_PER_BUCKET = 120  # room for a KV stage's unresolved bucket to grow alone (gates: groups)

INTRO = (
    "Below is a long and mostly dull diary. Somewhere inside it a pass key is written down. "
    "Read carefully, find the pass key and remember it. You will be asked for it at the end."
)
MULTI_INTRO = (
    "Below is a long and mostly dull diary. Somewhere inside it several pass keys are written "
    "down, each for a different door. Read carefully and remember which key opens which door. "
    "You will be asked for one of them at the end."
)

# Original filler: a seeded walk through these pieces gives varied, grammatical, harmless prose.
SUBJECTS = [
    "The ferryman", "My neighbour", "The old baker", "A tired courier", "The gardener",
    "Our landlady", "The night clerk", "A young painter", "The lighthouse keeper", "My cousin",
    "The librarian", "A travelling tinker", "The school teacher", "The mill owner",
]
VERBS = [
    "walked slowly past", "spent the morning near", "talked for an hour about",
    "repaired a fence beside", "complained loudly about", "drew a careful sketch of",
    "counted the crates behind", "swept the path in front of", "waited patiently by",
    "wrote a short letter about", "bought some bread close to", "looked for a lost glove near",
]
PLACES = [
    "the harbour", "the covered market", "the chapel on the hill", "the rope works",
    "the flooded meadow", "the railway bridge", "the bakery on Mill Lane", "the town hall",
    "the orchard", "the boat sheds", "the weaving house", "the quiet square",
]
ASIDES = [
    "The weather was grey and a little windy.", "Nothing much happened after that.",
    "The church bell rang twice in the distance.", "A cart full of turnips rattled by.",
    "Somebody had left a blue umbrella on the bench.", "The river was higher than usual.",
    "Gulls argued over a piece of bread.", "The smell of tar drifted in from the docks.",
    "It started to drizzle around noon.", "Two dogs chased each other along the wall.",
    "The tea had gone cold by then.", "A radio played an old waltz somewhere upstairs.",
]
TIMES = ["On Monday", "Later that day", "In the evening", "Early on Thursday", "At dawn",
         "Around midday", "The next morning", "On Sunday afternoon", "Before supper"]
DOORS = ["red", "blue", "green", "yellow", "white", "black", "orange", "purple"]


def filler_sentence(rng: random.Random) -> str:
    if rng.random() < 0.3:
        return rng.choice(ASIDES)
    return f"{rng.choice(TIMES)}, {rng.choice(SUBJECTS).lower()} {rng.choice(VERBS)} {rng.choice(PLACES)}."


def _key(rng: random.Random, taken: set[str]) -> str:
    while True:
        key = str(rng.randint(10000, 99999))
        if key not in taken:
            taken.add(key)
            return key


def render(context: str, question: str) -> str:
    """The prompt exactly as task.yaml's doc_to_text renders it (keep the two in step)."""
    return f"{context}\n\n{question}"


def _assemble(intro: str, filler: list[str], needles: list[tuple[float, str]]) -> str:
    sentences = list(filler)
    # Insert deepest first so earlier insertion points are not shifted.
    for depth, needle in sorted(needles, reverse=True):
        sentences.insert(round(depth * len(sentences)), needle)
    return intro + "\n\n" + " ".join(sentences)


def make_item(
    rng: random.Random,
    bucket: Bucket,
    multi: bool,
    count_tokens: Callable[[str], int],
    item_id: str,
) -> dict:
    """One item whose rendered prompt has a token count inside the bucket's bounds."""
    taken: set[str] = set()
    if multi:
        doors = rng.sample(DOORS, 3)
        keys = [_key(rng, taken) for _ in doors]
        needles = [
            (rng.uniform(0.05, 0.95), f"The pass key for the {door} door is {key}. "
             f"Remember it: the {door} door opens with {key}.")
            for door, key in zip(doors, keys, strict=True)
        ]
        asked = rng.randrange(3)
        answer, intro = keys[asked], MULTI_INTRO
        question = (f"What is the pass key for the {doors[asked]} door? "
                    f"Answer with the five-digit number only.")
    else:
        answer, intro = _key(rng, taken), INTRO
        depth = rng.uniform(0.05, 0.95)
        needles = [(depth, f"The pass key is {answer}. Remember it: {answer} is the pass key.")]
        question = "What is the pass key? Answer with the five-digit number only."
    target = rng.randint(bucket.min_tokens + (bucket.max_tokens - bucket.min_tokens) // 2,
                         bucket.max_tokens)
    filler: list[str] = []
    # Grow in steps sized by the shortfall (a filler sentence is 8-16 tokens), then trim to the
    # exact count: the tokenizer is the judge, not the estimate.
    while (tokens := count_tokens(render(_assemble(intro, filler, needles), question))) < target:
        filler.extend(filler_sentence(rng) for _ in range(max(1, (target - tokens) // 16)))
    while tokens > target:
        filler.pop()
        tokens = count_tokens(render(_assemble(intro, filler, needles), question))
    context = _assemble(intro, filler, needles)
    if not bucket.min_tokens <= tokens <= bucket.max_tokens:
        raise ValueError(f"{item_id}: {tokens} tokens outside bucket {bucket.name}")
    return {
        "id": item_id,
        "bucket": bucket.name,
        "kind": "multi" if multi else "single",
        "prompt_tokens": tokens,
        "context": context,
        "question": question,
        "answer": answer,
    }


def tokenizer_counter(tokenizer_dir: Path = TOKENIZER_DIR) -> Callable[[str], int]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir), local_files_only=True)
    return lambda text: len(tokenizer(text, add_special_tokens=False)["input_ids"])


def generate(
    count_tokens: Callable[[str], int],
    per_bucket: int = DEFAULT_PER_BUCKET,
    seed: int = DEFAULT_SEED,
) -> list[dict]:
    """`per_bucket` items in every bucket, half single-key, half multi-key.

    Items are interleaved across buckets (512, 1k, 2k, 4k, 512, ...) so an eval-set `limit`
    keeps every bucket represented.
    """
    rng = random.Random(seed)
    items = []
    buckets = load_buckets()
    for index in range(per_bucket):
        for bucket in buckets:
            multi = index % 2 == 1
            items.append(make_item(rng, bucket, multi, count_tokens,
                                   f"lc-{bucket.name}-{index:03d}"))
    return items


def write(path: Path = DATA_PATH, per_bucket: int = DEFAULT_PER_BUCKET,
          seed: int = DEFAULT_SEED, tokenizer_dir: Path = TOKENIZER_DIR) -> Path:
    return write_jsonl(path, generate(tokenizer_counter(tokenizer_dir), per_bucket, seed))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--per-bucket", type=int, default=DEFAULT_PER_BUCKET)
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED)
    parser.add_argument("--tokenizer", type=Path, default=TOKENIZER_DIR)
    parser.add_argument("--out", type=Path, default=DATA_PATH)
    args = parser.parse_args(argv)
    path = write(args.out, args.per_bucket, args.seed, args.tokenizer)
    print(f"wrote {args.per_bucket} items per bucket to {path}")


if __name__ == "__main__":
    main()
