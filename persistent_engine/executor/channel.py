"""The wire between the judge and one executor: framed msgpack over an inherited AF_UNIX socket, and the
sealed arena that carries the weights and KV caches.

Frames: a 4-byte little-endian length, then one msgpack map (``wire.py`` types them). Tensors travel inside a
map as ``{"__t__": dtype, "shape": [...], "data": bytes}`` (a copy; on CUDA the sender moves them to the host
first). What the judge reads from an executor is bounded before it is held: a frame's length above the
channel's ``max_frame`` (``MAX_REPLY_BYTES`` on the judge's end) is a protocol error, never an allocation; the
body is buffered only as its bytes arrive, so a length that lies allocates nothing; a frame begun and stalled
for ``FRAME_STALL_S`` is a protocol error (the reader never blocks on it: every read has the caller's
timeout); msgpack decodes with no ext types and at most ``MAX_ITEMS`` list and map entries per frame (an
empty map costs ~70x its one byte in Python); a packed tensor is checked (a dtype, a bounded shape, ``data``
bytes of exactly its size) before anything is copied.

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
import select
import socket
import struct
import threading
import time
import zlib

import msgpack

MAX_FRAME_BYTES = 1 << 31                # judge -> executor (the executor trusts its judge)
# executor -> judge: large reply tensors go through the mailbox; what is left inline is small (a reply that
# would need more is the executor's failure)
MAX_REPLY_BYTES = 16 << 20
MAX_ITEMS = 1 << 18                      # list + map entries per decoded frame (~20 MB of Python at most)
MAX_DIMS = 8
MAX_DIM = 1 << 40
FRAME_STALL_S = 10.0                     # a frame begun makes progress within this, or it is the sender's failure
READ_BYTES = 1 << 22
_LEN = struct.Struct("<I")
_SEALS = fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL
_BOX_SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL     # the mailbox: writable, fixed size
ALIGN = 64
CHUNK_BYTES = 16 << 20                   # the judge re-hashes a rotating window of these chunks
# an executor's reply tensors; also what one reply may copy out of it, so the judge's memory under a hostile
# executor: on CPU the box is 32 MiB unless the judge's largest output (a step's logits) needs more
MAILBOX_BYTES = {"cuda": 256 << 20, "cpu": 32 << 20}
MAILBOX_MIN_BYTES = 64 << 10             # smaller tensors stay inline
# the start of a mailbox the executor writes once before it reports ready: the shared-memory pages exist then,
# and no reply pays for the kernel allocating and zeroing them (~1-2 GB/s: 70 ms of a linear candidate's
# 150 MB of op-check outputs on the H200 box) inside a judged cycle
PREFAULT_BYTES = {"cuda": 128 << 20, "cpu": 8 << 20}


class ChannelClosed(EOFError):
    """The other side closed the socket (an executor died, or the judge went away)."""


class ExecutorProtocolError(ValueError):
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


def wire_dtype(name):
    """The torch dtype ``name`` names (ExecutorProtocolError for anything else: ``getattr(torch, name)`` alone would
    hand out any attribute of torch)."""
    import torch

    dtype = getattr(torch, name, None) if isinstance(name, str) else None
    if not isinstance(dtype, torch.dtype):
        raise ExecutorProtocolError(f"not a dtype: {str(name)[:40]!r}")
    return dtype


def wire_shape(shape) -> list[int]:
    """A shape off the wire: at most MAX_DIMS ints in 0..MAX_DIM (ExecutorProtocolError otherwise)."""
    if not isinstance(shape, list) or len(shape) > MAX_DIMS or not all(
            type(x) is int and 0 <= x <= MAX_DIM for x in shape):
        raise ExecutorProtocolError(f"not a shape: {str(shape)[:80]}")
    return shape


def _numel(shape: list[int]) -> int:
    n = 1
    for x in shape:
        n *= x
    return n


def unpack_tensor(d: dict, device=None):
    """A packed tensor as a tensor: its dtype and shape checked and ``data`` bytes of exactly that size
    (a field that claims another type, e.g. an int N, is refused before anything is allocated)."""
    import torch

    dtype, shape, data = wire_dtype(d.get("__t__")), wire_shape(d.get("shape")), d.get("data")
    itemsize = 1 if dtype == torch.bool else torch.empty((), dtype=dtype).element_size()
    if not isinstance(data, (bytes, bytearray)) or len(data) != _numel(shape) * itemsize:
        got = f"{len(data)} bytes" if isinstance(data, (bytes, bytearray)) else type(data).__name__
        raise ExecutorProtocolError(f"tensor data must be {_numel(shape) * itemsize} bytes, got {got}")
    buf = bytearray(data)
    if dtype == torch.bool:
        t = torch.frombuffer(buf, dtype=torch.uint8).to(torch.bool) if buf else torch.empty(0, dtype=torch.bool)
    else:
        t = torch.frombuffer(buf, dtype=dtype) if buf else torch.empty(0, dtype=dtype)
    t = t.reshape(shape)
    return t.to(device) if device is not None and torch.device(device).type != "cpu" else t


def _default(obj):
    import torch

    if isinstance(obj, torch.Tensor):
        return pack_tensor(obj)
    if isinstance(obj, (tuple, set)):
        return list(obj)
    raise TypeError(f"cannot send {type(obj).__name__}")


def decode_tensors(obj, device=None, mailbox: "Mailbox | None" = None, depth: int = 0):
    """``obj`` with every packed tensor turned back into a tensor (on ``device``); references into
    ``mailbox`` (the sender's box; without one they are a protocol error) copied out of it. Nesting deeper
    than 64 is a protocol error."""
    if depth > 64:
        raise ExecutorProtocolError("nested deeper than 64")
    if isinstance(obj, dict):
        if "__t__" in obj and "data" in obj:
            return unpack_tensor(obj, device)
        if "__m__" in obj:
            if mailbox is None:
                raise ExecutorProtocolError("a mailbox reference on a channel without a mailbox")
            t = mailbox.take(obj)
            return t.to(device) if device is not None and str(device) != "cpu" else t
        return {k: decode_tensors(v, device, mailbox, depth + 1) for k, v in obj.items()}
    if isinstance(obj, list):
        return [decode_tensors(v, device, mailbox, depth + 1) for v in obj]
    return obj


# ------------------------------------------------------------------------------ framed messages
class Mailbox:
    """A writable memfd the judge creates for ONE executor: the large tensors of that executor's replies
    are written here (one device-to-host copy straight into shared memory) and the judge copies them out
    as it decodes the reply, instead of ~7 host copies through msgpack and the socket (16 MB of logits:
    ~20 ms that way on the H200 box). Sealed against shrinking and growing before any executor gets it
    (``F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL``): a read of the judge's mapping can never fault (SIGBUS).
    The judge trusts nothing in it but the candidate's own outputs, bounds-checks every reference, copies
    at most the box's size per reply (``begin`` resets the count: a reply naming one region a thousand
    times is refused, not copied a thousand times), and copies each tensor out before the next request
    (the executor may rewrite the box at any time: it can only change its own outputs). Reset per message."""

    def __init__(self, fd: int, size: int, device=None):
        self.fd, self.size = fd, size
        self._closing = threading.Lock()
        self.device = device                 # the judge's: where ``take`` puts its copies (None: the host)
        self._map = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        self._used = 0
        self._taken = 0

    @classmethod
    def create(cls, size: int = MAILBOX_BYTES["cpu"], device=None) -> "Mailbox":
        fd = os.memfd_create("tkcc-mailbox", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        os.ftruncate(fd, size)
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, _BOX_SEALS)
        return cls(fd, size, device)

    def sealed(self) -> bool:
        """True when its size is fixed for good (no process can shrink or grow it)."""
        return fcntl.fcntl(self.fd, fcntl.F_GET_SEALS) & _BOX_SEALS == _BOX_SEALS

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

    def begin(self) -> None:
        """A new reply: nothing of the box taken yet."""
        self._taken = 0

    def take(self, ref: dict):
        """A copy of the tensor ``ref`` names (ExecutorProtocolError when it is not inside the box, or when the reply
        has already taken the box's size), on ``device``: one host-to-device copy straight out of the box
        there, else a host copy."""
        import torch

        dtype, shape = wire_dtype(ref.get("__m__")), wire_shape(ref.get("shape"))
        off, nbytes = ref.get("offset"), ref.get("nbytes")
        if not all(type(x) is int and x >= 0 for x in (off, nbytes)):
            raise ExecutorProtocolError(f"bad mailbox reference {ref!r:.200}")
        n = _numel(shape)
        if off + nbytes > self.size or n * torch.empty((), dtype=dtype).element_size() != nbytes:
            raise ExecutorProtocolError(f"mailbox reference outside the box or of the wrong size: {ref!r:.200}")
        self._taken += nbytes
        if self._taken > self.size:
            raise ExecutorProtocolError(f"a reply takes more than the mailbox's {self.size} bytes")
        if nbytes == 0:
            return torch.empty(shape, dtype=dtype)
        if os.fstat(self.fd).st_size < off + nbytes:        # unsealable kernels only: a shrunk box is refused
            raise ExecutorProtocolError("the mailbox was truncated")
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


def _count_items(limit: int):
    """msgpack ``list_hook`` / ``object_hook``: each container's entries counted, ExecutorProtocolError past
    ``limit``."""
    seen = [0]

    def hook(obj):
        seen[0] += len(obj) + 1
        if seen[0] > limit:
            raise ExecutorProtocolError(f"a frame of more than {limit} list and map entries")
        return obj
    return hook


def unpack_frame(body, max_items: int = MAX_ITEMS) -> dict:
    """One frame's body as a map: msgpack without ext types, at most ``max_items`` entries (ExecutorProtocolError)."""
    hook = _count_items(max_items)
    try:
        msg = msgpack.unpackb(body, raw=False, strict_map_key=False, max_ext_len=0, list_hook=hook,
                              object_hook=hook)
    except ExecutorProtocolError:
        raise
    except Exception as e:  # noqa: BLE001 - msgpack raises many types on garbage
        raise ExecutorProtocolError(f"not a msgpack frame: {type(e).__name__}") from None
    if not isinstance(msg, dict):
        raise ExecutorProtocolError(f"expected a map, got {type(msg).__name__}")
    return msg


def mailbox_bytes(device_type: str, largest_output: int = 0) -> int:
    """An executor's box: its device's ``MAILBOX_BYTES``, or room for two of the largest output the judge
    asks for at once (``largest_output`` bytes: one step's logits), whole MiB."""
    need = -(-2 * largest_output // (1 << 20)) << 20
    return max(MAILBOX_BYTES.get(device_type, MAILBOX_BYTES["cuda"]), need)


class Channel:
    """One end of the judge <-> executor socket: ``send(map)``, ``recv(timeout) -> map``. With a
    ``mailbox`` (the executor's end), tensors of at least ``MAILBOX_MIN_BYTES`` go through it. ``max_frame``:
    the longest frame this end accepts. A frame is buffered as its bytes arrive and kept across ``recv``
    calls, so a reader polling with short timeouts never loses or blocks on a half-received one."""

    def __init__(self, sock: socket.socket, mailbox: Mailbox | None = None, max_frame: int = MAX_FRAME_BYTES):
        self.sock = sock
        self.mailbox = mailbox
        self.max_frame = max_frame
        self._buf = bytearray()              # the frame being received (header, then body)
        self._progress = 0.0                 # monotonic time its last bytes arrived

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

    def _wanted(self) -> int:
        """Bytes still missing from the frame being received (the header's first)."""
        if len(self._buf) < _LEN.size:
            return _LEN.size - len(self._buf)
        (n,) = _LEN.unpack_from(self._buf)
        if n > self.max_frame:
            raise ExecutorProtocolError(f"frame of {n} bytes exceeds {self.max_frame}")
        return _LEN.size + n - len(self._buf)

    def _stalled(self) -> None:
        if self._buf and time.monotonic() - self._progress > FRAME_STALL_S:
            raise ExecutorProtocolError(f"a frame stalled for {FRAME_STALL_S:g} s after {len(self._buf)} bytes")

    def recv(self, timeout: float | None = None) -> dict:
        """The next message; ``TimeoutError`` when none completed within ``timeout`` seconds (a frame begun
        stays buffered for the next call); ``ExecutorProtocolError`` for a frame that breaks the limits or stalled."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            want = self._wanted()
            if want == 0 and len(self._buf) >= _LEN.size:
                body, self._buf = self._buf, bytearray()
                return unpack_frame(memoryview(body)[_LEN.size:])
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                self._stalled()
                raise TimeoutError("no message within the timeout")
            self.sock.settimeout(left)
            try:
                b = self.sock.recv(min(want, READ_BYTES))
            except socket.timeout:
                self._stalled()
                raise TimeoutError("no message within the timeout") from None
            finally:
                self.sock.settimeout(None)
            if not b:
                raise ChannelClosed("the other side closed the channel")
            self._buf += b
            self._progress = time.monotonic()

    def ready(self) -> bool:
        """Whether bytes of a message (or the other side's close) wait to be read: ``recv`` will not block
        long for its start."""
        if self._buf:
            return True
        readable, _, _ = select.select([self.sock], [], [], 0)
        return bool(readable)

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


def channel_pair() -> tuple[Channel, socket.socket]:
    """(the judge's end, the executor's socket to pass to it as an inherited fd)."""
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    b.set_inheritable(True)
    return Channel(a, max_frame=MAX_REPLY_BYTES), b


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
