"""The executor process: the only place candidate code runs (``python -m persistent_engine.executor.worker``).

Started by the judge (``launch.py``) inside the OS sandbox with two inherited file descriptors: a socket to
the judge (``channel.Channel``) and the judge's sealed arena (weights, KV caches, step inputs; read-only
here). It builds the model slice on the arena's weights (zero-copy on CPU, one host-to-device copy on
CUDA), re-creates each workload and overwrites every tensor of it with the judge's bytes (so the inputs
are the judge's), warms kernels, and then answers one request at a time:

  load      the candidate as a fresh module (guards snapshot taken before, checked after), CONFIG applied
  op_checks ``contract.run_candidate`` for each (shape, dtype, seed) of one op: outputs of each first run
            (as many cases as the mailbox holds; the judge asks again for the rest)
  steps     per (point i, variant v): one step with every override counted (and ``moe_route`` replayed to
            the reference routing the judge sent): logits, call counts, the routing it chose (as many as the
            mailbox holds; the judge asks again for the rest)
            (the baseline executor's, with no overrides, is the reference routing sent to candidates)
  capture   CUDA graphs of the given points with the overrides (the baseline executor: at start-up)
  precompile the timed step compiled with some ops' reference functions opaque (never after a load): the
            graphs a candidate overriding those ops needs, for the judge's compile cache (compile_cache.py)
  run       k back-to-back steps (graph replays where captured) of point i, variant v, each on the token
            ids the judge sent for it (chained: plus argmax of row 0 of the previous run's logits), each
            output copied into the judge's ring (``out_ring.py``: the judge reads it at the reply);
            replies once the device is idle
  warm      compile ahead (a candidate queued behind the one being judged): each override run once at every
            case its op-level check will draw and one step of each point that calls it; outputs dropped,
            a case that raises passed over (verify says why); replies with counts only
  guards    what this process's own guards saw (global state, threads): reasons that can only reject
  memory    its caching allocator's bytes (allocated now, reserved now and at peak; 0 on CPU): sizes the
            judge's pool (judge/memory.py ``measured_overhead``, asked of the baseline executor only)

Nothing this process reports decides a verdict in the candidate's favour: outputs are compared and times
measured by the judge; the reports it makes about itself (guards, call counts) can only reject.
"""

from __future__ import annotations

import argparse
import dataclasses
import faulthandler
import inspect
import os
import sys
import traceback

from persistent_engine.executor import wire
from persistent_engine.executor.channel import ALIGN, MAILBOX_BYTES, PREFAULT_BYTES, Arena, Channel, Mailbox
from persistent_engine.executor.compiled_step import compiled_step, opaque, warm_compiler
from persistent_engine.executor.out_ring import open_ring, runs_view

DEVICE_ERRORS = ("CUDA error", "illegal memory access", "device-side assert", "CUBLAS_STATUS",
                 "unspecified launch failure", "misaligned address", "illegal instruction")


class Worker:
    def __init__(self, init: dict, arena, out_ring):
        import torch

        from persistent_engine.measure import timing
        from persistent_engine.verification import guards
        from persistent_engine.io_struct import WorkloadPoint
        from persistent_engine.models.decoder import _resolve_layers, make_decoder
        from persistent_engine.models.spec import ModelSpec
        from persistent_engine.ops import registry
        from persistent_engine.inputs.workloads import make_workload

        self.torch, self.guards, self.timing, self.registry = torch, guards, timing, registry
        self.device = torch.device(init["device"])
        self.dtype = getattr(torch, init["dtype"])
        if self.device.type == "cpu":
            torch.set_num_threads(int(init.get("threads", 1)))
        torch.set_grad_enabled(False)
        spec = ModelSpec.from_name(init["model"], init.get("model_config"))
        layers = _resolve_layers(spec, init["layers"])
        self.spec = spec
        shared = arena.tensors()
        if init.get("weights"):                  # CUDA: the judge's device copy, mapped (device_share.py)
            from persistent_engine.executor.device_share import import_weights
            params = import_weights(init["weights"], self.device)
        else:
            params = {k[len("weight."):]: (t if self.device.type == "cpu" else t.to(self.device))
                      for k, t in shared.items() if k.startswith("weight.") and k != "weight.cos_sin"}
        self.model = make_decoder(spec, layers, params, self.device, self.dtype)
        # the timed step (run, capture, warm): compiled by inductor where the judge asks (compiled_step.py)
        self.compiled = bool(init.get("compiled"))
        self.timed_step = compiled_step(self.model) if self.compiled else self.model.step
        if self.compiled:
            warm_compiler(self.device)
        # compiled mode: points run eagerly on every executor of this judge (the baseline's could not compile
        # them), and the ones this executor could not compile itself (its candidate's graph breaks elsewhere)
        self.eager_points = set(init.get("eager_points") or [])
        self.uncompiled: dict[int, str] = {}
        self.points = [WorkloadPoint.from_dict(p) for p in init["points"]]     # msgpack maps: the wire
        self.workloads = []
        for i, p in enumerate(self.points):
            row = []
            for v in range(init["variants"]):
                w = make_workload(self.model, p, seed=init["seed"] * 1000 + 17 * i + v)
                for name, t in guards.tensors_of(w).items():     # the judge's inputs, not ours
                    t.copy_(shared[f"point{i}.v{v}.{name}"])
                row.append(w)
            self.workloads.append(row)
        self.op_params = {n: _param_names(inspect.signature(registry.get(n).reference)) for n in registry.names()}
        for ws in self.workloads:               # kernels warm (the new tokens' K/V slots written)
            for w in ws:
                self.model.step(w)
        _warm_triton(self.device)
        self.graphs: dict[int, list] = {}
        self.graph_errors: dict[int, str] = {}
        self.pool = torch.cuda.graph_pool_handle() if self.device.type == "cuda" else None
        self.candidate = None
        if init.get("capture"):
            self.capture(wire.Capture(points=list(range(len(self.points)))))
        self.out_ring = out_ring          # the judge's memory: every timed run's output goes there
        from persistent_engine import scratch
        self._dir = scratch.module_dir()          # in its workdir (TMPDIR): removed with it by the judge
        self._sync()
        import persistent_engine.ops.contract  # noqa: F401 - imported before the snapshot: watched
        import persistent_engine.verification.tolerance  # noqa: F401
        import persistent_engine.verification.verify  # noqa: F401
        self.state_guard = guards.GlobalStateGuard(guards.default_namespaces())
        self.thread_guard = guards.ThreadGuard()
        self.native_threads = _native_threads()         # tids at the end of warm-up

    def _timed_overrides(self) -> dict:
        """The candidate's overrides as the timed step calls them (compiled: each opaque to dynamo)."""
        overrides = self.candidate.overrides if self.candidate is not None else {}
        return opaque(overrides) if self.compiled else dict(overrides)

    def _sync(self) -> None:
        if self.device.type == "cuda":
            self.timing._synchronize(self.device)

    # ------------------------------------------------------------------------------ requests
    def load(self, msg: wire.Load) -> wire.Loaded:
        from persistent_engine import candidate as cand_mod
        from persistent_engine.inputs.workloads import relayout_workload

        loaded = cand_mod.load_candidate(msg.source, msg.name, self._dir, self.op_params)
        reasons = self.guard_reasons("load")
        if isinstance(loaded, list):
            return wire.Loaded(reasons=[str(r) for r in loaded + reasons])
        self.candidate = loaded
        bs = loaded.config.get("kv_block_size")
        if bs is not None and not reasons:
            if not 1 <= bs <= 4096:
                reasons.append(f"load: CONFIG['kv_block_size'] = {bs} is outside 1..4096")
            else:
                self.workloads = [[relayout_workload(self.model, w, bs, seed=9173 + 31 * i + v)
                                   for v, w in enumerate(ws)] for i, ws in enumerate(self.workloads)]
        return wire.Loaded(reasons=reasons, ops=sorted(loaded.overrides), config=dict(loaded.config),
                           description=str(loaded.description)[:2000])

    def op_checks(self, msg: wire.OpChecks) -> wire.OpResults:
        """``contract.run_candidate`` for each case (shape, dtype, seed) of one op, in order: the first
        run's outputs of each, or its reason. Stops before a case whose outputs would take the replies
        past ``reply_bytes`` (the mailbox): the judge asks again for the cases not answered."""
        from persistent_engine.ops.contract import run_candidate

        d = self.registry.get(msg.name)
        impl = self.candidate.overrides[msg.name]
        results, used = [], 0
        for case in msg.cases:
            first, reason = run_candidate(d, impl, case.shape, getattr(self.torch, case.dtype), self.device, case.seed)
            if reason is not None:
                results.append(wire.CaseResult(reason=str(reason)))
                continue
            tensors = [o for o in first if isinstance(o, self.torch.Tensor)]
            nbytes = sum(o.numel() * o.element_size() + ALIGN for o in tensors)
            if results and used + nbytes > self.reply_bytes:
                break
            used += nbytes
            # cloned: a candidate that hands back one buffer every call answered this case with its values now
            results.append(wire.CaseResult(
                outputs=[o.clone() if isinstance(o, self.torch.Tensor) else None for o in first],
                devices=[str(o.device) if isinstance(o, self.torch.Tensor) else "" for o in first]))
        return wire.OpResults(results=results)

    def warm(self, msg: wire.Warm) -> wire.Warmed:
        """Compile the loaded candidate's kernels ahead of its verification (Triton's cache and this
        process's loaded kernels are what verify and bench then find): each override once at every (dtype,
        shape) its op-level check draws (``verify.op_shapes`` within the judge's ``budget``, ``op_dtypes``; a
        case whose op's ``check_bytes`` is over ``budget`` even at its smallest fit is skipped: the executors
        compiling ahead share one check's memory, and a GLM-5.2 expert check at 16 experts holds ~19 GB),
        then one step of variant 0 at each point whose ops (``ops_at``, the judge's) it overrides. Inputs
        from the op's generator with seeds from ``seed`` (the judge's draw, not verify's, which comes later).
        Nothing here is compared or timed: it can only cost the candidate time. Stops at a device error (the
        context is gone; verify reports it)."""
        from persistent_engine.verification import verify

        c = self.candidate
        done = {"cases": 0, "steps": 0, "failed": 0, "skipped": 0}
        if c is None:
            return wire.Warmed(**done)
        seed, budget = msg.seed, msg.budget

        def attempt(fn) -> bool:
            try:
                fn()
                self._sync()
                return True
            except Exception as e:  # noqa: BLE001 - verify judges this candidate, not the warm-up
                done["failed"] += 1
                if any(s in f"{type(e).__name__}: {e}" for s in DEVICE_ERRORS):
                    raise
                return False

        for name in sorted(c.overrides):
            op, impl = self.registry.get(name), c.overrides[name]
            for dtype in verify.op_dtypes(self.dtype):
                for j, shape in enumerate(verify.op_shapes(op, self.spec, self.points, budget)):
                    if budget is not None and op.check_bytes is not None and op.check_bytes(shape) > budget:
                        done["skipped"] += 1        # even its smallest fit is over this warm-up's share
                        continue
                    done["cases"] += attempt(lambda: impl(*op.make_inputs(shape, dtype, self.device, seed + j)))
        ops_at = [set(at) for at in msg.ops_at]
        for i, at in enumerate(ops_at[:len(self.workloads)]):
            if at & set(c.overrides):
                w = self.workloads[i][0]

                def one_step(w=w, i=i) -> None:       # compiled: the candidate's graphs compiled ahead too
                    with self.registry.override(self._timed_overrides()):
                        self._step_of(i)(w)
                done["steps"] += attempt(one_step)
        return wire.Warmed(**done)

    def step(self, msg: wire.StepAsk) -> wire.StepResult:
        from persistent_engine.verification import verify
        from persistent_engine.executor.routes import calls_from_wire, calls_to_wire

        i, v = msg.i, msg.v
        overrides = self.candidate.overrides if self.candidate is not None else {}     # baseline: the reference
        counted = {n: self.guards.Counted(fn) for n, fn in overrides.items()}
        w = self.workloads[i][v]
        routes = None
        rows = self.guards.CacheRows(w) if msg.check_cache else None     # declared in-place cache writes
        if msg.moe:
            refs = calls_from_wire(msg.refs, self.device)
            out, rec = verify.routed_step(self.registry, self.model, w, counted, refs)
            routes = wire.Routes(calls=calls_to_wire(rec.calls), replayed=isinstance(rec, verify.RouteReplay))
        else:
            with self.registry.override(counted):
                out = self.model.step(w)
        self._sync()
        return wire.StepResult(logits=out if isinstance(out, self.torch.Tensor) else None, type=type(out).__name__,
                               calls={n: int(c.calls) for n, c in counted.items()}, routes=routes,
                               cache=rows.changed() if rows is not None else [])

    def steps(self, msg: wire.Steps) -> wire.StepResults:
        """``step`` for each of ``msg.steps`` in order, until the logits gathered would take the reply
        past ``reply_bytes`` (at least one answered): the judge asks again for the rest."""
        results, used = [], 0
        for one in msg.steps:
            r = self.step(one)
            out = r.logits
            if out is not None:                 # a candidate's lm_head may hand back one buffer every step
                out = out.clone()
                r = dataclasses.replace(r, logits=out)
            nbytes = out.numel() * out.element_size() + ALIGN if out is not None else 0
            if results and used + nbytes > self.reply_bytes:
                break
            used += nbytes
            results.append(r)
        return wire.StepResults(results=results)

    def capture(self, msg: wire.Capture) -> wire.Captured:
        """Compiled mode: each point's timed step compiled (run once); on CUDA then captured in CUDA graphs."""
        todo = [i for i in msg.points if i not in self.graphs]
        self.registry.set_overrides(self._timed_overrides())
        try:
            self._compile(todo)
            if self.device.type != "cuda":
                return wire.Captured(uncompiled={str(k): v for k, v in self.uncompiled.items()})
            graphs, healthy = self.timing.capture_points(
                todo, lambda i: [self.timing.capture_graph(lambda w=w, f=self._step_of(i): f(w), self.device, self.pool)
                                 for w in self.workloads[i]],
                lambda: self.timing.recover_after_capture(self.device), self.graph_errors)
        finally:
            self.registry.clear_overrides()
        self.graphs.update({i: g for i, g in graphs.items() if g is not None})
        return wire.Captured(graphed=sorted(self.graphs), errors={str(k): str(v) for k, v in self.graph_errors.items()},
                             healthy=bool(healthy), uncompiled={str(k): v for k, v in self.uncompiled.items()})

    def precompile(self, msg: wire.Precompile) -> wire.Captured:
        """A trusted compile for the judge's compile cache: the points' timed steps compiled with the reference
        functions of ``msg.ops`` opaque (what a candidate overriding those ops traces to the same graphs).
        Only in an executor that never loaded a candidate: its caches are copied for others to read."""
        if self.candidate is not None or not self.compiled:
            return wire.Failed(error="precompile: only a compiled-mode executor with no candidate compiles for the "
                                     "cache", kind="candidate")
        unknown = [op for op in msg.ops if op not in self.op_params]
        if unknown:
            return wire.Failed(error=f"precompile: unknown op(s) {unknown}", kind="candidate")
        self.registry.set_overrides(opaque({op: self.registry.get(op).reference for op in msg.ops}))
        try:
            self._compile([i for i in msg.points if 0 <= i < len(self.points)])
        finally:
            self.registry.clear_overrides()
        return wire.Captured(uncompiled={str(k): v for k, v in self.uncompiled.items()})

    def _step_of(self, i: int):
        """The timed step of point i: compiled, unless this point runs eagerly here."""
        return self.timed_step if self.compiled and i not in self.eager_points else self.model.step

    def _compile(self, points: list[int]) -> None:
        """Compiled mode: each point's timed step run once (with the overrides set), which compiles it; a point
        inductor cannot compile runs eagerly here from now on (why: ``uncompiled``)."""
        for i in points if self.compiled else ():
            if i in self.eager_points:
                continue
            try:
                self.timed_step(self.workloads[i][0])
                self._sync()
            except Exception as e:  # noqa: BLE001 - inductor refused this graph: eager here, said why
                text = f"{type(e).__name__}: {e}"
                if any(s in text for s in DEVICE_ERRORS):
                    raise
                self.eager_points.add(i)
                self.uncompiled[i] = wire.excerpt(text, 300)

    def run(self, msg: wire.TimedRun) -> wire.Ran:
        """k back-to-back steps, run r's output copied into slot r of the judge's ring (``out_ring``); with
        ``chain`` (the vocabulary size), run r's ids are the judge's draw plus argmax(row 0 of run r-1's
        output), mod ``chain`` (computed on the device: no host sync between runs)."""
        i, v, k = msg.i, msg.v, msg.k
        ids, chain = msg.ids, msg.chain
        g = None if msg.eager else self.graphs.get(i)
        w = self.workloads[i][v]
        if ids is not None:
            ids = ids.to(self.device)
        torch = self.torch
        ring = runs_view(self.out_ring, k, msg.shape, getattr(torch, msg.dtype))

        def feed(r: int) -> None:
            if ids is None:
                return
            if chain is None or r == 0:
                w.token_ids.copy_(ids[r])
            else:
                w.token_ids.copy_(torch.remainder(ids[r] + torch.argmax(ring[r - 1][0]), int(chain)))

        if g is not None:
            graph, static = g[v]
            for r in range(k):
                feed(r)
                graph.replay()
                ring[r].copy_(static)
        else:
            with self.registry.override(self._timed_overrides()):
                step = self._step_of(i)
                for r in range(k):
                    feed(r)
                    ring[r].copy_(step(w))
        self._sync()
        return wire.Ran(k=k, graph=g is not None)

    def guard_reasons(self, when: str) -> list[str]:
        reasons = []
        changed = self.state_guard.check()
        if changed:
            reasons.append(f"{when}: candidate changed global state: {', '.join(changed[:8])}")
            self.state_guard.restore()
        current = {n: self.registry.current(n) for n in self.registry.names()}
        touched = [n for n, fn in current.items() if fn is not self.registry.get(n).baseline]
        if touched:
            reasons.append(f"{when}: candidate changed the op registry: {', '.join(touched)}")
            self.registry.clear_overrides()
        threads = self.thread_guard.new_threads()
        if threads:
            reasons.append(f"candidate left {len(threads)} thread(s) running: {', '.join(threads[:5])}")
        native = _raw_threads(self.native_threads)
        if native:                              # raw _thread ones: not in threading.enumerate()
            reasons.append(f"{when}: candidate left {len(native)} native thread(s) running")
        return reasons

    def guards_request(self, msg: wire.Guards) -> wire.GuardsReply:
        return wire.GuardsReply(reasons=self.guard_reasons(msg.when))

    def memory_request(self, msg: wire.Memory) -> wire.MemoryReply:
        """This process's device bytes by torch's caching allocator (all 0 on CPU)."""
        cuda = self.torch.cuda
        if self.device.type != "cuda":
            return wire.MemoryReply()
        return wire.MemoryReply(allocated=int(cuda.memory_allocated(self.device)),
                                reserved=int(cuda.memory_reserved(self.device)),
                                peak_reserved=int(cuda.max_memory_reserved(self.device)))


def _native_threads() -> set[int]:
    """Thread ids of this process (``/proc/self/task``), raw ``_thread`` ones included."""
    try:
        return {int(t) for t in os.listdir("/proc/self/task")}
    except OSError:
        return set()


def _comm(tid: int) -> str:
    try:
        with open(f"/proc/self/task/{tid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


def _raw_threads(before: set[int]) -> list[int]:
    """Threads started since ``before`` that ``threading`` does not know and that carry the process's own
    name (a raw ``_thread``); native library threads (CUDA, Triton, OpenMP) name themselves and are left
    alone, Python-level ones are ``ThreadGuard``'s."""
    import threading

    known = {t.native_id for t in threading.enumerate()}
    main = _comm(os.getpid())
    return [t for t in sorted(_native_threads() - before) if t not in known and _comm(t) == main]


def _param_names(sig) -> list[str]:
    from persistent_engine.candidate import param_names

    return param_names(sig)


def _warm_triton(device) -> None:
    from persistent_engine.devices import warm_triton

    warm_triton(device)


def serve(chan, arena, init: dict, out_ring) -> int:
    worker = Worker(init, arena, out_ring)
    # op_checks' outputs of one reply: 3/4 of the mailbox (alignment and the rest of the reply: slack)
    worker.reply_bytes = 3 * (chan.mailbox.size if chan.mailbox is not None else MAILBOX_BYTES["cpu"]) // 4
    chan.send(wire.to_wire(wire.Ready(nonce=int(init["nonce"]), pid=os.getpid())))
    handlers = {wire.Load: worker.load, wire.OpChecks: worker.op_checks, wire.Steps: worker.steps,
                wire.Capture: worker.capture, wire.Precompile: worker.precompile, wire.TimedRun: worker.run,
                wire.Warm: worker.warm, wire.Guards: worker.guards_request, wire.Memory: worker.memory_request}
    while True:
        req = wire.decode_request(chan.recv())
        if isinstance(req, wire.Exit):
            return 0
        try:
            reply = handlers[type(req)](req)
        except worker.torch.OutOfMemoryError as e:
            reply = wire.Failed(error=f"out of memory: {str(e)[:300]}", kind="oom")
        except BaseException as e:  # noqa: BLE001 - SystemExit of a candidate too: a verdict, not a crash
            text = f"{type(e).__name__}: {e}"
            print("".join(traceback.format_exception(e))[-4000:], file=sys.stderr, flush=True)
            kind = "device" if any(s in text for s in DEVICE_ERRORS) else "candidate"
            reply = wire.Failed(error=text[:1000], kind=kind)
        chan.send(wire.to_wire(dataclasses.replace(reply, nonce=req.nonce)))


def _init_then_serve(args) -> None:
    """As PID 1 of the sandbox's PID namespace the kernel drops every signal this process sends itself
    without a handler (an abort or a segfault a candidate provokes would not end it, and its cause would be
    lost): PID 1 forks, the child serves, and PID 1 exits as the child ended (a signal s as 128 + s, which
    ``launch.describe_exit`` reads back)."""
    pid = os.fork()
    if pid == 0:
        return                              # the child: serve
    for fd in (args.fd, args.arena_fd, args.mailbox_fd, args.ring_fd):     # EOF reaches the judge when the child dies
        if fd is not None:
            os.close(fd)
    while True:
        try:
            _, status = os.waitpid(pid, 0)
            break
        except ChildProcessError:
            os._exit(0)
        except InterruptedError:
            continue
    if os.WIFSIGNALED(status):
        os._exit(128 + os.WTERMSIG(status))
    os._exit(os.waitstatus_to_exitcode(status))


def _die_with_parent() -> None:
    """SIGKILL when the judge goes (prctl PR_SET_PDEATHSIG): no executor outlives it, stopped or hung."""
    import ctypes
    import signal

    parent = os.getppid()
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL), 0, 0, 0)
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:
        os._exit(0)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m persistent_engine.executor.worker")
    ap.add_argument("--fd", type=int, required=True)
    ap.add_argument("--arena-fd", type=int, required=True)
    ap.add_argument("--mailbox-fd", type=int, default=None)
    ap.add_argument("--ring-fd", type=int, default=None)
    args = ap.parse_args(argv)
    if os.getpid() == 1:
        _init_then_serve(args)
    faulthandler.enable(file=sys.stderr)
    _die_with_parent()
    chan = Channel.from_fd(args.fd)
    init = chan.recv()
    arena = Arena.open(args.arena_fd, init["arena_size"], init["manifest"])
    if args.mailbox_fd is not None:         # large reply tensors go through the judge's memfd
        chan.mailbox = Mailbox(args.mailbox_fd, init["mailbox_size"])
        chan.mailbox.prefault(PREFAULT_BYTES["cuda" if str(init["device"]).startswith("cuda") else "cpu"])
    ring = open_ring(init["ring"], args.ring_fd, init["device"])
    try:
        code = serve(chan, arena, init, ring)
    except EOFError:                        # the judge went away: nothing left to do
        code = 0
    os._exit(code)                          # no atexit handler of a candidate runs


if __name__ == "__main__":
    main()
