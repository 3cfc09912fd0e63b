"""Fixtures of the board's contract suite: every test that takes ``board`` (or ``board_url``, from
tests/conftest.py) runs on SQLite and on PostgreSQL."""

from __future__ import annotations

import pytest

from bulletin_board import Board


@pytest.fixture
def board(board_url):
    b = Board(board_url)
    yield b
    b.close()
