"""Response headers and the served documentation over real HTTP: a Content-Security-Policy and nosniff on
every response, Swagger UI served from the relay itself (no CDN) and working under that policy in real
headless Chromium, and /metrics behind a bearer token when RELAY_METRICS_TOKEN is set."""

from __future__ import annotations

import re

import pytest

from relay.testing import loopback_client
from tests.relay.results_fixtures import oidc_issuer, results_backends, results_relay  # noqa: F401


@pytest.fixture
def relay(results_relay, sqlite_url):  # noqa: F811
    return results_relay(sqlite_url)[0]


@pytest.mark.parametrize("path", ["/", "/backends/l2", "/api/overview", "/docs", "/openapi.json", "/static/dashboard.css", "/readyz"])
def test_every_response_carries_csp_and_nosniff(relay, path):
    response = loopback_client().get(relay.url + path, timeout=10)
    assert response.status_code == 200, (path, response.status_code)
    assert response.headers["x-content-type-options"] == "nosniff"
    csp = response.headers["content-security-policy"]
    for directive in ("default-src 'self'", "script-src 'self'", "object-src 'none'", "frame-ancestors 'none'",
                      "base-uri 'none'"):
        assert directive in csp, (path, csp)
    assert "unsafe-eval" not in csp and "script-src 'self' 'unsafe-inline'" not in csp


def test_docs_load_nothing_from_another_origin(relay):
    html = loopback_client().get(relay.url + "/docs", timeout=10).text
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", html), html
    assert "<script>" not in html.replace(" ", "")  # no inline script: the policy would block it
    for asset in re.findall(r"""(?:src|href)=["'](/[^"']+)["']""", html):
        assert loopback_client().get(relay.url + asset, timeout=10).status_code == 200, asset
    assert loopback_client().get(relay.url + "/redoc", timeout=10).status_code == 404  # ReDoc would need a CDN


def test_swagger_ui_renders_under_the_policy_in_chromium(relay, page):
    violations = []
    page.on("console", lambda m: violations.append(m.text) if "Content Security Policy" in m.text else None)
    external = []
    page.on("request", lambda r: external.append(r.url) if not r.url.startswith(relay.url) else None)
    assert page.goto(relay.url + "/docs").status == 200
    page.wait_for_selector(".opblock-tag", timeout=15_000)
    assert "/github/callback" in page.content()
    assert violations == [] and external == []


def test_metrics_behind_a_token_when_configured(results_relay, sqlite_url):  # noqa: F811
    relay, _ = results_relay(sqlite_url, metrics_token="metrics-secret-0123456789")
    refused = loopback_client().get(relay.url + "/metrics", timeout=10)
    assert refused.status_code == 401 and refused.json()["error"] == "metrics_token"
    assert "RELAY_METRICS_TOKEN" in refused.json()["detail"] and "metrics-secret" not in refused.text
    wrong = loopback_client().get(relay.url + "/metrics", headers={"Authorization": "Bearer nope"}, timeout=10)
    assert wrong.status_code == 401
    ok = loopback_client().get(relay.url + "/metrics", headers={"Authorization": "Bearer metrics-secret-0123456789"}, timeout=10)
    assert ok.status_code == 200 and "relay_webhook_events" in ok.text


def test_metrics_open_by_default(relay):
    assert loopback_client().get(relay.url + "/metrics", timeout=10).status_code == 200
