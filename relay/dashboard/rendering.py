"""What every dashboard page shares: the Jinja2 environment (autoescaping on), the request's context
(store, visible backends, level criteria), and small formatting helpers.

Read by each page module; reads the app's parts (``relay.assembly.parts_of``); writes nothing.
Every string that came from outside (PR titles, test ids, failure messages, run URLs) reaches HTML
only through Jinja2 with autoescaping, and reaches scripts only through ``tojson`` inside a
``<script type="application/json">`` block, which escapes ``<``, ``>`` and ``&``.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fastapi import HTTPException, Request
from fastapi.responses import HTMLResponse
from jinja2 import Environment, FileSystemLoader, select_autoescape

from relay.levels.review import criteria_from_settings
from relay.assembly import parts_of
from relay.trust import BackendTarget, LevelCriteria, TrustLevel

if TYPE_CHECKING:
    from relay.store import Store

__all__ = ["DashboardContext", "STATIC_DIR", "context", "render"]

HERE = Path(__file__).resolve().parent
STATIC_DIR = HERE / "static"
_env = Environment(
    loader=FileSystemLoader(HERE / "templates"),
    autoescape=select_autoescape(enabled_extensions=("html",), default=True),
    trim_blocks=True,
    lstrip_blocks=True,
)

_OUTCOME_CLASS = {
    "success": "ok", "failure": "bad", "timed_out": "bad", "action_required": "bad", "neutral": "warn",
    "cancelled": "muted", "skipped": "muted", "dispatched": "pending", "in_progress": "pending",
    "passed": "ok", "failed": "bad", "error": "bad", "xpassed": "bad", "xfailed": "muted",
    "unexpected_pass": "ok",
}


def outcome_class(outcome: str | None) -> str:
    return _OUTCOME_CLASS.get(outcome or "", "muted")


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 60:
        return f"{seconds:.0f} s"
    if seconds < 3600:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def when(value: dt.datetime | None) -> str:
    return "-" if value is None else value.strftime("%Y-%m-%d %H:%M UTC")


_env.filters.update(outcome_class=outcome_class, duration=duration, when=when, short=lambda s: (s or "")[:10])


@dataclasses.dataclass(frozen=True)
class DashboardContext:
    store: Store
    backends: dict[str, BackendTarget]  # the backends shown on the dashboard, by name
    hidden: tuple[str, ...]  # allowlisted but not shown (L1 in the levels table)
    criteria: dict[TrustLevel, LevelCriteria]  # the level criteria, with the settings' overrides
    upstream: str


def context(request: Request) -> DashboardContext:
    state = parts_of(request)
    visible = {t.name: t for t in state.allowlist if t.on_dashboard}
    hidden = tuple(t.name for t in state.allowlist if not t.on_dashboard)
    return DashboardContext(state.store, visible, hidden, criteria_from_settings(state.settings), state.settings.upstream_repo)


def backend_or_404(ctx: DashboardContext, name: str):
    target = ctx.backends.get(name)
    if target is None:
        raise HTTPException(404, f"no backend {name!r} on the dashboard")
    return target


def render(template: str, **values: Any) -> HTMLResponse:
    return HTMLResponse(_env.get_template(template).render(**values))


def iso(value: dt.datetime | None) -> str | None:
    return None if value is None else value.replace(microsecond=0).isoformat() + "Z"
