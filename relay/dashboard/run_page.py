"""Run page (``/runs/{run}``) and its API: one downstream run, its per-suite counts and failing tests.

This is the page upstream check runs and statuses link to. Reads the run and its test results;
writes nothing.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, HTTPException, Path, Request
from fastapi.responses import HTMLResponse
from pydantic import BaseModel, Field

from relay.dashboard.rendering import DashboardContext, context, iso, render
from relay.store.per_test_results import FAILING_OUTCOMES

router = APIRouter()


class Failure(BaseModel):
    test_id: str
    suite: str
    outcome: str
    duration: float
    message: str


class RunPage(BaseModel):
    run: int
    backend: str
    level: str
    event: str
    upstream_repository: str
    pr_number: int | None
    title: str | None
    head_sha: str
    head_ref: str | None
    run_id: int | None
    run_attempt: int | None
    run_url: str | None
    state: str
    conclusion: str | None
    outcome: str
    reason: str | None
    dispatched_at: str | None
    started_at: str | None
    finished_at: str | None
    queue_seconds: float | None
    execution_seconds: float | None
    torch_version: str | None
    torch_git_version: str | None = Field(description="the commit the tested torch was built from (the report's)")
    provenance: str | None = Field(description="matched | mismatched | unknown against head_sha; null without a report")
    provenance_problem: str | None = Field(description="why this is not a result for head_sha, when it is not")
    counts: dict[str, int]
    suites: dict[str, dict[str, int]]
    failures: list[Failure]


_TIMES = ("dispatched_at", "started_at", "finished_at")


def build(ctx: DashboardContext, run_pk: int) -> RunPage:
    run = ctx.store.run(run_pk)
    if run is None or run.backend not in ctx.backends:
        raise HTTPException(404, f"no run {run_pk} on the dashboard")
    failures = ctx.store.test_results([run.id], FAILING_OUTCOMES)
    summary = run.summary or {}
    # The page is the store's run view (every field of RunPage it has, read as it is), with times in
    # ISO form, the backend's level, the report's counts and the failing tests.
    shown = {name: getattr(run, name) for name in RunPage.model_fields if hasattr(run, name)}
    return RunPage(**{
        **shown, "run": run.id, "level": ctx.backends[run.backend].level.value,
        **{name: iso(getattr(run, name)) for name in _TIMES},
        "counts": summary.get("counts") or {}, "suites": summary.get("suites") or {},
        "failures": [Failure(test_id=f.test_id, suite=f.suite, outcome=f.outcome, duration=f.duration, message=f.message)
                     for f in failures],
    })


@router.get("/api/runs/{run}", response_model=RunPage, tags=["dashboard API"],
            responses={404: {"description": "no such run on the dashboard"}})
def run_api(run: Annotated[int, Path(ge=1, le=2**62)], ctx: Annotated[DashboardContext, Depends(context)]) -> RunPage:
    """One run: state, times, per-suite counts and failing tests with their messages."""
    return build(ctx, run)


@router.get("/runs/{run}", response_class=HTMLResponse, include_in_schema=False)
def run_page(request: Request, run: Annotated[int, Path(ge=1, le=2**62)], ctx: Annotated[DashboardContext, Depends(context)]) -> HTMLResponse:
    page = build(ctx, run)
    return render("run.html", page=page, title=f"Run {run}")
