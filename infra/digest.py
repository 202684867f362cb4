"""Content digests: what a checkpoint, a data folder or this host is, as a stable sha256.

Hashing a checkpoint's weights reads every byte (seconds per GiB), so each file's digest is kept
in a small JSON file keyed by absolute path, size and modification time: a file that did not
change is not read again.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import subprocess
from pathlib import Path

from infra.checkpoint import WEIGHT_SUFFIXES

CHUNK = 1 << 20
# Files besides the weights that change what a checkpoint serves.
CHECKPOINT_FILES = ("config.json", "generation_config.json", "tokenizer.json",
                    "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
                    "quantization_config.json", "recipe.yaml")


# A dequantized twin's config.json key (infra/make_candidates.py) and its fields that only name.
EMULATED_KEY = "quantgate_emulated"
TWIN_NAMES = ("format", "source", "note")


def default_store() -> Path:
    root = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(root) / "quantgate" / "file-digests.json"


def file_digest(path: Path, store: Path | None = None) -> str:
    """sha256 of a file's bytes, remembered by (path, size, mtime)."""
    store = store or default_store()
    path = path.resolve()
    stat = path.stat()
    key = f"{path}|{stat.st_size}|{stat.st_mtime_ns}"
    known = _read(store)
    if key in known:
        return known[key]
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(CHUNK):
            digest.update(chunk)
    known = _read(store)  # another process may have added entries meanwhile
    known[key] = digest.hexdigest()
    store.parent.mkdir(parents=True, exist_ok=True)
    scratch = store.with_name(f"{store.name}.{os.getpid()}")
    scratch.write_text(json.dumps(known, indent=0, sort_keys=True))
    os.replace(scratch, store)
    return known[key]


def _read(store: Path) -> dict[str, str]:
    try:
        return json.loads(store.read_text())
    except (OSError, ValueError):
        return {}


def checkpoint_digest(checkpoint: Path, store: Path | None = None) -> str:
    """What is served from a checkpoint folder: its weight files and the files that configure
    them, by name and content (not by where the folder lies, nor what a dequantized twin says it
    was named: `config_digest`)."""
    files = sorted(p for p in checkpoint.iterdir()
                   if p.suffix in WEIGHT_SUFFIXES or p.name in CHECKPOINT_FILES)
    return _combine({p.name: config_digest(p) if p.name == "config.json" else file_digest(p, store)
                     for p in files if p.is_file()})


def config_digest(path: Path) -> str:
    """A config.json's content, less a dequantized twin's names for itself and its source
    (make_candidates.py's `format`, `source` and `note` under quantgate_emulated): two twins of
    the same weights and quantization_config serve the same, whatever they were called (a
    repair built as int8/channel is the W8A16 twin byte for byte)."""
    data = path.read_bytes()
    try:
        config = json.loads(data)
    except ValueError:
        return hashlib.sha256(data).hexdigest()
    emulated = config.get(EMULATED_KEY) if isinstance(config, dict) else None
    if not isinstance(emulated, dict):
        return hashlib.sha256(data).hexdigest()
    config[EMULATED_KEY] = {k: v for k, v in emulated.items() if k not in TWIN_NAMES}
    return hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()


def folder_digest(folder: Path, suffixes: tuple[str, ...] = ()) -> str:
    """Every file under a folder (optionally only some suffixes), by relative path and content;
    small files only: read every time."""
    files = sorted(p for p in folder.rglob("*") if p.is_file() and "__pycache__" not in p.parts
                   and (not suffixes or p.suffix in suffixes))
    return _combine({str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
                     for p in files})


def _combine(parts: dict[str, str]) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def hardware(device: str) -> dict[str, str]:
    """What the timings depend on: the CPU model and flags, or the GPU model."""
    facts = {"machine": platform.machine(), "cpus": str(os.cpu_count())}
    if device == "cuda":
        try:
            gpus = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total",
                                   "--format=csv,noheader"], capture_output=True, text=True,
                                  timeout=30).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            gpus = "unknown"
        return facts | {"gpus": gpus}
    model, flags = "unknown", ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            name, _, value = line.partition(":")
            if name.strip() == "model name":
                model = value.strip()
            elif name.strip() == "flags" and not flags:
                flags = " ".join(sorted(value.split()))
    except OSError:
        pass
    return facts | {"cpu": model, "flags": hashlib.sha256(flags.encode()).hexdigest()[:16]}
