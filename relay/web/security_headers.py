"""Security headers on every response, and the API documentation served from the relay itself.

The dashboard shows text from webhooks and reports (escaped by Jinja2); a Content-Security-Policy
that allows scripts only from the relay's own origin, and no inline script, keeps an escaping slip
from becoming script execution, and ``nosniff`` keeps a JSON or text answer from being run as a
script. The policy is one constant for every response: the dashboard, its JSON API and ``/docs``.

``/docs`` is Swagger UI from the ``fastapi-offline`` package's files (served under ``/static/docs``)
with a start-up script of our own (``static/swagger-init.js``): nothing is loaded from a CDN, and no
inline script is needed. ReDoc (FastAPI's ``/redoc``, which needs a CDN) is not served.
"""

from __future__ import annotations

from pathlib import Path

import fastapi_offline
from fastapi import FastAPI
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

__all__ = ["CONTENT_SECURITY_POLICY", "install"]

CONTENT_SECURITY_POLICY = "; ".join((
    "default-src 'self'",
    "script-src 'self'",
    # Swagger UI and uPlot set style attributes from their scripts; styles cannot run code.
    "style-src 'self' 'unsafe-inline'",
    "img-src 'self' data:",
    "object-src 'none'",
    "base-uri 'none'",
    "frame-ancestors 'none'",
    "form-action 'self'",
))
_HEADERS = (
    (b"content-security-policy", CONTENT_SECURITY_POLICY.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"same-origin"),
)
_SWAGGER_DIR = Path(fastapi_offline.__file__).parent / "static"

_DOCS_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>relay API</title>
<link rel="icon" href="/static/docs/favicon.png">
<link rel="stylesheet" href="/static/docs/swagger-ui.css"></head>
<body><div id="swagger-ui" data-openapi-url="{openapi_url}"></div>
<script src="/static/docs/swagger-ui-bundle.js"></script>
<script src="/static/swagger-init.js"></script></body></html>
"""


class SecurityHeaders:
    """ASGI middleware adding the headers above to every HTTP response (raw ASGI: no body buffering)."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def send_with_headers(message):
            if message["type"] == "http.response.start":
                names = {name.lower() for name, _ in message.get("headers", [])}
                message["headers"] = [*message.get("headers", []), *(h for h in _HEADERS if h[0] not in names)]
            await send(message)

        await self.app(scope, receive, send_with_headers)


def install(app: FastAPI) -> None:
    """Add the headers middleware and the local ``/docs`` (create the app with ``docs_url=None, redoc_url=None``)."""
    app.add_middleware(SecurityHeaders)
    app.mount("/static/docs", StaticFiles(directory=_SWAGGER_DIR), name="docs-static")
    page = _DOCS_PAGE.format(openapi_url=app.openapi_url)

    @app.get("/docs", include_in_schema=False)
    def docs() -> HTMLResponse:
        return HTMLResponse(page)
