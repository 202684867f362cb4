"""Patterns whose search backtracks through exponentially (or n^10+) many ways of matching one
answer: a repeat that can end in more than one place inside a repeat ('(a|aa)*b', '(.*a){20}').

Read off Python's own parse of the pattern (re._parser), as evalsets.patterns.nested_repeat
does, by the characters each piece can start with: two ways to go on that can start with the
same character are an ambiguity; inside a repeat, the search tries every combination of them.
"""

from __future__ import annotations

import string
import warnings
from dataclasses import dataclass
from re import _constants as sre
from re import _parser

# A bounded repeat of at least this many rounds over an ambiguous body is refused: its search
# is polynomial of this degree on an answer that almost matches (2,000 characters: 10^33 steps).
MANY_ROUNDS = 10
_SPACE = frozenset(string.whitespace)
_DIGIT = frozenset(string.digits)
_NOT_WORD = _SPACE | frozenset(string.punctuation)


@dataclass(frozen=True)
class Starts:
    """The characters a piece can start with: `chars`, or with `wild` any character outside
    `chars`; `empty` when it can match nothing (then what follows it starts the match)."""

    chars: frozenset = frozenset()
    wild: bool = False
    empty: bool = False

    def __or__(self, other: Starts) -> Starts:
        if self.wild and other.wild:  # any character outside both exclusions
            return Starts(self.chars & other.chars, True, self.empty or other.empty)
        if self.wild or other.wild:
            wild, plain = (self, other) if self.wild else (other, self)
            return Starts(wild.chars - plain.chars, True, self.empty or other.empty)
        return Starts(self.chars | other.chars, False, self.empty or other.empty)

    def then(self, following: Starts) -> Starts:
        """The starts of this piece followed by `following`."""
        if not self.empty:
            return self
        return Starts(self.chars, self.wild) | following

    def overlaps(self, other: Starts) -> bool:
        if self.wild and other.wild:
            return True
        if self.wild or other.wild:
            wild, plain = (self, other) if self.wild else (other, self)
            return bool(plain.chars - wild.chars)
        return bool(self.chars & other.chars)


ANY = Starts(wild=True)
NOTHING = Starts(empty=True)


def _category(name: object) -> Starts:
    return {sre.CATEGORY_DIGIT: Starts(_DIGIT), sre.CATEGORY_NOT_DIGIT: Starts(_DIGIT, True),
            sre.CATEGORY_SPACE: Starts(_SPACE), sre.CATEGORY_NOT_SPACE: Starts(_SPACE, True),
            sre.CATEGORY_WORD: Starts(_NOT_WORD, True), sre.CATEGORY_NOT_WORD: Starts(_NOT_WORD),
            }.get(name, ANY)


def _char_set(items: list) -> Starts:
    found = Starts()
    negate = False
    for op, arg in items:
        if op is sre.NEGATE:
            negate = True
        elif op is sre.LITERAL:
            found = found | Starts(frozenset({chr(arg)}))
        elif op is sre.RANGE and arg[1] - arg[0] < 512:
            found = found | Starts(frozenset(map(chr, range(arg[0], arg[1] + 1))))
        elif op is sre.CATEGORY:
            found = found | _category(arg)
        else:
            return ANY
    if not negate:
        return found
    return ANY if found.wild else Starts(found.chars, True)


def _piece(op: object, arg: object) -> Starts:
    """What one parsed piece can start with (`empty`: it can match nothing)."""
    if op in (sre.AT, sre.ASSERT, sre.ASSERT_NOT):  # zero-width: the next piece starts it
        return NOTHING
    if op is sre.LITERAL:
        return Starts(frozenset({chr(arg)}))
    if op is sre.NOT_LITERAL:
        return Starts(frozenset({chr(arg)}), True)
    if op is sre.IN:
        return _char_set(arg)
    if op is sre.CATEGORY:
        return _category(arg)
    if op is sre.SUBPATTERN:
        return starts(arg[3])
    if op is sre.ATOMIC_GROUP:
        return starts(arg)
    if op in (sre.MAX_REPEAT, sre.MIN_REPEAT, sre.POSSESSIVE_REPEAT):
        body = starts(arg[2])
        return Starts(body.chars, body.wild, body.empty or arg[0] == 0)
    if op is sre.BRANCH:
        found = NOTHING if not arg[1] else Starts()
        for branch in arg[1]:
            found = found | starts(branch)
        return found
    # A back-reference, any character, a conditional group: anything (or nothing).
    return ANY | NOTHING if op is sre.GROUPREF_EXISTS else ANY


def starts(items: list, following: Starts = NOTHING) -> Starts:
    """What the sequence `items`, then `following`, can start with."""
    return _afters(items, following)[0]


def _afters(items: list, following: Starts) -> list[Starts]:
    """For each i, what items[i:] then `following` can start with (one pass, from the end:
    a long pattern of optional pieces stays linear)."""
    found = [following]
    for op, arg in reversed(items):
        found.append(_piece(op, arg).then(found[-1]))
    return found[::-1]


def _ambiguous(items: list, rounds: int, following: Starts) -> bool:
    """Whether `items`, inside repeats of `rounds` rounds in all (0: none), can match one text
    in more than one way each round: two branches that start alike, or a repeat that can stop
    or go on at the same character. `following`: what can come after `items`."""
    many = rounds >= MANY_ROUNDS
    afters = _afters(items, following)
    for index, (op, arg) in enumerate(items):
        after = afters[index + 1]
        if op is sre.BRANCH:
            heads = [starts(branch, after) for branch in arg[1]]
            if many and any(a.overlaps(b) for i, a in enumerate(heads) for b in heads[i + 1:]):
                return True
            if any(_ambiguous(branch, rounds, after) for branch in arg[1]):
                return True
        elif op is sre.SUBPATTERN and _ambiguous(arg[3], rounds, after):
            return True
        elif op in (sre.MAX_REPEAT, sre.MIN_REPEAT):
            low, high, body = arg
            head = starts(body)
            if many and low != high and Starts(head.chars, head.wild).overlaps(after):
                return True  # where this repeat stops is a choice, made again every round
            if high > 1:  # its body follows itself, then what follows the repeat
                own = MANY_ROUNDS if high == sre.MAXREPEAT else high
                if _ambiguous(body, max(rounds, 1) * own, Starts(head.chars, head.wild) | after):
                    return True
            elif _ambiguous(body, rounds, after):
                return True
        # Atomic groups and possessive repeats never give back what they matched: no choice.
    return False


def ambiguous_repeat(pattern: str) -> str | None:
    """Why a pattern can take exponential (or high polynomial) time, or None."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # regex_problem reports them
        parsed = _parser.parse(pattern)
    if not _ambiguous(list(parsed), 0, NOTHING):
        return None
    return (f"pattern {pattern!r} repeats a part that can match the same text in more than one "
            "way (like '(a|aa)*' or '(.*a){20}'), which can take exponential time on an answer "
            "that almost matches; make the alternatives start differently, or the inner repeat "
            "possessive ('a++') or atomic ('(?>...)')")
