"""Provenance: is a torch's ``git_version`` the commit a run was dispatched for?

The one rule, shared by the CI job (``conformance preflight torch`` refuses to spend hours on the wrong
build) and the relay (which checks every report again: a job's word is not proof). Torch-free.

==========  ===================================================================================
matched     the tested torch's git_version is the dispatched commit
mismatched  another commit: the result says nothing about this PR
unknown     no usable git_version (a build without git metadata, ``Unknown``): not proof either
==========  ===================================================================================
"""

from __future__ import annotations

import dataclasses
import enum
import re

__all__ = ["Provenance", "ProvenanceCheck", "check", "describe"]

_SHA = re.compile(r"[0-9a-f]{7,64}")
_MIN_PREFIX = 7  # git's shortest abbreviation: a shorter string could name many commits


class Provenance(str, enum.Enum):
    matched = "matched"
    mismatched = "mismatched"
    unknown = "unknown"


@dataclasses.dataclass(frozen=True)
class ProvenanceCheck:
    verdict: Provenance
    tested: str  # the report's torch.git_version, as sent (cut to 64 characters)


def check(tested_git_version: str | None, dispatched_sha: str) -> ProvenanceCheck:
    """check(tested torch's git_version, dispatched commit) -> the verdict.

    An abbreviated hash on either side matches when it is a prefix of the other, at least 7 characters."""
    tested = (tested_git_version or "").strip()
    tested_key, expected = tested.lower(), dispatched_sha.strip().lower()
    if not _SHA.fullmatch(tested_key) or not _SHA.fullmatch(expected):
        return ProvenanceCheck(Provenance.unknown, tested[:64])
    shorter, longer = sorted((tested_key, expected), key=len)
    same = len(shorter) >= _MIN_PREFIX and longer.startswith(shorter)
    return ProvenanceCheck(Provenance.matched if same else Provenance.mismatched, tested[:64])


def describe(verdict: str | None, tested: str | None, dispatched_sha: str) -> str | None:
    """The sentence shown when the tested torch is not the dispatched one (None when it is)."""
    if verdict == Provenance.mismatched.value:
        return (f"wrong torch: tested torch built from {tested[:12]}, expected {dispatched_sha[:12]} "
                "(this result is not for this commit)")
    if verdict == Provenance.unknown.value:
        return (f"unknown torch: the report's torch.git_version is {tested or 'empty'!r}, expected "
                f"{dispatched_sha[:12]} (this result cannot be tied to this commit)")
    return None
