"""The dashboard: server-rendered pages over the store, readable without login, and a JSON API per page.

One module per page (Prow's deck layout): ``overview`` (``/``), ``backend`` (``/backends/{name}``),
``pull_request`` (``/prs/{number}``), ``tests_page`` (``/tests/{test_id}``, ``/failing``) and ``run_page``
(``/runs/{run}``, where upstream checks link). Each page's data comes from a ``build`` function that its
``/api/...`` route returns as JSON (documented in the OpenAPI document) and its HTML route renders.
``rendering`` holds the shared Jinja2 environment (autoescape on); ``static/`` the stylesheet, the
chart script and the vendored uPlot chart library. The dashboard only reads the store.
"""

from fastapi import APIRouter
from fastapi.staticfiles import StaticFiles

from relay.dashboard import backend_page, overview_page, pull_request_page, run_page, tests_page
from relay.dashboard.rendering import STATIC_DIR

__all__ = ["router", "static_files"]

router = APIRouter()
for _page in (overview_page, backend_page, pull_request_page, tests_page, run_page):
    router.include_router(_page.router)


def static_files() -> StaticFiles:
    """Mount at ``/static``: stylesheet, chart script, vendored uPlot."""
    return StaticFiles(directory=STATIC_DIR)
