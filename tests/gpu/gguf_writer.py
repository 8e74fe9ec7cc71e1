"""Writes small GGUF files for tests: a header in the GGUF v3 layout and a blob of tensor bytes.

Kept tiny and independent of servedeck's reader (struct packing straight from the format spec), so a
reader bug cannot hide behind a writer with the same bug."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any


def _s(text: str) -> bytes:
    b = text.encode()
    return struct.pack("<Q", len(b)) + b


def _value(v: Any) -> bytes:
    if isinstance(v, bool):
        return struct.pack("<I?", 7, v)
    if isinstance(v, int):
        return struct.pack("<IQ", 10, v) if v > 0xFFFFFFFF else struct.pack("<II", 4, v)
    if isinstance(v, float):
        return struct.pack("<If", 6, v)
    if isinstance(v, str):
        return struct.pack("<I", 8) + _s(v)
    if isinstance(v, list) and all(isinstance(x, str) for x in v):
        return struct.pack("<IIQ", 9, 8, len(v)) + b"".join(_s(x) for x in v)
    if isinstance(v, list):
        return struct.pack("<IIQ", 9, 5, len(v)) + b"".join(struct.pack("<i", x) for x in v)
    raise TypeError(v)


def write_gguf(path: Path, arch: str, meta: dict[str, Any], tensor_bytes: int = 64,
               vocab: int = 5000, truncate_at: int | None = None) -> Path:
    kv = {"general.architecture": arch, "tokenizer.ggml.tokens": [f"t{i}" for i in range(vocab)], **meta}
    body = b"GGUF" + struct.pack("<IQQ", 3, 1, len(kv))
    for k, v in kv.items():
        body += _s(k) + _value(v)
    # one tensor: name, n_dims, dims, type (f32), offset
    body += _s("token_embd.weight") + struct.pack("<I", 1) + struct.pack("<Q", tensor_bytes // 4) + struct.pack("<IQ", 0, 0)
    body += b"\0" * (-len(body) % 32)
    body += b"\1" * tensor_bytes
    if truncate_at is not None:
        body = body[:truncate_at]
    path.write_bytes(body)
    return path
