"""The long-context length buckets, as declared in this set's contract.yaml."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from evalsets.contracts import Contract
from infra.yamlfile import load_model

CONTRACT_PATH = Path(__file__).with_name("contract.yaml")


@dataclass(frozen=True)
class Bucket:
    name: str
    min_tokens: int
    max_tokens: int


def load_buckets(path: Path = CONTRACT_PATH) -> list[Bucket]:
    """Buckets from shortest to longest."""
    lengths = load_model(path, Contract).lengths
    if lengths is None:
        raise ValueError(f"{path} declares no length bounds")
    buckets = [Bucket(name, low, high) for name, (low, high) in lengths.bounds.items()]
    return sorted(buckets, key=lambda b: b.max_tokens)

