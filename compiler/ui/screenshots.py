"""PNG screenshots of the UI's main pages with headless Chromium (for docs/screenshots/).

    python -m compiler.ui.screenshots docs/screenshots                 # a sample board
    python -m compiler.ui.screenshots docs/screenshots --board sqlite:///out/board.db

Needs the ``playwright`` package and a Chromium binary (``TKCC_CHROMIUM``, else ``chromium`` on
PATH; Debian's package is installed by ``scripts/test_services.sh install``). Each PNG is written
to a temporary name and renamed into place.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

from bulletin_board import Board

from .app import UIConfig
from .sample import SampleSpec, fill_board
from .server import UIServer

LONG_LISTS = ("optimizations", "run", "ideas")      # shot at the viewport's height, not in full
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]


class ScreenshotError(RuntimeError):
    user_error = True


def chromium_path() -> str:
    path = os.environ.get("TKCC_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
    if not os.path.exists(path):
        raise ScreenshotError("no chromium binary: set TKCC_CHROMIUM or run scripts/test_services.sh install")
    return path


def pages(board: Board) -> list[tuple[str, str]]:
    """(file stem, path) of the main pages, picked from what the board holds."""
    out = [("deployments", "/"), ("optimizations", "/optimizations"), ("runs", "/runs"),
           ("ideas", "/ideas"), ("drift", "/drift")]
    if (dep := board.list_deployments(sort="id", limit=1).items):
        out.insert(1, ("deployment", f"/deployments/{dep[0].id}"))
    if (opt := board.list_optimizations(sort="-speedup", limit=1).items):
        out.insert(3, ("optimization", f"/optimizations/{opt[0].id}"))
    if (run := board.list_runs(sort="-date", limit=1).items):
        out.insert(-2, ("run", f"/runs/{run[0].id}"))
    if (idea := board.list_ideas(sort="-id", limit=1).items):
        out.insert(-1, ("idea", f"/ideas/{idea[0].id}"))
    return out


def shoot(url: str, out_dir: Path, width: int = 1360) -> list[Path]:
    from playwright.sync_api import sync_playwright

    out_dir.mkdir(parents=True, exist_ok=True)
    reader = Board(url, readonly=True)
    written = []
    try:
        with UIServer(UIConfig(board=url)) as server, sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": width, "height": 1100})
            for stem, path in pages(reader):
                page.goto(server.url + path)
                page.wait_for_load_state("load")
                target = out_dir / f"{stem}.png"
                tmp = out_dir / f".{stem}.png.tmp"
                page.screenshot(path=str(tmp), full_page=stem not in LONG_LISTS, type="png")
                os.replace(tmp, target)
                written.append(target)
            browser.close()
    finally:
        reader.close()
    return written


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="screenshots of the tkcc UI's main pages")
    ap.add_argument("out", help="output directory (e.g. docs/screenshots)")
    ap.add_argument("--board", help="board URL (default: a sample board in a temp directory)")
    args = ap.parse_args(argv)
    try:
        if args.board:
            written = shoot(args.board, Path(args.out))
        else:
            with tempfile.TemporaryDirectory(prefix="tkcc-ui-shots-") as tmp:
                url = f"sqlite:///{Path(tmp) / 'board.db'}"
                with Board(url) as board:
                    fill_board(board, SampleSpec(deployments=2, runs=4, ideas=80, evaluations=160, seed=7))
                written = shoot(url, Path(args.out))
    except Exception as exc:  # noqa: BLE001 - one line, exit 2, for user errors
        if getattr(exc, "user_error", False):
            print(f"screenshots: error: {exc}", file=sys.stderr)
            return 2
        raise
    for p in written:
        print(p)
    return 0


if __name__ == "__main__":
    sys.exit(main())
