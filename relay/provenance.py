"""Provenance: was the torch a backend tested built from the commit the relay dispatched?

Triggered by every ``completed`` callback that carries a report (the store calls :func:`check` inside
the callback's transaction). Reads the report's ``torch.git_version`` and the run's dispatched commit
(``head.sha`` of the PR, or the pushed commit); writes nothing itself: the store keeps the verdict on
the run, reporting turns a result of another torch into a non-pass, the dashboard shows it.

Verdicts:

==========  ===================================================================================
matched     the tested torch's git_version is the dispatched commit
mismatched  another commit: the result says nothing about this PR
unknown     no usable git_version (a build without git metadata, ``Unknown``): not proof either
==========  ===================================================================================

Upstream a run whose verdict is not ``matched`` is never a pass: at L4 it is a ``failure`` and at L3
``neutral``, each with :func:`describe`'s sentence, whatever the suite's own conclusion was.

The rule itself is :mod:`conformance.provenance`: the CI job applies the same one before the suite
(``conformance preflight torch``), so the two sides can never disagree on what a match is.
"""

from conformance.provenance import Provenance, ProvenanceCheck, check, describe

__all__ = ["Provenance", "ProvenanceCheck", "check", "describe"]
