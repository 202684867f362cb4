"""Deterministic generator of the long-context family (RULER's task kinds) sized to a model.

Buckets double from 512 prompt tokens up to the served `max_model_len` (evalsets.context_ruler
.buckets); each item is grown unit by unit until its prompt, counted with the served model's own
tokenizer, lies inside its bucket, and the count is stored in `prompt_tokens` for the data
contract to check. Every item is seeded by (seed, bucket, index) alone, so a longer context or
more items per bucket keep the earlier items as they are.

`python -m tools.generators.context_ruler` rewrites the built-in set (the demo model, 8k);
`--max-model-len 131072 --tokenizer MODEL_DIR --out DIR` writes a complete set folder (task.yaml,
contract.yaml, grading.py, data.jsonl) for a spec entry `{name: ..., path: DIR}`.
"""

from __future__ import annotations

import argparse
import random
import shutil
from collections.abc import Callable
from pathlib import Path

import yaml

from evalsets.context_ruler.buckets import ANSWER_TOKENS, buckets_for
from evalsets.contracts import TEMPLATE_MARGIN_TOKENS
from evalsets.jsonl import write_jsonl
from evalsets.long_context.buckets import Bucket
from tools.generators import set_folder
from tools.generators.long_context import TOKENIZER_DIR
from tools.generators.ruler_kinds import KINDS, MAKERS, Plan

FOLDER = set_folder("context_ruler")
DEFAULT_SEED = 20260601
DEFAULT_PER_BUCKET = 20  # 4 of each kind: the gates' min_items per bucket
DEMO_MAX_MODEL_LEN = 8192  # SmolLM2-135M's max_position_embeddings
SET_FILES = ("task.yaml", "grading.py")


def served_tokenizer(tokenizer_dir: Path) -> tuple[Callable[[str], int], int]:
    """(token counter, tokens the chat template adds around one user turn) of the served
    model's own tokenizer, from local files only."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir), local_files_only=True)

    def count(text: str) -> int:
        return len(tokenizer(text, add_special_tokens=False)["input_ids"])

    if not getattr(tokenizer, "chat_template", None):
        return count, 0
    probe = "Hello."
    ids = tokenizer.apply_chat_template([{"role": "user", "content": probe}], tokenize=True,
                                        add_generation_prompt=True)
    ids = ids["input_ids"] if hasattr(ids, "keys") else ids
    return count, len(ids) - count(probe)


def render(context: str, question: str) -> str:
    """The prompt exactly as task.yaml's doc_to_text renders it (keep the two in step)."""
    return f"{context}\n\n{question}"


def fit(plan: Plan, target: int, count_tokens: Callable[[str], int]) -> tuple[str, int]:
    """(context, tokens) of the largest size whose prompt has at most `target` tokens."""
    seen: dict[int, int] = {}

    def tokens(size: int) -> int:
        if size not in seen:
            seen[size] = count_tokens(render(plan.build(size), plan.question))
        return seen[size]

    probe = 64
    per_unit = max(1.0, (tokens(probe) - tokens(0)) / probe)
    low = max(0, int((target - tokens(0)) / per_unit * 0.97))  # an estimate, then the tokenizer
    while low > 0 and tokens(low) > target:
        low //= 2
    step, high = max(1, low // 64), low + 1
    while tokens(high) <= target:
        low, high, step = high, high + step, step * 2
    while high - low > 1:  # tokens(low) <= target < tokens(high)
        middle = (low + high) // 2
        low, high = (middle, high) if tokens(middle) <= target else (low, middle)
    return plan.build(low), tokens(low)


def make_item(bucket: Bucket, index: int, seed: int,
              count_tokens: Callable[[str], int]) -> dict:
    """Item `index` of a bucket: its kind by turn, its content by (seed, bucket, index)."""
    item_id = f"cr-{bucket.name}-{index:03d}"
    rng = random.Random(f"{seed}:{item_id}")
    plan = MAKERS[KINDS[index % len(KINDS)]](rng, f"{seed}:{item_id}:filler")
    target = rng.randint(bucket.min_tokens + (bucket.max_tokens - bucket.min_tokens) // 2,
                         bucket.max_tokens)
    context, tokens = fit(plan, target, count_tokens)
    if not bucket.min_tokens <= tokens <= bucket.max_tokens:
        raise ValueError(f"{item_id}: {tokens} tokens outside bucket {bucket.name} "
                         f"[{bucket.min_tokens}, {bucket.max_tokens}]")
    return {"id": item_id, "bucket": bucket.name, "kind": plan.kind, "prompt_tokens": tokens,
            "context": context, "question": plan.question, "answer": ", ".join(plan.answers),
            "answers": list(plan.answers)}


def generate(count_tokens: Callable[[str], int], buckets: list[Bucket],
             per_bucket: int = DEFAULT_PER_BUCKET, seed: int = DEFAULT_SEED) -> list[dict]:
    """`per_bucket` items in every bucket, the kinds in turn.

    Items are interleaved across buckets (512, 1k, ..., 512, ...) and each round is one kind,
    so an eval-set `limit` of a multiple of five rounds keeps every bucket and kind balanced.
    """
    return [make_item(bucket, index, seed, count_tokens)
            for index in range(per_bucket) for bucket in buckets]


def contract_text(buckets: list[Bucket], tokenizer_dir: Path, max_model_len: int,
                  template_tokens: int = TEMPLATE_MARGIN_TOKENS) -> str:
    """The set's contract.yaml: fields, and the token bounds of each bucket."""
    contract = {
        "id": "id", "prompt": ["context", "question"], "reference": ["answer"], "group": "bucket",
        "lengths": {"field": "prompt_tokens",
                    "bounds": {b.name: [b.min_tokens, b.max_tokens] for b in buckets}},
    }
    return (f"# Data contract of the long-context family, written by tools.generators."
            f"context_ruler\n# for max_model_len {max_model_len}, prompt tokens counted with "
            f"{tokenizer_dir.name}'s tokenizer\n# (chat template excluded; {ANSWER_TOKENS} "
            f"answer tokens and {max(template_tokens, TEMPLATE_MARGIN_TOKENS)} for the template "
            "left free).\n"
            + yaml.safe_dump(contract, sort_keys=False, default_flow_style=None))


def write_set(folder: Path, max_model_len: int, count_tokens: Callable[[str], int],
              tokenizer_dir: Path, per_bucket: int = DEFAULT_PER_BUCKET,
              seed: int = DEFAULT_SEED,
              template_tokens: int = TEMPLATE_MARGIN_TOKENS) -> list[Bucket]:
    """A complete set folder for a model served at `max_model_len`: data.jsonl and
    contract.yaml, plus task.yaml and grading.py when the folder is not the built-in one.
    `template_tokens`: what the model's chat template adds (a longer one than the contracts'
    margin shortens every bucket's prompts by the difference)."""
    buckets = buckets_for(max_model_len, template_tokens=template_tokens)
    folder.mkdir(parents=True, exist_ok=True)
    if folder.resolve() != FOLDER:
        for name in SET_FILES:
            shutil.copyfile(FOLDER / name, folder / name)
    write_jsonl(folder / "data.jsonl", generate(count_tokens, buckets, per_bucket, seed))
    (folder / "contract.yaml").write_text(contract_text(buckets, tokenizer_dir, max_model_len,
                                                        template_tokens))
    return buckets


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-model-len", type=int, default=DEMO_MAX_MODEL_LEN,
                        help="the engine's served context (buckets double up to it)")
    parser.add_argument("--tokenizer", type=Path, default=TOKENIZER_DIR,
                        help="the served model's folder (its tokenizer counts the prompts)")
    parser.add_argument("--per-bucket", type=int, default=DEFAULT_PER_BUCKET)
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED)
    parser.add_argument("--out", type=Path, default=FOLDER, help="the set folder to write")
    args = parser.parse_args(argv)
    if not args.tokenizer.is_dir():
        raise SystemExit(f"context_ruler: --tokenizer {args.tokenizer}: no such folder (give the "
                         "served model's folder: its tokenizer counts the prompts)")
    try:
        count_tokens, template_tokens = served_tokenizer(args.tokenizer)
        buckets = write_set(args.out, args.max_model_len, count_tokens, args.tokenizer,
                            args.per_bucket, args.seed, template_tokens)
    except (ValueError, OSError) as exc:
        raise SystemExit(f"context_ruler: {exc}") from exc
    print(f"wrote {args.per_bucket} items per bucket ({', '.join(b.name for b in buckets)}) to "
          f"{args.out}")
    if args.out.resolve() != FOLDER:
        print(f"spec entry: {{name: context_ruler_{args.max_model_len}, path: {args.out}}}")


if __name__ == "__main__":
    main()
