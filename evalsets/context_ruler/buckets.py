"""The family's length buckets: doubling from 512 prompt tokens up to the served context."""

from __future__ import annotations

from evalsets.contracts import TEMPLATE_MARGIN_TOKENS
from evalsets.long_context.buckets import Bucket

# The generation budget of every item (task.yaml max_gen_toks): the longest answer (three
# words, five variable names, four 7-digit numbers) with room to spare.
ANSWER_TOKENS = 64
SHORTEST = 512
# A context this much longer than the last doubling gets a bucket of its own (40960 -> 40k).
OWN_BUCKET_OVER = 1.25


def bucket_name(tokens: int) -> str:
    """512 -> '512', 8192 -> '8k', 40960 -> '40k' (1k = 1024 tokens)."""
    return f"{tokens // 1024}k" if tokens >= 1024 and tokens % 1024 == 0 else str(tokens)


def bucket_tokens(name: str) -> int:
    """The nominal length a bucket name stands for: '8k' -> 8192, '512' -> 512."""
    digits = name.lower().removesuffix("k")
    if not digits.isdigit():
        raise ValueError(f"bucket {name!r} is not a length ('512', '8k')")
    return int(digits) * (1024 if name.lower().endswith("k") else 1)


def nominal_lengths(max_model_len: int, shortest: int = SHORTEST) -> list[int]:
    """512, 1024, ... while the doubling fits, plus `max_model_len` itself when it is well past
    the last doubling (a model served at 40960 gets 32k and 40k)."""
    if max_model_len < shortest:
        raise ValueError(f"max_model_len {max_model_len} is below the shortest bucket ({shortest} "
                         "tokens)")
    lengths = [shortest]
    while lengths[-1] * 2 <= max_model_len:
        lengths.append(lengths[-1] * 2)
    if max_model_len >= OWN_BUCKET_OVER * lengths[-1]:
        lengths.append(max_model_len)
    return lengths


def bucket_for(nominal: int, answer_tokens: int = ANSWER_TOKENS,
               template_tokens: int = TEMPLATE_MARGIN_TOKENS) -> Bucket:
    """The prompt-token bounds of one bucket: at most its nominal length less the chat template
    (at least the contracts' margin) and the answer budget, so the whole request fits a context
    of that length; at least an eighth of the nominal length below that."""
    template_tokens = max(template_tokens, TEMPLATE_MARGIN_TOKENS)
    high = nominal - template_tokens - answer_tokens
    low = high - nominal // 8
    if low <= 0:
        raise ValueError(f"bucket {bucket_name(nominal)}: no room for a prompt after the "
                         f"{template_tokens}-token chat template and {answer_tokens} answer tokens")
    return Bucket(bucket_name(nominal), low, high)


def buckets_for(max_model_len: int, answer_tokens: int = ANSWER_TOKENS,
                shortest: int = SHORTEST,
                template_tokens: int = TEMPLATE_MARGIN_TOKENS) -> list[Bucket]:
    """Every bucket a model served at `max_model_len` can answer in, shortest first."""
    return [bucket_for(n, answer_tokens, template_tokens)
            for n in nominal_lengths(max_model_len, shortest)]
