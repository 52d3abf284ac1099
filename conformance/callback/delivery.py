"""Sending callback bodies for one run: a fresh credential per body, the relay's answers interpreted.

Some 409s count as delivered: ``replay`` for ``in-progress`` and ``already_completed`` after an attempt
whose answer was lost (the relay remembers the earlier attempt), and ``already_cancelled``/
``already_timed_out`` for ``completed`` (the relay ended the run itself: the PR closed, a newer run
superseded it, or it timed out). A ``completed`` refused with ``completed_before_in_progress`` (the
``in-progress`` call failed earlier) sends ``in-progress`` first and then ``completed`` again. A
``completed`` whose report is over the relay's limits is shortened first (``report_fit``); one the relay
still answers 413 is shortened to half the bytes and sent once more, never resent as it was.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any

from conformance.callback import report_fit
from conformance.callback.credential import checked_url, credential
from conformance.callback.transport import CallbackFailed, RetryPolicy, request, with_retries
from conformance.callback.workflow_log import annotate

MESSAGE_LIMIT = 1000  # the relay's limit for a callback's message
# The relay ended the run itself (the PR closed, a newer run superseded it, the sweeper timed it out):
# the final callback has nothing left to say, and saying so is not an error of this job.
_ENDED_BY_RELAY = frozenset({"already_cancelled", "already_timed_out"})
_TOO_LARGE = frozenset({"payload_too_large", "report_too_large"})


@dataclasses.dataclass
class Delivery:
    """Sends callback bodies to the relay for one run, with retries; a fresh credential per body."""

    url: str
    env: Mapping[str, str]
    policy: RetryPolicy = dataclasses.field(default_factory=RetryPolicy)
    timeout: float = 30.0

    def __post_init__(self) -> None:
        self.url = checked_url(self.url, "RELAY_CALLBACK_URL", self.env)

    def send(self, body: dict[str, Any]) -> dict[str, Any]:
        """POST one body; returns the relay's answer, or raises CallbackFailed with the relay's error."""
        what = f"callback {body['state']}"
        authorization = credential(self.env, self.policy, self.timeout)
        data = json.dumps(body).encode()
        headers = {"Authorization": authorization, "Content-Type": "application/json", "Accept": "application/json"}
        answer, maybe_delivered = with_retries(
            what, lambda: request("POST", self.url, headers, data, self.timeout), self.policy,
        )
        if answer.status == 200:
            return answer.json()
        code = answer.json().get("error")
        if answer.status == 409 and (code == "replay" and body["state"] == "in_progress"
                                     or code == "already_completed" and maybe_delivered
                                     or code in _ENDED_BY_RELAY and body["state"] == "completed"):
            annotate("notice", f"{what}: the relay already has it ({answer.describe()})")
            return answer.json()
        if answer.status == 413 and code not in _TOO_LARGE:
            code = "payload_too_large"  # a proxy's 413 in front of the relay says no code of its own
        raise CallbackFailed(f"{what} refused by the relay: {answer.describe()}", code)

    def send_fitted(self, body: dict[str, Any]) -> dict[str, Any]:
        """Send a ``completed`` body shortened to the relay's limits; once more, shorter, after a 413."""
        if "report" not in body:
            return self.send(body)
        limits = report_fit.fetch_limits(self.url, self.env, self.timeout)
        for attempt in range(2):
            fitted, note = report_fit.fit(body, limits)
            if note is not None:
                annotate("warning", note)
                fitted = {**fitted, "message": note[:MESSAGE_LIMIT]}
            try:
                return self.send(fitted)
            except CallbackFailed as exc:
                if exc.code not in _TOO_LARGE or attempt == 1:
                    raise
                annotate("warning", f"{exc}; shortening the report further")
                limits = limits.tighter()
        raise AssertionError("unreachable")

    def report(self, body: dict[str, Any], run: Mapping[str, Any]) -> dict[str, Any]:
        """Send ``body``; a ``completed`` the relay refuses as before ``in_progress`` gets its ``in_progress`` first."""
        try:
            return self.send_fitted(body)
        except CallbackFailed as exc:
            if body["state"] != "completed" or exc.code != "completed_before_in_progress":
                raise
        annotate("warning", "the relay never got in_progress for this run: sending it now, then completed")
        self.send({**run, "state": "in_progress"})
        return self.send_fitted(body)
