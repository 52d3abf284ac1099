"""Overview page (``/``) and its API (``/api/overview``): backends x recent upstream PRs and commits.

Each row is one upstream change (a PR head or a pushed commit), newest first; each cell the outcome of
that backend's latest run on it, coloured; each column header shows the backend's level and the level
review's recommendation; below, how many rows each background pass set aside. Reads runs, the level
review and the quarantine counts; writes nothing.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import HTMLResponse
from pydantic import BaseModel

from relay.dashboard.rendering import DashboardContext, context, iso, render
from relay.levels.review import review

router = APIRouter()


class BackendColumn(BaseModel):
    name: str
    level: str
    recommendation: str
    recommended_level: str
    reason: str


class Cell(BaseModel):
    run: int
    outcome: str


class Row(BaseModel):
    key: str
    event: str
    pr_number: int | None
    title: str | None
    head_sha: str
    head_ref: str | None
    dispatched_at: str | None
    cells: dict[str, Cell]


class Overview(BaseModel):
    upstream: str
    backends: list[BackendColumn]
    hidden_backends: list[str]
    rows: list[Row]
    # Rows background passes set aside, per pass (their errors: /api/quarantine; retry: relay quarantined retry).
    set_aside: dict[str, int] = {}


def build(ctx: DashboardContext, limit: int) -> Overview:
    reviews = review(ctx.store, list(ctx.backends.values()), criteria=ctx.criteria)
    columns = [BackendColumn(name=r.backend, level=r.level, recommendation=r.recommendation,
                             recommended_level=r.recommended_level, reason=r.reason) for r in reviews]
    rows: dict[str, Row] = {}
    for run in ctx.store.runs(limit=limit * max(1, len(ctx.backends)) * 3):
        if run.backend not in ctx.backends:
            continue
        key = f"pr-{run.pr_number}-{run.head_sha}" if run.pr_number is not None else f"push-{run.head_sha}"
        row = rows.get(key)
        if row is None:
            if len(rows) >= limit:
                continue
            row = rows[key] = Row(key=key, event=run.event, pr_number=run.pr_number, title=run.title,
                                  head_sha=run.head_sha, head_ref=run.head_ref, dispatched_at=iso(run.dispatched_at),
                                  cells={})
        row.cells.setdefault(run.backend, Cell(run=run.id, outcome=run.outcome))  # newest run wins
    return Overview(upstream=ctx.upstream, backends=columns, hidden_backends=list(ctx.hidden), rows=list(rows.values()),
                    set_aside=ctx.store.quarantine_counts())


@router.get("/api/overview", response_model=Overview, tags=["dashboard API"])
def overview_api(ctx: Annotated[DashboardContext, Depends(context)], limit: int = Query(30, ge=1, le=200)) -> Overview:
    """Backends (level, recommendation) x recent upstream PRs and commits (latest run's outcome)."""
    return build(ctx, limit)


@router.get("/", response_class=HTMLResponse, include_in_schema=False)
def overview_page(request: Request, ctx: Annotated[DashboardContext, Depends(context)]) -> HTMLResponse:
    return render("overview.html", page=build(ctx, 30), title="Overview")
