"""The summary text of a run upstream: a check run's Markdown summary and a commit status's one line.

Used by the reporter (:mod:`relay.results.reporter`) and the level proposals (``md_code``); reads and
writes nothing. Everything a report carries (test ids, suite names, torch versions, messages) goes
through ``md_code`` or ``plain_text``, so no text from a downstream run becomes a link, a mention or HTML.

Two forms, for the reporter's two modes: a GitHub App writes check runs (name
``crcr/<backend>``, ``external_id`` = the run's id, details link = the dashboard's run page, summary
with per-suite counts and the first failing tests); a plain token writes commit statuses (context
``crcr/<backend>``, description cut to 140 characters). Commit statuses have no neutral state: an L3
failure is reported as ``success`` whose description starts with ``neutral (non-blocking)``, so the
PR is not marked red by a backend that cannot block it.
"""

from __future__ import annotations

import datetime as dt
import re

from relay.results.fixed_entries import FixedEntry
from relay.results.verdict import Decision, Failures
from relay.store.runs import RunView
from relay.trust import HeldBelowBar

__all__ = ["DESCRIPTION_MAX_CHARS", "FIRST_FAILURES", "SUMMARY_MAX_CHARS", "check_title", "fixed_phrase", "github_time",
           "held_line", "md_code", "plain_text", "status_description", "summary_markdown"]

FIRST_FAILURES = 10
SUMMARY_MAX_CHARS = 65_000  # GitHub allows 65 535
DESCRIPTION_MAX_CHARS = 140


def _counts_line(run: RunView) -> str:
    counts = (run.summary or {}).get("counts")
    if not counts:
        return {"timed_out": "timed out", "cancelled": "cancelled"}.get(run.state, "no report")
    parts = [f"{counts.get('passed', 0)} passed"]
    for key, word in (("failed", "failed"), ("errors", "errors"), ("xpassed", "xpassed"),
                      ("unexpected_passes", "unexpected passes"), ("skipped", "skipped")):
        if counts.get(key):
            parts.append(f"{counts[key]} {word}")
    return ", ".join(parts)


def md_code(text: str, *, in_table: bool = False) -> str:
    """``text`` as one inert Markdown code span: no link, image, HTML, mention or autolink survives.

    Everything a report carries (test ids, suite names, torch versions) is written through this. The
    fence is one backtick longer than the longest run of backticks inside, so nothing can close it
    early; line breaks become spaces (they would end a list item or a table row); in a table, ``|``
    is escaped, because GitHub splits cells before it reads code spans.
    """
    flat = " ".join(text.split())
    longest = max((len(run) for run in re.findall(r"`+", flat)), default=0)
    fence = "`" * (longest + 1)
    if in_table:
        flat = flat.replace("|", "\\|")
    return f"{fence} {flat} {fence}" if flat else "` `"


def plain_text(text: str) -> str:
    """One line of printable text (commit status descriptions are shown as they are sent)."""
    return "".join(ch if ch.isprintable() else " " for ch in " ".join(text.split()))


def _quarantined_line(failures: Failures) -> str:
    return f"{len(failures.quarantined)} quarantined failure(s) (non-blocking)"


def check_title(run: RunView, split: Failures) -> str:
    """A check run's title after its name: the counts, and how many failures were quarantined."""
    return f"{_counts_line(run)}; {_quarantined_line(split)}"


def held_line(hold: HeldBelowBar, review_url: str) -> str:
    return (f"**Non-blocking**: below its {hold.level} bar since {github_time(hold.started_at)} "
            f"({md_code(hold.reason)}); level review: {review_url}")


def _fixed_lines(run: RunView, fixed: tuple[FixedEntry, ...]) -> list[str]:
    """What this run found fixed: each known failure of the backend whose tests now pass (news, not a failure)."""
    if not fixed:
        return []
    tests = sum(entry.count for entry in fixed)
    lines = ["", f"**Fixes {len(fixed)} known failure(s) of `{run.backend}`** ({tests} test(s) listed as failing "
             "there now pass; the backend's descriptor should bound or remove each entry):", ""]
    for entry in fixed[:FIRST_FAILURES]:
        bound = f", bound {md_code(entry.torch)}" if entry.torch else ""
        lines.append(f"- {md_code(entry.match)}: {md_code(entry.reason)} ({md_code(entry.link)}{bound}); "
                     f"{entry.count} test(s)" + (f", first {md_code(entry.tests[0])}" if entry.tests else ""))
    if len(fixed) > FIRST_FAILURES:
        lines.append(f"- and {len(fixed) - FIRST_FAILURES} more entries")
    return lines


def fixed_phrase(fixed: tuple[FixedEntry, ...]) -> str:
    """``fixes known failure <match>`` (and how many more), for one-line texts."""
    more = f" and {len(fixed) - 1} more" if len(fixed) > 1 else ""
    return f"fixes known failure {plain_text(fixed[0].match)}{more}" if fixed else ""


def summary_markdown(run: RunView, split: Failures, details_url: str, hold: HeldBelowBar | None = None,
                     review_url: str = "", fixed: tuple[FixedEntry, ...] = ()) -> str:
    failures = list(split.blocking)
    lines = [f"**{_counts_line(run)}** on `{run.backend}`; {_quarantined_line(split)}"]
    if run.torch_version:
        lines[0] += f" (torch {md_code(run.torch_version)})"
    if hold is not None:
        lines.append("\n" + held_line(hold, review_url))
    if run.provenance_problem:
        lines.append(f"\n**Not a result for this commit**: {md_code(run.provenance_problem)}")
    if run.reason:
        lines.append(f"\nReason: {run.reason.replace('_', ' ')}")
    suites = (run.summary or {}).get("suites") or {}
    if suites:
        lines += ["", "| suite | passed | failed | errors | skipped | xfailed | total |", "|---|---|---|---|---|---|---|"]
        for suite, c in suites.items():
            lines.append(
                f"| {md_code(suite, in_table=True)} | {c.get('passed', 0)} | {c.get('failed', 0)} | {c.get('errors', 0)} | "
                f"{c.get('skipped', 0)} | {c.get('xfailed', 0)} | {c.get('total', 0)} |"
            )
    if failures:
        lines += ["", f"First failing tests ({min(len(failures), FIRST_FAILURES)} of {len(failures)}):", ""]
        for failure in failures[:FIRST_FAILURES]:
            message = failure.message.strip()[:1500]
            lines.append(f"- {md_code(failure.test_id)} ({failure.outcome})")
            if message:
                # A fenced block is literal text; its fence outgrows any backtick run of the message.
                fence = "`" * max(3, 1 + max((len(run) for run in re.findall(r"`+", message)), default=0))
                lines += [f"  {fence}", *("  " + m for m in message.splitlines()[:15]), f"  {fence}"]
    lines += _fixed_lines(run, fixed)
    if split.quarantined:
        lines += ["", f"Quarantined failing tests (non-blocking; {len(split.quarantined)}):", ""]
        for failure, entry in split.quarantined[:FIRST_FAILURES]:
            lines.append(f"- {md_code(failure.test_id)} ({failure.outcome}): quarantined until {entry.expires.isoformat()}, "
                         f"{md_code(entry.reason)}")
    lines += ["", f"Full results: {details_url}"]
    text = "\n".join(lines)
    return text if len(text) <= SUMMARY_MAX_CHARS else text[: SUMMARY_MAX_CHARS - 20] + "\n\n(cut)"


def _reason_line(reason: str, room: int) -> str:
    """A run's reason on one line: whole when it fits in ``room``, else its first line, less a closing
    clause that only announces the lines left out ("...; its last lines:")."""
    whole = plain_text(reason)
    if len(whole) <= room:
        return whole
    first = reason.splitlines()[0].rstrip()
    if first.endswith(":"):
        head, separator, _ = first.rpartition("; ")
        first = head if separator else first.rstrip(":")
    return plain_text(first)


def status_description(run: RunView, decision: Decision, split: Failures, fixed: tuple[FixedEntry, ...] = ()) -> str:
    failures = split.blocking
    if decision.withdrawn:
        text = f"neutral: {decision.withdrawn}"
    elif decision.status == "queued":
        text = "queued: waiting for the backend's runner"
    elif decision.status == "in_progress":
        text = "running the conformance suite"
    else:
        text = _counts_line(run)
        if not (run.summary or {}).get("counts") and run.reason:
            # No report: the reason is all there is (the job's failed step, a missing report, ...).
            text += f": {_reason_line(run.reason, DESCRIPTION_MAX_CHARS - len(text) - 2)}"
        if split.quarantined:
            text += f"; {len(split.quarantined)} quarantined"
        if failures:
            text += f"; first: {plain_text(failures[0].test_id)}"
        if fixed:
            text += f"; {fixed_phrase(fixed)}"
        if run.provenance_problem:
            text = plain_text(run.provenance_problem.split(" (")[0]) + f"; {text}"
        if decision.conclusion == "neutral":
            held = f", below its {decision.hold.level} bar" if decision.hold is not None else ""
            text = f"neutral (non-blocking{held}): {text}"
    return text if len(text) <= DESCRIPTION_MAX_CHARS else text[: DESCRIPTION_MAX_CHARS - 1] + "…"


def github_time(when: dt.datetime | None) -> str | None:
    return None if when is None else when.replace(microsecond=0).isoformat() + "Z"
