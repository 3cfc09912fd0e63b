"""A separate process that works a board, for the multi-process tests (run as a script).

    board_worker.py claim URL RUN AGENT GO_FILE   claim/finish until the pool is empty; prints the
                                                  claimed idea ids as one JSON list at the end
    board_worker.py hold URL RUN AGENT LEASE_S    claims one idea, prints its id, then sleeps
                                                  (the test kills it)
    board_worker.py write URL RUN SIZE            writes candidates of SIZE bytes and their
                                                  evaluations forever, printing "start K" before
                                                  and "done K" after each pair (the test kills it)
Every worker prints "ready" once its Board is open.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time

from bulletin_board import Board


def payload(k: int, size: int) -> str:
    """``size`` bytes of text that differ per ``k`` (so every candidate is new)."""
    block = hashlib.sha256(str(k).encode()).hexdigest()
    return (block * (size // len(block) + 1))[:size]


def main(argv: list[str]) -> int:
    mode, url, run = argv[0], argv[1], int(argv[2])
    board = Board(url)
    print("ready", flush=True)
    if mode == "claim":
        agent, go = argv[3], argv[4]
        while not os.path.exists(go):
            time.sleep(0.01)
        claimed = []
        while (idea := board.claim_idea(run, agent, lease_s=600)) is not None:
            claimed.append(idea.id)
            if not board.finish_idea(idea, agent, "done"):
                raise SystemExit(f"{agent} lost its claim on idea {idea.id}")
        print(json.dumps(claimed), flush=True)
    elif mode == "hold":
        idea = board.claim_idea(run, argv[3], lease_s=float(argv[4]))
        print(json.dumps({"id": idea.id, "lease_expires_at": idea.lease_expires_at}), flush=True)
        time.sleep(600)
    elif mode == "write":
        size = int(argv[3])
        for k in range(10**9):
            print(f"start {k}", flush=True)
            source = f"# candidate {k}\nOVERRIDES = {{}}\n# {payload(k, size)}\n"
            cid = board.add_candidate(run, "writer", source)
            samples = [k] * (size // 8)
            check = hashlib.sha256(json.dumps(samples).encode()).hexdigest()
            board.add_evaluation(cid, "fast", None, {"samples": samples, "check": check},
                                 verdict="correct")
            print(f"done {k}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
