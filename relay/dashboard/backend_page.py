"""Backend page (``/backends/{name}``) and its API: run history, pass rate and queue/execution time
charts, the current level, the level review's recommendation, each criterion with its value and bar, the
level holds (below its bar since when and why, whether its check is non-blocking, how each ended) and
the weekly history.

Reads runs, level holds and the level review; writes nothing. The charts are drawn in the browser by the vendored
uPlot (``static/vendor``) from the same data the API returns.
"""

from __future__ import annotations

import dataclasses
from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import HTMLResponse
from pydantic import BaseModel

from relay.dashboard.rendering import DashboardContext, backend_or_404, context, iso, render
from relay.levels.review import review, weekly_history

router = APIRouter()


class RunItem(BaseModel):
    run: int
    event: str
    pr_number: int | None
    title: str | None
    head_sha: str
    state: str
    outcome: str
    dispatched_at: str | None
    queue_seconds: float | None
    execution_seconds: float | None
    passed: int | None
    total: int | None
    pass_rate: float | None
    run_url: str | None
    torch_git_version: str | None = None
    provenance: str | None = None  # matched | mismatched | unknown (conformance.provenance); null without a report
    provenance_problem: str | None = None


class Week(BaseModel):
    since: str
    until: str
    runs: int
    success_rate: float | None
    time_to_result_p50: float | None
    time_to_result_max: float | None


class CriterionItem(BaseModel):
    level: str
    measure: str
    comparison: str  # above | below | at_least
    bar: float
    window_days: int
    value: float | None
    met: bool | None  # None: nothing to measure yet
    entry: bool  # a criterion for entering the level above, not for holding this one
    label: str
    value_text: str
    bar_text: str


class HoldItem(BaseModel):
    level: str  # the level whose hold bar it fell below
    reason: str
    started_at: str
    above_since: str | None  # back above its bar since (None: still below)
    ended_at: str | None
    ended_by: str | None  # recovered | restored: <reason> | level changed: <from> -> <to>
    active: bool


class BackendPage(BaseModel):
    name: str
    repository: str
    level: str
    label: str
    blocks: bool  # whether its check may fail a PR now (its level blocks and no active hold suspends it)
    hold: HoldItem | None  # the active level hold
    holds: list[HoldItem]  # every hold, newest first (at most 20)
    recommendation: str
    recommended_level: str
    reason: str
    criteria: list[CriterionItem]
    weeks: list[Week]
    runs: list[RunItem]


def run_item(run) -> RunItem:
    counts = (run.summary or {}).get("counts") or {}
    total = counts.get("total")
    passed = counts.get("passed")
    considered = (total or 0) - (counts.get("skipped") or 0)
    rate = None if not considered or passed is None else passed / considered
    return RunItem(
        run=run.id, event=run.event, pr_number=run.pr_number, title=run.title, head_sha=run.head_sha, state=run.state,
        outcome=run.outcome, dispatched_at=iso(run.dispatched_at), queue_seconds=run.queue_seconds,
        execution_seconds=run.execution_seconds, passed=passed, total=total, pass_rate=rate, run_url=run.run_url,
        torch_git_version=run.torch_git_version, provenance=run.provenance, provenance_problem=run.provenance_problem,
    )


def hold_item(hold) -> HoldItem:
    return HoldItem(level=hold.level, reason=hold.reason, started_at=iso(hold.started_at),
                    above_since=iso(hold.above_since) if hold.above_since else None,
                    ended_at=iso(hold.ended_at) if hold.ended_at else None, ended_by=hold.ended_by, active=hold.active)


def build(ctx: DashboardContext, name: str, limit: int) -> BackendPage:
    target = backend_or_404(ctx, name)
    holds = ctx.store.level_holds(name)
    active = next((h for h in holds if h.active), None)
    history = weekly_history(ctx.store, name, time_limit_seconds=ctx.criteria[target.level].time_limit_seconds)
    (level_review,) = review(ctx.store, [target], criteria=ctx.criteria)
    weeks = [
        Week(since=iso(w.since), until=iso(w.until), runs=w.runs, success_rate=w.success_rate,
             time_to_result_p50=w.time_to_result_p50, time_to_result_max=w.time_to_result_max)
        for w in history
    ]
    return BackendPage(
        name=name, repository=target.repository, level=target.level.value, label=target.label,
        blocks=target.blocks_under(active), hold=hold_item(active) if active else None,
        holds=[hold_item(h) for h in holds],
        recommendation=level_review.recommendation, recommended_level=level_review.recommended_level,
        reason=level_review.reason, weeks=weeks,
        criteria=[CriterionItem(**dataclasses.asdict(c), label=c.label, value_text=c.value_text,
                                bar_text=c.bar_text) for c in level_review.criteria],
        runs=[run_item(r) for r in ctx.store.runs(backend=name, limit=limit)],
    )


@router.get("/api/backends/{name}", response_model=BackendPage, tags=["dashboard API"],
            responses={404: {"description": "no such backend on the dashboard"}})
def backend_api(name: str, ctx: Annotated[DashboardContext, Depends(context)],
                limit: int = Query(100, ge=1, le=1000)) -> BackendPage:
    """One backend: level, recommendation, weekly history, and its runs (newest first)."""
    return build(ctx, name, limit)


@router.get("/backends/{name}", response_class=HTMLResponse, include_in_schema=False)
def backend_page(request: Request, name: str, ctx: Annotated[DashboardContext, Depends(context)]) -> HTMLResponse:
    page = build(ctx, name, 100)
    chart = [r.model_dump() for r in reversed(page.runs) if r.dispatched_at]
    return render("backend.html", page=page, chart=chart, title=f"Backend {name}")
