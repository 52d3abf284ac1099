"""``conformance preflight``: what a CI job checks before it spends hours on the suite.

``preflight descriptor`` loads the descriptors (packaged, plus ``--backends-dir`` or
``$CONFORMANCE_BACKENDS_DIR``) and finds the backend's, without importing torch or the backend's setup
modules: it runs before torch is installed. ``preflight torch`` imports torch, prints its version and
the commit it was built from, and with ``--expect`` (the dispatched commit) refuses another build with
an error naming both commits (the rule is ``conformance.provenance``'s, the one the relay applies).

Each exits 0 when the check passes and 1 with a one-line reason when it does not (in GitHub Actions an
``::error::`` annotation); the reusable workflow runs them as steps of their own so a failure names its
step.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from conformance.provenance import Provenance, check, describe


def _fail(message: str) -> int:
    """The reason, one line: in GitHub Actions an error annotation (shown on the run's page), else stderr."""
    if os.environ.get("GITHUB_ACTIONS") == "true":
        print(f"::error::conformance preflight: {message}", flush=True)
    else:
        print(f"conformance preflight: {message}", file=sys.stderr, flush=True)
    return 1


def check_descriptor(args: argparse.Namespace) -> int:
    from conformance.descriptors import DescriptorError, load_descriptors

    try:
        descriptors = load_descriptors(args.backends_dir)
    except DescriptorError as exc:
        return _fail(str(exc))
    descriptor = descriptors.get(args.backend)
    if descriptor is None:
        return _fail(f"unknown backend {args.backend!r}; known: {', '.join(sorted(descriptors))}; give the "
                     "workflow the input 'descriptor' (the path of your backends/<name>.yaml) or fix the name")
    print(f"descriptor {descriptor.name}: {descriptor.device_type} over {descriptor.distributed_backend}, "
          f"from {descriptor.source}", flush=True)
    return 0


def check_torch(args: argparse.Namespace) -> int:
    try:
        import torch
    except Exception as exc:  # noqa: BLE001 - any failure to import is the finding
        return _fail(f"torch does not import: {type(exc).__name__}: {exc}")
    git_version = getattr(torch.version, "git_version", "") or ""
    print(f"torch {torch.__version__} built from {git_version or 'an unknown commit'}", flush=True)
    if args.expect:
        verdict = check(git_version, args.expect)
        if verdict.verdict is not Provenance.matched:
            return _fail(describe(verdict.verdict.value, verdict.tested, args.expect)
                         + "; install the torch built from the dispatched commit (the input torch-install)")
    return 0


def register(subcommands: Any) -> None:
    """Add ``preflight`` to the ``conformance`` command's subcommands."""
    parser = subcommands.add_parser("preflight", help="checks a CI job makes before the suite (descriptor, torch)")
    checks = parser.add_subparsers(dest="preflight_check", required=True, metavar="CHECK")
    descriptor = checks.add_parser("descriptor", help="the backend's descriptor loads (torch-free)")
    descriptor.add_argument("--backend", required=True, help="descriptor name")
    descriptor.add_argument("--backends-dir", default=None, help="extra descriptor directory")
    descriptor.set_defaults(func=check_descriptor)
    torch_check = checks.add_parser("torch", help="torch imports, and is the dispatched commit's build")
    torch_check.add_argument("--expect", default="", help="the dispatched commit (HEAD_SHA); empty: no check")
    torch_check.set_defaults(func=check_torch)
