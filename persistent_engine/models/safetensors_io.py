"""A minimal safetensors reader and writer (the format: 8-byte little-endian header length, a JSON
header ``{name: {dtype, shape, data_offsets}}``, then raw little-endian tensor bytes).

Written here rather than imported so that ``persistent_engine`` needs nothing beyond torch on a GPU
box. Reading is lazy: ``SafetensorsDir`` parses the headers of every ``*.safetensors`` file of a
directory and reads only the tensors asked for (a slice of DeepSeek-V3 reads a few GB, not 700).
"""

from __future__ import annotations

import json
import os
import struct
import tempfile
from pathlib import Path

import torch

DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
          "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
          "BOOL": torch.bool, "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2}
NAMES = {v: k for k, v in DTYPES.items()}


class WeightsError(ValueError):
    """Unreadable or incomplete weights: one line for the user, exit 2."""

    user_error = True


def save_file(tensors: dict[str, torch.Tensor], path: str | os.PathLike, metadata: dict | None = None) -> None:
    """Write ``tensors`` to ``path`` atomically (temp file in the same directory, then rename)."""
    header: dict = {"__metadata__": {k: str(v) for k, v in (metadata or {}).items()}}
    offset, blobs = 0, []
    for name, t in tensors.items():
        t = t.detach().contiguous().cpu()
        raw = t.view(torch.uint8).numpy().tobytes() if t.numel() else b""
        header[name] = {"dtype": NAMES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
        blobs.append(raw)
    hb = json.dumps(header, separators=(",", ":")).encode()
    hb += b" " * (-len(hb) % 8)
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(struct.pack("<Q", len(hb)))
            f.write(hb)
            for raw in blobs:
                f.write(raw)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _read_header(path: Path) -> tuple[dict, int]:
    try:
        with open(path, "rb") as f:
            n = struct.unpack("<Q", f.read(8))[0]
            header = json.loads(f.read(n))
    except (OSError, struct.error, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise WeightsError(f"cannot read safetensors file {path}: {e}") from None
    header.pop("__metadata__", None)
    return header, 8 + n


class SafetensorsDir:
    """Lazy view of one ``.safetensors`` file or of every one in a directory."""

    def __init__(self, path: str | os.PathLike):
        p = self.path = Path(path)
        files = sorted(p.glob("*.safetensors")) if p.is_dir() else [p]
        if not files or not files[0].exists():
            raise WeightsError(f"no safetensors weights at {path}")
        self._where: dict[str, tuple[Path, int, dict]] = {}
        for f in files:
            header, base = _read_header(f)
            for name, info in header.items():
                self._where[name] = (f, base, info)

    def keys(self) -> list[str]:
        return list(self._where)

    def __contains__(self, name: str) -> bool:
        return name in self._where

    def get(self, name: str) -> torch.Tensor:
        if name not in self._where:
            raise WeightsError(f"weights at {self.path} lack tensor {name!r}")
        f, base, info = self._where[name]
        start, end = info["data_offsets"]
        with open(f, "rb") as fh:
            fh.seek(base + start)
            raw = bytearray(fh.read(end - start))
        dtype = DTYPES[info["dtype"]]
        if not raw:
            return torch.empty(info["shape"], dtype=dtype)
        return torch.frombuffer(raw, dtype=dtype).reshape(info["shape"])


def load_file(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    st = SafetensorsDir(path)
    return {k: st.get(k) for k in st.keys()}
