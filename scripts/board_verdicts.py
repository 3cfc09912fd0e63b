"""Every verdict of an optimize run's board, one line each: tier, verdict, speedup, idea title, first reasons.

    python3 scripts/board_verdicts.py OUT/board.db [--run N]

Reads the SQLite board (``--out``'s ``board.db``) with the standard library only, so it runs on a GPU box
with nothing but the run's own output: the progress log counts rejections, this names them.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import sys

QUERY = """
select e.tier, e.verdict, e.speedup, e.reasons, c.author, coalesce(i.title, ''), e.run_id
from evaluations e join candidates c on c.id = e.candidate_id left join ideas i on i.id = c.idea_id
{where} order by e.id
"""


def verdict_lines(db: str, run: int | None = None, width: int = 400) -> list[str]:
    """One line per evaluation of ``run`` (all runs when None), in the order they were made."""
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        rows = con.execute(QUERY.format(where="where e.run_id = ?" if run is not None else ""),
                           (run,) if run is not None else ()).fetchall()
    finally:
        con.close()
    out = []
    for tier, verdict, speedup, reasons, author, title, run_id in rows:
        why = "; ".join(json.loads(reasons or "[]"))
        sp = f"{speedup:.3f}x" if speedup is not None else "-"
        out.append(f"run {run_id} {tier:4} {verdict:8} {sp:>7}  {author}  {title}  {why}"[:width])
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("db")
    ap.add_argument("--run", type=int, default=None)
    args = ap.parse_args(argv)
    try:
        lines = verdict_lines(args.db, args.run)
    except sqlite3.Error as e:
        print(f"board_verdicts: {args.db}: {e}", file=sys.stderr)
        return 2
    print("\n".join(lines) if lines else "no verdicts on this board")
    return 0


if __name__ == "__main__":
    sys.exit(main())
