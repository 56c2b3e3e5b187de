"""A GGUF file's header (llama.cpp's format): its metadata and tensor table, read without the tensors.

The planner needs only the architecture, the quantization type and each tensor's shape, so this reads the
little-endian header with `struct` over a memory map, skipping arrays: tens of milliseconds, where the `gguf`
package's `GGUFReader` spends seconds wrapping each of a tokenizer's ~50k strings.
"""

import math
import mmap
import struct
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MAGIC = b"GGUF"
VERSIONS = (2, 3)  # version 1 used 32-bit counts and has not been written since 2023
STRING, ARRAY = 8, 9  # value types with a length; the others are fixed-size scalars
SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}

# ggml's tensor types (ggml.h's `ggml_type`), the names llama.cpp users know a file by.
GGML_TYPES = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 6: "Q5_0", 7: "Q5_1", 8: "Q8_0", 9: "Q8_1", 10: "Q2_K",
    11: "Q3_K", 12: "Q4_K", 13: "Q5_K", 14: "Q6_K", 15: "Q8_K", 16: "IQ2_XXS", 17: "IQ2_XS", 18: "IQ3_XXS",
    19: "IQ1_S", 20: "IQ4_NL", 21: "IQ3_S", 22: "IQ2_S", 23: "IQ4_XS", 24: "I8", 25: "I16", 26: "I32",
    27: "I64", 28: "F64", 29: "IQ1_M", 30: "BF16", 34: "TQ1_0", 35: "TQ2_0", 39: "MXFP4", 40: "NVFP4", 41: "Q1_0",
}  # fmt: skip
# llama.cpp's `llama_ftype` (the `general.file_type` key): how the file as a whole was quantized.
FILE_TYPES = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K", 11: "Q3_K_S",
    12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S", 17: "Q5_K_M", 18: "Q6_K",
    19: "IQ2_XXS", 20: "IQ2_XS", 21: "Q2_K_S", 22: "IQ3_XS", 23: "IQ3_XXS", 24: "IQ1_S", 25: "IQ4_NL",
    26: "IQ3_S", 27: "IQ3_M", 28: "IQ2_S", 29: "IQ2_M", 30: "IQ4_XS", 31: "IQ1_M", 32: "BF16", 36: "TQ1_0",
    37: "TQ2_0", 38: "MXFP4_MOE", 39: "NVFP4", 40: "Q1_0",
}  # fmt: skip
FLOAT_TYPES = frozenset({"F32", "F16", "BF16", "F64"})


class NotGguf(ValueError):
    """The file is not a GGUF file this reader understands (wrong magic, an unknown version, cut short)."""


@dataclass(frozen=True)
class GgufTensor:
    name: str
    shape: tuple[int, ...]  # as ggml stores it, fastest-moving dimension first
    ggml_type: int

    @property
    def elements(self) -> int:
        return math.prod(self.shape)

    @property
    def type_name(self) -> str:
        return GGML_TYPES.get(self.ggml_type, f"type {self.ggml_type}")


@dataclass(frozen=True)
class GgufHeader:
    version: int
    metadata: dict[str, Any]  # scalars and strings; an array as ("array", its length)
    tensors: tuple[GgufTensor, ...]

    @property
    def architecture(self) -> str:
        return str(self.metadata.get("general.architecture", ""))

    @property
    def quantization(self) -> str:
        """The file's quantization as llama.cpp names it (`Q4_K_M`, `Q8_0`, `F16`): `general.file_type` when it is
        written and known, else the type most of its quantized weights have (the float type when there are none)."""
        file_type = self.metadata.get("general.file_type")
        if isinstance(file_type, int) and file_type in FILE_TYPES:
            return FILE_TYPES[file_type]
        counts = Counter(t.type_name for t in self.tensors if t.type_name not in FLOAT_TYPES)
        counts = counts or Counter(t.type_name for t in self.tensors)
        return counts.most_common(1)[0][0] if counts else "unknown"


def read_gguf_header(path: str | Path) -> GgufHeader:
    """The header of the GGUF file at `path`; `NotGguf` when it is not one, `OSError` when it cannot be read."""
    with open(path, "rb") as f:
        if f.read(4) != MAGIC:  # an empty file included (it cannot be memory-mapped)
            f.seek(0)
            raise NotGguf(f"it does not start with GGUF's magic bytes (it starts with {f.read(4)!r})")
        data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    with data:
        try:
            return _parse(data)
        except (struct.error, IndexError, KeyError, UnicodeDecodeError) as exc:
            raise NotGguf(f"its GGUF header is cut short or damaged ({type(exc).__name__}: {exc})") from None


def _parse(data: mmap.mmap) -> GgufHeader:
    (version,) = struct.unpack_from("<I", data, 4)
    if version not in VERSIONS:
        raise NotGguf(f"GGUF version {version} is not one this reader knows ({', '.join(map(str, VERSIONS))})")
    tensor_count, metadata_count = struct.unpack_from("<QQ", data, 8)
    position = 24
    metadata: dict[str, Any] = {}
    for _ in range(metadata_count):
        key, position = _string(data, position)
        (value_type,) = struct.unpack_from("<I", data, position)
        metadata[key], position = _value(data, position + 4, value_type)
    tensors = []
    for _ in range(tensor_count):
        name, position = _string(data, position)
        (dims,) = struct.unpack_from("<I", data, position)
        shape = struct.unpack_from(f"<{dims}Q", data, position + 4)
        position += 4 + 8 * dims
        ggml_type, _offset = struct.unpack_from("<IQ", data, position)
        position += 12
        tensors.append(GgufTensor(name, tuple(shape), ggml_type))
    return GgufHeader(version, metadata, tuple(tensors))


def _string(data: mmap.mmap, position: int) -> tuple[str, int]:
    (length,) = struct.unpack_from("<Q", data, position)
    end = position + 8 + length
    if end > len(data):
        raise IndexError("a string runs past the end of the file")
    return data[position + 8 : end].decode("utf-8"), end


def _value(data: mmap.mmap, position: int, value_type: int) -> tuple[Any, int]:
    """One metadata value and the position after it; an array is skipped, kept as ("array", its length)."""
    if value_type == STRING:
        return _string(data, position)
    if value_type == ARRAY:
        item_type, length = struct.unpack_from("<IQ", data, position)
        position += 12
        if item_type in SCALARS:
            return ("array", length), position + struct.calcsize("<" + SCALARS[item_type]) * length
        for _ in range(length):  # strings (a tokenizer's vocabulary) or nested arrays: walked, not decoded
            position = _skip(data, position, item_type)
        return ("array", length), position
    fmt = "<" + SCALARS[value_type]
    return struct.unpack_from(fmt, data, position)[0], position + struct.calcsize(fmt)


def _skip(data: mmap.mmap, position: int, value_type: int) -> int:
    """The position after one array item (a string's bytes are never decoded: a vocabulary may hold invalid UTF-8)."""
    if value_type == STRING:
        (length,) = struct.unpack_from("<Q", data, position)
        return position + 8 + length
    return _value(data, position, value_type)[1]
