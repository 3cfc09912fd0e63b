"""A tiny Python syntax highlighter for candidate sources, built on the stdlib ``tokenize``.

Candidate sources are written by LLM agents, so they are untrusted text: every token is passed
through ``html.escape`` before it is wrapped in a ``<span class="...">``; whitespace and the text
between tokens are copied verbatim (escaped too). A source that does not tokenize (an unterminated
string, bad indentation) is highlighted up to the error and the rest is shown as escaped plain text.

``highlight(src)`` returns ``markupsafe.Markup`` (safe to put in an autoescaped Jinja2 template)
whose text content is exactly ``src``, except that each invisible character (bidi controls such as
U+202E, zero-width and other format or control characters: ``views.INVISIBLE``) is shown as a
visible ``⟨U+202E⟩`` marker in a ``ctl`` span, so code cannot read differently from what it does. Cost: one pass over the tokens, O(len(src)).

CSS classes: ``k`` keyword, ``b`` builtin, ``s`` string, ``c`` comment, ``n`` number, ``o``
operator, ``f`` the name after ``def``/``class``, ``d`` decorator.
"""

from __future__ import annotations

import builtins
import io
import keyword
import tokenize
from html import escape

from markupsafe import Markup

from .views import INVISIBLE, marker

_KEYWORDS = frozenset(keyword.kwlist) | frozenset(getattr(keyword, "softkwlist", ()))
_BUILTINS = frozenset(n for n in dir(builtins) if not n.startswith("_"))
_FSTRING_PARTS = {getattr(tokenize, n) for n in ("FSTRING_START", "FSTRING_MIDDLE", "FSTRING_END")
                  if hasattr(tokenize, n)}       # Python 3.12+ splits f-strings into parts


def _esc(text: str) -> str:
    """HTML-escaped ``text`` with each invisible character (views.INVISIBLE) as a visible, marked span."""
    return INVISIBLE.sub(lambda m: f'<span class="ctl" title="invisible character">{marker(m.group())}</span>',
                         escape(text, quote=False))


def _css_class(tok: tokenize.TokenInfo, prev: tokenize.TokenInfo | None) -> str | None:
    t = tok.type
    if t == tokenize.COMMENT:
        return "c"
    if t == tokenize.STRING or t in _FSTRING_PARTS:
        return "s"
    if t == tokenize.NUMBER:
        return "n"
    if t == tokenize.OP:
        if tok.string == "@" and (prev is None or prev.type in (tokenize.NEWLINE, tokenize.NL,
                                                               tokenize.INDENT, tokenize.DEDENT)):
            return "d"
        return "o"
    if t == tokenize.NAME:
        if prev is not None and prev.type == tokenize.NAME and prev.string in ("def", "class"):
            return "f"
        if prev is not None and prev.type == tokenize.OP and prev.string == "@":
            return "d"
        if tok.string in _KEYWORDS:
            return "k"
        if tok.string in _BUILTINS:
            return "b"
    return None


def highlight(source: str) -> Markup:
    """``source`` as escaped HTML with token spans (no ``<pre>`` around it)."""
    lines = source.splitlines(keepends=True)
    offsets = [0]                       # offset of the start of each (1-based) line
    for line in lines:
        offsets.append(offsets[-1] + len(line))

    def at(row: int, col: int) -> int:
        return offsets[min(row - 1, len(lines))] + col if row >= 1 else 0

    out: list[str] = []
    pos = 0
    prev: tokenize.TokenInfo | None = None
    try:
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            if tok.type == tokenize.ENDMARKER:
                break
            start, end = at(*tok.start), at(*tok.end)
            if start < pos or end < start or end > len(source):   # pseudo tokens at odd places
                continue
            out.append(_esc(source[pos:start]))
            text = source[start:end]
            cls = _css_class(tok, prev)
            out.append(f'<span class="{cls}">{_esc(text)}</span>' if cls and text else _esc(text))
            pos = end
            if tok.type not in (tokenize.NL, tokenize.COMMENT):
                prev = tok
    except (tokenize.TokenError, IndentationError, SyntaxError):
        pass                            # the rest is shown as plain text below
    out.append(_esc(source[pos:]))
    return Markup("".join(out))
