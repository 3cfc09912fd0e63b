"""Who may read the UI: the Host check and, off loopback, a token (docs/errors.md "UI access").

``Access(token=None, hosts=None)``: no checks (tests, an app embedded elsewhere). ``tkcc ui`` always
sets ``hosts``: the names the browser may use in its ``Host`` header (loopback names by default,
plus the bound host and this machine's names with ``--allow-remote``), so a page on another site
that rebinds its DNS name to 127.0.0.1 gets a 400, not the board. With ``--allow-remote`` a
``token`` is required on every request, as ``Authorization: Bearer <token>`` or as the password of
HTTP basic auth (any user name; browsers prompt for it); without it the answer is 401. Tokens are
compared in constant time.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import os
import secrets
import socket
from dataclasses import dataclass
from typing import Mapping

__all__ = ["Access", "check_access", "remote_access", "local_access", "TOKEN_ENV"]

TOKEN_ENV = "TKCC_UI_TOKEN"
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "::1")


@dataclass(frozen=True)
class Access:
    token: str | None = None                 # required on every request when set
    hosts: tuple[str, ...] | None = None     # allowed Host names (lower case, no port); None: any


def _host_name(host_header: str) -> str:
    """``example.org:8800`` -> ``example.org``; ``[::1]:8800`` -> ``::1``."""
    h = host_header.strip().lower()
    if h.startswith("["):
        return h[1:h.find("]")] if "]" in h else h
    return h.rsplit(":", 1)[0] if h.count(":") == 1 else h


def _token_of(authorization: str) -> str | None:
    scheme, _, value = authorization.strip().partition(" ")
    if scheme.lower() == "bearer":
        return value.strip()
    if scheme.lower() == "basic":
        try:
            return base64.b64decode(value.strip(), validate=True).decode("utf-8").partition(":")[2]
        except (binascii.Error, UnicodeDecodeError):
            return None
    return None


def check_access(access: Access, headers: Mapping[str, str]) -> tuple[int, str, dict] | None:
    """None when the request may go on; else (status, one-line message, extra headers)."""
    if access.hosts is not None and _host_name(headers.get("host", "")) not in access.hosts:
        return 400, "bad Host header: this UI answers only to " + ", ".join(access.hosts), {}
    if access.token is not None:
        given = _token_of(headers.get("authorization", ""))
        if given is None or not hmac.compare_digest(given.encode(), access.token.encode()):
            return 401, "a token is required (Authorization: Bearer TOKEN, or basic auth with it as the password)", \
                {"WWW-Authenticate": 'Basic realm="tkcc ui", charset="UTF-8"'}
    return None


def local_access(host: str) -> Access:
    """Loopback serving: the Host check only."""
    return Access(hosts=tuple(dict.fromkeys((*LOOPBACK_NAMES, host.lower()))))


def remote_access(host: str, extra_hosts: tuple[str, ...] = (), token: str | None = None) -> Access:
    """``--allow-remote``: a token (``TKCC_UI_TOKEN`` or a fresh one) and the Host names of this machine."""
    names = {*LOOPBACK_NAMES, host.lower(), socket.gethostname().lower(), socket.getfqdn().lower(),
             *(h.lower() for h in extra_hosts)}
    names.discard("0.0.0.0")
    names.discard("::")
    return Access(token=token or os.environ.get(TOKEN_ENV) or secrets.token_urlsafe(24),
                  hosts=tuple(sorted(names)))
