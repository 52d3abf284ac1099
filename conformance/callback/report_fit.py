"""Make a ``completed`` body fit the relay's limits, so the run that fails everywhere still arrives.

A run of thousands of tests that all fail (a broken build, a backend that cannot initialise) is the one
whose result matters most, and the one most likely to be over the relay's limits: its body size
(``RELAY_CALLBACK_MAX_BYTES``), its test count (``RELAY_CALLBACK_MAX_TESTS``) and the length of one test's
message (``RELAY_CALLBACK_MAX_MESSAGE_CHARS``). The relay publishes them at ``GET`` of the callback URL;
a relay that does not (an older one) is assumed to have the defaults below.

Over a limit, the report is reordered with the failures first, then its messages are cut shorter and
shorter, and when even the shortest do not fit, tests are left out from the end (passed and skipped
ones first). The summary keeps counting every test, ``events`` and the callback's ``message`` say what
was left out, and the relay's own limit checks still apply to what is sent.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from collections import Counter
from collections.abc import Mapping
from typing import Any

from conformance.callback.credential import checked_url
from conformance.callback.transport import request
from conformance.callback.workflow_log import annotate

# Most important first: what failed, then what is news (a known failure that passed), then the rest.
_OUTCOME_ORDER = {"error": 0, "failed": 0, "xpassed": 1, "unexpected_pass": 1, "xfailed": 2, "passed": 3,
                  "skipped": 4}
_MESSAGE_CAPS = (4000, 1000, 300, 80)  # tried in turn, after the relay's own limit
_ENVELOPE_BYTES = 4096  # the run fields and the callback's message, besides the report


@dataclasses.dataclass(frozen=True)
class RelayLimits:
    """The relay's limits on a callback (defaults: the relay's own defaults, checked by a test)."""

    max_bytes: int = 8 * 1024 * 1024
    max_tests: int = 20_000
    max_message_chars: int = 16_384

    @classmethod
    def from_answer(cls, data: Mapping[str, Any]) -> RelayLimits | None:
        values = {field.name: data.get(field.name) for field in dataclasses.fields(cls)}
        if all(isinstance(value, int) and not isinstance(value, bool) and value > 0 for value in values.values()):
            return cls(**values)
        return None

    def tighter(self) -> RelayLimits:
        """Half the byte budget: for a second try after the relay still answered 413."""
        return dataclasses.replace(self, max_bytes=self.max_bytes // 2)


def fetch_limits(callback_url: str, env: Mapping[str, str], timeout: float = 15.0) -> RelayLimits:
    """The limits the relay publishes at ``GET`` of its callback URL; the defaults when it publishes none."""
    url = checked_url(callback_url, "RELAY_CALLBACK_URL", env)
    try:
        answer = request("GET", url, {"Accept": "application/json"}, None, timeout)
    except OSError as exc:  # URLError is an OSError
        annotate("notice", f"the relay's limits could not be read ({getattr(exc, 'reason', exc)}); assuming its defaults")
        return RelayLimits()
    limits = RelayLimits.from_answer(answer.json()) if answer.status == 200 else None
    if limits is None:
        annotate("notice", f"the relay publishes no limits (GET answered HTTP {answer.status}); assuming its defaults")
        return RelayLimits()
    return limits


def _size(value: Any) -> int:
    return len(json.dumps(value).encode())  # the same encoding Delivery sends


def _shortened(test: dict[str, Any], cap: int) -> tuple[dict[str, Any], bool]:
    cut = False
    test = dict(test)
    message = test.get("message")
    if isinstance(message, str) and len(message) > cap:
        test["message"], cut = message[: max(0, cap - 1)] + "…", True
    if isinstance(test.get("ranks"), list):
        ranks = []
        for rank in test["ranks"]:
            text = rank.get("message") if isinstance(rank, dict) else None
            if isinstance(text, str) and len(text) > cap:
                rank, cut = {**rank, "message": text[: max(0, cap - 1)] + "…"}, True
            ranks.append(rank)
        test["ranks"] = ranks
    return test, cut


def _fitting_count(sizes: list[int], budget: int, max_tests: int) -> int:
    """How many of the first tests fit in ``budget`` bytes (", " between them) and the test count."""
    used, count = 0, 0
    for size in sizes[:max_tests]:
        used += size + (2 if count else 0)
        if used > budget:
            break
        count += 1
    return count


def fit(body: dict[str, Any], limits: RelayLimits) -> tuple[dict[str, Any], str | None]:
    """``body`` unchanged when it fits, else (a shortened copy, a sentence saying what was left out)."""
    report = body.get("report")
    if not isinstance(report, dict) or not isinstance(report.get("tests"), list):
        return body, None
    tests = report["tests"]
    too_long = any(isinstance(t.get("message"), str) and len(t["message"]) > limits.max_message_chars for t in tests)
    if not too_long and len(tests) <= limits.max_tests and _size(body) + _ENVELOPE_BYTES <= limits.max_bytes:
        return body, None

    ordered = sorted(tests, key=lambda t: _OUTCOME_ORDER.get(t.get("outcome"), 1))
    base = _size({**body, "report": {**report, "tests": []}}) + _ENVELOPE_BYTES
    budget = limits.max_bytes - base
    caps = [limits.max_message_chars, *(cap for cap in _MESSAGE_CAPS if cap < limits.max_message_chars)]
    for cap in caps:
        shortened = [_shortened(test, cap) for test in ordered]
        kept = _fitting_count([_size(test) for test, _ in shortened], budget, limits.max_tests)
        if kept == len(shortened):
            break
    left_out = Counter(test.get("outcome", "?") for test in ordered[kept:])
    messages_cut = sum(cut for _, cut in shortened[:kept])

    parts = []
    if left_out:
        by_outcome = ", ".join(f"{count} {outcome}" for outcome, count in left_out.most_common())
        parts.append(f"{sum(left_out.values())} of {len(tests)} tests left out ({by_outcome})")
    if messages_cut:
        parts.append(f"{messages_cut} messages cut to {cap} characters")
    note = (f"the report was shortened to fit the relay's limits ({limits.max_bytes} bytes, {limits.max_tests} "
            f"tests, {limits.max_message_chars} characters a message): {'; '.join(parts)}; failures are listed "
            "first and the summary counts every test")
    fitted = copy.copy(report)
    fitted["tests"] = [test for test, _ in shortened[:kept]]
    fitted["events"] = [*report.get("events", []), note]
    return {**body, "report": fitted}, note
