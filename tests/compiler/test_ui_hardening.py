"""UI hardening (issue 21), over real HTTP (uvicorn on 127.0.0.1): the security headers on every
response including a 500, bad ids and pages as 404/400 (never a 500), invisible characters in code
and text shown visibly, ``--allow-remote`` with a token and a Host check."""

from __future__ import annotations

import base64
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from bulletin_board import Board
from compiler.ui import UIConfig, UIServer
from compiler.ui.access import Access
from compiler.ui.app import SECURITY_HEADERS

ROOT = Path(__file__).resolve().parents[2]
TROJAN = 'access = "user"\nif access != "none\u202e \u2066# admin only\u2069 \u2066":  # \u200bcheck\n    grant()\n'


@pytest.fixture(scope="module")
def board_url(tmp_path_factory):
    url = f"sqlite:///{tmp_path_factory.mktemp('uih') / 'board.db'}"
    b = Board(url)
    run = b.create_run("m\u202eevil", "cpu", "t")
    cand = b.add_candidate(run, "agent\u200b-1", TROJAN)
    b.add_evaluation(cand, tier="fast", point=None, metrics={"speedup": 1.1}, verdict="correct",
                     reasons=["ok\u202e"])
    b.close()
    return url, run.id, cand


@pytest.fixture(scope="module")
def client(board_url):
    with UIServer(UIConfig(board=board_url[0])) as server, httpx.Client(base_url=server.url, timeout=30) as c:
        yield server, c


def _secure(r: httpx.Response) -> bool:
    return all(r.headers.get(k) == v for k, v in SECURITY_HEADERS.items())


@pytest.mark.parametrize("path,status", [
    ("/runs/99999999999999999999999", 404), ("/api/runs/99999999999999999999999", 404),
    ("/optimizations/99999999999999999999999", 404), ("/ideas/-99999999999999999999999", 404),
    ("/deployments/1e20", 404), ("/candidates/" + "x" * 500, 404),
    ("/runs?page=1e20", 400), ("/runs?page=99999999999999999999", 400), ("/runs/1?page=100000000000000000", 400),
    ("/optimizations?deployment=99999999999999999999999", 400), ("/ideas?run=1e30", 400),
])
def test_bad_ids_and_pages_are_404_or_400_with_the_headers(client, path, status):
    _, c = client
    r = c.get(path)
    assert r.status_code == status, r.text[:300]
    assert _secure(r)


def test_a_500_carries_the_security_headers_and_no_detail(board_url, monkeypatch):
    from bulletin_board.board import Board as B
    monkeypatch.setattr(B, "list_runs", lambda *a, **k: 1 / 0)
    with UIServer(UIConfig(board=board_url[0])) as server, httpx.Client(base_url=server.url, timeout=30) as c:
        r = c.get("/runs")
    assert r.status_code == 500 and _secure(r) and "ZeroDivision" not in r.text


def test_invisible_characters_in_code_and_text_are_shown_visibly(client, board_url):
    _, c = client
    _, run_id, cand = board_url
    page = c.get(f"/candidates/{cand}").text
    for ch in ("\u202e", "\u2066", "\u2069", "\u200b"):
        assert ch not in page
    assert page.count("\u27e8U+202E\u27e9") >= 1 and "\u27e8U+2066\u27e9" in page and "\u27e8U+200B\u27e9" in page
    assert re.search(r'<span class="ctl"[^>]*>\u27e8U\+202E\u27e9</span>', page)
    run_page = c.get(f"/runs/{run_id}").text          # the model name on the run's page is text, not code
    assert "\u202e" not in run_page and "m\u27e8U+202E\u27e9evil" in run_page


def test_token_and_host_are_checked_when_configured(board_url):
    access = Access(token="s3cret", hosts=("127.0.0.1", "ui.example"))
    with UIServer(UIConfig(board=board_url[0], access=access)) as server, \
            httpx.Client(base_url=server.url, timeout=30) as c:
        r = c.get("/runs")
        assert r.status_code == 401 and "Basic" in r.headers["www-authenticate"] and _secure(r)
        assert c.get("/runs", headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert c.get("/runs", headers={"Authorization": "Bearer s3cret"}).status_code == 200
        basic = base64.b64encode(b"anyone:s3cret").decode()
        assert c.get("/runs", headers={"Authorization": f"Basic {basic}"}).status_code == 200
        assert c.get("/static/ui.js").status_code == 401             # static files too
        r = c.get("/runs", headers={"Authorization": "Bearer s3cret", "Host": "evil.example"})
        assert r.status_code == 400 and "Host" in r.text
        assert c.get("/runs", headers={"Authorization": "Bearer s3cret", "Host": "ui.example:8800"}).status_code == 200


def test_tkcc_ui_allow_remote_requires_the_token_it_prints(board_url, tmp_path):
    env = {**os.environ, "TKCC_UI_TOKEN": "tok-for-test"}
    proc = subprocess.Popen([sys.executable, "-m", "compiler", "ui", "--board", board_url[0], "--host", "127.0.0.2",
                             "--port", "0", "--allow-remote"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, cwd=ROOT, env=env)
    try:
        lines = []
        t0 = time.monotonic()
        while time.monotonic() - t0 < 60:
            line = proc.stdout.readline()
            lines.append(line)
            m = re.search(r"at (http://[^/]+)/", line)
            if m:
                base = m.group(1)
                break
        else:
            pytest.fail("".join(lines))
        assert any("tok-for-test" in ln for ln in lines)
        assert httpx.get(base + "/runs", timeout=10).status_code == 401
        assert httpx.get(base + "/runs", headers={"Authorization": "Bearer tok-for-test"}, timeout=10).status_code == 200
        assert httpx.get(base + "/runs", headers={"Authorization": "Bearer tok-for-test", "Host": "attacker.example"},
                         timeout=10).status_code == 400
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.mark.parametrize("content,match", [(b"this is not a database at all" * 10, "not a SQLite database"),
                                           (None, "is a directory")])
def test_tkcc_ui_refuses_a_garbage_board_with_one_line(tmp_path, content, match):
    target = tmp_path / "board.db"
    if content is None:
        target.mkdir()
    else:
        target.write_bytes(content)
    r = subprocess.run([sys.executable, "-m", "compiler", "ui", "--board", str(target), "--port", "0"],
                       capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert r.returncode == 2 and match in r.stderr and len(r.stderr.strip().splitlines()) == 1
