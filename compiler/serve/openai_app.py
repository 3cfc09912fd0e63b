"""``tkcc serve``: the OpenAI-compatible HTTP front over the serving engine.

    with ServeServer(build_runtime(ServeOptions(model="smollm2-135m"))) as s:   # tests, benchmarks
        client = openai.OpenAI(base_url=s.url + "/v1", api_key="-")

Routes: ``/v1/completions`` and ``/v1/chat/completions`` (JSON, or server-sent events with
``stream``; ``max_tokens``, ``temperature``, ``top_p``, ``stop``, ``seed``, plus vLLM's ``ignore_eos``;
chat also ``tools`` and ``tool_choice``, see compiler/serve/tool_calls.py),
``/v1/models``, ``/health``, ``/metrics`` (Prometheus text). Every bad request gets a 4xx with an
OpenAI error body ``{"error": {"message", "type", "param", "code"}}``.

Threads: uvicorn's event loop parses requests and streams tokens; one engine thread owns the model,
runs ``engine.step()`` while there is work and hands each token to its request's asyncio queue. A
request whose client went away (a closed stream) is aborted in the engine, freeing its KV blocks.
Stop strings are matched on the detokenized text (held back while a stop string may be starting).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import queue
import threading
import time
import uuid
from dataclasses import dataclass, field

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from compiler.serve.http_server import ThreadedServer, bind
from compiler.serve.metrics import Metrics
from compiler.serve.model import render_chat, template_has_tools
from compiler.serve.runtime import Runtime
from compiler.serve.tool_calls import ToolRequest, parse_tool_calls, parse_tool_request, template_messages
from compiler.serve.validation import ApiError, CompletionArgs, parse_chat, parse_completion

__all__ = ["create_app", "ServeServer", "serve_forever", "EngineLoop"]


@dataclass
class _Stream:
    """One request's token queue on the event loop."""

    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)


class EngineLoop:
    """The engine thread: takes add/abort commands, steps the engine, delivers TokenEvents."""

    def __init__(self, runtime: Runtime, metrics: Metrics):
        self.rt, self.metrics = runtime, metrics
        self.commands: queue.Queue = queue.Queue()
        self.streams: dict[str, _Stream] = {}
        self._stop = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="tkcc-serve-engine", daemon=True)

    def start(self) -> None:
        self.thread.start()

    join_s = 30.0       # how long stop() waits for the step in progress (the thread is a daemon)

    def stop(self) -> None:
        self._stop.set()
        self.commands.put(None)
        self.thread.join(timeout=self.join_s)

    def submit(self, rid: str, prompt: list[int], params, stream: _Stream) -> None:
        self.streams[rid] = stream
        self.commands.put(("add", rid, prompt, params))

    def abort(self, rid: str) -> None:
        if self.streams.pop(rid, None) is not None:
            self.commands.put(("abort", rid))

    def _run(self) -> None:
        eng = self.rt.engine
        with self.rt.overrides():
            while not self._stop.is_set():
                self._drain(block=not eng.has_work())
                if not eng.has_work():
                    continue
                if getattr(eng, "drop_graphs", False):     # a spot check disabled an override (serving thread)
                    eng.graphs, eng.drop_graphs = None, False
                t0 = time.perf_counter()
                try:
                    events = eng.step()
                except Exception as e:  # noqa: BLE001 - a failed step fails its requests, not the server
                    self.error = e
                    events = [ev for rid in list(eng.requests) for ev in self._fail(rid)]
                self.metrics.step(time.perf_counter() - t0, eng.stats())
                for ev in events:
                    s = self.streams.get(ev.rid)
                    if s is not None:
                        s.loop.call_soon_threadsafe(s.queue.put_nowait, ev)
                    if ev.finish_reason is not None:
                        self.streams.pop(ev.rid, None)

    def _fail(self, rid):
        from persistent_engine.serving import TokenEvent

        self.rt.engine.abort(rid)
        return [TokenEvent(rid, None, "error")]

    def _drain(self, block: bool) -> None:
        while True:
            try:
                cmd = self.commands.get(timeout=0.5) if block else self.commands.get_nowait()
            except queue.Empty:
                return
            block = False
            if cmd is None:
                return
            if cmd[0] == "add":
                self.rt.engine.add(cmd[1], cmd[2], cmd[3])
            else:
                self.rt.engine.abort(cmd[1])


def _error(status: int, message: str, type_: str = "invalid_request_error", param: str | None = None,
           code: str | None = None) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": type_, "param": param, "code": code}},
                        status_code=status)


class _Detokenizer:
    """Incremental text of a growing token list, with stop strings: ``push(token) -> (delta, stopped)``."""

    def __init__(self, tokenizer, stop: tuple[str, ...]):
        self.tok, self.stop, self.ids, self.sent = tokenizer, stop, [], 0
        self.hold = max((len(s) for s in stop), default=1) - 1

    def push(self, token: int | None, final: bool) -> tuple[str, bool]:
        if token is not None:
            self.ids.append(token)
        text = self.tok.decode(self.ids)
        for s in self.stop:
            i = text.find(s)
            if i >= 0:
                delta = text[self.sent:i] if i > self.sent else ""
                self.sent = max(self.sent, i)
                return delta, True
        end = len(text) if final else len(text) - self.hold
        if not final and text.endswith("\ufffd"):       # an incomplete UTF-8 sequence: wait for more
            end = min(end, len(text) - 1)
        if end <= self.sent:
            return "", False
        delta, self.sent = text[self.sent:end], end
        return delta, False


def create_app(runtime: Runtime) -> FastAPI:
    metrics = Metrics()
    loop_ = EngineLoop(runtime, metrics)

    @contextlib.asynccontextmanager
    async def lifespan(_app):
        loop_.start()
        try:
            yield
        finally:
            loop_.stop()

    app = FastAPI(title="tkcc serve", docs_url=None, redoc_url=None, openapi_url=None, lifespan=lifespan)
    app.state.runtime, app.state.metrics, app.state.engine_loop = runtime, metrics, loop_
    _add_error_handlers(app)
    _add_info_routes(app, runtime, metrics, loop_)
    _add_generate_routes(app, runtime, metrics, loop_)
    return app


def _add_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def _api_error(_req, exc: ApiError):
        return _error(exc.status, str(exc), exc.type, exc.param, exc.code)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_req, exc: StarletteHTTPException):
        return _error(exc.status_code, str(exc.detail), "invalid_request_error" if exc.status_code < 500 else "server_error")

    @app.exception_handler(Exception)
    async def _internal(_req, exc: Exception):
        return _error(500, f"internal error: {type(exc).__name__}: {exc}", "server_error")


def _add_info_routes(app: FastAPI, runtime: Runtime, metrics: Metrics, loop_: EngineLoop) -> None:
    """GET /health, /v1/models and /metrics."""
    created = int(time.time())

    @app.get("/health")
    async def health():
        return {"status": "ok" if loop_.thread.is_alive() else "engine stopped", "model": runtime.name,
                "random_weights": runtime.source == "random", **runtime.engine.stats()}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{
            "id": runtime.name, "object": "model", "created": created, "owned_by": "tkcc",
            "max_model_len": runtime.engine.cfg.max_model_len, "source": runtime.source,
            "random_weights": runtime.source == "random", "plan": runtime.plan_dir, "overrides": sorted(runtime.plan_overrides), "max_num_seqs": runtime.sched_cfg.max_num_seqs,
            "max_num_batched_tokens": runtime.sched_cfg.max_num_batched_tokens,
            "mixed_batches": runtime.engine.cfg.mixed_batches,
            "variants": [{"batches": [v.lo, v.hi], "overrides": sorted(o)} for v, o in runtime.variants],
            "kv_capacity_tokens": (runtime.engine.kv.num_blocks - 1) * runtime.engine.kv.block_size}]}

    @app.get("/metrics")
    async def prom():
        text = metrics.render(runtime.engine.stats())
        if runtime.checker is not None:
            text += "\n".join(runtime.checker.metrics_lines()) + "\n"
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4")


async def _body(request: Request) -> dict:
    try:
        body = json.loads(await request.body() or b"null")
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ApiError(f"request body is not valid JSON: {e}") from None
    if not isinstance(body, dict):
        raise ApiError("request body must be a JSON object")
    return body


def _add_generate_routes(app: FastAPI, runtime: Runtime, metrics: Metrics, loop_: EngineLoop) -> None:
    """POST /v1/completions and /v1/chat/completions."""

    @app.post("/v1/completions")
    async def completions(request: Request):
        args = parse_completion(await _body(request), runtime)
        return await _generate(_Generation.start(runtime, metrics, loop_, args, chat=False), request)

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        body = await _body(request)
        messages, args = parse_chat(body, runtime)
        tools = parse_tool_request(body)
        native = tools is not None and tools.active and template_has_tools(runtime.tokenizer)
        listed = [{"type": "function", "function": t} for t in tools.tools] if native else None
        text = render_chat(runtime.tokenizer, template_messages(messages, tools, native), listed)
        prompt = runtime.tokenizer.encode(text + (tools.prefix() if tools else ""))
        g = _Generation.start(runtime, metrics, loop_, args.with_prompt(prompt, runtime), chat=True,
                              tools=tools if tools is not None and tools.active else None)
        return await _generate(g, request)


@dataclass(frozen=True)
class _Generation:
    """One request submitted to the engine loop: its stream of events, the response head and the usage
    counts (updated as tokens arrive)."""

    rid: str
    args: CompletionArgs
    chat: bool
    stream: _Stream
    t0: float
    head: dict
    usage: dict
    metrics: Metrics
    loop_: EngineLoop
    detok: _Detokenizer
    tools: ToolRequest | None = None      # the answer is parsed into tool_calls (streamed whole, at the end)

    @classmethod
    def start(cls, runtime: Runtime, metrics: Metrics, loop_: EngineLoop, args: CompletionArgs, chat: bool,
              tools: ToolRequest | None = None):
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        stream = _Stream(asyncio.get_running_loop())
        t0 = time.perf_counter()
        loop_.submit(rid, args.prompt, args.params, stream)
        metrics.request_started()
        obj = "chat.completion.chunk" if chat else "text_completion"
        head = {"id": rid, "object": obj, "created": int(time.time()), "model": runtime.name}
        usage = {"prompt_tokens": len(args.prompt), "completion_tokens": 0,
                 "total_tokens": len(args.prompt)}
        return cls(rid, args, chat, stream, t0, head, usage, metrics, loop_, _Detokenizer(runtime.tokenizer, args.stop),
                   tools)

    def tool_choice(self, text: str, reason: str, final_body: bool) -> dict:
        """The whole answer of a request with tools: its tool calls parsed, the rest as content."""
        content, calls = parse_tool_calls(self.tools.prefix() + text)
        self.metrics.tool_answer(len(calls))
        reason = "tool_calls" if calls else reason
        if final_body:
            msg = {"role": "assistant", "content": content, **({"tool_calls": calls} if calls else {})}
            return {"index": 0, "message": msg, "finish_reason": reason}
        delta = {"content": content} if content else {}
        if calls:
            delta["tool_calls"] = [{"index": i, **c} for i, c in enumerate(calls)]
        return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}

    def choice(self, delta: str, reason: str | None, final_body: bool) -> dict:
        if not self.chat:
            return {"index": 0, "text": delta, "logprobs": None, "finish_reason": reason}
        if final_body:
            return {"index": 0, "message": {"role": "assistant", "content": delta}, "finish_reason": reason}
        return {"index": 0, "delta": {"content": delta} if delta else {}, "logprobs": None, "finish_reason": reason}


async def _tokens(g: _Generation):
    """(delta text, finish reason or None) as tokens arrive; aborts the request if left early."""
    last = None
    finished = False
    try:
        while True:
            ev = await g.stream.queue.get()
            now = time.perf_counter()
            if ev.token is not None:
                g.usage["completion_tokens"] += 1
                g.metrics.token(now - (last or g.t0), first=last is None)
                last = now
            if ev.finish_reason in ("rejected", "error"):
                finished = True
                raise ApiError("the request cannot be served: "
                               + ("it does not fit the KV cache" if ev.finish_reason == "rejected"
                                  else f"engine error {g.loop_.error}"), status=400 if ev.finish_reason == "rejected" else 500)
            delta, stopped = g.detok.push(ev.token, final=ev.finish_reason is not None)
            if stopped:
                g.loop_.abort(g.rid)
                finished = True
                yield delta, "stop"
                return
            if ev.finish_reason is not None:
                finished = True
                yield delta, "stop" if ev.finish_reason == "stop" else "length"
                return
            if delta:
                yield delta, None
    finally:
        if not finished:
            g.loop_.abort(g.rid)
        g.usage["total_tokens"] = g.usage["prompt_tokens"] + g.usage["completion_tokens"]
        g.metrics.request_finished(time.perf_counter() - g.t0)


async def _generate(g: _Generation, request: Request):
    if not g.args.stream:
        return await _whole_body(g, request)
    return StreamingResponse(_sse(g), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


async def _whole_body(g: _Generation, request: Request) -> dict:
    """The non-streaming response: every delta joined (stops early when the client disconnects)."""
    parts, reason = [], "length"
    gen = _tokens(g)
    try:
        async for delta, r in gen:
            parts.append(delta)
            reason = r or reason
            if await request.is_disconnected():
                break
    finally:
        await gen.aclose()
    obj_final = "chat.completion" if g.chat else "text_completion"
    choice = g.tool_choice("".join(parts), reason, True) if g.tools else g.choice("".join(parts), reason, True)
    return {**g.head, "object": obj_final, "choices": [choice], "usage": g.usage}


async def _sse(g: _Generation):
    """The streaming response: one server-sent event per delta, an error event, usage, then [DONE]."""
    gen = _tokens(g)
    try:
        if g.chat:
            first = {**g.head, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                            "logprobs": None, "finish_reason": None}]}
            yield f"data: {json.dumps(first)}\n\n"
        try:
            if g.tools:                       # tool calls are known once the answer is whole: one chunk
                parts, reason = [], "length"
                async for delta, r in gen:
                    parts.append(delta)
                    reason = r or reason
                yield f"data: {json.dumps({**g.head, 'choices': [g.tool_choice(''.join(parts), reason, False)]})}\n\n"
            else:
                async for delta, reason in gen:
                    yield f"data: {json.dumps({**g.head, 'choices': [g.choice(delta, reason, False)]})}\n\n"
        except ApiError as e:
            yield f"data: {json.dumps({'error': {'message': str(e), 'type': e.type}})}\n\n"
        if g.args.include_usage:
            yield f"data: {json.dumps({**g.head, 'choices': [], 'usage': g.usage})}\n\n"
        yield "data: [DONE]\n\n"
    finally:
        await gen.aclose()


class ServeServer(ThreadedServer):
    """The server on a background thread (tests, benchmarks): ``with ServeServer(rt) as s: s.url``."""

    name = "tkcc-serve"
    start_timeout_s = 60.0
    stop_timeout_s = 30.0
    graceful_shutdown_s = 5

    def __init__(self, runtime: Runtime, host: str = "127.0.0.1", port: int = 0):
        super().__init__(create_app(runtime), host, port)


def serve_forever(runtime: Runtime, host: str, port: int) -> None:
    """Serve in the foreground until Ctrl-C or SIGTERM (which a step in progress does not delay: a CPU prefill
    of a few thousand tokens takes tens of seconds, and the process exits without it)."""
    app = create_app(runtime)
    app.state.engine_loop.join_s = 2.0
    sock = bind(host, port)
    h, p = sock.getsockname()[:2]
    print(f"tkcc serve: {runtime.name} ({runtime.source}{', plan ' + runtime.plan_dir if runtime.plan_dir else ''}) "
          f"at http://{h}:{p}/v1  (Ctrl-C stops)", flush=True)
    if runtime.source == "random":
        print("tkcc serve: RANDOM WEIGHTS (seeded): the answers are noise, not the model's; serve a checkpoint with "
              "--model CHECKPOINT_DIR or --weights PATH", flush=True)
    try:
        # SIGTERM: open requests get 5 s, the engine thread 2 s
        uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on",
                                      timeout_graceful_shutdown=5)).run(sockets=[sock])
    finally:
        sock.close()
