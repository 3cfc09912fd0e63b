"""What a run that never wrote its plan had accepted, recovered from the board.

A run killed outright (SIGKILL, an out-of-memory kill, a lost machine, a second Ctrl-C) leaves its
accepted candidates on the board but no plan version. The next ``tkcc optimize`` into the same ``--out``
(same model and hardware) re-verifies them first, like the previous plan's optimizations, so nothing
accepted is lost. A run counts as unfinished when it wrote no plan (its message does not name one) and
it is not still running: its status is ``failed`` or ``interrupted``, or ``running`` with no progress for
``STALE_S`` seconds (a live run mirrors its progress every few seconds). Accepted = a fast-tier evaluation
whose metrics say ``"accepted": true`` (written by the loop since this module exists). Once recovered, a
run is marked (``mark_recovered``: failed, "recovered by run N") so that its candidates are taken once.
"""

from __future__ import annotations

from typing import Any

from bulletin_board import BoardAPI, source_hash

STALE_S = 600.0
MAX_RUNS = 20                       # most recent unfinished runs looked at
RECOVERED = "recovered by run "


def _unfinished(run: Any, now: float) -> bool:
    if str(run.message or "").startswith(("plan ", RECOVERED)):
        return False
    if run.status in ("failed", "interrupted"):
        return True
    return run.status == "running" and now - float(run.updated_at) > STALE_S


def recovered_seeds(board: BoardAPI, model: str, hw: str,
                    known: tuple[tuple[str, str], ...] = ()) -> tuple[list[tuple[str, str]], list[int]]:
    """``(name, source)`` of candidates accepted by unfinished runs of ``model`` on ``hw``, newest run first,
    one per distinct source, leaving out sources already in ``known`` (the continued plan's seeds); and the
    ids of the unfinished runs looked at."""
    seen = {source_hash(src) for _, src in known}
    now = board.db_time()
    out: list[tuple[str, str]] = []
    runs: list[int] = []
    for run in board.list_runs(model=model, hw=hw, sort="-date", limit=MAX_RUNS).items:
        if not _unfinished(run, now):
            continue
        runs.append(run.id)
        accepted = {e.candidate_id for e in board.list_evaluations(run=run.id, tier="fast", limit=1000).items
                    if (e.metrics or {}).get("accepted") is True}
        for cand in board.list_candidates(run=run.id, sort="date", limit=1000).items:
            if cand.id in accepted and cand.source_hash not in seen:
                seen.add(cand.source_hash)
                out.append((f"run{run.id}:{cand.author}", cand.source))
    return out, runs


def mark_recovered(board: BoardAPI, runs: list[int], by: Any) -> None:
    """The unfinished runs whose candidates run ``by`` took over: failed, and never recovered again."""
    by = getattr(by, "id", by)                  # a Run record or its id
    for run in runs:
        board.update_run(run, status="failed", message=f"{RECOVERED}{by}")
