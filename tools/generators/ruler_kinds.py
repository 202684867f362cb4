"""The RULER task kinds, generated here: what each item hides, asks and expects.

Each kind turns a seeded random source into a `Plan`: the question, the answers and a function
that builds the context at any size (a number of filler units). The generator picks the size
whose prompt, counted with the model's tokenizer, falls inside the item's length bucket; the
needles and answers do not change with the size, so the same item exists at every length.

- niah_single: one "special magic number" for one key, hidden at a random depth in diary prose.
- niah_multikey: four keys, four numbers; the question asks for one key (three distractors).
- niah_multivalue: one key with four numbers; all four must be given.
- variable_tracking: VAR A = 12345, VAR B = VAR A, ... (four hops) spread through the prose;
  every variable holding the value must be named.
- common_words: a numbered list of words where three words are four times as frequent as any
  other; the three must be named (aggregation over the whole context).
"""

from __future__ import annotations

import math
import random
import string
from collections.abc import Callable
from dataclasses import dataclass

from tools.generators.long_context import filler_sentence
from tools.generators.ruler_words import NOUNS

KINDS = ("niah_single", "niah_multikey", "niah_multivalue", "variable_tracking", "common_words")

NEEDLE_INTRO = (
    "Below is a long and mostly dull diary. Some special magic numbers are hidden inside it. "
    "Read carefully and remember them: you will be asked about them at the end."
)
VARIABLE_INTRO = (
    "Below is a long and mostly dull diary. Variable assignments are hidden inside it. Read "
    "carefully and keep track of them: you will be asked about them at the end."
)
WORDS_INTRO = (
    "Below is a numbered list of words. Some words appear in it more often than others. Read "
    "the whole list: you will be asked about it at the end."
)
NEEDLES_MULTIKEY = 4
VALUES_MULTIVALUE = 4
VARIABLE_HOPS = 4
COMMON_WORDS = 3
COMMON_RATIO = 4  # a common word appears this many times as often as the most frequent other


@dataclass(frozen=True)
class Plan:
    """One item before sizing: `build(n)` is its context with n filler units."""

    kind: str
    question: str
    answers: tuple[str, ...]
    build: Callable[[int], str]


class _Filler:
    """The first n sentences of one seeded stream of diary prose (the same prefix for every n)."""

    def __init__(self, seed: str) -> None:
        self._rng = random.Random(seed)
        self._sentences: list[str] = []

    def first(self, count: int) -> list[str]:
        while len(self._sentences) < count:
            self._sentences.append(filler_sentence(self._rng))
        return self._sentences[:count]


def _haystack(intro: str, filler: _Filler, needles: list[tuple[float, str]]) -> Callable[[int], str]:
    """Context builder: `needles` (depth 0-1, sentence) inserted into n filler sentences, in
    depth order (a later needle never lands before an earlier one)."""

    def build(count: int) -> str:
        sentences = list(filler.first(count))
        # Deepest first, so earlier insertion points are not shifted.
        for depth, needle in sorted(needles, key=lambda pair: pair[0], reverse=True):
            sentences.insert(round(depth * count), needle)
        return intro + "\n\n" + " ".join(sentences)

    return build


def _number(rng: random.Random, taken: set[str]) -> str:
    while (value := str(rng.randint(1_000_000, 9_999_999))) in taken:
        pass
    taken.add(value)
    return value


def _depths(rng: random.Random, count: int) -> list[float]:
    return sorted(rng.uniform(0.05, 0.95) for _ in range(count))


def _needle(key: str, value: str) -> str:
    return f"One of the special magic numbers for {key} is: {value}."


def niah_single(rng: random.Random, seed: str) -> Plan:
    key, value = rng.choice(NOUNS), _number(rng, set())
    needles = [(rng.uniform(0.05, 0.95), _needle(key, value))]
    return Plan("niah_single", f"What is the special magic number for {key} mentioned in the "
                "text above? Answer with the number only.", (value,),
                _haystack(NEEDLE_INTRO, _Filler(seed), needles))


def niah_multikey(rng: random.Random, seed: str) -> Plan:
    keys, taken = rng.sample(NOUNS, NEEDLES_MULTIKEY), set()
    values = [_number(rng, taken) for _ in keys]
    needles = [(rng.uniform(0.05, 0.95), _needle(k, v)) for k, v in zip(keys, values, strict=True)]
    asked = rng.randrange(len(keys))
    return Plan("niah_multikey", f"What is the special magic number for {keys[asked]} mentioned "
                "in the text above? Answer with the number only.", (values[asked],),
                _haystack(NEEDLE_INTRO, _Filler(seed), needles))


def niah_multivalue(rng: random.Random, seed: str) -> Plan:
    key, taken = rng.choice(NOUNS), set()
    values = [_number(rng, taken) for _ in range(VALUES_MULTIVALUE)]
    needles = [(rng.uniform(0.05, 0.95), _needle(key, v)) for v in values]
    return Plan("niah_multivalue", f"What are all the special magic numbers for {key} mentioned "
                "in the text above? Answer with the numbers only, separated by commas.",
                tuple(values), _haystack(NEEDLE_INTRO, _Filler(seed), needles))


def variable_tracking(rng: random.Random, seed: str) -> Plan:
    names: list[str] = []
    while len(names) < VARIABLE_HOPS + 1:
        name = "".join(rng.choices(string.ascii_uppercase, k=5))
        if name not in names:
            names.append(name)
    value = str(rng.randint(10000, 99999))
    chain = [f"VAR {names[0]} = {value}."] + [f"VAR {new} = VAR {old}."
                                              for old, new in zip(names, names[1:], strict=False)]
    needles = list(zip(_depths(rng, len(chain)), chain, strict=True))
    return Plan("variable_tracking", f"Find all variables that are assigned the value {value} in "
                "the text above, directly or through another variable. Answer with the variable "
                "names only, separated by commas.", tuple(names),
                _haystack(VARIABLE_INTRO, _Filler(seed), needles))


def common_words(rng: random.Random, seed: str) -> Plan:
    vocabulary = list(NOUNS)
    rng.shuffle(vocabulary)
    common, others = vocabulary[:COMMON_WORDS], vocabulary[COMMON_WORDS:]

    def build(count: int) -> str:
        # Each other word at most `rare` times, each common word COMMON_RATIO x `rare` times.
        rare = max(1, math.ceil(count / (len(others) + COMMON_RATIO * COMMON_WORDS)))
        frequent = COMMON_RATIO * rare
        rest = max(0, count - frequent * COMMON_WORDS)
        words = [w for w in common for _ in range(frequent)]
        words += [w for _ in range(rare) for w in others][:rest]
        random.Random(f"{seed}:{count}").shuffle(words)
        listing = " ".join(f"{i}. {w}" for i, w in enumerate(words, start=1))
        return WORDS_INTRO + "\n\n" + listing

    return Plan("common_words", f"What are the {COMMON_WORDS} most common words in the list "
                f"above? Answer with the {COMMON_WORDS} words only, separated by commas.",
                tuple(common), build)


MAKERS: dict[str, Callable[[random.Random, str], Plan]] = {
    "niah_single": niah_single, "niah_multikey": niah_multikey,
    "niah_multivalue": niah_multivalue, "variable_tracking": variable_tracking,
    "common_words": common_words,
}
