"""A GGUF file's header, read in pure Python (no MLX): its metadata and its tensors' names and types.

Enough to tell, before any weight is read, whether MLX can load a llama.cpp file (its tensor
types), which architecture it is and what its tokenizer is. The format (version 2 and 3): magic,
version, tensor and metadata counts, the metadata's typed key-value pairs, then each tensor's name,
dimensions, ggml type and offset (llama.cpp's gguf.h).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

MAGIC = b"GGUF"
# ggml's type ids, by name (ggml.h)
GGML_TYPES = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 6: "Q5_0", 7: "Q5_1", 8: "Q8_0", 9: "Q8_1", 10: "Q2_K",
    11: "Q3_K", 12: "Q4_K", 13: "Q5_K", 14: "Q6_K", 15: "Q8_K", 16: "IQ2_XXS", 17: "IQ2_XS", 18: "IQ3_XXS",
    19: "IQ1_S", 20: "IQ4_NL", 21: "IQ3_S", 22: "IQ2_S", 23: "IQ4_XS", 24: "I8", 25: "I16", 26: "I32",
    27: "I64", 28: "F64", 29: "IQ1_M", 30: "BF16", 34: "TQ1_0", 35: "TQ2_0", 39: "MXFP4",
}  # fmt: skip
# metadata value types with a fixed width: their struct format
SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
STRING, ARRAY = 8, 9


class GgufError(ValueError):
    """Not a GGUF file this reader can read."""


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # ggml's order: the fastest-moving dimension first
    type: int

    @property
    def type_name(self) -> str:
        return GGML_TYPES.get(self.type, f"type {self.type}")


@dataclass(frozen=True)
class GgufHeader:
    path: Path
    version: int
    metadata: dict[str, Any]
    tensors: tuple[TensorInfo, ...]

    @property
    def architecture(self) -> str:
        return str(self.metadata.get("general.architecture", ""))


def _read(stream: BinaryIO, fmt: str) -> Any:
    size = struct.calcsize(fmt)
    data = stream.read(size)
    if len(data) != size:
        raise GgufError("the file ends inside its header")
    return struct.unpack(fmt, data)[0]


def _string(stream: BinaryIO) -> str:
    length = _read(stream, "<Q")
    data = stream.read(length)
    if len(data) != length:
        raise GgufError("the file ends inside its header")
    return data.decode("utf-8", errors="replace")


def _value(stream: BinaryIO, kind: int) -> Any:
    if kind in SCALARS:
        return _read(stream, SCALARS[kind])
    if kind == STRING:
        return _string(stream)
    if kind == ARRAY:
        item, count = _read(stream, "<I"), _read(stream, "<Q")
        if item in SCALARS:  # one read for the whole array
            fmt = SCALARS[item]
            data = stream.read(struct.calcsize(fmt) * count)
            if len(data) != struct.calcsize(fmt) * count:
                raise GgufError("the file ends inside its header")
            return list(struct.unpack(f"<{count}{fmt[1:]}", data))
        return [_value(stream, item) for _ in range(count)]
    raise GgufError(f"unknown metadata value type {kind}")


def read_header(path: str | Path) -> GgufHeader:
    """The header of the GGUF file at `path`; GgufError when it is not one."""
    path = Path(path)
    with path.open("rb") as stream:
        if stream.read(4) != MAGIC:
            raise GgufError(f"{path} is not a GGUF file (no GGUF magic)")
        version = _read(stream, "<I")
        if version not in (2, 3):
            raise GgufError(f"{path}: GGUF version {version}; versions 2 and 3 are read")
        n_tensors, n_metadata = _read(stream, "<Q"), _read(stream, "<Q")
        metadata = {}
        for _ in range(n_metadata):
            key = _string(stream)
            metadata[key] = _value(stream, _read(stream, "<I"))
        tensors = []
        for _ in range(n_tensors):
            name = _string(stream)
            dims = _read(stream, "<I")
            shape = tuple(_read(stream, "<Q") for _ in range(dims))
            kind = _read(stream, "<I")
            _read(stream, "<Q")  # the offset in the data section: MLX reads the data
            tensors.append(TensorInfo(name, shape, kind))
    return GgufHeader(path, version, metadata, tuple(tensors))
