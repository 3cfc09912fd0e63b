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
import threading
import zlib

import msgpack

MAX_FRAME_BYTES = 1 << 31
_LEN = struct.Struct("<I")
_SEALS = fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL
ALIGN = 64
CHUNK_BYTES = 16 << 20                   # the judge re-hashes a rotating window of these chunks
MAILBOX_BYTES = 256 << 20                # an executor's reply tensors (larger ones: msgpack bytes)
MAILBOX_MIN_BYTES = 64 << 10             # smaller tensors stay inline
# the start of a mailbox the executor writes once before it reports ready: the shared-memory pages exist then,
# and no reply pays for the kernel allocating and zeroing them (~1-2 GB/s: 70 ms of a linear candidate's
# 150 MB of op-check outputs on the H200 box) inside a judged cycle
PREFAULT_BYTES = {"cuda": 128 << 20, "cpu": 8 << 20}


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


def decode_tensors(obj, device=None, mailbox: "Mailbox | None" = None):
    """``obj`` with every packed tensor turned back into a tensor (on ``device``); references into
    ``mailbox`` (the sender's box; without one they are a protocol error) copied out of it."""
    if isinstance(obj, dict):
        if "__t__" in obj and "data" in obj:
            return unpack_tensor(obj, device)
        if "__m__" in obj:
            if mailbox is None:
                raise ProtocolError("a mailbox reference on a channel without a mailbox")
            t = mailbox.take(obj)
            return t.to(device) if device is not None and str(device) != "cpu" else t
        return {k: decode_tensors(v, device, mailbox) for k, v in obj.items()}
    if isinstance(obj, list):
        return [decode_tensors(v, device, mailbox) for v in obj]
    return obj


# ------------------------------------------------------------------------------ framed messages
class Mailbox:
    """A writable memfd the judge creates for ONE executor: the large tensors of that executor's replies
    are written here (one device-to-host copy straight into shared memory) and the judge copies them out
    as it decodes the reply, instead of ~7 host copies through msgpack and the socket (16 MB of logits:
    ~20 ms that way on the H200 box). The judge trusts nothing in it but the candidate's own outputs,
    bounds-checks every reference, and copies each tensor out before the next request (the executor may
    rewrite the box at any time: it can only change its own outputs). Reset per message."""

    def __init__(self, fd: int, size: int, device=None):
        self.fd, self.size = fd, size
        self._closing = threading.Lock()
        self.device = device                 # the judge's: where ``take`` puts its copies (None: the host)
        self._map = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        self._used = 0

    @classmethod
    def create(cls, size: int = MAILBOX_BYTES, device=None) -> "Mailbox":
        fd = os.memfd_create("tkcc-mailbox", os.MFD_CLOEXEC)
        os.ftruncate(fd, size)
        return cls(fd, size, device)

    def prefault(self, nbytes: int) -> None:
        """Write zeros over the first ``nbytes`` (the executor, before it reports ready): their pages exist."""
        step = 1 << 20
        zeros = bytes(step)
        for off in range(0, min(nbytes, self.size), step):
            n = min(step, self.size - off)
            self._map[off:off + n] = zeros[:n]

    def put(self, t) -> dict | None:
        """Write ``t`` at the next aligned offset: its reference, or None when it does not fit."""
        import torch

        t = t.detach()
        is_bool = t.dtype == torch.bool
        t = (t.to(torch.uint8) if is_bool else t).contiguous()
        nbytes = t.numel() * t.element_size()
        off = -(-self._used // ALIGN) * ALIGN
        if off + nbytes > self.size:
            return None
        dst = torch.frombuffer(self._map, dtype=torch.uint8, count=nbytes, offset=off)
        dst.copy_(t.reshape(-1).view(torch.uint8))
        self._used = off + nbytes
        return {"__m__": _dtype_name(t.dtype), "bool": is_bool, "shape": list(t.shape),
                "offset": off, "nbytes": nbytes}

    def take(self, ref: dict):
        """A copy of the tensor ``ref`` names (ProtocolError when it is not inside the box), on ``device``:
        one host-to-device copy straight out of the box there, else a host copy."""
        import torch

        dtype = getattr(torch, str(ref.get("__m__")), None)
        off, nbytes, shape = ref.get("offset"), ref.get("nbytes"), ref.get("shape")
        if not isinstance(dtype, torch.dtype) or not all(isinstance(x, int) and x >= 0 for x in (off, nbytes)) \
                or not isinstance(shape, list) or not all(isinstance(x, int) and x >= 0 for x in shape):
            raise ProtocolError(f"bad mailbox reference {ref!r:.200}")
        n = 1
        for x in shape:
            n *= x
        if off + nbytes > self.size or n * torch.empty((), dtype=dtype).element_size() != nbytes:
            raise ProtocolError(f"mailbox reference outside the box or of the wrong size: {ref!r:.200}")
        if nbytes == 0:
            return torch.empty(shape, dtype=dtype)
        view = torch.frombuffer(self._map, dtype=dtype, count=n, offset=off)
        on_device = self.device is not None and torch.device(self.device).type != "cpu"
        out = (view.to(self.device) if on_device else view.clone()).reshape(shape)
        return out.to(torch.bool) if ref.get("bool") else out

    def reset(self) -> None:
        self._used = 0

    def close(self) -> None:
        """Idempotent and thread-safe (an executor is killed from more than one path, and threads): a
        second ``os.close`` of the number would close whatever the process opened under it since, e.g.
        a ZeroMQ socket of the judge's RPC (which then fails with "Socket operation on non-socket")."""
        with self._closing:
            fd, self.fd = self.fd, -1
        if fd < 0:
            return
        try:
            self._map.close()
        except BufferError:                  # a view still alive: the mapping goes with it
            pass
        os.close(fd)


class Channel:
    """One end of the judge <-> executor socket: ``send(map)``, ``recv(timeout) -> map``. With a
    ``mailbox`` (the executor's end), tensors of at least ``MAILBOX_MIN_BYTES`` go through it."""

    def __init__(self, sock: socket.socket, mailbox: Mailbox | None = None):
        self.sock = sock
        self.mailbox = mailbox

    @classmethod
    def from_fd(cls, fd: int, mailbox: Mailbox | None = None) -> "Channel":
        return cls(socket.socket(fileno=fd), mailbox)

    def send(self, msg: dict) -> None:
        default = _default
        if self.mailbox is not None:
            box = self.mailbox
            box.reset()

            def default(obj):
                import torch

                if isinstance(obj, torch.Tensor) and obj.numel() * obj.element_size() >= MAILBOX_MIN_BYTES:
                    ref = box.put(obj)
                    if ref is not None:
                        return ref
                return _default(obj)
        body = msgpack.packb(msg, use_bin_type=True, default=default)
        self.sock.sendall(_LEN.pack(len(body)))
        self.sock.sendall(body)

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
