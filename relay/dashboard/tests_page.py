"""Test pages: one conformance test's history across backends (``/tests/{test_id}``), and the list of
tests failing now on each backend with the upstream commit they started failing at (``/failing``).

Reads test results; writes nothing. "Failing since": walking a backend's results for a test newest
first, the streak of failed/error/xpassed results ends at a pass; its oldest commit is where it
started. Every read is bounded (a page of tests, 50 results per streak) and served from indexes, so no
window or report size makes a page expensive.
"""

from __future__ import annotations

import datetime as dt
from typing import Annotated

from urllib.parse import quote

from fastapi import APIRouter, Depends, HTTPException, Query, Request, Response
from fastapi.responses import HTMLResponse
from pydantic import BaseModel, Field

from relay.dashboard.rendering import DashboardContext, context, iso, render
from relay.store.base import utcnow
router = APIRouter()

PAGE = 100  # tests failing now per page
MAX_PAGE = 500
STREAK_LIMIT = 50  # results walked back per test for its streak


class HistoryItem(BaseModel):
    backend: str
    run: int
    pr_number: int | None
    head_sha: str
    outcome: str
    duration: float
    message: str
    recorded_at: str | None


class TestPage(BaseModel):
    test_id: str
    latest: dict[str, str]  # backend -> latest outcome
    history: list[HistoryItem]


class FailingNow(BaseModel):
    backend: str
    test_id: str
    since_sha: str = Field(description="upstream commit of the first result of the current failing streak")
    since_pr: int | None
    since: str | None
    last_run: int
    failures_in_a_row: int
    message: str


def build_test(ctx: DashboardContext, test_id: str, limit: int) -> TestPage:
    history = [h for h in ctx.store.test_history(test_id, limit) if h.backend in ctx.backends]
    if not history:
        raise HTTPException(404, f"no results for test {test_id!r}")
    latest: dict[str, str] = {}
    for item in history:
        latest.setdefault(item.backend, item.outcome)
    return TestPage(test_id=test_id, latest=latest, history=[
        HistoryItem(backend=h.backend, run=h.run_pk, pr_number=h.pr_number, head_sha=h.head_sha, outcome=h.outcome,
                    duration=h.duration, message=h.message, recorded_at=iso(h.recorded_at))
        for h in history
    ])


def failing_now(ctx: DashboardContext, days: int, backend: str | None = None, *, limit: int = PAGE,
                after: tuple[str, str] | None = None) -> tuple[list[FailingNow], tuple[str, str] | None]:
    """A page of tests failing now (allowlisted backends only) and the cursor of the next page."""
    streaks, cursor = ctx.store.failing_tests(since=utcnow() - dt.timedelta(days=days), backend=backend,
                                              after=after, limit=limit, streak_limit=STREAK_LIMIT)
    return [
        FailingNow(backend=s.backend, test_id=s.test_id, since_sha=s.first.head_sha, since_pr=s.first.pr_number,
                   since=iso(s.first.recorded_at), last_run=s.last.run_pk, failures_in_a_row=s.failures_in_a_row,
                   message=s.last.message)
        for s in streaks if s.backend in ctx.backends
    ], cursor


def _next_link(request: Request, cursor: tuple[str, str] | None) -> str | None:
    if cursor is None:
        return None
    return str(request.url.include_query_params(after_backend=cursor[0], after_test=cursor[1]))


@router.get("/api/tests/failing", response_model=list[FailingNow], tags=["dashboard API"])
def failing_api(request: Request, response: Response, ctx: Annotated[DashboardContext, Depends(context)],
                days: int = Query(30, ge=1, le=365), backend: str | None = Query(None, max_length=100),
                limit: int = Query(PAGE, ge=1, le=MAX_PAGE),
                after_backend: str | None = Query(None, max_length=100, description="cursor: from the previous page's Link"),
                after_test: str | None = Query(None, max_length=500)) -> list[FailingNow]:
    """Tests failing now, per backend, with the upstream commit (and PR) each started failing at.

    Paginated in (backend, test id) order: when there is more, the ``Link`` header holds the next page
    (``rel="next"``). A streak longer than 50 results is counted as 50."""
    after = (after_backend, after_test or "") if after_backend is not None else None
    page, cursor = failing_now(ctx, days, backend, limit=limit, after=after)
    link = _next_link(request, cursor)
    if link:
        response.headers["Link"] = f'<{link}>; rel="next"'
    return page


@router.get("/api/tests/{test_id:path}", response_model=TestPage, tags=["dashboard API"],
            responses={404: {"description": "no results for that test"}})
def test_api(test_id: str, ctx: Annotated[DashboardContext, Depends(context)],
             limit: int = Query(200, ge=1, le=2000)) -> TestPage:
    """One conformance test (``<suite>::<name>``) across backends, newest first."""
    return build_test(ctx, test_id, limit)


@router.get("/failing", response_class=HTMLResponse, include_in_schema=False)
def failing_page(request: Request, ctx: Annotated[DashboardContext, Depends(context)]) -> HTMLResponse:
    failing, cursor = failing_now(ctx, 30)
    more = None if cursor is None else f"/api/tests/failing?after_backend={quote(cursor[0])}&after_test={quote(cursor[1])}"
    return render("failing.html", failing=failing, more=more, title="Failing tests")


@router.get("/tests/{test_id:path}", response_class=HTMLResponse, include_in_schema=False)
def test_page(request: Request, test_id: str, ctx: Annotated[DashboardContext, Depends(context)]) -> HTMLResponse:
    page = build_test(ctx, test_id, 200)
    return render("test.html", page=page, title=f"Test {test_id}")
