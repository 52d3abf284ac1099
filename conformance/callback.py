"""``conformance callback``: a downstream run tells the relay it started, then how it ended.

Run by the reusable workflow (``.github/workflows/conformance.yml``) twice per job: ``in-progress`` when
the job starts and ``completed`` at the end, whatever happened before it. Reads the dispatch and run
from the environment the workflow sets (``RELAY_CALLBACK_URL``, ``NONCE``, ``RUN_ID``, ``RUN_ATTEMPT``,
``RUN_URL``), the credential (a GitHub Actions OIDC token for ``RELAY_AUDIENCE``, fetched from
``ACTIONS_ID_TOKEN_REQUEST_URL`` with ``ACTIONS_ID_TOKEN_REQUEST_TOKEN``, or a static
``RELAY_CALLBACK_TOKEN``) and, for ``completed``, the JSON report; writes one HTTP request to the relay.

Torch-free, and standard library plus the report schema only, so it works before the suite's
dependencies are installed and in a job whose torch install failed. The token never appears on a
command line or in the log: it is masked (``::add-mask::``) as soon as it is known.

Delivery: 429, 5xx and network errors are retried with exponential backoff (``Retry-After`` honoured)
within ``--max-seconds``; any other 4xx fails at once with the relay's ``error`` and ``detail``, since
it means a misconfiguration that a retry cannot fix. Some 409s count as delivered: ``replay`` for
``in-progress`` and ``already_completed`` after an attempt whose answer was lost (the relay remembers
the earlier attempt), and ``already_cancelled``/``already_timed_out`` for ``completed`` (the relay
ended the run itself: the PR closed, a newer run superseded it, or it timed out). A ``completed`` refused with ``completed_before_in_progress`` (the
``in-progress`` call failed earlier) sends ``in-progress`` first and then ``completed`` again.

A report that is missing, truncated or off-schema is never sent: the callback says ``completed`` with
conclusion ``failure`` and a message naming the problem, so the relay hears about every run.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

__all__ = [
    "CallbackFailed",
    "Delivery",
    "RetryPolicy",
    "build_parser",
    "completed_body",
    "conclusion_for",
    "credential",
    "main",
    "read_report",
    "register",
    "run_callback",
]

_DESCRIPTION = "Tell the relay this CI run started (in-progress) or how it ended (completed)."
MESSAGE_LIMIT = 1000  # the relay's limit for a callback's message
# The relay ended the run itself (the PR closed, a newer run superseded it, the sweeper timed it out):
# the final callback has nothing left to say, and saying so is not an error of this job.
_ENDED_BY_RELAY = frozenset({"already_cancelled", "already_timed_out"})
_RETRIED_STATUSES = frozenset({408, 429}) | frozenset(range(500, 600))


class CallbackFailed(Exception):
    """The callback could not be delivered: the relay refused it, or retries ran out. The message says which;
    ``code`` is the relay's error code when it refused (e.g. ``completed_before_in_progress``)."""

    def __init__(self, message: str, code: str | None = None):
        super().__init__(message)
        self.code = code


# Whether output goes to a GitHub Actions log (workflow commands) or a terminal; run_callback sets it
# from the environment it is given.
_in_actions = os.environ.get("GITHUB_ACTIONS") == "true"


def _annotate(level: str, message: str) -> None:
    """A message for the job log; in GitHub Actions also an annotation on the run's page."""
    if _in_actions:
        print(f"::{level}::{message}", flush=True)
    else:
        print(f"conformance callback: {level}: {message}", file=sys.stderr, flush=True)


def _mask(secret: str) -> None:
    # Only inside Actions: elsewhere the workflow command would print the secret to a terminal.
    if _in_actions and secret:
        print(f"::add-mask::{secret}", flush=True)


@dataclasses.dataclass
class RetryPolicy:
    """Exponential backoff with jitter within ``max_seconds`` in total; ``Retry-After`` wins when given."""

    max_seconds: float = 300.0
    first_delay: float = 1.0
    max_delay: float = 60.0
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep

    def delay(self, attempt: int, retry_after: float | None) -> float:
        if retry_after is not None:
            return max(0.0, retry_after)
        return min(self.max_delay, self.first_delay * 2 ** attempt) * random.uniform(0.5, 1.0)


def _retry_after(headers: Mapping[str, str] | None) -> float | None:
    value = (headers or {}).get("Retry-After")
    try:
        return float(value) if value is not None else None
    except ValueError:  # an HTTP date: rare from the relay; fall back to our own backoff
        return None


@dataclasses.dataclass(frozen=True)
class _Answer:
    status: int
    body: bytes
    headers: Mapping[str, str]

    def json(self) -> dict[str, Any]:
        try:
            data = json.loads(self.body)
        except ValueError:
            return {}
        return data if isinstance(data, dict) else {}

    def describe(self) -> str:
        data = self.json()
        if "error" in data or "detail" in data:
            return f"HTTP {self.status} {data.get('error', '')}: {data.get('detail', '')}".strip()
        return f"HTTP {self.status}: {self.body[:300].decode('utf-8', 'replace')}"


def _request(method: str, url: str, headers: dict[str, str], data: bytes | None, timeout: float) -> _Answer:
    request = urllib.request.Request(url, data=data, headers=headers, method=method)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310 - the relay's URL
            return _Answer(response.status, response.read(), dict(response.headers))
    except urllib.error.HTTPError as exc:
        return _Answer(exc.code, exc.read(), dict(exc.headers or {}))


def _with_retries(what: str, send: Callable[[], _Answer], policy: RetryPolicy) -> tuple[_Answer, bool]:
    """Call ``send`` until it answers something other than 429/5xx/a network error, within the policy.

    Returns the answer and whether an earlier attempt may have reached the server (its answer lost)."""
    deadline = policy.clock() + policy.max_seconds
    attempt, maybe_delivered, last = 0, False, ""
    while True:
        retry_after = None
        try:
            answer = send()
        except (urllib.error.URLError, OSError) as exc:  # refused, reset, timed out
            reason = getattr(exc, "reason", exc)
            last, maybe_delivered = f"network error: {reason}", True
        else:
            if answer.status not in _RETRIED_STATUSES:
                return answer, maybe_delivered
            last, retry_after = answer.describe(), _retry_after(answer.headers)
            maybe_delivered = maybe_delivered or answer.status >= 500
        wait = policy.delay(attempt, retry_after)
        left = deadline - policy.clock()
        if wait > left:
            raise CallbackFailed(
                f"{what}: gave up after {attempt + 1} attempts within {policy.max_seconds:g} s; last: {last}"
                + (f" (Retry-After {retry_after:g} s is beyond the time left)" if retry_after is not None else "")
            )
        _annotate("warning", f"{what}: {last}; retrying in {wait:.1f} s")
        policy.sleep(wait)
        attempt += 1


def credential(env: Mapping[str, str], policy: RetryPolicy, timeout: float = 30.0) -> str:
    """The ``Authorization`` header value: ``Token <RELAY_CALLBACK_TOKEN>``, else ``Bearer <OIDC token>``."""
    static = env.get("RELAY_CALLBACK_TOKEN", "")
    if static:
        _mask(static)
        return f"Token {static}"
    url, request_token = env.get("ACTIONS_ID_TOKEN_REQUEST_URL", ""), env.get("ACTIONS_ID_TOKEN_REQUEST_TOKEN", "")
    if not url or not request_token:
        raise CallbackFailed(
            "no credential: ACTIONS_ID_TOKEN_REQUEST_URL/_TOKEN are unset (give the job 'permissions: id-token: write') "
            "and RELAY_CALLBACK_TOKEN is empty"
        )
    audience = env.get("RELAY_AUDIENCE", "")
    if not audience:
        raise CallbackFailed("RELAY_AUDIENCE is empty: set it to the relay's RELAY_OIDC_AUDIENCE")
    parts = urllib.parse.urlsplit(url)
    query = urllib.parse.urlencode([*urllib.parse.parse_qsl(parts.query), ("audience", audience)])
    token_url = urllib.parse.urlunsplit(parts._replace(query=query))
    headers = {"Authorization": f"bearer {request_token}", "Accept": "application/json"}
    answer, _ = _with_retries("OIDC token request", lambda: _request("GET", token_url, headers, None, timeout), policy)
    if answer.status != 200:
        raise CallbackFailed(f"OIDC token request refused: {answer.describe()}")
    token = answer.json().get("value")
    if not isinstance(token, str) or not token:
        raise CallbackFailed("OIDC token request answered without a token ('value' missing or empty)")
    _mask(token)
    return f"Bearer {token}"


@dataclasses.dataclass
class Delivery:
    """Sends callback bodies to the relay for one run, with retries; a fresh credential per body."""

    url: str
    env: Mapping[str, str]
    policy: RetryPolicy = dataclasses.field(default_factory=RetryPolicy)
    timeout: float = 30.0

    def send(self, body: dict[str, Any]) -> dict[str, Any]:
        """POST one body; returns the relay's answer, or raises CallbackFailed with the relay's error."""
        what = f"callback {body['state']}"
        authorization = credential(self.env, self.policy, self.timeout)
        data = json.dumps(body).encode()
        headers = {"Authorization": authorization, "Content-Type": "application/json", "Accept": "application/json"}
        answer, maybe_delivered = _with_retries(
            what, lambda: _request("POST", self.url, headers, data, self.timeout), self.policy,
        )
        if answer.status == 200:
            return answer.json()
        code = answer.json().get("error")
        if answer.status == 409 and (code == "replay" and body["state"] == "in_progress"
                                     or code == "already_completed" and maybe_delivered
                                     or code in _ENDED_BY_RELAY and body["state"] == "completed"):
            _annotate("notice", f"{what}: the relay already has it ({answer.describe()})")
            return answer.json()
        raise CallbackFailed(f"{what} refused by the relay: {answer.describe()}", code)

    def report(self, body: dict[str, Any], run: Mapping[str, Any]) -> dict[str, Any]:
        """Send ``body``; a ``completed`` the relay refuses as before ``in_progress`` gets its ``in_progress`` first."""
        try:
            return self.send(body)
        except CallbackFailed as exc:
            if body["state"] != "completed" or exc.code != "completed_before_in_progress":
                raise
        _annotate("warning", "the relay never got in_progress for this run: sending it now, then completed")
        self.send({**run, "state": "in_progress"})
        return self.send(body)


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
    """(report, None) for a valid report; (None, why) when there is none or it cannot be sent."""
    from conformance.report import ReportValidationError, validate_report

    if path is None:
        return None, "no report path was given"
    if not path.is_file():
        return None, f"the suite wrote no report at {path}"
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


def completed_body(run: Mapping[str, Any], conclusion: str, report_path: Path | None) -> dict[str, Any]:
    """The ``completed`` body: the report when it is valid, else conclusion ``failure`` and the reason."""
    report, problem = read_report(report_path)
    body: dict[str, Any] = {**run, "state": "completed", "conclusion": conclusion}
    if report is not None:
        body["report"] = report
    elif conclusion in ("success", "failure"):
        # A success without a report proves nothing; a failure without one still says why.
        body["conclusion"] = "failure"
        body["message"] = problem[:MESSAGE_LIMIT]
        _annotate("error" if conclusion == "success" else "warning", f"{problem}; reporting conclusion failure")
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


def run_callback(args: argparse.Namespace, env: Mapping[str, str] | None = None) -> int:
    global _in_actions
    env = os.environ if env is None else env
    _in_actions = env.get("GITHUB_ACTIONS") == "true"
    try:
        run = _run_fields(env)
        delivery = Delivery(env["RELAY_CALLBACK_URL"], env, RetryPolicy(max_seconds=args.max_seconds,
                                                                           first_delay=args.backoff_seconds))
        if args.callback_state == "in-progress":
            answer = delivery.send({**run, "state": "in_progress"})
        else:
            conclusion = conclusion_for(args.suite_outcome, args.job_status, started_at=args.started_at,
                                        timeout_minutes=args.timeout_minutes)
            answer = delivery.report(completed_body(run, conclusion, args.report), run)
    except CallbackFailed as exc:
        _annotate("error", str(exc))
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


if __name__ == "__main__":
    sys.exit(main())
