"""Shared pytest setup: the ``gpu`` marker skips without CUDA; TRITON_INTERPRET=1 on CPU so that
Triton kernels run under the interpreter here; ``board_url``: an empty board database on SQLite (a file in
tmp_path) and on PostgreSQL (a fresh database on the server that ``scripts/test_services.sh run`` starts
and names in TKCC_TEST_PG_URL; skipped without it), for every test that runs against both backends; each
test its own engine start-up records (``TKCC_STARTUP_FILE``)."""

import os
import uuid

import pytest

# a GPU's device files (not torch: importing it here would be slow for every run); on a GPU machine with no
# CUDA_VISIBLE_DEVICES set, the GPU tests must run their kernels compiled, not interpreted
if (not os.environ.get("CUDA_VISIBLE_DEVICES") and not os.path.exists("/dev/nvidiactl")
        and "TRITON_INTERPRET" not in os.environ):
    os.environ["TRITON_INTERPRET"] = "1"


@pytest.fixture(autouse=True)
def _startup_records(tmp_path_factory, monkeypatch):
    """Each test its own engine start-up records (compiler/search/startup_estimate.py): no test's run is refused
    on what another test's engines took, nor on the user's own ~/.cache/tkcc/startup.json."""
    monkeypatch.setenv("TKCC_STARTUP_FILE", str(tmp_path_factory.getbasetemp() / f"startup-{uuid.uuid4().hex}.json"))


def _has_cuda() -> bool:
    try:
        import torch
        return torch.cuda.is_available()
    except Exception:  # noqa: BLE001
        return False


def pytest_collection_modifyitems(config, items):
    if _has_cuda():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


PG_URL = os.environ.get("TKCC_TEST_PG_URL")


def _pg_admin():
    from sqlalchemy import create_engine

    return create_engine(PG_URL, isolation_level="AUTOCOMMIT")


@pytest.fixture(params=["sqlite", "postgresql"])
def board_url(request, tmp_path):
    """A URL of an empty database on each backend."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'board.db'}"
        return
    if not PG_URL:
        pytest.skip("PostgreSQL tests need TKCC_TEST_PG_URL (scripts/test_services.sh run ...)")
    from sqlalchemy import text
    from sqlalchemy.engine import make_url

    name = f"tkcc_t_{uuid.uuid4().hex[:12]}"
    admin = _pg_admin()
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield make_url(PG_URL).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()
