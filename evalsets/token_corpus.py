"""The scoring corpus for KL, top-1 and paired perplexity: token sequences every stage scores.

Built once, from the baseline's quality folder after its eval sets ran: each item's prompt and
the baseline's own greedy answer, rendered with the checkpoint's chat template (as the server
rendered them), plus the prose texts of `evalsets/corpus/`. Stored as token ids in the baseline's
folder (`scoring_corpus.json`) and copied into every later stage's folder, so all stages score
exactly the same tokens (prompt logprobs, evalsets.perplexity).

Scored positions (spans): every answer token and the turn's closing end-of-sequence token (the
stop decision); the prompt's own tokens after the template's fixed header (the system prompt
repeats identically in every item and is skipped); prose from its second token. The answers
alone are ~7k tokens in the demo configuration, so the prompts (in-distribution text the eval
really sends) and the long-context items up to `MAX_SEQUENCE_TOKENS` carry the corpus past 20k
tokens; longer items are left out and listed in `skipped`: their context costs ~2 s of prompt
logprobs per 1k tokens on a 2-core CPU for a ~10-token answer. The gate policy's
`divergence.corpus_tokens` bounds the whole (prompt logprobs cost ~1 ms a token there, whatever
the sets' sizes): each set gives its first items within an equal share (within_budget).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable
from pathlib import Path

from pydantic import BaseModel, Field

from evalsets.multiturn import expand_messages
from infra.errors import MeasurementError

log = logging.getLogger(__name__)

CORPUS_FILE = "scoring_corpus.json"
PROSE_DIR = Path(__file__).resolve().parent / "corpus"
MAX_SEQUENCE_TOKENS = 1280


class Span(BaseModel):
    """Positions [start, end) of a sequence that are scored; position p scores token p."""

    name: str
    start: int = Field(ge=1, description="Position 0 has no logprob: nothing precedes it.")
    end: int


class ScoredSequence(BaseModel):
    name: str
    token_ids: list[int]
    spans: list[Span]

    @property
    def tokens(self) -> int:
        """Scored positions."""
        return sum(span.end - span.start for span in self.spans)


class ScoringCorpus(BaseModel):
    source: str = Field(description="Where it was built from (the baseline's quality folder).")
    chat_template: bool
    sequences: list[ScoredSequence]
    skipped: list[str] = Field(default_factory=list, description="Items left out, with why.")

    @property
    def tokens(self) -> int:
        """Scored positions."""
        return sum(sequence.tokens for sequence in self.sequences)

    def save(self, folder: Path) -> Path:
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / CORPUS_FILE
        path.write_text(self.model_dump_json())
        return path

    @classmethod
    def read(cls, folder: Path) -> ScoringCorpus | None:
        path = folder / CORPUS_FILE
        if not path.is_file():
            return None
        try:
            return cls.model_validate_json(path.read_text())
        except ValueError as exc:
            raise MeasurementError(f"scoring corpus {path} is unreadable: {exc}") from exc


def _messages(argument: object) -> list[dict] | str:
    """lm-eval's logged context: a JSON chat (a string, or its JsonChatStr as a 1-list) or text."""
    if isinstance(argument, list | tuple) and argument:
        argument = argument[0]
    text = str(argument)
    try:
        chat = json.loads(text)
    except ValueError:
        return text
    if isinstance(chat, list) and all(isinstance(m, dict) and "role" in m for m in chat):
        return expand_messages(chat)  # an encoded dialogue: the turns the server saw
    return text


def logged_items(samples_file: Path) -> Iterable[tuple[str, list[dict] | str, str]]:
    """(item id, prompt messages or text, raw response) from an lm-eval samples file."""
    with samples_file.open() as lines:
        for line in lines:
            sample = json.loads(line)
            arguments = sample.get("arguments")
            first = (next(iter(arguments.values()))["arg_0"] if isinstance(arguments, dict)
                     else arguments[0][0])
            response = sample.get("resps") or sample.get("filtered_resps") or [""]
            while isinstance(response, list | tuple):
                response = response[0] if response else ""
            yield str(sample["doc"]["id"]), _messages(first), str(response)


class Renderer:
    """Turns (prompt, answer) into token ids and spans with one tokenizer, as the server would."""

    def __init__(self, tokenizer, chat_template: bool) -> None:
        if chat_template and getattr(tokenizer, "chat_template", "") is None:
            # validate refuses such a baseline (infra.checkpoint.check_has_chat_template)
            where = getattr(tokenizer, "name_or_path", "") or "the baseline's tokenizer"
            raise MeasurementError(f"scoring corpus: {where} has no chat template to render the "
                                   "chat prompts with; add one, or set chat_template: false")
        self.tokenizer = tokenizer
        self.chat = chat_template
        self.header = self._header() if chat_template else 0

    def encode(self, text: str, special: bool = False) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=special)["input_ids"])

    def _render(self, messages: list[dict], generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(
            messages, add_generation_prompt=generation_prompt, tokenize=False)

    def _header(self) -> int:
        """Tokens before the user's text: what two different one-word prompts share."""
        a = self.encode(self._render([{"role": "user", "content": "apple"}], True))
        b = self.encode(self._render([{"role": "user", "content": "zebra"}], True))
        return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), 1)

    def item(self, name: str, prompt: list[dict] | str, answer: str) -> ScoredSequence:
        if self.chat:
            messages = prompt if isinstance(prompt, list) else [{"role": "user", "content": prompt}]
            prefix = self.encode(self._render(messages, True))
            full = self.encode(self._render([*messages, {"role": "assistant", "content": answer}],
                                            False))
            if full[:len(prefix)] != prefix:
                raise MeasurementError(f"scoring corpus: {name}: the answer changes the prompt's "
                                       f"tokens (chat template boundary)")
            eos = self.tokenizer.eos_token_id
            end = next((i + 1 for i in range(len(prefix), len(full)) if full[i] == eos), len(full))
            full, prompt_start = full[:end], max(1, self.header)
        else:
            text = prompt if isinstance(prompt, str) else "\n".join(m["content"] for m in prompt)
            prefix = self.encode(text, special=True)
            full, prompt_start = prefix + self.encode(answer), 1
        spans = [Span(name=f"{name}/prompt", start=prompt_start, end=len(prefix)),
                 Span(name=f"{name}/answer", start=len(prefix), end=len(full))]
        return ScoredSequence(name=name, token_ids=full,
                              spans=[s for s in spans if s.end > s.start])

    def prose(self, name: str, text: str) -> ScoredSequence:
        ids = self.encode(text, special=True)
        return ScoredSequence(name=name, token_ids=ids, spans=[Span(name=name, start=1,
                                                                      end=len(ids))])


def load_tokenizer(tokenizer_dir: Path):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(tokenizer_dir), local_files_only=True)
    except (OSError, ValueError) as exc:
        raise MeasurementError(f"scoring corpus: no tokenizer in {tokenizer_dir}: {exc}") from exc


def build_corpus(
    quality_dir: Path,
    set_names: list[str],
    tokenizer_or_dir: Path | object,
    chat_template: bool = True,
    prose_dir: Path | None = None,
    max_sequence_tokens: int = MAX_SEQUENCE_TOKENS,
    samples_file: Callable[[Path, str], Path] | None = None,
    max_tokens: int | None = None,
) -> ScoringCorpus:
    """The baseline's answers to each set's items (from `quality_dir/<set>/`; a sampled set's
    first sample, `<set>-s0/`) plus the prose (`prose_dir`, default evalsets/corpus/);
    sequences over `max_sequence_tokens` are skipped. `max_tokens`: the most scored tokens
    (within_budget)."""
    from evalsets.results import SAMPLES_FILE, sample_folder

    def answers(folder: Path, name: str) -> Path:
        """A greedy set's lm-eval samples, else a sampled set's first sample's."""
        greedy = folder / name / SAMPLES_FILE
        first = sample_folder(folder / name, 0) / SAMPLES_FILE
        return first if not greedy.is_file() and first.is_file() else greedy

    tokenizer = (load_tokenizer(tokenizer_or_dir) if isinstance(tokenizer_or_dir, Path)
                 else tokenizer_or_dir)
    render = Renderer(tokenizer, chat_template)
    where = samples_file or answers
    per_set: dict[str, list[ScoredSequence]] = {}
    skipped = []
    for set_name in set_names:
        path = where(quality_dir, set_name)
        if not path.is_file():
            raise MeasurementError(f"scoring corpus: no lm-eval samples for {set_name!r} at {path}")
        kept = per_set.setdefault(set_name, [])
        for item_id, prompt, answer in logged_items(path):
            sequence = render.item(f"{set_name}/{item_id}", prompt, answer)
            if len(sequence.token_ids) > max_sequence_tokens:
                skipped.append(f"{sequence.name}: {len(sequence.token_ids)} tokens > "
                               f"{max_sequence_tokens}")
                continue
            kept.append(sequence)
    prose = [render.prose(f"prose/{path.stem}", path.read_text())
             for path in sorted((prose_dir or PROSE_DIR).glob("*.txt"))]
    if max_tokens is not None:
        per_set, over = within_budget(per_set, max_tokens - sum(s.tokens for s in prose))
        skipped += [f"{name}: {count} items over the corpus budget of {max_tokens:,} scored "
                    "tokens" for name, count in over.items() if count]
    sequences = [sequence for kept in per_set.values() for sequence in kept] + prose
    corpus = ScoringCorpus(source=str(quality_dir), chat_template=chat_template,
                           sequences=sequences, skipped=skipped)
    if corpus.tokens == 0:
        raise MeasurementError(f"scoring corpus from {quality_dir} has no tokens to score")
    log.info("scoring corpus: %d sequences, %d scored tokens, %d items skipped (longer than %d "
             "tokens, or over a budget of %s)", len(sequences), corpus.tokens, len(skipped),
             max_sequence_tokens, f"{max_tokens:,}" if max_tokens is not None else "none")
    return corpus


def within_budget(per_set: dict[str, list[ScoredSequence]], budget: int
                  ) -> tuple[dict[str, list[ScoredSequence]], dict[str, int]]:
    """Each set's first items within an equal share of `budget` scored tokens; a set that needs
    less than its share leaves the rest to the others (water-filling, smallest set first), so
    every set is in the corpus and none crowds the others out. (kept per set, items left out)"""
    need = {name: sum(s.tokens for s in kept) for name, kept in per_set.items()}
    left, shares = max(0, budget), {}
    for count, name in enumerate(sorted(need, key=need.__getitem__)):
        shares[name] = min(need[name], left // (len(need) - count))
        left -= shares[name]
    kept, over = {}, {}
    for name, sequences in per_set.items():
        total, prefix = 0, []
        for sequence in sequences:
            if total + sequence.tokens > shares[name]:
                break
            total += sequence.tokens
            prefix.append(sequence)
        kept[name], over[name] = prefix, len(sequences) - len(prefix)
    return kept, over
