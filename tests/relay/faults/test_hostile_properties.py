"""Hostile strings into every stored field, generated (hypothesis), on both stores: webhooks (title, refs,
labels, sender), callbacks (test ids, suites, messages, torch version, run URL, reason) and the dashboard
API's parameters. Whatever arrives: no 500, no 503, every refusal a 4xx naming its field, no worker
failing, no row set aside, no run left open.

``RELAY_HYPOTHESIS_EXAMPLES`` sets the examples per store (default 8; the long run uses 5000 per store).
"""

from __future__ import annotations

import json
import os
import uuid
from urllib.parse import quote

import httpx
import pytest
from hypothesis import HealthCheck, Phase, given, settings, strategies as st

from relay.testing import loopback_client
from tests.relay.results_fixtures import oidc_issuer, results_backends, results_relay  # noqa: F401
from tests.relay.results_support import report

EXAMPLES = int(os.environ.get("RELAY_HYPOTHESIS_EXAMPLES", "8"))

_SPECIAL = ["\x00", "a\x00b", "%00", "\ud800", "\udfff", "'; DROP TABLE runs;--", "\\", "\u202e", "\ufeff",
            "𝕏" * 300, "\n\r\t", "{{ 7*7 }}", "<script>", "x" * 256, "y" * 1001]
hostile = st.one_of(
    st.sampled_from(_SPECIAL),
    st.text(max_size=40),
    st.text(st.characters(min_codepoint=0, max_codepoint=0x3000), min_size=90, max_size=400),
    st.builds(lambda a, b: a + "\x00" + b, st.text(max_size=20), st.text(max_size=20)),
)


def _in_url(text: str) -> str:
    return quote(text.encode("utf-8", "surrogatepass"), safe="")


def _send(drive, body: dict) -> httpx.Response:
    """A callback whose body keeps every string as generated (JSON escapes, lone surrogates too)."""
    return drive.callback({}, backend="l2", content=json.dumps(body).encode())


def _acceptable(answer: httpx.Response, fields: tuple[str, ...], where: str) -> bool:
    """2xx, or a 4xx whose detail names one of ``fields``; never 5xx."""
    assert answer.status_code < 500, f"{where}: {answer.status_code} {answer.text[:500]}"
    if answer.status_code < 300:
        return True
    detail = str(answer.json().get("detail"))
    assert any(field in detail for field in fields), f"{where}: {answer.status_code} names none of {fields}: {detail[:300]}"
    return False


@pytest.mark.slow
def test_hostile_strings_in_every_stored_field_never_break_the_relay(database_url, results_relay):  # noqa: F811
    # Many callbacks a minute from one backend: the rate limit (0: off) is not what this test is about.
    relay, drive = results_relay(database_url, rerun_poll_seconds=3600, callback_rate_per_minute=0)
    numbers = iter(range(100, 10_000_000))
    finished: list[int] = []

    @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None, phases=[Phase.generate],
              suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
    @given(title=hostile, ref=hostile, label=hostile, sender=hostile, nodeid=hostile, suite=hostile,
           message=hostile, torch_version=hostile, reason=hostile, run_url=hostile)
    def one(title, ref, label, sender, nodeid, suite, message, torch_version, reason, run_url):
        from tests.relay.helpers import pr_payload

        number = next(numbers)
        payload = pr_payload(number=number, labels=("ciflow/crcr/l3", label))
        payload["pull_request"]["title"] = title
        payload["pull_request"]["head"]["ref"] = ref
        payload["sender"]["login"] = sender
        delivery = str(uuid.uuid4())
        hook = relay.post("pull_request", payload, delivery=delivery)
        if not _acceptable(hook, ("pull_request.", "sender.login", "labels"), "webhook"):
            return
        relay.wait_settled()
        nonce = drive.nonce("l2", delivery)
        start = _send(drive, {"nonce": nonce, "state": "in_progress", "run_id": number, "run_url": "https://x/" + run_url})
        if not _acceptable(start, ("run_url",), "in_progress"):
            start = drive.start("l2", nonce, run_id=number)
            assert start.status_code == 200, start.text
        body = report("l2", [(f"conformance/suites/test_x.py::{nodeid}", "failed", message)])
        body["tests"][0]["suite"] = suite
        body["torch"]["version"] = torch_version
        done = _send(drive, {"nonce": nonce, "state": "completed", "run_id": number, "conclusion": "failure",
                             "report": body})
        if not _acceptable(done, ("report", "torch", "tests/0", "tests.0"), "completed"):
            done = _send(drive, {"nonce": nonce, "state": "completed", "run_id": number, "conclusion": "failure",
                                 "message": reason[:1000]})
            if not _acceptable(done, ("message",), "completed without a report"):
                done = drive.complete("l2", nonce, run_id=number, with_report=False)
        assert done.status_code == 200, done.text
        finished.append(done.json()["run"])
        for path in (f"/api/tests/{_in_url(nodeid)}", f"/api/tests/failing?backend={_in_url(suite)}",
                     f"/backends/{_in_url(label)}", f"/api/tests/flaky?backend={_in_url(sender)}"):
            answer = loopback_client().get(f"{relay.url}{path}", timeout=30)
            assert answer.status_code < 500, f"GET {path}: {answer.status_code} {answer.text[:300]}"

    one()
    assert relay.parts.results.problems() == []
    assert relay.store.quarantined() == []
    assert {relay.store.run(pk).state for pk in finished} <= {"completed"}
