"""The wire between the judge and one executor: framed msgpack over an inherited AF_UNIX socket, and the
sealed arena that carries the weights and KV caches.

Frames: a 4-byte little-endian length, then one msgpack map. Tensors travel inside a map as
``{"__t__": dtype, "shape": [...], "data": bytes}`` (a copy; on CUDA the sender moves them to the host
first). Limit per frame: ``MAX_FRAME_BYTES`` (a larger length is a protocol error, never an allocation).

The arena (``Arena.build``) is a memfd holding every tensor the judge shares (weights, the workloads'
KV caches and inputs), written once by the judge and then sealed (``F_SEAL_WRITE | F_SEAL_SHRINK |
F_SEAL_GROW | F_SEAL_SEAL``): from then on the kernel refuses every write and every writable shared
mapping, in the judge and in every executor alike, so no candidate can change what the next one reads.
Executors map it read-only (``Arena.open``). Cost: one copy of the shared tensors in host memory.
Stdlib + msgpack, torch imported lazily (the judge's tensors, the executor's views).
"""

from __future__ import annotations

import fcntl
import mmap
import os
import socket
import struct
import zlib

import msgpack

MAX_FRAME_BYTES = 1 << 31
_LEN = struct.Struct("<I")
_SEALS = fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL
ALIGN = 64
CHUNK_BYTES = 16 << 20                   # the judge re-hashes a rotating window of these chunks


class ChannelClosed(EOFError):
    """The other side closed the socket (an executor died, or the judge went away)."""


class ProtocolError(ValueError):
    """A frame that is not what the protocol allows (too long, not a map)."""


# ------------------------------------------------------------------------------ tensors on the wire
def _dtype_name(dtype) -> str:
    return str(dtype).removeprefix("torch.")


def pack_tensor(t) -> dict:
    import torch

    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.contiguous()
    raw = t.view(torch.uint8) if t.numel() and t.dtype != torch.bool else t.to(torch.uint8)
    return {"__t__": _dtype_name(t.dtype), "shape": list(t.shape), "data": raw.numpy().tobytes()}


def unpack_tensor(d: dict, device=None):
    import torch

    dtype = getattr(torch, d["__t__"])
    buf = bytearray(d["data"])
    if dtype == torch.bool:
        t = torch.frombuffer(buf, dtype=torch.uint8).to(torch.bool) if buf else torch.empty(0, dtype=torch.bool)
    else:
        t = torch.frombuffer(buf, dtype=dtype) if buf else torch.empty(0, dtype=dtype)
    t = t.reshape(d["shape"])
    return t.to(device) if device is not None and torch.device(device).type != "cpu" else t


def _default(obj):
    import torch

    if isinstance(obj, torch.Tensor):
        return pack_tensor(obj)
    if isinstance(obj, (tuple, set)):
        return list(obj)
    raise TypeError(f"cannot send {type(obj).__name__}")


def decode_tensors(obj, device=None):
    """``obj`` with every packed tensor turned back into a tensor (on ``device``)."""
    if isinstance(obj, dict):
        if "__t__" in obj and "data" in obj:
            return unpack_tensor(obj, device)
        return {k: decode_tensors(v, device) for k, v in obj.items()}
    if isinstance(obj, list):
        return [decode_tensors(v, device) for v in obj]
    return obj


# ------------------------------------------------------------------------------ framed messages
class Channel:
    """One end of the judge <-> executor socket: ``send(map)``, ``recv(timeout) -> map``."""

    def __init__(self, sock: socket.socket):
        self.sock = sock

    @classmethod
    def from_fd(cls, fd: int) -> "Channel":
        return cls(socket.socket(fileno=fd))

    def send(self, msg: dict) -> None:
        body = msgpack.packb(msg, use_bin_type=True, default=_default)
        self.sock.sendall(_LEN.pack(len(body)) + body)

    def _read(self, n: int) -> bytes:
        chunks, left = [], n
        while left:
            b = self.sock.recv(min(left, 1 << 22))
            if not b:
                raise ChannelClosed("the other side closed the channel")
            chunks.append(b)
            left -= len(b)
        return b"".join(chunks)

    def recv(self, timeout: float | None = None) -> dict:
        """The next message; ``TimeoutError`` when none started within ``timeout`` seconds."""
        self.sock.settimeout(timeout)
        try:
            head = self._read(_LEN.size)
        except socket.timeout:
            raise TimeoutError("no message within the timeout") from None
        finally:
            self.sock.settimeout(None)
        (n,) = _LEN.unpack(head)
        if n > MAX_FRAME_BYTES:
            raise ProtocolError(f"frame of {n} bytes exceeds {MAX_FRAME_BYTES}")
        msg = msgpack.unpackb(self._read(n), raw=False, strict_map_key=False)
        if not isinstance(msg, dict):
            raise ProtocolError(f"expected a map, got {type(msg).__name__}")
        return msg

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


def channel_pair() -> tuple[Channel, socket.socket]:
    """(the judge's end, the executor's socket to pass to it as an inherited fd)."""
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    b.set_inheritable(True)
    return Channel(a), b


# ------------------------------------------------------------------------------ the sealed arena
class Arena:
    """Named tensors in one sealed memfd. ``manifest``: name -> (offset, dtype, shape)."""

    def __init__(self, fd: int, size: int, manifest: dict[str, list]):
        self.fd, self.size, self.manifest = fd, size, manifest
        self._map = mmap.mmap(fd, max(size, 1), mmap.MAP_SHARED, mmap.PROT_READ)

    @classmethod
    def build(cls, tensors: dict) -> "Arena":
        """Write ``tensors`` (any device) into a new memfd and seal it. Cost: one host copy of them."""
        manifest, offset = {}, 0
        for name, t in tensors.items():
            nbytes = t.numel() * t.element_size()
            manifest[name] = [offset, _dtype_name(t.dtype), list(t.shape)]
            offset += -(-nbytes // ALIGN) * ALIGN
        fd = os.memfd_create("tkcc-arena", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        os.ftruncate(fd, max(offset, 1))
        with mmap.mmap(fd, max(offset, 1), mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE) as m:
            for name, t in tensors.items():
                off = manifest[name][0]
                data = pack_tensor(t)["data"]
                m[off:off + len(data)] = data
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, _SEALS)
        return cls(fd, offset, manifest)

    @classmethod
    def open(cls, fd: int, size: int, manifest: dict) -> "Arena":
        """An executor's read-only view of the judge's arena (inherited ``fd``)."""
        return cls(fd, size, manifest)

    def sealed(self) -> bool:
        """True when every write seal is in place (the kernel refuses any write to the arena)."""
        return fcntl.fcntl(self.fd, fcntl.F_GET_SEALS) & _SEALS == _SEALS

    def checksums(self) -> list[int]:
        """CRC32 of each CHUNK_BYTES chunk (taken once by the judge, right after sealing)."""
        return [self.chunk_checksum(j) for j in range(-(-self.size // CHUNK_BYTES))]

    def chunk_checksum(self, j: int) -> int:
        return zlib.crc32(memoryview(self._map)[j * CHUNK_BYTES:(j + 1) * CHUNK_BYTES])

    def tensor(self, name: str):
        """A zero-copy, read-only CPU view (a write through it faults: the mapping is PROT_READ)."""
        import warnings

        import torch

        off, dtype, shape = self.manifest[name]
        dt = getattr(torch, dtype)
        n = 1
        for s in shape:
            n *= s
        if n == 0:
            return torch.empty(shape, dtype=dt)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")     # "non-writable buffer": intended, the mapping is read-only
            return torch.frombuffer(self._map, dtype=dt, count=n, offset=off).view(shape)

    def tensors(self) -> dict:
        return {k: self.tensor(k) for k in self.manifest}

    def unchanged(self, tensors: dict) -> list[str]:
        """Names whose arena bytes differ from ``tensors`` (the judge's own copies): [] when intact."""
        import torch

        bad = [k for k in self.manifest if k not in tensors]
        for k, t in tensors.items():
            if k not in self.manifest or not torch.equal(self.tensor(k), t.detach().cpu()):
                bad.append(k)
        return bad
