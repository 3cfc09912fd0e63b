"""Board throughput: claims/s (claim + finish cycles) and posts/s with 1, 8 and 32 concurrent
writer processes, on SQLite and PostgreSQL. Prints a table and writes benchmarks/results/board.json.

    python benchmarks/board.py                          # both backends, 1/8/32 writers
    python benchmarks/board.py --backends sqlite --writers 1,8 --ops 400

PostgreSQL: uses TKCC_TEST_PG_URL when set; otherwise re-runs itself under
``scripts/test_services.sh run`` (a throwaway server on 127.0.0.1), or skips PostgreSQL when
PostgreSQL is not installed. Each (backend, writers) cell gets a fresh database. Every writer is a
separate process with its own Board; all start together (a barrier), and a phase's rate is its
total operations over the wall time from the start signal until the last writer is done.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from compiler.plan.artifact import atomic_write_json  # noqa: E402

from bulletin_board import Board  # noqa: E402


def _writer(url: str, run_id: int, name: str, ops: int, ready, go_claim, go_post, done) -> None:
    """One writer process: ``ops`` claim/finish cycles, then ``ops`` posts."""
    board = Board(url)
    ready.put(name)
    go_claim.wait()
    cycles = 0
    for _ in range(ops):
        idea = board.claim_idea(run_id, name, lease_s=600)
        if idea is None:
            break
        board.finish_idea(idea, name, "done")
        cycles += 1
    done.put(("claims", cycles))
    go_post.wait()
    for k in range(ops):
        board.post(run_id, name, f"post {k} by {name}")
    done.put(("posts", ops))
    board.close()


def _phase(go, done, writers: int) -> tuple[int, float]:
    t0 = time.perf_counter()
    go.set()
    total = 0
    for _ in range(writers):
        total += done.get(timeout=600)[1]
    return total, time.perf_counter() - t0


def measure(url: str, writers: int, ops_total: int) -> dict:
    """Throughput of ``writers`` processes sharing ``ops_total`` claims and ``ops_total`` posts."""
    ops = max(1, ops_total // writers)
    board = Board(url)
    run = board.create_run("bench", "cpu", uuid.uuid4().hex[:8])
    for k in range(ops * writers):
        board.post_idea(run, "bench", f"idea {k}")
    ctx = mp.get_context("spawn")
    ready, done = ctx.Queue(), ctx.Queue()
    go_claim, go_post = ctx.Event(), ctx.Event()
    procs = [ctx.Process(target=_writer, args=(url, run.id, f"w{i}", ops, ready, go_claim,
                                               go_post, done)) for i in range(writers)]
    for p in procs:
        p.start()
    for _ in procs:
        ready.get(timeout=300)
    claims, claim_s = _phase(go_claim, done, writers)
    posts, post_s = _phase(go_post, done, writers)
    for p in procs:
        p.join(timeout=60)
    left = board.idea_counts(run)["open"]
    board.close()
    if claims != ops * writers or left != 0:
        raise SystemExit(f"benchmark error: {claims} claims of {ops * writers}, {left} left open")
    return {"writers": writers, "claims": claims, "claim_s": round(claim_s, 4),
            "claims_per_s": round(claims / claim_s, 1), "posts": posts,
            "post_s": round(post_s, 4), "posts_per_s": round(posts / post_s, 1)}


def _pg_database(base_url: str):
    """A fresh database on the server of ``base_url``; returns (url, drop)."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    name = f"tkcc_bench_{uuid.uuid4().hex[:10]}"
    admin = create_engine(base_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))

    def drop() -> None:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()

    return make_url(base_url).set(database=name).render_as_string(hide_password=False), drop


def run_backend(backend: str, writers: list[int], ops: int) -> list[dict]:
    rows = []
    for w in writers:
        if backend == "sqlite":
            tmp = tempfile.mkdtemp(prefix="tkcc-bench-")
            url, drop = f"sqlite:///{tmp}/board.db", (lambda t=tmp: shutil.rmtree(t))
        else:
            url, drop = _pg_database(os.environ["TKCC_TEST_PG_URL"])
        try:
            row = {"backend": backend, **measure(url, w, ops)}
        finally:
            drop()
        print(f"  {backend:<10} {w:>7} {row['claims_per_s']:>10.1f} {row['posts_per_s']:>10.1f}",
              flush=True)
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backends", default="sqlite,postgresql")
    ap.add_argument("--writers", default="1,8,32")
    ap.add_argument("--ops", type=int, default=960,
                    help="claim/finish cycles (and posts) per cell, shared by its writers")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "board.json"))
    args = ap.parse_args(argv)
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    writers = [int(w) for w in args.writers.split(",")]
    if bad := [b for b in backends if b not in ("sqlite", "postgresql")]:
        print(f"board.py: error: unknown backend {bad[0]!r} (sqlite, postgresql)", file=sys.stderr)
        return 2
    notes = []
    if "postgresql" in backends and not os.environ.get("TKCC_TEST_PG_URL"):
        services = ROOT / "scripts" / "test_services.sh"
        has_pg = any(Path("/usr/lib/postgresql").glob("*/bin/initdb")) or shutil.which("initdb")
        if has_pg and not os.environ.get("TKCC_BENCH_NESTED"):
            env = dict(os.environ, TKCC_BENCH_NESTED="1")
            argv_out = [str(services), "run", sys.executable, __file__, *(argv or sys.argv[1:])]
            return subprocess.call(argv_out, env=env)
        backends.remove("postgresql")
        notes.append("postgresql skipped: not installed (scripts/test_services.sh install)")
        print(f"[board] {notes[-1]}", file=sys.stderr)

    print(f"  {'backend':<10} {'writers':>7} {'claims/s':>10} {'posts/s':>10}")
    rows = []
    for backend in backends:
        rows += run_backend(backend, writers, args.ops)
    import sqlalchemy

    doc = {"benchmark": "board", "ops_per_cell": args.ops, "results": rows, "notes": notes,
           "host": {"machine": platform.machine(), "cpus": os.cpu_count(),
                    "python": platform.python_version(), "sqlalchemy": sqlalchemy.__version__,
                    "load_avg_1m": round(os.getloadavg()[0], 2)},
           "unix_time": round(time.time(), 1)}
    atomic_write_json(Path(args.out), doc)
    print(f"[board] wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
