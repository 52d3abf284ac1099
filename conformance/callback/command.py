"""``conformance callback``: a downstream run tells the relay it started, then how it ended.

Run by the reusable workflow (``.github/workflows/conformance.yml``) twice per job: ``in-progress`` when
the job starts and ``completed`` at the end, whatever happened before it. Reads the dispatch and run
from the environment the workflow sets (``RELAY_CALLBACK_URL``, ``NONCE``, ``RUN_ID``, ``RUN_ATTEMPT``,
``RUN_URL``), the credential (``credential``) and, for ``completed``, the JSON report; sends it through
``delivery``.

A report that is missing, truncated or off-schema is never sent: the callback says ``completed`` with
conclusion ``failure`` and a message naming the problem, so the relay hears about every run.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from conformance.callback import workflow_log
from conformance.callback.delivery import MESSAGE_LIMIT, Delivery
from conformance.callback.transport import CallbackFailed, RetryPolicy
from conformance.callback.workflow_log import annotate

# user:password@ (or a token@) in a URL (a private index in a pip log, say): never sent to the relay.
_URL_CREDENTIALS = re.compile(r"(\w+://)[^/\s@]+@")
# A workflow command that starts a log line (``::error::``, ``::warning file=x::``): the relay shows its text.
_ANNOTATION = re.compile(r"^::(?:error|warning|notice)(?: [^\n]*?)?::", re.M)
_DESCRIPTION = "Tell the relay this CI run started (in-progress) or how it ended (completed)."


def conclusion_for(suite_outcome: str, job_status: str, *, started_at: float | None = None,
                   timeout_minutes: float | None = None, now: float | None = None) -> str:
    """The run's conclusion from the suite step's outcome and ``job.status``.

    A cancelled or failed job that has used up its ``timeout-minutes`` is ``timed_out`` (GitHub shows a
    job time-out as a cancellation to the steps that still run)."""
    if suite_outcome == "success" and job_status != "cancelled":
        return "success"
    if started_at is not None and timeout_minutes:
        elapsed = (time.time() if now is None else now) - started_at
        if elapsed >= timeout_minutes * 60 - 30:
            return "timed_out"
    if job_status == "cancelled" or suite_outcome == "cancelled":
        return "cancelled"
    return "failure"


def read_report(path: Path | None) -> tuple[dict[str, Any] | None, str | None]:
    """(report, None) for a valid report; (None, why) when there is none or it cannot be sent.

    The schema (pydantic, jsonschema) is imported only when there is a report: when the package did not
    install, the workflow runs this client from its source on the standard library alone, and there is
    no report then."""
    if path is None:
        return None, "no report path was given"
    if not path.is_file():
        return None, f"the suite wrote no report at {path}"
    from conformance.report import ReportValidationError, validate_report

    try:
        data = json.loads(path.read_bytes())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        return None, f"the report at {path} is not valid JSON (truncated?): {exc}"
    if not isinstance(data, dict):
        return None, f"the report at {path} is not a JSON object"
    try:
        validate_report(data)
    except ReportValidationError as exc:
        return None, f"the report at {path} does not follow the report schema: {exc}"
    return data, None


def _step_tail(step_log: Path | None, secrets: list[str], room: int) -> str:
    """The last ``room`` characters of a step's log, secrets and URL credentials blotted out, annotations
    as their text."""
    if step_log is None or not step_log.is_file():
        return ""
    text = step_log.read_bytes()[-64 * 1024:].decode("utf-8", "replace")
    for secret in sorted(filter(None, secrets), key=len, reverse=True):
        text = text.replace(secret, "***")
    text = _ANNOTATION.sub("", _URL_CREDENTIALS.sub(r"\1***@", text)).strip()
    return text if len(text) <= room else "…" + text[-(room - 1):]


def completed_body(run: Mapping[str, Any], conclusion: str, report_path: Path | None, *,
                   failed_step: str | None = None, step_log: Path | None = None,
                   secrets: list[str] | None = None) -> dict[str, Any]:
    """The ``completed`` body: the report when it is valid, else conclusion ``failure`` and the reason.

    ``failed_step`` names the job's step that failed (or was cancelled) before the suite could run; the
    reason is then that step and the last lines of its log (``step_log``), ``secrets`` blotted out."""
    report, problem = read_report(report_path)
    body: dict[str, Any] = {**run, "state": "completed", "conclusion": conclusion}
    if report is not None:
        body["report"] = report
        return body
    headline = problem
    if failed_step:
        ended = "was cancelled" if conclusion == "cancelled" else "failed"
        headline = f"step '{failed_step}' {ended} before the suite ran"
        tail = _step_tail(step_log, secrets or [], MESSAGE_LIMIT - len(headline) - 20)
        problem = f"{headline}; its last lines:\n{tail}" if tail else headline
    if conclusion in ("success", "failure"):
        # A success without a report proves nothing; a failure without one still says why.
        body["conclusion"] = "failure"
        body["message"] = problem[:MESSAGE_LIMIT]
        annotate("error" if conclusion == "success" else "warning", f"{headline}; reporting conclusion failure")
    elif failed_step:
        body["message"] = problem[:MESSAGE_LIMIT]
    return body


def _run_fields(env: Mapping[str, str]) -> dict[str, Any]:
    missing = [name for name in ("RELAY_CALLBACK_URL", "NONCE", "RUN_ID") if not env.get(name)]
    if missing:
        raise CallbackFailed(f"{', '.join(missing)} unset: the workflow's job env provides them")
    try:
        run_id, attempt = int(env["RUN_ID"]), int(env.get("RUN_ATTEMPT") or 1)
    except ValueError:
        raise CallbackFailed(f"RUN_ID {env['RUN_ID']!r} / RUN_ATTEMPT {env.get('RUN_ATTEMPT')!r} must be integers") from None
    fields: dict[str, Any] = {"nonce": env["NONCE"], "run_id": run_id, "run_attempt": attempt}
    if env.get("RUN_URL", "").startswith(("http://", "https://")):
        fields["run_url"] = env["RUN_URL"]
    return fields


def _optional(convert: Callable[[str], Any]) -> Callable[[str], Any]:
    """An option value where an empty string (or 0) means "not known": the workflow passes "" when a
    step that sets it never ran."""
    return lambda text: convert(text) if text.strip() not in ("", "0") else None


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--max-seconds", type=float, default=300.0,
                        help="give up retrying after this many seconds in total (default 300)")
    parser.add_argument("--backoff-seconds", type=float, default=1.0,
                        help="first retry delay, doubled per attempt up to 60 s (default 1)")
    states = parser.add_subparsers(dest="callback_state", required=True, metavar="STATE")
    states.add_parser("in-progress", help="the run has started")
    done = states.add_parser("completed", help="the run has ended (always send it, whatever happened)")
    done.add_argument("--suite-outcome", required=True, help="steps.<suite>.outcome: success, failure, cancelled, skipped")
    done.add_argument("--job-status", required=True, help="job.status: success, failure, cancelled")
    done.add_argument("--report", type=_optional(Path), default=None, help="the JSON report the suite wrote")
    done.add_argument("--started-at", type=_optional(float), default=None,
                      help="the job's start (epoch seconds), for time-outs; empty or 0: unknown")
    done.add_argument("--timeout-minutes", type=float, default=None, help="the job's timeout-minutes")
    done.add_argument("--failed-step", default="", help="the job's step that failed before the suite ran (its name)")
    done.add_argument("--step-log", type=_optional(Path), default=None,
                      help="that step's log: its last lines go to the relay with the conclusion")


def run_callback(args: argparse.Namespace, env: Mapping[str, str] | None = None) -> int:
    env = os.environ if env is None else env
    workflow_log.in_actions = env.get("GITHUB_ACTIONS") == "true"
    try:
        run = _run_fields(env)
        delivery = Delivery(env["RELAY_CALLBACK_URL"], env, RetryPolicy(max_seconds=args.max_seconds,
                                                                           first_delay=args.backoff_seconds))
        if args.callback_state == "in-progress":
            answer = delivery.send({**run, "state": "in_progress"})
        else:
            conclusion = conclusion_for(args.suite_outcome, args.job_status, started_at=args.started_at,
                                        timeout_minutes=args.timeout_minutes)
            secrets = [env.get(name, "") for name in ("RELAY_CALLBACK_TOKEN", "ACTIONS_ID_TOKEN_REQUEST_TOKEN")]
            body = completed_body(run, conclusion, args.report, failed_step=args.failed_step or None,
                                  step_log=args.step_log, secrets=secrets)
            answer = delivery.report(body, run)
    except CallbackFailed as exc:
        annotate("error", str(exc))
        return 1
    print(f"relay: run {answer.get('run')} of {answer.get('backend')} is {answer.get('state')}"
          + (f" ({answer['conclusion']})" if answer.get("conclusion") else ""), flush=True)
    return 0


def register(subcommands: Any) -> None:
    """Add ``callback`` to the ``conformance`` command's subcommands."""
    parser = subcommands.add_parser("callback", help="report this CI run's state to the relay (used by the workflow)",
                                    description=_DESCRIPTION)
    _arguments(parser)
    parser.set_defaults(func=run_callback)


def build_parser() -> argparse.ArgumentParser:
    """The same options as ``conformance callback``, as a parser of its own (``python -m conformance.callback``)."""
    parser = argparse.ArgumentParser(prog="conformance callback", description=_DESCRIPTION)
    _arguments(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    return run_callback(build_parser().parse_args(argv))
