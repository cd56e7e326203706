"""A GGUF file's metadata scalars from its header alone: gguf-py's reader parses every field,
a 49152-token vocabulary and its merges included (seconds), before anything can be refused.

GGUF v2/v3, little-endian: magic, version (u32), tensor count and key-value count (u64), then
each key (u64 length + UTF-8), its type (u32) and value; a string is u64 length + bytes, an
array its element type (u32), count (u64) and elements. Arrays are skipped, not read.
"""
from __future__ import annotations

import mmap
import struct
from pathlib import Path
from typing import Any

FIXED = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q",
         11: "<q", 12: "<d"}  # GGUFValueType -> struct format
STRING, ARRAY = 8, 9


class HeaderError(ValueError):
    """Not a GGUF header this reader knows (gguf-py's reader says why)."""


def header_scalars(path: str | Path) -> dict[str, Any]:
    """Every number, bool and string of the metadata, by key (arrays left out)."""
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as view:
        if view[:4] != b"GGUF" or struct.unpack_from("<I", view, 4)[0] not in (2, 3):
            raise HeaderError(f"{path}: not a little-endian GGUF v2/v3 file")
        count = struct.unpack_from("<Q", view, 16)[0]
        values, at = {}, 24
        try:
            for _ in range(count):
                key, at = _string(view, at)
                kind = struct.unpack_from("<I", view, at)[0]
                value, at = _value(view, at + 4, kind)
                if kind != ARRAY:
                    values[key] = value
        except (struct.error, UnicodeDecodeError, KeyError) as e:
            raise HeaderError(f"{path}: a damaged GGUF header ({e})") from None
    return values


def _string(view: mmap.mmap, at: int) -> tuple[str, int]:
    n = struct.unpack_from("<Q", view, at)[0]
    if at + 8 + n > len(view):
        raise struct.error("a string past the end of the file")
    return view[at + 8:at + 8 + n].decode("utf-8"), at + 8 + n


def _value(view: mmap.mmap, at: int, kind: int) -> tuple[Any, int]:
    """(value, the offset after it); an array's value is None (skipped)."""
    if kind == STRING:
        return _string(view, at)
    if kind == ARRAY:
        element, n = struct.unpack_from("<IQ", view, at)
        at += 12
        if element in FIXED:
            return None, at + n * struct.calcsize(FIXED[element])
        for _ in range(n):
            _, at = _value(view, at, element)
        return None, at
    return struct.unpack_from(FIXED[kind], view, at)[0], at + struct.calcsize(FIXED[kind])
