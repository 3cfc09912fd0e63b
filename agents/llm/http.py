"""POST a JSON request to an LLM endpoint with retries: exponential backoff with jitter on HTTP 429,
5xx (and Anthropic's 529), connection errors, timeouts and bodies that are not the JSON expected.
Other 4xx answers (bad key, bad request) fail at once: retrying cannot fix them."""

from __future__ import annotations

import json
import logging
import random
import threading
from dataclasses import dataclass
from typing import Any, Callable

import httpx

from agents.llm.messages import LLMError, LLMReply, Message, ToolSpec

log = logging.getLogger("tkcc.agents.llm")

RETRY_STATUSES = frozenset({408, 409, 429, 500, 502, 503, 504, 529})


@dataclass(frozen=True)
class RetryPolicy:
    """``max_retries`` extra attempts after the first; delay ``base_s * 2**n`` (x jitter 0.5-1),
    capped at ``cap_s``; a ``retry-after`` header (seconds) is honoured up to ``cap_s``."""

    max_retries: int = 4
    base_s: float = 1.0
    cap_s: float = 30.0
    timeout_s: float = 120.0

    def delay(self, attempt: int, retry_after: str | None = None) -> float:
        if retry_after:
            try:
                return min(max(float(retry_after), 0.0), self.cap_s)
            except ValueError:
                pass
        return min(self.base_s * 2 ** attempt, self.cap_s) * (0.5 + random.random() / 2)


class _Retryable(Exception):
    def __init__(self, message: str, status: int | None = None, retry_after: str | None = None):
        super().__init__(message)
        self.status, self.retry_after = status, retry_after


def post_json(client: httpx.Client, url: str, headers: dict, body: dict, policy: RetryPolicy,
              parse: Callable[[dict], Any], *, stop: threading.Event | None = None) -> Any:
    """POST ``body`` and return ``parse(response_json)``; ``parse`` raises ValueError/KeyError/TypeError
    on a malformed body, which is retried like a 5xx. Raises :class:`LLMError` when attempts run out."""
    last: _Retryable | None = None
    for attempt in range(policy.max_retries + 1):
        if attempt:
            wait = policy.delay(attempt - 1, last.retry_after if last else None)
            log.info("retrying %s in %.2fs after %s", url, wait, last)
            if (stop or threading.Event()).wait(wait):
                raise LLMError(f"stopped while retrying {url}: {last}",
                               status=last.status if last else None, attempts=attempt)
        try:
            resp = client.post(url, headers=headers, json=body, timeout=policy.timeout_s)
        except httpx.TransportError as exc:  # connect errors, timeouts, broken connections
            last = _Retryable(f"{type(exc).__name__}: {exc}")
            continue
        if resp.status_code in RETRY_STATUSES:
            last = _Retryable(f"HTTP {resp.status_code}: {_snippet(resp.text)}", resp.status_code,
                              resp.headers.get("retry-after"))
            continue
        if resp.status_code >= 400:
            raise LLMError(f"HTTP {resp.status_code} from {url}: {_snippet(resp.text)}",
                           status=resp.status_code, attempts=attempt + 1)
        try:
            return parse(json.loads(resp.text))
        except (ValueError, KeyError, TypeError, IndexError) as exc:
            last = _Retryable(f"malformed response ({type(exc).__name__}: {exc}): "
                              f"{_snippet(resp.text)}", resp.status_code)
    attempts = policy.max_retries + 1
    raise LLMError(f"{url} failed after {attempts} attempts: {last}",
                   status=last.status if last else None, attempts=attempts)


def _snippet(text: str, n: int = 300) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[:n] + "..."


class WireChat:
    """A chat endpoint over ``post_json``. Subclasses bind their wire format as ``to_wire(system,
    messages, tools, config) -> body`` and ``from_wire(data, tools) -> LLMReply`` and call
    ``WireChat.__init__(config, url, headers)``; ``config`` carries ``model`` and ``retry``."""

    to_wire: Callable[..., dict]
    from_wire: Callable[[dict, list], LLMReply]

    def __init__(self, config: Any, url: str, headers: dict[str, str]):
        self.config, self.url, self._headers = config, url, headers
        self._client = httpx.Client()

    @property
    def model(self) -> str:
        return self.config.model

    def complete(self, system: str, messages: list[Message], tools: list[ToolSpec], *,
                 stop: threading.Event | None = None) -> LLMReply:
        body = self.to_wire(system, messages, tools, self.config)
        return post_json(self._client, self.url, self._headers, body, self.config.retry,
                         lambda data: self.from_wire(data, tools), stop=stop)

    def close(self) -> None:
        self._client.close()
