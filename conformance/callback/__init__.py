"""``conformance callback``: the client a downstream CI job reports to the relay with.

Torch-free, standard library plus the report schema only, so it works before the suite's dependencies
are installed and in a job whose torch install failed. One module per concern:

- ``command``: the command line, the run's fields from the job environment, the ``completed`` body;
- ``delivery``: sending bodies for one run and reading the relay's answers (409s, 413s);
- ``report_fit``: shortening a report to the relay's published limits, failures first;
- ``credential``: the ``Authorization`` value (static token or OIDC), https-only URLs, one-line secrets;
- ``transport``: one HTTP request without redirects, and retries with backoff;
- ``workflow_log``: messages and masks for the GitHub Actions log.
"""

from conformance.callback.command import (
    build_parser,
    completed_body,
    conclusion_for,
    main,
    read_report,
    register,
    run_callback,
)
from conformance.callback.credential import ALLOW_HTTP_LOOPBACK, checked_secret, checked_url, credential
from conformance.callback.delivery import Delivery
from conformance.callback.report_fit import RelayLimits, fetch_limits, fit
from conformance.callback.transport import CallbackFailed, RetryPolicy

__all__ = [
    "ALLOW_HTTP_LOOPBACK",
    "CallbackFailed",
    "Delivery",
    "RelayLimits",
    "RetryPolicy",
    "build_parser",
    "checked_secret",
    "checked_url",
    "completed_body",
    "conclusion_for",
    "credential",
    "fetch_limits",
    "fit",
    "main",
    "read_report",
    "register",
    "run_callback",
]
