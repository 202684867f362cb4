"""Safetensors headers: what the safetensors library refuses to open is refused from the header alone."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import save_file

from infra.errors import CheckpointError
from infra.safetensors_check import check_safetensors, tensor_names


def raw(header: dict, data: int, extra: bytes = b"") -> bytes:
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + b"\0" * data + extra


W = {"dtype": "BF16", "shape": [2, 2], "data_offsets": [0, 8]}


def test_what_the_library_writes_is_read_back(tmp_path):
    path = tmp_path / "model.safetensors"
    save_file({"a": np.zeros((3, 5), np.float32), "b": np.ones(7, np.int8),
               "c": np.zeros((0, 4), np.float16)}, str(path), metadata={"format": "pt"})
    assert tensor_names(path) == {"a", "b", "c"}


@pytest.mark.parametrize("data, expected", [
    (raw({"w": W}, 8, b"xx"), "bytes but its header accounts for"),
    (raw({"w": W | {"data_offsets": [4, 12]}}, 12), "starts at data byte 4, not 0"),
    (raw({"w": W | {"shape": [2, 3]}}, 8), "BF16 [2, 3] takes 12 bytes but its data_offsets"),
    (raw({"__metadata__": {"format": 1}, "w": W}, 8), "__metadata__ must map names to strings"),
    (raw({"w": W | {"dtype": "BF61"}}, 8), "dtype 'BF61' is not one safetensors reads; did you "
     "mean 'BF16'"),
    (raw({"w": W}, 4), "its data ends at byte"),
    (raw({"w": W | {"data_offsets": [8, 0]}}, 8), "is not a [begin, end] byte range"),
    (raw({"w": W | {"shape": [-1, 2]}}, 8), "is not a list of sizes"),
    (raw([W], 8), "is a JSON list, not an object of tensors"),
    (b"\x05\0\0\0", "shorter than the 8-byte header length"),
])
def test_what_the_library_refuses_is_refused(tmp_path, data, expected):
    path = tmp_path / "model.safetensors"
    path.write_bytes(data)
    with pytest.raises(Exception):  # noqa: B017 - the library raises its own SafetensorError
        with safe_open(str(path), "np"):
            pass
    with pytest.raises(CheckpointError, match="model.safetensors") as err:
        tensor_names(path)
    assert expected in str(err.value)


def test_only_the_header_is_read(tmp_path, monkeypatch):
    path = tmp_path / "model.safetensors"
    path.write_bytes(raw({"w": {"dtype": "F32", "shape": [1 << 18], "data_offsets": [0, 1 << 20]}},
                         1 << 20))
    reads = []
    real_open = Path.open

    def spy(self, *args, **kwargs):
        handle = real_open(self, *args, **kwargs)
        real_read = handle.read
        handle.read = lambda n=-1: reads.append(n) or real_read(n)
        return handle

    monkeypatch.setattr(Path, "open", spy)
    assert tensor_names(path) == {"w"}
    assert -1 not in reads and sum(reads) < 200


def index(folder: Path, weight_map: dict) -> None:
    (folder / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": 16}, "weight_map": weight_map}))


def test_a_sharded_checkpoint_is_checked_through_its_index(tmp_path):
    (tmp_path / "model-00001-of-00002.safetensors").write_bytes(raw({"a": W}, 8))
    (tmp_path / "model-00002-of-00002.safetensors").write_bytes(raw({"b": W}, 8))
    index(tmp_path, {"a": "model-00001-of-00002.safetensors",
                     "b": "model-00002-of-00002.safetensors"})
    check_safetensors(tmp_path)
    index(tmp_path, {"a": "model-00001-of-00002.safetensors",
                     "b": "model-00001-of-00002.safetensors"})
    with pytest.raises(CheckpointError, match="maps 'b' to model-00001-of-00002.safetensors, "
                       "whose header does not list it"):
        check_safetensors(tmp_path)


@pytest.mark.parametrize("text, expected", [
    ('{"weight_map": {}}', "weight_map is {}, not an object mapping each weight to its file"),
    ('{"weight_map": ["a"]}', "weight_map is ['a']"),
    ("", "is empty (0 bytes)"),
    ("{", "is not valid JSON"),
])
def test_a_broken_index_is_refused(tmp_path, text, expected):
    (tmp_path / "model.safetensors").write_bytes(raw({"a": W}, 8))
    (tmp_path / "model.safetensors.index.json").write_text(text)
    with pytest.raises(CheckpointError, match="model.safetensors.index.json") as err:
        check_safetensors(tmp_path)
    assert expected in str(err.value)


def test_every_file_is_checked_without_an_index(tmp_path):
    (tmp_path / "a.safetensors").write_bytes(raw({"a": W}, 8))
    (tmp_path / "b.safetensors").write_bytes(raw({"b": W}, 4))
    with pytest.raises(CheckpointError, match="b.safetensors"):
        check_safetensors(tmp_path)

