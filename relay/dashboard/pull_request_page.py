"""PR page (``/prs/{number}``) and its API: every backend's runs on one upstream PR, the failing tests
with their messages, and the cross-backend diff (tests that fail on one backend and pass on the others).

The diff compares each backend's latest finished run on the PR's newest head commit that has
results, leaving out runs whose torch was not that commit (their provenance problem is shown instead). Reads runs and test results; writes nothing.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, HTTPException, Path, Request
from fastapi.responses import HTMLResponse
from pydantic import BaseModel

from relay.dashboard.backend_page import RunItem, run_item
from relay.dashboard.rendering import DashboardContext, context, render
from relay.store.per_test_results import FAILING_OUTCOMES

router = APIRouter()


class FailingTest(BaseModel):
    backend: str
    run: int
    test_id: str
    outcome: str
    message: str


class DiffRow(BaseModel):
    test_id: str
    failing_on: dict[str, str]  # backend -> message
    passing_on: list[str]


class PullRequestPage(BaseModel):
    upstream: str
    number: int
    title: str | None
    head_sha: str | None
    runs: dict[str, list[RunItem]]
    failing: list[FailingTest]
    diff: list[DiffRow]


def build(ctx: DashboardContext, number: int) -> PullRequestPage:
    runs = [r for r in ctx.store.runs(upstream_repository=ctx.upstream, pr_number=number) if r.backend in ctx.backends]
    if not runs:
        raise HTTPException(404, f"no runs for PR #{number} on the dashboard")
    pr = ctx.store.pull_request(ctx.upstream, number)
    by_backend: dict[str, list] = {}
    for run in runs:
        by_backend.setdefault(run.backend, []).append(run)
    # The commit compared: the PR's head if known and finished somewhere, else the newest finished one.
    # A run of another torch than its commit is listed but not compared: its results are not that commit's.
    finished = [r for r in runs if r.summary and not r.provenance_problem]
    head = pr.head_sha if pr is not None else None
    if head is None or not any(r.head_sha == head for r in finished):
        head = finished[0].head_sha if finished else None
    latest: dict[str, int] = {}
    for run in finished:
        if run.head_sha == head:
            latest.setdefault(run.backend, run.id)
    results = ctx.store.test_results(list(latest.values()))
    outcome: dict[str, dict[str, tuple[str, str]]] = {}
    for res in results:
        outcome.setdefault(res.test_id, {})[res.backend] = (res.outcome, res.message)
    failing = [
        FailingTest(backend=res.backend, run=res.run_pk, test_id=res.test_id, outcome=res.outcome, message=res.message)
        for res in results if res.outcome in FAILING_OUTCOMES
    ]
    diff = []
    for test_id, per_backend in sorted(outcome.items()):
        bad = {b: m for b, (o, m) in per_backend.items() if o in FAILING_OUTCOMES}
        good = sorted(b for b, (o, _) in per_backend.items() if o == "passed")
        if bad and good:
            diff.append(DiffRow(test_id=test_id, failing_on=bad, passing_on=good))
    title = next((r.title for r in runs if r.title), None)
    return PullRequestPage(
        upstream=ctx.upstream, number=number, title=title, head_sha=head,
        runs={b: [run_item(r) for r in rs] for b, rs in sorted(by_backend.items())}, failing=failing, diff=diff,
    )


_NUMBER = Path(ge=1, le=2**31 - 1)


@router.get("/api/prs/{number}", response_model=PullRequestPage, tags=["dashboard API"],
            responses={404: {"description": "no runs for that PR"}})
def pull_request_api(number: Annotated[int, _NUMBER], ctx: Annotated[DashboardContext, Depends(context)]) -> PullRequestPage:
    """One upstream PR: runs per backend, failing tests with messages, and the cross-backend diff."""
    return build(ctx, number)


@router.get("/prs/{number}", response_class=HTMLResponse, include_in_schema=False)
def pull_request_page(request: Request, number: Annotated[int, _NUMBER],
                      ctx: Annotated[DashboardContext, Depends(context)]) -> HTMLResponse:
    page = build(ctx, number)
    return render("pull_request.html", page=page, title=f"PR #{number}")
