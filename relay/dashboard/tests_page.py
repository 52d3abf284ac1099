"""Test pages: one conformance test's history across backends (``/tests/{test_id}``), with where it is
flaky and where it is quarantined; the list of tests failing now on each backend with the upstream
commit they started failing at (``/failing``); and the flaky tests (``/api/tests/flaky``).

Flaky: the test both passed and failed for one backend on one tested torch commit (re-runs, attempts,
``/retest``); the evidence is the runs of each outcome. Quarantined: the backend's descriptor lists
it in ``relay.quarantine`` (reason, expiry); once its newest RELEASE_AFTER_PASSES results on that
backend all passed, the page proposes releasing it.

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
from relay.trust import RELEASE_AFTER_PASSES

router = APIRouter()

PAGE = 100  # tests failing now per page
MAX_PAGE = 500
STREAK_LIMIT = 50  # results walked back per test for its streak
FLAKY_DAYS = 30  # how far back the test page looks for flaky evidence


class HistoryItem(BaseModel):
    backend: str
    run: int
    pr_number: int | None
    head_sha: str
    outcome: str
    duration: float
    message: str
    recorded_at: str | None


class FlakyItem(BaseModel):
    backend: str
    test_id: str
    torch_commit: str = Field(description="the torch commit both outcomes were seen on")
    passed_runs: list[int]
    failed_runs: list[int]
    last_seen: str | None


class QuarantineItem(BaseModel):
    backend: str
    match: str
    reason: str
    expires: str
    link: str | None
    passes_in_a_row: int = Field(description="newest results on this backend that passed, in a row")
    release_proposed: bool = Field(description=f"passes_in_a_row reached {RELEASE_AFTER_PASSES}")


class TestPage(BaseModel):
    test_id: str
    latest: dict[str, str]  # backend -> latest outcome
    flaky: list[FlakyItem]
    quarantined: list[QuarantineItem]
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


def flaky_items(ctx: DashboardContext, days: int, *, test_id: str | None = None,
                backend: str | None = None) -> list[FlakyItem]:
    found = ctx.store.flaky_tests(utcnow() - dt.timedelta(days=days), test_id=test_id, backend=backend)
    return [FlakyItem(backend=f.backend, test_id=f.test_id, torch_commit=f.torch_commit, passed_runs=list(f.passed_runs),
                      failed_runs=list(f.failed_runs), last_seen=iso(f.last_seen))
            for f in found if f.backend in ctx.backends]


def _passes_in_a_row(history, backend: str) -> int:
    count = 0
    for item in history:  # newest first
        if item.backend != backend or item.outcome in ("skipped", "xfailed"):
            continue
        if item.outcome != "passed":
            break
        count += 1
    return count


def quarantine_items(ctx: DashboardContext, test_id: str, history) -> list[QuarantineItem]:
    out = []
    for target in ctx.backends.values():
        entry = target.quarantined(test_id, utcnow().date())
        if entry is None:
            continue
        passes = _passes_in_a_row(history, target.name)
        out.append(QuarantineItem(backend=target.name, match=entry.match, reason=entry.reason,
                                  expires=entry.expires.isoformat(), link=entry.link, passes_in_a_row=passes,
                                  release_proposed=passes >= RELEASE_AFTER_PASSES))
    return out


def build_test(ctx: DashboardContext, test_id: str, limit: int) -> TestPage:
    history = [h for h in ctx.store.test_history(test_id, limit) if h.backend in ctx.backends]
    if not history:
        raise HTTPException(404, f"no results for test {test_id!r}")
    latest: dict[str, str] = {}
    for item in history:
        latest.setdefault(item.backend, item.outcome)
    return TestPage(test_id=test_id, latest=latest, flaky=flaky_items(ctx, FLAKY_DAYS, test_id=test_id),
                    quarantined=quarantine_items(ctx, test_id, history), history=[
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


@router.get("/api/tests/flaky", response_model=list[FlakyItem], tags=["dashboard API"])
def flaky_api(ctx: Annotated[DashboardContext, Depends(context)], days: int = Query(FLAKY_DAYS, ge=1, le=365),
              backend: str | None = Query(None, max_length=100)) -> list[FlakyItem]:
    """Tests that both passed and failed for one backend on one torch commit, with the runs of each."""
    return flaky_items(ctx, days, backend=backend)


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
