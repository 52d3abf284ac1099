"""``relay levels review|propose|restore [--json]``: the command-line face of the level flow.

Registered by :mod:`relay.cli` (``arguments`` adds the options, ``levels_command`` runs one). Reads the
settings, the descriptors and the store; ``review`` prints the level review (:mod:`relay.levels.review`),
``propose`` runs one proposals pass (:mod:`relay.levels.proposals`), ``restore`` ends a backend's level
hold. The domain modules are imported when a command runs, so ``relay --help`` stays light.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from relay.levels.proposals import ProposalOutcome
    from relay.levels.review import LevelReview

__all__ = ["arguments", "levels_command", "outcome_json", "propose_command", "review_json"]


def arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=["review", "propose", "restore"],
                        help="review: recommend promotions and demotions; propose: open or update their pull "
                             "requests on RELAY_PROPOSALS_REPOSITORY (one pass); restore: end a backend's level hold")
    parser.add_argument("backend", nargs="?", help="restore: the backend whose level hold ends")
    parser.add_argument("--reason", help="restore: why (stored with the hold's end)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")


def review_json(r: LevelReview) -> dict:
    return {
        "backend": r.backend, "level": r.level, "recommendation": r.recommendation,
        "recommended_level": r.recommended_level, "reason": r.reason, "runs": r.stats.runs,
        "success_rate": r.stats.success_rate, "time_to_result_p50": r.stats.time_to_result_p50,
        "time_to_result_max": r.stats.time_to_result_max,
        "criteria": [dataclasses.asdict(c) for c in r.criteria],
    }


def levels_command(args: argparse.Namespace) -> int:
    from conformance.descriptors import packaged_backends_dir

    if args.action == "propose":
        return propose_command(args)

    from relay.levels.review import criteria_from_settings, format_table, review
    from relay.settings import load_settings
    from relay.store import Store
    from relay.trust import load_allowlist

    if args.action == "restore" and (not args.backend or not (args.reason or "").strip()):
        raise ValueError("restore needs the backend and a reason: relay levels restore <backend> --reason TEXT")
    if args.action == "review" and args.backend:
        raise ValueError(f"review takes no backend (got {args.backend!r}); it reviews every backend")
    settings = load_settings()
    allowlist = load_allowlist(settings.backends_dir or packaged_backends_dir())
    store = Store(settings.database_url)
    try:
        store.migrate()
        if args.action == "restore":
            return _restore(store, allowlist, args.backend, args.reason.strip(), args.json)
        reviews = review(store, allowlist, criteria=criteria_from_settings(settings))
    finally:
        store.close()
    if args.json:
        print(json.dumps([review_json(r) for r in reviews], indent=2))
    else:
        print(format_table(reviews))
    return 0


def _restore(store, allowlist, backend: str, reason: str, as_json: bool) -> int:
    """End ``backend``'s level hold by a person's decision (the level watch then judges only later runs)."""
    if backend not in {t.name for t in allowlist}:
        raise ValueError(f"no backend {backend!r} in the allowlist; known: {', '.join(t.name for t in allowlist)}")
    hold = store.end_level_hold(backend, f"restored: {reason}")
    if hold is None:
        print(f"relay levels restore: {backend} has no level hold; nothing to restore", file=sys.stderr)
        return 1
    if as_json:
        print(json.dumps({"backend": backend, "level": hold.level, "reason": hold.reason,
                          "started_at": hold.started_at.isoformat(), "ended_at": hold.ended_at.isoformat(),
                          "ended_by": hold.ended_by}))
    else:
        print(f"{backend}: level hold at {hold.level} since {hold.started_at:%Y-%m-%d %H:%M} UTC ended "
              f"({hold.ended_by})")
    return 0


def outcome_json(outcome: ProposalOutcome) -> dict[str, Any]:
    return dataclasses.asdict(outcome)


def propose_command(args: argparse.Namespace) -> int:
    """``relay levels propose [--json]``: one pass against the configured descriptor repository."""
    from conformance.descriptors import packaged_backends_dir

    from relay.github import GitHubClient
    from relay.levels.proposals import Proposer
    from relay.settings import load_settings
    from relay.store import Store
    from relay.trust import load_allowlist

    settings = load_settings()
    if settings.proposals_repository is None:
        print("relay levels propose: RELAY_PROPOSALS_REPOSITORY is not set (owner/name of the repository that "
              "holds the backend descriptors): nothing proposed", file=sys.stderr)
        return 2
    allowlist = load_allowlist(settings.backends_dir or packaged_backends_dir())
    store = Store(settings.database_url)
    try:
        store.migrate()
        outcomes = Proposer.from_settings(settings, store, GitHubClient.from_settings(settings), allowlist).propose_once()
    finally:
        store.close()
    if args.json:
        print(json.dumps([outcome_json(o) for o in outcomes], indent=2))
    else:
        for o in outcomes:
            where = f" #{o.pull_request} {o.url}" if o.pull_request else ""
            print(f"{o.backend:<16} {o.kind:<8} {o.action:<9}{where}{': ' + o.detail if o.detail else ''}")
    return 1 if any(o.action == "failed" for o in outcomes) else 0
