"""The conversation set's generator: the shipped file is what it writes, byte for byte."""

from __future__ import annotations

from tools.generators import conversation as generate


def test_the_shipped_file_is_what_the_generator_writes(tmp_path):
    written = generate.write(tmp_path / "data.jsonl")
    assert written.read_bytes() == generate.DATA_PATH.read_bytes()
    assert generate.write(tmp_path / "again.jsonl").read_bytes() == written.read_bytes()
    other = generate.write(tmp_path / "other.jsonl", seed=7)
    assert other.read_bytes() != written.read_bytes()
