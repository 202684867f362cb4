"""Safetensors files checked as far as their headers: each file whole, and holding what its index maps.

The format: an 8-byte little-endian header length, a JSON header naming each tensor's dtype, shape
and byte range in the data that follows. The rules are the safetensors library's own (the one vLLM
loads with): ranges back to back from 0, each as long as its dtype and shape, ending at the end of
the file. Only headers are read, never the weights.
"""

from __future__ import annotations

import json
import math
import re
import struct
from pathlib import Path
from typing import Any

from infra.errors import CheckpointError, did_you_mean
from infra.jsonfile import parse_json, read_json, shown_value

INDEX = "model.safetensors.index.json"
MAX_HEADER_BYTES = 100_000_000  # the safetensors library's own limit
# Bits per element of each dtype the safetensors library reads.
DTYPE_BITS = {"BOOL": 8, "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6, "U8": 8, "I8": 8, "F8_E5M2": 8,
              "F8_E4M3": 8, "F8_E8M0": 8, "F8_E4M3FNUZ": 8, "F8_E5M2FNUZ": 8, "I16": 16, "U16": 16,
              "F16": 16, "BF16": 16, "I32": 32, "U32": 32, "F32": 32, "C64": 64, "F64": 64,
              "I64": 64, "U64": 64}
REMAKE = "copy the file again, or save the checkpoint again (a partial copy or an interrupted save)"


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _header(path: Path) -> tuple[dict[str, Any], int, int]:
    """(the parsed header, where the data starts, the file size)."""
    try:
        size = path.stat().st_size
        with path.open("rb") as handle:
            prefix = handle.read(8)
            if len(prefix) < 8:
                raise CheckpointError(f"{path} is {size} bytes, shorter than the 8-byte header length "
                                      f"every safetensors file starts with; {REMAKE}")
            (length,) = struct.unpack("<Q", prefix)
            if length == 0:
                raise CheckpointError(f"{path} is not a safetensors file: its header length field "
                                      "reads 0 (zeros where the header should be); " + REMAKE)
            if 8 + length > size or length > MAX_HEADER_BYTES:
                limit = (f"the {size}-byte file holds" if 8 + length > size
                         else f"safetensors allows ({MAX_HEADER_BYTES})")
                raise CheckpointError(f"{path} is not a whole safetensors file: its header length "
                                      f"field reads {length} bytes, more than {limit}; {REMAKE}")
            raw = handle.read(length)
    except OSError as err:
        raise CheckpointError(f"{path} cannot be read: {err.strerror or err}") from err
    header = parse_json(raw, f"{path} (safetensors header)")
    if not isinstance(header, dict):
        raise CheckpointError(f"{path} (safetensors header) is a JSON {type(header).__name__}, not "
                              f"an object of tensors; {REMAKE}")
    return header, 8 + length, size


def tensor_names(path: Path) -> set[str]:
    """The tensors a safetensors file holds, once its header has been checked against the file."""
    return set(tensor_shapes(path))


def tensor_shapes(path: Path) -> dict[str, tuple[str, list[int]]]:
    """{tensor: (dtype, shape)} of a safetensors file, once its header has been checked."""
    header, data_start, size = _header(path)
    metadata = header.pop("__metadata__", None)
    if metadata is not None and not (isinstance(metadata, dict)
                                     and all(isinstance(v, str) for v in metadata.values())):
        raise CheckpointError(f"{path} (safetensors header): __metadata__ must map names to strings, "
                              f"not {str(metadata)[:80]}; {REMAKE}")
    if not header:
        raise CheckpointError(f"{path} holds no tensors (its header lists none); {REMAKE}")
    spans = []
    for name, info in header.items():
        where = f"{path} (safetensors header) tensor {name!r}"
        if not isinstance(info, dict):
            raise CheckpointError(f"{where} is {str(info)[:60]}, not an object with dtype, shape and "
                                  f"data_offsets; {REMAKE}")
        dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
        if dtype not in DTYPE_BITS:
            raise CheckpointError(f"{where}: dtype {dtype!r} is not one safetensors reads; "
                                  f"{did_you_mean(str(dtype), tuple(DTYPE_BITS))}")
        if not (isinstance(shape, list) and all(_is_int(n) and n >= 0 for n in shape)):
            raise CheckpointError(f"{where}: shape {shape!r} is not a list of sizes; {REMAKE}")
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(map(_is_int, offsets))
                and 0 <= offsets[0] <= offsets[1]):
            raise CheckpointError(f"{where}: data_offsets {offsets!r} is not a [begin, end] byte "
                                  f"range; {REMAKE}")
        if data_start + offsets[1] > size:
            raise CheckpointError(f"{where}: its data ends at byte {data_start + offsets[1]}, past "
                                  f"the end of the {size}-byte file (truncated); {REMAKE}")
        if name.endswith(".weight") and 0 in shape:
            raise CheckpointError(f"{where}: shape {shape} holds no values (an empty weight); "
                                  f"{REMAKE}")
        bits = math.prod(shape) * DTYPE_BITS[dtype]
        if bits != 8 * (offsets[1] - offsets[0]):
            raise CheckpointError(f"{where}: {dtype} {shape} takes {bits / 8:g} bytes but its "
                                  f"data_offsets {offsets} span {offsets[1] - offsets[0]}; {REMAKE}")
        spans.append((offsets[0], offsets[1], name))
    end = 0
    for begin, stop, name in sorted(spans):
        if begin != end:
            raise CheckpointError(f"{path} (safetensors header) tensor {name!r} starts at data byte "
                                  f"{begin}, not {end} where the tensor before it ends; {REMAKE}")
        end = stop
    if end == 0:
        raise CheckpointError(f"{path} holds no weight data: its header lists {len(spans)} "
                              f"tensor{'s' if len(spans) > 1 else ''}, every one empty; {REMAKE}")
    if data_start + end != size:
        raise CheckpointError(f"{path} is {size} bytes but its header accounts for "
                              f"{data_start + end}; {REMAKE}")
    return {name: (info["dtype"], info["shape"]) for name, info in header.items()}


def check_safetensors(checkpoint: Path, config: dict[str, Any] | None = None) -> None:
    """Every safetensors file the engine will load is whole; with an index, every file it names
    exists and every weight it maps is in that file's header; with `config` (config.json), the
    shapes it fixes (embeddings, norms, layer count) are the weights' shapes."""
    index_path = checkpoint / INDEX
    shapes: dict[str, tuple[str, list[int], Path]] = {}
    if not index_path.exists():
        for path in sorted(checkpoint.glob("*.safetensors")):
            shapes |= {name: (*found, path) for name, found in tensor_shapes(path).items()}
        check_shapes(checkpoint, shapes, config)
        return
    index = read_json(index_path)
    if not isinstance(index, dict):
        raise CheckpointError(f"{index_path} is {shown_value(index)}, not an object with a "
                              "weight_map; save the checkpoint again")
    weight_map = index.get("weight_map")
    if not (isinstance(weight_map, dict) and weight_map):
        raise CheckpointError(f"{index_path}: weight_map is {str(weight_map)[:60]}, not an "
                              "object mapping each weight to its file; save the checkpoint again")
    by_file: dict[str, list[str]] = {}
    for weight, file in weight_map.items():
        problem = shard_name_problem(file)
        if problem:
            raise CheckpointError(f"{index_path}: weight_map[{json.dumps(weight)[:80]}] is "
                                  f"{shown_value(file)}, {problem}; save the checkpoint again")
        by_file.setdefault(file, []).append(weight)
    for file, weights in sorted(by_file.items()):
        path = checkpoint / file
        if not path.is_file():
            raise CheckpointError(f"{index_path}: weight_map maps {weights[0]!r}"
                                  f"{f' and {len(weights) - 1} more' if len(weights) > 1 else ''} "
                                  f"to {file}, which is not in {checkpoint}; copy the missing "
                                  "shard")
        found = tensor_shapes(path)
        missing = [w for w in weights if w not in found]
        if missing:
            raise CheckpointError(f"{index_path}: weight_map maps {missing[0]!r} to {file}, whose "
                                  f"header does not list it ({len(missing)} of {len(weights)} "
                                  "missing); the index belongs to other shards: copy the "
                                  "checkpoint again, index and shards together")
        shapes |= {name: (*info, path) for name, info in found.items()}
    check_shapes(checkpoint, shapes, config)


def shard_name_problem(file: object) -> str | None:
    """Why an index entry cannot name a shard in the checkpoint folder (the engine loads only
    the folder's own files), or None."""
    if not isinstance(file, str):
        return "not a file name"
    if any(char in file for char in "/\\") or re.search(r"[\x00-\x1f\x7f]", file):
        return ("not a plain file name in the checkpoint folder (a path, or a control character "
                "such as a NUL byte)")
    if not file.endswith(".safetensors") or file.startswith("."):
        return "not a .safetensors file name"
    return None


FLOAT_DTYPES = ("BF16", "F16", "F32", "F64")
# A decoder stack's tensors: model.layers.N. (Llama family), transformer.h.N. (GPT-2, Falcon),
# gpt_neox.layers.N., model.decoder.layers.N. ...
_LAYER = re.compile(r"^(.*?\b(?:layers|h|blocks|block|layer))\.(\d+)\.")
LLAMA_STACK = "model.layers"


def check_shapes(checkpoint: Path, shapes: dict[str, tuple[str, list[int], Path]],
                 config: dict[str, Any] | None) -> None:
    """The shapes config.json fixes, where its keys and the usual (Llama-family) tensor names are
    both there: embeddings and lm_head [vocab_size, hidden_size], the final norm [hidden_size];
    the embeddings and an untied lm_head are there at all, and layers 0 .. num_hidden_layers - 1.
    Quantized (packed) tensors are not compared."""
    if not config:
        return
    where = checkpoint / "config.json"
    hidden, vocab = config.get("hidden_size"), config.get("vocab_size")
    expected = {"model.norm.weight": ([hidden], "hidden_size")}
    if _is_int(vocab) and _is_int(hidden):
        expected["model.embed_tokens.weight"] = ([vocab, hidden], "vocab_size, hidden_size")
        expected["lm_head.weight"] = ([vocab, hidden], "vocab_size, hidden_size")
    for name, (shape, keys) in expected.items():
        if name not in shapes or not all(map(_is_int, shape)):
            continue
        dtype, found, path = shapes[name]
        if dtype in FLOAT_DTYPES and found != shape:
            values = ", ".join(f"{key} {config[key]}" for key in keys.split(", "))
            raise CheckpointError(f"{path} (safetensors header) tensor {name!r} has shape {found} "
                                  f"but {where} says {values} (shape {shape}); the weights and "
                                  "config.json are of different models: copy the checkpoint's "
                                  "own config.json, or its own weights")
    if any(name.startswith(f"{LLAMA_STACK}.") for name in shapes):
        needed = {"model.embed_tokens.": "the token embeddings"}
        if config.get("tie_word_embeddings") is False:
            needed["lm_head."] = "the output head (tie_word_embeddings is false)"
        for prefix, what in needed.items():
            if not any(name.startswith(prefix) for name in shapes):
                raise CheckpointError(f"{checkpoint}: the weights hold no {prefix}* tensor, "
                                      f"{what} the model needs ({where}); copy the checkpoint's "
                                      "missing shards")
    check_layers(checkpoint, shapes, config)


def check_layers(checkpoint: Path, shapes: dict[str, tuple[str, list[int], Path]],
                 config: dict[str, Any]) -> None:
    """config.json's num_hidden_layers layers are in the weights: some stack of layer tensors
    holds layers 0 .. num_hidden_layers - 1 (the Llama family's model.layers.N exactly those,
    and the multi-token-prediction layers config.json adds)."""
    layers = config.get("num_hidden_layers")
    if not _is_int(layers) or layers <= 0:
        return
    where = checkpoint / "config.json"
    stacks: dict[str, set[int]] = {}
    for name in shapes:
        if match := _LAYER.match(name):
            stacks.setdefault(match.group(1), set()).add(int(match.group(2)))
    if not stacks:
        raise CheckpointError(f"{checkpoint}: the weights hold no layer (no tensor named like "
                              f"{LLAMA_STACK}.N.) but {where} says num_hidden_layers {layers}; "
                              "copy the checkpoint's missing shards, or its own config.json")
    nextn = config.get("num_nextn_predict_layers")
    allowed = layers + (nextn if _is_int(nextn) and nextn > 0 else 0)

    def held(found: set[int]) -> int:  # counted: a set of range(layers) may not fit in memory
        return sum(1 for index in found if index < layers)

    if LLAMA_STACK in stacks:
        stack, found = LLAMA_STACK, stacks[LLAMA_STACK]
        if held(found) == layers and max(found) < allowed:
            return
    elif any(held(found) == layers for found in stacks.values()):
        return
    else:
        stack, found = max(stacks.items(), key=lambda item: len(item[1]))
    missing = layers - held(found)
    if missing:
        first = next(index for index in range(layers) if index not in found)
        detail = f"layer {first} is missing ({missing} missing)"
    else:
        extra = sorted(index for index in found if index >= allowed)
        detail = f"they hold layer {extra[0]} ({len(extra)} beyond)"
    raise CheckpointError(f"{checkpoint}: the weights hold {len(found)} layers ({stack}.N, N up "
                          f"to {max(found)}) but {where} says num_hidden_layers {layers}: "
                          f"{detail}; copy the checkpoint's own config.json, or copy its "
                          "missing shards")
