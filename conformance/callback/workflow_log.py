"""Messages for the job log: GitHub Actions workflow commands inside Actions, plain stderr lines elsewhere.

``run_callback`` sets :data:`in_actions` from the environment it is given, so tests can drive both forms.
"""

from __future__ import annotations

import os
import sys

# Whether output goes to a GitHub Actions log (workflow commands) or a terminal.
in_actions = os.environ.get("GITHUB_ACTIONS") == "true"


def annotate(level: str, message: str) -> None:
    """A message for the job log; in GitHub Actions also an annotation on the run's page."""
    if in_actions:
        print(f"::{level}::{message}", flush=True)
    else:
        print(f"conformance callback: {level}: {message}", file=sys.stderr, flush=True)


def mask(secret: str) -> None:
    """Hide ``secret`` from the rest of the job log. The caller has checked it is one line (see
    ``credential.checked_secret``): ``::add-mask::`` masks only up to the first newline."""
    # Only inside Actions: elsewhere the workflow command would print the secret to a terminal.
    if in_actions and secret:
        print(f"::add-mask::{secret}", flush=True)
