"""Reading a checkpoint folder: is it a model, how big are its weights, what quantization it carries."""

from __future__ import annotations

import hashlib
import importlib.util
import json
from pathlib import Path
from typing import Any

from infra.errors import CheckpointError
from infra.jsonfile import check_size, read_json, shown_value
from infra.paths import follow, path_problem, shown
from infra.quant_config import quantization_problem
from infra.safetensors_check import check_safetensors
from infra.tokenizer_probe import tokenizer_problem

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".gguf")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json")  # fast, sentencepiece, BPE
TEMPLATE_FILE = "chat_template.jinja"
# sha256 of tokenizer.json contents that loaded: the stages of a run mostly ship the same one.
_TOKENIZERS_LOADED: set[str] = set()


def read_config(checkpoint: Path) -> dict[str, Any]:
    """The checkpoint's config.json, or a CheckpointError naming what is wrong."""
    problem = path_problem(checkpoint)
    if problem:
        raise CheckpointError(f"checkpoint {shown(checkpoint)} {problem}")
    if not checkpoint.exists():
        if checkpoint.is_symlink():
            raise CheckpointError(f"checkpoint {checkpoint} is a symlink that leads to no folder (a "
                                  "loop, or its target is gone); point it at the checkpoint folder")
        raise CheckpointError(f"checkpoint {checkpoint} does not exist")
    if not checkpoint.is_dir():
        raise CheckpointError(f"checkpoint {checkpoint} is not a directory")
    config_path = checkpoint / "config.json"
    if not config_path.is_file():
        _, problem = follow(config_path) if config_path.is_symlink() else (None, None)
        if problem:
            raise CheckpointError(f"{config_path} {problem}; copy the model's config.json into "
                                  "the checkpoint")
        raise CheckpointError(f"checkpoint {checkpoint} is not a model: no config.json")
    config = read_json(config_path)
    if not isinstance(config, dict):
        raise CheckpointError(f"{config_path} is not a model config: a JSON "
                              f"{type(config).__name__}, not an object")
    if "model_type" not in config and "architectures" not in config:
        raise CheckpointError(f"{config_path} is not a model config: no model_type or architectures")
    if not any(path.suffix in WEIGHT_SUFFIXES for path in checkpoint.iterdir()):
        raise CheckpointError(f"checkpoint {checkpoint} is not a model: no weight files")
    problem = config_problem(config) or quantization_problem(config)
    if problem:
        raise CheckpointError(f"{config_path}: {problem}")
    return config


# config.json keys the engine sizes the model by: a positive integer each (a list of them, one per
# layer, in a few architectures), or null for the architecture's default; MoE expert counts may be 0.
SIZE_KEYS = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
             "num_key_value_heads", "head_dim", "vocab_size", "max_position_embeddings")
COUNT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts",
              "num_experts_per_tok")


def _is_size(value: Any, least: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= least


def config_problem(config: dict[str, Any], field: str = "") -> str | None:
    """What an engine would trip over in config.json's model keys (a size written as a string,
    architectures as one name), as `field value; fix`, or None. `field`: the keys' prefix."""
    for key, least in [*((k, 1) for k in SIZE_KEYS), *((k, 0) for k in COUNT_KEYS)]:
        value = config.get(key)
        if value is None or _is_size(value, least) or (
                isinstance(value, list) and value and all(_is_size(v, least) for v in value)):
            continue
        hint = (f": write {value.strip()}" if isinstance(value, str) and value.strip().isdigit()
                else f"; write {'a positive' if least else 'a'} whole number")
        return f"{field}{key} is {shown_value(value)}{hint}"
    for key, kind, what in (("model_type", str, 'the model type, e.g. "llama"'),
                            ("torch_dtype", str, 'a dtype name, e.g. "bfloat16"'),
                            ("dtype", str, 'a dtype name, e.g. "bfloat16"'),
                            ("tie_word_embeddings", bool, "true or false")):
        value = config.get(key)
        if value is not None and not isinstance(value, kind):
            return f"{field}{key} is {shown_value(value)}; write {what}"
    names = config.get("architectures")
    if names is not None and not (isinstance(names, list)
                                  and all(isinstance(name, str) for name in names)):
        return (f"{field}architectures is {shown_value(names)}; write a list of class names, "
                'e.g. ["LlamaForCausalLM"]')
    text = config.get("text_config")
    if text is not None and not isinstance(text, dict):
        return (f"{field}text_config is {shown_value(text)}; write the language model's config "
                "object, or remove the key")
    return config_problem(text, f"{field}text_config.") if text is not None else None


def check_checkpoint(checkpoint: Path) -> None:
    """What the engine reads before it serves, checked without loading a weight: every weight
    file whole (safetensors headers against their files and their index) and a tokenizer that
    loads. A broken file fails here, not as an engine that will not start."""
    for path in sorted(checkpoint.iterdir()):
        if path.suffix in WEIGHT_SUFFIXES and path.is_file() and path.stat().st_size == 0:
            raise CheckpointError(f"{path} is empty (0 bytes); copy the checkpoint's weights again")
    check_safetensors(checkpoint, read_config(checkpoint))
    check_tokenizer(checkpoint)


def _check_tokenizer_json(path: Path) -> None:
    check_size(path, "copy the base model's tokenizer.json into the checkpoint")
    data = path.read_bytes()
    if not data.strip():
        raise CheckpointError(f"{path} is empty ({len(data)} bytes); copy the base model's "
                              "tokenizer.json into the checkpoint")
    digest = hashlib.sha256(data).hexdigest()
    if digest in _TOKENIZERS_LOADED:
        return
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise CheckpointError(f"{path} is not UTF-8 text: {err.reason}; copy the base "
                              "model's tokenizer.json into the checkpoint") from err
    if importlib.util.find_spec("tokenizers") is None:
        # The engine brings the library; without it, check what a loader reads first.
        tokenizer = read_json(path)
        if not isinstance(tokenizer, dict) or "model" not in tokenizer:
            raise CheckpointError(f"{path} is not a tokenizer: no top-level \"model\"; copy the "
                                  "base model's tokenizer.json into the checkpoint")
    else:
        problem = tokenizer_problem(path)
        if problem:
            raise CheckpointError(f"{path} {problem}; copy the base model's tokenizer.json into "
                                  "the checkpoint")
    _TOKENIZERS_LOADED.add(digest)


def check_tokenizer(checkpoint: Path) -> None:
    """The engine loads the tokenizer from the checkpoint: it must ship one, and it must load."""
    if not any((checkpoint / name).is_file() for name in TOKENIZER_FILES):
        raise CheckpointError(f"checkpoint {checkpoint} has no tokenizer (none of "
                              f"{', '.join(TOKENIZER_FILES)}); copy the base model's tokenizer "
                              "files into it")
    if (checkpoint / "tokenizer.json").is_file():
        _check_tokenizer_json(checkpoint / "tokenizer.json")
    elif (checkpoint / "vocab.json").is_file() and not isinstance(
            read_json(checkpoint / "vocab.json"), dict):
        raise CheckpointError(f"{checkpoint / 'vocab.json'} is not a vocabulary (a JSON object of "
                              "token: id); copy the base model's vocab.json into the checkpoint")
    elif (checkpoint / "tokenizer.model").is_file() and \
            (checkpoint / "tokenizer.model").stat().st_size == 0:
        raise CheckpointError(f"{checkpoint / 'tokenizer.model'} is empty (0 bytes); copy the base "
                              "model's tokenizer.model into the checkpoint")
    chat_template(checkpoint)  # tokenizer_config.json and the template must read


def chat_template(checkpoint: Path) -> tuple[str | None, str]:
    """The chat template the server applies, and where it lies: chat_template.jinja, else
    tokenizer_config.json's `chat_template` (the order transformers reads them in, and the text
    gates/comparability hashes: a list of named templates as sorted JSON)."""
    jinja = checkpoint / TEMPLATE_FILE
    config_path = checkpoint / "tokenizer_config.json"
    config = read_json(config_path) if config_path.is_file() else {}
    if not isinstance(config, dict):
        raise CheckpointError(f"{config_path} is a JSON {type(config).__name__}, not an object; "
                              "copy the base model's tokenizer_config.json into the checkpoint")
    if jinja.is_file():
        try:  # as its bytes read, line ends and all: the comparability gate hashes the bytes
            return jinja.read_bytes().decode("utf-8"), str(jinja)
        except UnicodeDecodeError as err:
            raise CheckpointError(f"{jinja} is not UTF-8 text: {err.reason}; copy the base "
                                  f"model's {TEMPLATE_FILE} into the checkpoint") from err
    template = config.get("chat_template")
    where = f"{config_path} chat_template"
    if template is None:
        return None, f"none ({checkpoint} has no {TEMPLATE_FILE}, no tokenizer_config.json chat_template)"
    if isinstance(template, str):
        return template, where
    if isinstance(template, list) and all(isinstance(t, dict) and isinstance(t.get("name"), str)
                                          and isinstance(t.get("template"), str) for t in template):
        return json.dumps(template, sort_keys=True), where
    raise CheckpointError(f"{where} is {json.dumps(template)[:60]}; write the template text, or a "
                          'list of {"name": ..., "template": ...}')


def check_has_chat_template(checkpoint: Path, role: str = "baseline") -> None:
    """The spec asks the chat endpoint (chat_template: true): vLLM answers it only with a
    template (transformers dropped the default one), and the scoring corpus renders with it.
    A base model without one is asked plain completions; a template is not guessed for it."""
    if chat_template(checkpoint)[0] is not None:
        return
    raise CheckpointError(
        f"{role} checkpoint {checkpoint} has no chat template (no {TEMPLATE_FILE}, no "
        "chat_template in tokenizer_config.json) but the spec asks the chat endpoint "
        "(chat_template: true, the default), which vLLM refuses without one: add the model's "
        f"template as {checkpoint / TEMPLATE_FILE}, or set chat_template: false in the spec to "
        "ask plain completions (a base model)")


def check_same_chat_template(stage: str, checkpoint: Path, baseline: Path) -> None:
    """A stage must be asked with the baseline's chat template: the comparability gate fails a
    stage whose template differs, but only after both have been measured."""
    if checkpoint == baseline:
        return
    (mine, mine_at), (theirs, theirs_at) = chat_template(checkpoint), chat_template(baseline)
    if mine == theirs:
        return
    detail = ""
    if mine is not None and theirs is not None:
        # Line ends kept: a template that differs only in them (CRLF) differs for the gate too.
        lines, base_lines = mine.splitlines(keepends=True), theirs.splitlines(keepends=True)
        line = next((i for i, (a, b) in enumerate(zip(lines, base_lines, strict=False)) if a != b),
                    min(len(lines), len(base_lines)))
        detail = f" (first difference at line {line + 1})"
    if theirs is None:
        fix = f"remove the stage's template ({mine_at}), or give the baseline the same one"
    elif theirs_at.endswith(TEMPLATE_FILE):
        fix = f"copy {theirs_at} into {checkpoint}"
    else:
        fix = (f"copy the baseline's chat_template into {checkpoint / 'tokenizer_config.json'}"
               + (f" and remove {checkpoint / TEMPLATE_FILE}" if mine_at.endswith(TEMPLATE_FILE)
                  else ""))
    raise CheckpointError(f"stage {stage!r}: chat template {mine_at} ({template_digest(mine)}) "
                          f"differs from the baseline's {theirs_at} ({template_digest(theirs)})"
                          f"{detail}; the comparability gate would fail the stage after both "
                          f"ran, and no stage option accepts another template: {fix}")


def template_digest(template: str | None) -> str:
    """`sha256 <16 hex>` of a chat template's text, the digest the comparability gate reports."""
    if template is None:
        return "no template"
    return f"sha256 {hashlib.sha256(template.encode()).hexdigest()[:16]}"


def _file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def check_same_tokenizer(stage: str, checkpoint: Path, baseline: Path) -> None:
    """A stage must ship the baseline's tokenizer files, byte for byte (what the comparability
    gate hashes): else its items are tokenized differently and the gate fails it after both ran."""
    if checkpoint.resolve() == baseline.resolve():
        return
    for name in TOKENIZER_FILES:
        mine, theirs = checkpoint / name, baseline / name
        if not mine.is_file() and not theirs.is_file():
            continue
        if not theirs.is_file():
            raise CheckpointError(f"stage {stage!r}: {mine} has no counterpart in the baseline "
                                  f"({theirs} is missing); the stage would be tokenized "
                                  f"differently: remove {mine} or give the stage the baseline's "
                                  "tokenizer files")
        if not mine.is_file():
            raise CheckpointError(f"stage {stage!r}: {mine} is missing but the baseline ships "
                                  f"{theirs}; the stage would be tokenized differently: copy "
                                  f"{theirs} into {checkpoint}")
        a, b = _file_digest(mine), _file_digest(theirs)
        if a != b:
            raise CheckpointError(f"stage {stage!r}: tokenizer file {mine} (sha256 {a[:12]}) "
                                  f"differs from the baseline's {theirs} (sha256 {b[:12]}); the "
                                  "comparability gate would fail the stage after both ran: copy "
                                  f"{theirs} into {checkpoint}")


SHAPE_KEYS = ("model_type", "architectures", "hidden_size", "intermediate_size",
              "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
              "vocab_size", "tie_word_embeddings", "num_experts", "num_local_experts",
              "text_config", "max_position_embeddings", "torch_dtype", "dtype")


def model_shape(config: dict[str, Any]) -> dict[str, Any]:
    """The keys of a config.json that describe the model's shape (not its quantization)."""
    return {key: config[key] for key in SHAPE_KEYS if key in config}


def weight_bytes(checkpoint: Path) -> int:
    """Bytes of weight files on disk: a fair weight-size figure across formats."""
    return sum(p.stat().st_size for p in checkpoint.iterdir() if p.suffix in WEIGHT_SUFFIXES)
