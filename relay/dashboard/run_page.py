"""Run page (``/runs/{run}``) and its API: one downstream run, its per-suite counts and failing tests.

This is the page upstream check runs and statuses link to. Reads the run and its test results;
writes nothing.
"""

from __future__ import annotations

import datetime as dt
import typing
from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Path, Request
from fastapi.responses import HTMLResponse
from pydantic import BaseModel, Field, create_model

from relay.dashboard.rendering import DashboardContext, context, iso, render
from relay.store.per_test_results import FAILING_OUTCOMES
from relay.store.runs import RunView

router = APIRouter()


class Failure(BaseModel):
    test_id: str
    suite: str
    outcome: str
    duration: float
    message: str


# The page is the store's run view (relay.store.runs.RunView): its fields and properties, read as they
# are, with its times in ISO form. Left out: the store's own keys and what the page shows in another form.
_NOT_SHOWN = {"id", "dispatch_id", "delivery_id", "updated_at", "summary"}
_DESCRIPTIONS = {
    "torch_git_version": "the commit the tested torch was built from (the report's)",
    "provenance": "matched | mismatched | unknown against head_sha; null without a report",
    "provenance_problem": "why this is not a result for head_sha, when it is not",
}


def _is_time(annotation: Any) -> bool:
    return annotation is dt.datetime or dt.datetime in typing.get_args(annotation)


def _view_fields() -> dict[str, Any]:
    """RunView's fields and properties as the page's: name -> (type, Field); a time becomes its ISO text."""
    hints = typing.get_type_hints(RunView)
    for name, member in vars(RunView).items():
        if isinstance(member, property):
            hints[name] = typing.get_type_hints(member.fget)["return"]
    return {name: (str | None if _is_time(hint) else hint, Field(description=_DESCRIPTIONS.get(name)))
            for name, hint in hints.items() if name not in _NOT_SHOWN}


_SHOWN = _view_fields()
_TIMES = tuple(name for name, hint in typing.get_type_hints(RunView).items() if name in _SHOWN and _is_time(hint))

RunPage = create_model(
    "RunPage",
    run=(int, ...), level=(str, Field(description="the backend's trust level")),
    **_SHOWN,
    counts=(dict[str, int], ...), suites=(dict[str, dict[str, int]], ...), failures=(list[Failure], ...),
)


def build(ctx: DashboardContext, run_pk: int) -> RunPage:
    run = ctx.store.run(run_pk)
    if run is None or run.backend not in ctx.backends:
        raise HTTPException(404, f"no run {run_pk} on the dashboard")
    failures = ctx.store.test_results([run.id], FAILING_OUTCOMES)
    summary = run.summary or {}
    shown = {name: getattr(run, name) for name in _SHOWN}
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
