"""One call through an official SDK client (``anthropic`` or ``openai``), its failures as :class:`LLMError`.

The SDKs retry by themselves: HTTP 408, 409, 429 and 5xx (Anthropic's 529 too), connection errors and
timeouts, ``max_retries`` extra attempts with exponential backoff that honours ``retry-after`` /
``retry-after-ms``; ``timeout`` bounds each attempt. What they do not retry is a 200 whose body is not
the JSON expected (a broken proxy, a truncated reply): :func:`sdk_call` retries that itself, the same
``max_retries`` times. Every other failure (a bad key, a bad request, retries spent) raises
:class:`LLMError` with the HTTP status and the number of attempts, one line.
"""

from __future__ import annotations

import json
import logging
from types import ModuleType
from typing import Any, Callable

from agents.llm.messages import LLMError

log = logging.getLogger("tkcc.agents.llm")

RETRIED_STATUSES = frozenset({408, 409, 429}) | frozenset(range(500, 600))


def _attempts(status: int | None, max_retries: int) -> int:
    return max_retries + 1 if status is None or status in RETRIED_STATUSES else 1


def _snippet(text: str, n: int = 300) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= n else text[:n] + "..."


def sdk_call(create: Callable[[], Any], parse: Callable[[Any], Any], sdk: ModuleType, *, what: str,
             max_retries: int) -> Any:
    """``parse(create())``: ``create`` makes one SDK request (retried inside the SDK), ``parse`` turns
    the SDK's response object into an ``LLMReply`` (raising ValueError/KeyError/TypeError/
    AttributeError when it is not one). Raises :class:`LLMError` when no usable answer came."""
    last = ""
    for attempt in range(max_retries + 1):
        try:
            return parse(create())
        except sdk.APIStatusError as exc:
            status = exc.status_code
            n = _attempts(status, max_retries)
            raise LLMError(f"{what}: HTTP {status} after {n} attempt{'s' * (n > 1)}: "
                           f"{_snippet(exc.message)}", status=status, attempts=n) from None
        except sdk.APITimeoutError:
            n = max_retries + 1
            raise LLMError(f"{what}: timed out after {n} attempts", attempts=n) from None
        except sdk.APIConnectionError as exc:
            n = max_retries + 1
            raise LLMError(f"{what}: connection failed after {n} attempts: {_snippet(exc)}",
                           attempts=n) from None
        except (sdk.APIResponseValidationError, json.JSONDecodeError, ValueError, KeyError, TypeError,
                AttributeError, IndexError) as exc:
            last = f"malformed response ({type(exc).__name__}: {_snippet(exc)})"
            log.info("%s: %s; attempt %d of %d", what, last, attempt + 1, max_retries + 1)
    n = max_retries + 1
    raise LLMError(f"{what}: {last} after {n} attempts", status=200, attempts=n)
