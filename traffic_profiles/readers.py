"""Readers: any supported request log -> a validated ``Trace``.

The container is detected from content (parquet magic ``PAR1``, JSON lines when the first character
is ``{``, CSV otherwise) and the trace format from the column names, so a CSV, JSONL or parquet file
of any format below is read the same way.

| format    | columns (required in bold)                                                  | timestamp |
|-----------|------------------------------------------------------------------------------|-----------|
| canonical | **timestamp, input_tokens, output_tokens**, cached_tokens, session_id,       | seconds (number) or a date-time |
|           | hash_ids, block_size, model, region                                          |           |
| azure     | **TIMESTAMP, ContextTokens, GeneratedTokens** (Azure LLM inference 2023)     | date-time |
| mooncake  | **timestamp, input_length, output_length**, hash_ids (512-token blocks)      | milliseconds |
| burstgpt  | **Timestamp, Request tokens, Response tokens**, Model, Total tokens, Log Type | seconds |

The canonical parquet schema is documented in ``traffic_profiles/README.md``. Lengths must be
non-negative integers, ``cached_tokens <= input_tokens``; any bad row raises ``TraceError`` naming the
file, the row (1-based data row; CSV/JSONL also give the line) and the problem. Cost: one vectorized
pass per column; JSON-lines and CSV ``hash_ids`` are parsed per row in Python.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from .trace import DEFAULT_BLOCK_SIZE, Trace, TraceError


@dataclass(frozen=True)
class Format:
    name: str
    timestamp: str
    input: str
    output: str
    time_unit: str                  # "s", "ms" or "datetime"; numbers in "s" may also be date-times
    hash_ids: str | None = None
    cached: str | None = None
    session: str | None = None
    model: str | None = None
    region: str | None = None
    block_size: int = DEFAULT_BLOCK_SIZE

    @property
    def required(self) -> tuple[str, str, str]:
        return (self.timestamp, self.input, self.output)


FORMATS = (
    Format("canonical", "timestamp", "input_tokens", "output_tokens", "s", hash_ids="hash_ids",
           cached="cached_tokens", session="session_id", model="model", region="region"),
    Format("mooncake", "timestamp", "input_length", "output_length", "ms", hash_ids="hash_ids"),
    Format("azure", "TIMESTAMP", "ContextTokens", "GeneratedTokens", "datetime"),
    Format("burstgpt", "Timestamp", "Request tokens", "Response tokens", "s", model="Model"),
)


class _Table:
    """Columns of a file as pandas Series (``str`` or native dtype), plus where row i lives."""

    def __init__(self, path: Path, kind: str, frame: pd.DataFrame, lists: dict[str, Any],
                 line_of: np.ndarray | None, block_size: int | None):
        self.path, self.kind, self.frame, self.lists = path, kind, frame, lists
        self.line_of, self.block_size = line_of, block_size   # line_of[i]: file line of data row i
        self.start_time: str | None = None                      # wall-clock start kept in metadata

    @property
    def columns(self) -> list[str]:
        return list(self.frame.columns) + [c for c in self.lists if c not in self.frame.columns]

    def where(self, i: int) -> str:
        at = f"row {i + 1}"
        return at + (f" (line {int(self.line_of[i])})" if self.line_of is not None else "")

    def fail(self, i: int | None, problem: str) -> TraceError:
        return TraceError(f"{self.path}: {self.where(i) + ': ' if i is not None else ''}{problem}")


# ---------------------------------------------------------------------------- containers
def _sniff(path: Path) -> str:
    with open(path, "rb") as f:
        head = f.read(4096)
    if not head.strip():
        raise TraceError(f"{path}: empty file")
    if head[:4] == b"PAR1":
        return "parquet"
    if b"\x00" in head:
        raise TraceError(f"{path}: not a trace (binary content that is not parquet)")
    return "jsonl" if head.lstrip()[:1] in (b"{", b"[") else "csv"


def _load_parquet(path: Path) -> _Table:
    import pyarrow as pa
    import pyarrow.parquet as pq
    try:
        table = pq.read_table(path)
    except (pa.ArrowException, OSError) as e:
        raise TraceError(f"{path}: unreadable parquet: {e}") from None
    meta = table.schema.metadata or {}
    block = meta.get(b"block_size")
    lists = {}
    for name in table.column_names:
        if pa.types.is_list(table.schema.field(name).type) or pa.types.is_large_list(table.schema.field(name).type):
            lists[name] = table.column(name).combine_chunks()
    frame = table.drop_columns(list(lists)).to_pandas()
    t = _Table(path, "parquet", frame, lists, None, int(block) if block else None)
    t.start_time = meta[b"start_time"].decode() if b"start_time" in meta else None
    return t


def _load_csv(path: Path) -> _Table:
    try:
        frame = pd.read_csv(path, dtype=str, keep_default_na=False, skipinitialspace=True)
    except (pd.errors.ParserError, UnicodeDecodeError, ValueError) as e:
        raise TraceError(f"{path}: not a readable CSV: {str(e).strip().splitlines()[-1]}") from None
    frame.columns = [str(c).strip() for c in frame.columns]
    lists = {}
    for name in ("hash_ids",):
        if name in frame.columns:
            lists[name] = [_parse_list(path, v, i, i + 2) for i, v in enumerate(frame.pop(name))]
    return _Table(path, "csv", frame, lists, np.arange(len(frame)) + 2, None)


def _parse_list(path: Path, text: str, i: int, line: int) -> list:
    text = (text or "").strip()
    if not text:
        return []
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        value = None
    if not isinstance(value, list):
        raise TraceError(f"{path}: row {i + 1} (line {line}): hash_ids is not a list: {text[:40]!r}")
    return value


def _load_jsonl(path: Path) -> _Table:
    records, lines = [], []
    with open(path, encoding="utf-8", errors="replace") as f:
        first = f.read(1)
        f.seek(0)
        if first == "[":                       # a JSON array of records is accepted too
            try:
                records = json.load(f)
            except json.JSONDecodeError as e:
                raise TraceError(f"{path}: invalid JSON: {e}") from None
            if not isinstance(records, list):
                raise TraceError(f"{path}: not a trace (JSON, but not a list of records)")
            lines = None
        else:
            for n, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                try:
                    records.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise TraceError(f"{path}: row {len(records) + 1} (line {n}): invalid JSON: {e.msg}") from None
                lines.append(n)
    for i, r in enumerate(records):
        if not isinstance(r, dict):
            at = f"row {i + 1}" + (f" (line {lines[i]})" if lines else "")
            raise TraceError(f"{path}: {at}: not a JSON object")
    list_cols = {k for r in records[:1000] for k, v in r.items() if isinstance(v, list)}
    lists = {k: [r.get(k) or [] for r in records] for k in list_cols}
    frame = pd.DataFrame.from_records([{k: v for k, v in r.items() if k not in list_cols} for r in records])
    return _Table(path, "jsonl", frame, lists, np.asarray(lines) if lines else None, None)


# ---------------------------------------------------------------------------- columns
def _detect(t: _Table) -> Format:
    cols = set(t.columns)
    for fmt in FORMATS:
        if all(c in cols for c in fmt.required):
            return fmt
    best = max(FORMATS, key=lambda f: sum(c in cols for c in f.required))
    have = sum(c in cols for c in best.required)
    if have == 0:
        shown = ", ".join(sorted(map(str, cols))[:8]) or "none"
        raise TraceError(f"{t.path}: not a trace: columns ({shown}) match none of the formats "
                         f"{', '.join(f.name for f in FORMATS)}")
    missing = next(c for c in best.required if c not in cols)
    raise TraceError(f"{t.path}: missing column {missing!r} ({best.name} format)")


def _lengths(t: _Table, col: str) -> np.ndarray:
    raw = t.frame[col]
    num = pd.to_numeric(raw, errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
    bad = ~np.isfinite(num)
    if bad.any():
        i = int(np.argmax(bad))
        raise t.fail(i, f"{col} is not a number: {str(raw.iloc[i])[:40]!r}")
    if (num < 0).any():
        i = int(np.argmax(num < 0))
        raise t.fail(i, f"{col} is negative: {raw.iloc[i]}")
    frac = num != np.floor(num)
    if frac.any():
        i = int(np.argmax(frac))
        raise t.fail(i, f"{col} is not an integer: {raw.iloc[i]}")
    return num.astype(np.int64)


def _timestamps(t: _Table, fmt: Format) -> tuple[np.ndarray, str | None]:
    """Seconds since the earliest request, and its ISO wall-clock time when the log has one."""
    raw = t.frame[fmt.timestamp]
    if pd.api.types.is_datetime64_any_dtype(raw):
        dt = pd.to_datetime(raw, utc=True)
    else:
        num = pd.to_numeric(raw, errors="coerce")
        if fmt.time_unit != "datetime" and num.notna().all():
            sec = num.to_numpy(dtype=np.float64) * (1e-3 if fmt.time_unit == "ms" else 1.0)
            if not np.isfinite(sec).all():
                i = int(np.argmax(~np.isfinite(sec)))
                raise t.fail(i, f"unparsable timestamp {raw.iloc[i]!r}")
            return sec - sec.min(), t.start_time
        dt = pd.to_datetime(raw.astype(str), errors="coerce", utc=True, format="ISO8601")
    bad = dt.isna().to_numpy()
    if bad.any():
        i = int(np.argmax(bad))
        raise t.fail(i, f"unparsable timestamp {str(raw.iloc[i])[:40]!r}")
    first = dt.min()
    sec = (dt - first).dt.total_seconds().to_numpy(dtype=np.float64)
    return sec, first.tz_convert(None).isoformat()


def _hashes(t: _Table, col: str, n: int) -> tuple[np.ndarray, np.ndarray]:
    """CSR (offsets [n+1], values [B] int64) of a list column; strings are mapped to dense ints."""
    data = t.lists[col]
    if isinstance(data, list):
        lengths = np.fromiter((len(v) if isinstance(v, list) else -1 for v in data), np.int64, n)
        if (lengths < 0).any():
            raise t.fail(int(np.argmax(lengths < 0)), f"{col} is not a list")
        flat = [x for v in data for x in v]
        values = np.asarray(flat) if flat else np.empty(0, dtype=np.int64)
    else:                                     # pyarrow ListArray: null rows count as empty
        import pyarrow.compute as pc
        data = data.fill_null([]) if data.null_count else data
        offsets = np.asarray(data.offsets, dtype=np.int64)
        lengths = np.diff(offsets)
        values = np.asarray(pc.list_flatten(data).to_numpy(zero_copy_only=False))
    if values.dtype.kind not in "iu":
        if values.dtype.kind == "f" and np.all(values == np.floor(values)):
            values = values.astype(np.int64)
        else:
            values = pd.factorize(pd.Series(values).astype(str))[0].astype(np.int64)
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return offsets, values.astype(np.int64, copy=False)


def _strings(t: _Table, col: str | None) -> np.ndarray | None:
    if not col or col not in t.frame.columns:
        return None
    return t.frame[col].astype(str).to_numpy(dtype=object)


# ---------------------------------------------------------------------------- entry point
def read_trace(path: str | os.PathLike, block_size: int | None = None) -> Trace:
    """Read and validate any supported log. ``block_size`` overrides the tokens per hash block."""
    p = Path(path)
    if p.is_dir():
        raise IsADirectoryError(21, "is a directory", str(p))
    if not p.exists():
        raise FileNotFoundError(2, "no such file", str(p))
    kind = _sniff(p)
    table = {"parquet": _load_parquet, "csv": _load_csv, "jsonl": _load_jsonl}[kind](p)
    n = len(table.frame)
    if n == 0:
        raise TraceError(f"{p}: empty trace (no rows)")
    fmt = _detect(table)
    ts, start = _timestamps(table, fmt)
    inp, out = _lengths(table, fmt.input), _lengths(table, fmt.output)
    cached = _lengths(table, fmt.cached) if fmt.cached and fmt.cached in table.frame.columns else None
    if cached is not None and (cached > inp).any():
        i = int(np.argmax(cached > inp))
        raise table.fail(i, f"cached_tokens {cached[i]} exceeds input_tokens {inp[i]}")
    session = None
    if fmt.session and fmt.session in table.frame.columns:
        codes = pd.factorize(table.frame[fmt.session].replace("", None))[0]
        session = np.asarray(codes, dtype=np.int64)          # -1: no session logged
    offsets = values = None
    if fmt.hash_ids and fmt.hash_ids in table.lists:
        offsets, values = _hashes(table, fmt.hash_ids, n)
    bs = block_size or table.block_size
    if not bs and "block_size" in table.frame.columns:
        bs = int(_lengths(table, "block_size")[0])
    bs = int(bs or fmt.block_size)
    if bs <= 0:
        raise TraceError(f"{p}: block_size must be positive, got {bs}")
    trace = Trace(timestamp_s=ts, input_tokens=inp, output_tokens=out, cached_tokens=cached,
                  session_id=session, hash_offsets=offsets, hash_values=values, block_size=bs,
                  model=_strings(table, fmt.model), region=_strings(table, fmt.region),
                  source=str(p), format=fmt.name, start_time=start)
    if len(ts) > 1 and (np.diff(ts) < 0).any():
        trace = trace.take(np.argsort(ts, kind="stable"))
    return trace
