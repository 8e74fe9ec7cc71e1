"""A GGUF header reader: the metadata key/values and where the tensor data starts.

Hand-written on purpose: gguf-py's GGUFReader turns every tokenizer array element into a numpy view and
took 13 s on a 98 MB SmolLM2 file here; the planner and the doctor need ~15 scalar keys, and this reads
them in milliseconds by skipping arrays. Format: github.com/ggml-org/ggml/blob/master/docs/gguf.md.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

MAGIC = b"GGUF"
# value type id → struct format (scalars); 8 = string, 9 = array
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9
# arrays longer than this are skipped (tokenizer vocabularies); shorter ones (per-layer head counts) are read
MAX_ARRAY_KEPT = 4096


class GGUFError(ValueError):
    pass


@dataclass
class GGUFHeader:
    version: int
    tensor_count: int
    metadata: dict[str, Any] = field(default_factory=dict)
    data_offset: int = 0  # where tensor data begins
    file_size: int = 0

    @property
    def architecture(self) -> str:
        return str(self.metadata.get("general.architecture", ""))

    def arch_key(self, suffix: str, default: Any = None) -> Any:
        return self.metadata.get(f"{self.architecture}.{suffix}", default)

    @property
    def tensor_bytes(self) -> int:
        """Bytes of tensor data (the weights), alignment padding included (at most 32 B a tensor)."""
        return max(0, self.file_size - self.data_offset)


class _Reader:
    def __init__(self, fh: BinaryIO):
        self.fh = fh

    def take(self, fmt: str) -> Any:
        size = struct.calcsize("<" + fmt)
        data = self.fh.read(size)
        if len(data) != size:
            raise GGUFError("file ends inside the header (truncated or not a GGUF file)")
        return struct.unpack("<" + fmt, data)[0]

    def string(self) -> str:
        n = self.take("Q")
        if n > 1 << 24:
            raise GGUFError(f"implausible string length {n} in header")
        return self.fh.read(n).decode("utf-8", "replace")

    def skip(self, n: int) -> None:
        self.fh.seek(n, 1)

    def value(self, vtype: int) -> Any:
        if vtype in _SCALARS:
            return self.take(_SCALARS[vtype])
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            etype, count = self.take("I"), self.take("Q")
            if count > MAX_ARRAY_KEPT:
                self._skip_array(etype, count)
                return f"<array of {count}>"
            return [self.value(etype) for _ in range(count)]
        raise GGUFError(f"unknown GGUF value type {vtype}")

    def _skip_array(self, etype: int, count: int) -> None:
        if etype in _SCALARS:
            self.skip(struct.calcsize("<" + _SCALARS[etype]) * count)
        elif etype == _STRING:
            for _ in range(count):
                self.skip(self.take("Q"))
        else:  # arrays of arrays do not occur in practice; read them the slow way
            for _ in range(count):
                self.value(etype)


def is_gguf(path: str | Path) -> bool:
    """A .gguf name, or a file that starts with GGUF's magic: Ollama keeps its models as blobs named by hash."""
    p = Path(path)
    if p.suffix == ".gguf":
        return True
    try:
        with open(p, "rb") as fh:
            return fh.read(4) == MAGIC
    except OSError:
        return False


def read_header(path: str | Path) -> GGUFHeader:
    """Parse a GGUF file's header. Raises GGUFError (with why) for anything that is not a readable GGUF."""
    path = Path(path)
    size = path.stat().st_size
    with open(path, "rb") as fh:
        if fh.read(4) != MAGIC:
            raise GGUFError("no GGUF magic at the start of the file")
        r = _Reader(fh)
        version = r.take("I")
        if version not in (2, 3):
            raise GGUFError(f"GGUF version {version} is not supported (2 and 3 are)")
        n_tensors, n_kv = r.take("Q"), r.take("Q")
        meta: dict[str, Any] = {}
        for _ in range(n_kv):
            key = r.string()
            meta[key] = r.value(r.take("I"))
        for _ in range(n_tensors):  # name, dims, type, offset: only read to find where data begins
            r.string()
            n_dims = r.take("I")
            r.skip(8 * n_dims + 4 + 8)
        align = int(meta.get("general.alignment", 32))
        pos = fh.tell()
        data_offset = pos + (-pos % align)
    if data_offset > size:
        raise GGUFError("header runs past the end of the file (truncated download?)")
    return GGUFHeader(version=version, tensor_count=n_tensors, metadata=meta, data_offset=data_offset, file_size=size)
