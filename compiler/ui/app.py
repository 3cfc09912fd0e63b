"""The web UI: a read-only FastAPI app over a board, rendered on the server with Jinja2.

```python
from compiler.ui import UIConfig, create_app
app = create_app(UIConfig(board="sqlite:///out/board.db"))   # serve with uvicorn
```

Pages (all paginated, ``?page=N&n=50``):
  /                      deployments with their counts
  /deployments/{id}      best speedup over time, time per op before/after, runs, drift
  /optimizations         accepted optimizations; sort speedup|date|op|agent (``-`` descending);
                         filter deployment, run, status, op, agent
  /optimizations/{id}    code (highlighted, escaped), per-tier and per-point measurements, the idea
  /candidates/{id}       any candidate's code and evaluations, its parent and children (lineage)
  /runs, /runs/{id}      runs with live progress (``static/ui.js`` polls ``/api/runs/{id}``)
  /ideas, /ideas/{id}    the idea board and an idea's thread
  /drift                 drift checks with their per-feature tables
JSON: /api/runs/{id} (live progress), /api/optimizations (the same filters as the page).

Safety: the board is opened read-only (``Board(readonly=True)``: SQLite ``mode=ro`` and
``query_only``, PostgreSQL read-only transactions), so the UI never holds a write lock. Templates
autoescape every value; candidate code goes through ``highlight`` (escaped token by token); a
strict Content-Security-Policy allows only this app's own script and style.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from importlib import resources
from typing import Any

from fastapi import FastAPI, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response
from fastapi.staticfiles import StaticFiles
from jinja2 import Environment, FileSystemLoader

from bulletin_board import IDEA_STATUSES, OPTIMIZATION_STATUSES, RUN_STATUSES, Board, BoardError, UIQueries

from . import views
from .access import Access, check_access
from .charts import op_breakdown, op_breakdown_chart, speedup_history_chart
from .highlight import highlight

CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
       "connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'")
OPT_SORTS = ("speedup", "date", "op", "agent", "name")
IDEA_SORTS = ("id", "date", "priority", "status", "target", "author")
POLL_MS = 2000              # how often a page with a running run polls /api/runs/{id}
MAX_ID = 2 ** 63 - 1        # ids past a 64-bit integer are on no board: 404, never an overflow
SECURITY_HEADERS = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff",
                    "Referrer-Policy": "no-referrer", "X-Frame-Options": "DENY",
                    "Cache-Control": "no-store"}


@dataclass(frozen=True)
class UIConfig:
    board: str = "sqlite:///tkcc.db"     # board URL; opened read-only
    title: str = "tkcc"
    poll_ms: int = POLL_MS
    access: Access = Access()            # token and allowed Host names (compiler/ui/access.py)




def page_query() -> Any:
    """``?page=``: 1..MAX_PAGE, else a 400 (never an offset overflow). A fresh Query per parameter:
    FastAPI binds a Query object to the parameter it first serves."""
    return Query(1, ge=1, le=views.MAX_PAGE)


def id_query() -> Any:
    """``?run=``, ``?deployment=``: a 64-bit id, else a 400."""
    return Query(None, ge=0, le=MAX_ID)


class NotFound(Exception):
    """An id that is not on the board (rendered as a 404 page)."""


def _package_dir(name: str) -> str:
    return str(resources.files("compiler.ui") / name)


def _env() -> Environment:
    env = Environment(loader=FileSystemLoader(_package_dir("templates")), autoescape=True,
                      trim_blocks=True, lstrip_blocks=True, finalize=views.visible)
    env.filters.update(views.FILTERS)
    env.globals["url"] = views.url
    return env


def _sort(value: str, allowed: tuple[str, ...]) -> str:
    """``value`` when it names one of ``allowed`` (``-`` prefix: descending); else a 400."""
    if value.lstrip("-") not in allowed:
        raise BoardError(f"cannot sort by {value!r}; use one of {', '.join(allowed)} (prefix '-' for descending)")
    return value


def secure(response: Response) -> Response:
    """``response`` with the security headers (every response: pages, JSON, static files, errors)."""
    for k, v in SECURITY_HEADERS.items():
        response.headers[k] = v
    return response


def create_app(config: UIConfig) -> FastAPI:
    """The app over ``config.board`` (raises ``bulletin_board.SchemaError`` when it cannot be opened)."""
    board = Board(config.board, readonly=True, migrate=False)
    queries = UIQueries(config.board)

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI):
        yield
        board.close()
        queries.close()

    app = FastAPI(title="tkcc ui", docs_url=None, redoc_url=None, openapi_url=None, lifespan=lifespan)
    app.state.board, app.state.queries = board, queries
    app.mount("/static", StaticFiles(directory=_package_dir("static")), name="static")
    ui = Pages(config, board, queries)
    _add_access_and_headers(app, config)
    _add_error_pages(app, ui)
    _add_deployment_pages(app, ui)
    _add_optimization_pages(app, ui)
    _add_run_pages(app, ui)
    _add_idea_pages(app, ui)
    _add_drift_page(app, ui)
    return app


class Pages:
    """What every page handler uses: the read-only board, the UI's own queries, ``render`` (a template
    to an HTML response) and ``need`` (a row, or a 404 page)."""

    def __init__(self, config: UIConfig, board: Board, queries: UIQueries):
        self.board, self.queries = board, queries
        self.env = _env()
        self.env.globals.update(app_title=config.title, board_url=board.url, poll_ms=config.poll_ms)

    def render(self, request: Request, name: str, status_code: int = 200, **ctx: Any) -> HTMLResponse:
        ctx.setdefault("nav", name.split(".")[0])
        html = self.env.get_template(name).render(request_path=request.url.path[:500],
                                                  params=dict(request.query_params), **ctx)
        return HTMLResponse(html, status_code=status_code)

    @staticmethod
    def need(obj: Any, what: str) -> Any:
        if obj is None:
            raise NotFound(f"no {what}")
        return obj


def _add_access_and_headers(app: FastAPI, config: UIConfig) -> None:
    """Every request: refused unless its token and Host pass ``check_access``; every response: the
    security headers and its server time."""

    @app.middleware("http")
    async def _headers(request: Request, call_next):
        t0 = time.perf_counter()
        refused = check_access(config.access, request.headers)
        if refused is not None:
            status, message, extra = refused
            return secure(Response(message + "\n", status_code=status, media_type="text/plain", headers=extra))
        response = await call_next(request)
        response.headers["Server-Timing"] = f"app;dur={(time.perf_counter() - t0) * 1000:.1f}"
        return secure(response)


def _add_error_pages(app: FastAPI, ui: Pages) -> None:
    """Errors as pages: 500 without detail, 404 for a bad path or a missing row, 400 for a bad query."""

    @app.exception_handler(Exception)
    def _internal(request: Request, exc: Exception):
        """A 500 is answered here, outside the middleware: it gets the headers too, and no detail."""
        return secure(HTMLResponse("<!doctype html><title>tkcc: error</title><p>internal error</p>\n",
                                   status_code=500))

    @app.exception_handler(RequestValidationError)
    def _invalid(request: Request, exc: RequestValidationError):
        """A bad id in the path is a page that does not exist (404); a bad query value is a 400."""
        errors = exc.errors()
        in_path = any(e.get("loc", ("",))[0] == "path" for e in errors)
        what = "; ".join(f"{'.'.join(str(x) for x in e.get('loc', ())[1:])}: {e.get('msg', 'invalid')}"
                         for e in errors)[:300]
        return ui.render(request, "error.html", status_code=404 if in_path else 400,
                         message="no such page" if in_path else f"bad query: {what}")

    @app.exception_handler(BoardError)
    def _bad_request(request: Request, exc: BoardError):
        return ui.render(request, "error.html", status_code=400, message=str(exc))

    @app.exception_handler(NotFound)
    def _not_found(request: Request, exc: NotFound):
        return ui.render(request, "error.html", status_code=404, message=str(exc))


def _add_deployment_pages(app: FastAPI, ui: Pages) -> None:
    """/ and /deployments/{id}."""
    board, q, render, need = ui.board, ui.queries, ui.render, ui.need

    @app.get("/", response_class=HTMLResponse)
    def deployments(request: Request, page: int = page_query(), n: int = Query(views.PER_PAGE, ge=1)):
        pg = views.pager("/", request.query_params, page, n)
        found = board.list_deployments(sort="-date", limit=pg.per_page, offset=pg.offset)
        pg = views.pager("/", request.query_params, page, n, found.total)
        return render(request, "deployments.html", items=found.items, pager=pg,
                      summaries=q.deployment_summaries(d.id for d in found.items))

    @app.get("/deployments/{did}", response_class=HTMLResponse)
    def deployment(request: Request, did: int = Path(ge=0, le=MAX_ID)):
        dep = need(board.get_deployment(did), f"deployment {did}")
        base = q.latest_baseline(deployment=did)
        opts = q.best_per_target(base[0]) if base else ()
        before, after = op_breakdown(base[1], opts) if base else ({}, {})
        runs = board.list_runs(deployment=did, sort="-date", limit=10)
        return render(request, "deployment.html", nav="deployments", dep=dep,
                      summary=q.deployment_summaries([did])[did],
                      history=speedup_history_chart(q.speedup_history(did)),
                      breakdown=op_breakdown_chart(before, after), baseline_run=base[0] if base else None,
                      runs=runs, progress={r.id: views.run_progress(r) for r in runs.items},
                      top=board.list_optimizations(deployment=did, status="active", sort="-speedup", limit=10),
                      drift=board.list_drift_events(deployment=did, sort="-date", limit=5))


def _add_optimization_pages(app: FastAPI, ui: Pages) -> None:
    """/optimizations (and its JSON), /optimizations/{id}, /candidates/{id}."""
    board, q, render, need = ui.board, ui.queries, ui.render, ui.need

    def _opt_page(request: Request, deployment: int | None, run: int | None, status: str | None,
                  op: str | None, agent: str | None, sort: str, page: int, n: int):
        sort = _sort(sort, OPT_SORTS)
        pg = views.pager("/optimizations", request.query_params, page, n)
        found = board.list_optimizations(deployment=deployment, run=run, status=status or None, op=op or None,
                                         agent=agent or None, sort=sort, limit=pg.per_page,
                                         offset=pg.offset)
        return found, views.pager("/optimizations", request.query_params, page, n, found.total)

    @app.get("/optimizations", response_class=HTMLResponse)
    def optimizations(request: Request, deployment: int | None = id_query(), run: int | None = id_query(),
                      status: str | None = None,
                      op: str | None = None, agent: str | None = None, sort: str = "-speedup",
                      page: int = page_query(), n: int = Query(views.PER_PAGE, ge=1)):
        found, pg = _opt_page(request, deployment, run, status, op, agent, sort, page, n)
        ops, agents = q.optimization_choices()
        return render(request, "optimizations.html", items=found.items, pager=pg, sort=sort,
                      deployments=board.list_deployments(limit=200).items, ops=ops, agents=agents,
                      statuses=OPTIMIZATION_STATUSES)

    @app.get("/api/optimizations")
    def optimizations_json(request: Request, deployment: int | None = id_query(), run: int | None = id_query(),
                           status: str | None = None,
                           op: str | None = None, agent: str | None = None, sort: str = "-speedup",
                           page: int = page_query(), n: int = Query(views.PER_PAGE, ge=1)):
        found, _ = _opt_page(request, deployment, run, status, op, agent, sort, page, n)
        return JSONResponse(found.to_dict())

    @app.get("/optimizations/{oid}", response_class=HTMLResponse)
    def optimization(request: Request, oid: int = Path(ge=0, le=MAX_ID)):
        opt = need(board.get_optimization(oid), f"optimization {oid}")
        cand = board.get_candidate(opt.candidate_id)
        idea, posts = (board.thread(cand.idea_id, limit=200) if cand and cand.idea_id is not None
                       else (None, ()))
        return render(request, "optimization.html", nav="optimizations", opt=opt, cand=cand,
                      code=highlight(cand.source) if cand else None,
                      evals=board.list_evaluations(candidate=opt.candidate_id, sort="id", limit=100),
                      idea=idea, posts=posts, run=board.get_run(opt.run_id),
                      dep=board.get_deployment(opt.deployment_id))

    @app.get("/candidates/{cid}", response_class=HTMLResponse)
    def candidate(request: Request, cid: str = Path(max_length=64)):
        cand = need(board.get_candidate(cid), f"candidate {cid}")
        return render(request, "candidate.html", nav="runs", cand=cand, code=highlight(cand.source),
                      evals=board.list_evaluations(candidate=cid, sort="id", limit=100),
                      idea=board.get_idea(cand.idea_id) if cand.idea_id is not None else None,
                      optimization=q.optimization_of_candidate(cid),
                      parent=board.get_candidate(cand.parent_id) if cand.parent_id else None,
                      children=board.list_candidates(parent=cid, sort="date", limit=100).items)


def _add_run_pages(app: FastAPI, ui: Pages) -> None:
    """/runs, /runs/{id} and the live progress JSON /api/runs/{id}."""
    board, q, render, need = ui.board, ui.queries, ui.render, ui.need

    @app.get("/runs", response_class=HTMLResponse)
    def runs(request: Request, deployment: int | None = id_query(), status: str | None = None,
             page: int = page_query(), n: int = Query(views.PER_PAGE, ge=1)):
        pg = views.pager("/runs", request.query_params, page, n)
        found = board.list_runs(deployment=deployment, status=status or None, sort="-date",
                                limit=pg.per_page, offset=pg.offset)
        pg = views.pager("/runs", request.query_params, page, n, found.total)
        return render(request, "runs.html", items=found.items, pager=pg, statuses=RUN_STATUSES,
                      progress={r.id: views.run_progress(r) for r in found.items})

    @app.get("/runs/{rid}", response_class=HTMLResponse)
    def run(request: Request, rid: int = Path(ge=0, le=MAX_ID), verdict: str | None = None, page: int = page_query(),
            n: int = Query(views.PER_PAGE, ge=1)):
        r = need(board.get_run(rid), f"run {rid}")
        pg = views.pager(f"/runs/{rid}", request.query_params, page, n)
        evals = board.list_evaluations(run=rid, verdict=verdict or None, sort="-id",
                                       limit=pg.per_page, offset=pg.offset)
        pg = views.pager(f"/runs/{rid}", request.query_params, page, n, evals.total)
        return render(request, "run.html", nav="runs", run=r, progress=views.run_progress(r),
                      evals=evals.items, pager=pg, verdicts=q.verdict_counts(rid),
                      ideas=board.idea_counts(rid), dep=board.get_deployment(r.deployment_id),
                      opts=board.list_optimizations(run=rid, sort="-speedup", limit=20),
                      history=speedup_history_chart(q.speedup_history(r.deployment_id, run=rid)),
                      agent_reports=(r.config or {}).get("agent_reports") or [],
                      lineage=board.lineage(rid))

    @app.get("/api/runs/{rid}")
    def run_json(rid: int = Path(ge=0, le=MAX_ID)):
        r = board.get_run(rid)
        if r is None:
            return JSONResponse({"error": f"no run {rid}"}, status_code=404)
        return JSONResponse(views.run_progress(r))


def _add_idea_pages(app: FastAPI, ui: Pages) -> None:
    """/ideas and /ideas/{id}."""
    board, q, render, need = ui.board, ui.queries, ui.render, ui.need

    @app.get("/ideas", response_class=HTMLResponse)
    def ideas(request: Request, run: int | None = id_query(), status: str | None = None,
              target: str | None = None, author: str | None = None, sort: str = "-id",
              page: int = page_query(), n: int = Query(views.PER_PAGE, ge=1)):
        sort = _sort(sort, IDEA_SORTS)
        pg = views.pager("/ideas", request.query_params, page, n)
        found = board.list_ideas(run, status=status or None, target=target or None,
                                 author=author or None, sort=sort, limit=pg.per_page, offset=pg.offset)
        pg = views.pager("/ideas", request.query_params, page, n, found.total)
        targets, authors = q.idea_choices(run)
        return render(request, "ideas.html", items=found.items, pager=pg, sort=sort,
                      statuses=IDEA_STATUSES, targets=targets, authors=authors,
                      counts=board.idea_counts(run) if run is not None else None)

    @app.get("/ideas/{iid}", response_class=HTMLResponse)
    def idea(request: Request, iid: int = Path(ge=0, le=MAX_ID)):
        found = need(board.get_idea(iid), f"idea {iid}")
        _, posts = board.thread(found, limit=500)
        return render(request, "idea.html", nav="ideas", idea=found, posts=posts,
                      parent=board.get_idea(found.parent_id) if found.parent_id is not None else None,
                      evals=q.idea_evaluations(iid),
                      claims=board.list_claims(idea=iid, sort="id", limit=100).items)


def _add_drift_page(app: FastAPI, ui: Pages) -> None:
    """/drift."""
    board, render = ui.board, ui.render

    @app.get("/drift", response_class=HTMLResponse)
    def drift(request: Request, deployment: int | None = id_query(), page: int = page_query(),
              n: int = Query(20, ge=1)):
        pg = views.pager("/drift", request.query_params, page, n)
        found = board.list_drift_events(deployment=deployment, sort="-date", limit=pg.per_page,
                                        offset=pg.offset)
        pg = views.pager("/drift", request.query_params, page, n, found.total)
        return render(request, "drift.html", items=found.items, pager=pg,
                      deployments=board.list_deployments(limit=200).items)
