"""Trust levels and the allowlist: who receives an upstream event, and what may come back to the PR.

Triggered at start-up (``load_allowlist`` reads the backend descriptors' ``relay`` sections) and for
every webhook (``route`` picks the targets). Writes nothing. The four switches and the L1-L4 presets
follow PyTorch's RFC-0050 relay, so an allowlist written for it reads the same here:

    level  forward_event  display_on_hud  display_on_pr  block_pr
    L1     yes            no              never          no     onboarding: events only
    L2     yes            yes             never          no     results on the dashboard
    L3     yes            yes             label_only     no     a check on PRs carrying the label
    L4     yes            yes             always         yes    a check on every PR, meant to be required

Routing (``route``): ``pull_request`` opened/reopened/synchronize/closed and ``push`` go to every target
with ``forward_event``; ``labeled``/``unlabeled`` go only to the target(s) whose label changed (so adding
``ciflow/crcr/<name>`` starts that backend's run now that its check will show); a push that deletes
its ref has no commit to test and goes nowhere; a repository that is not in the allowlist gets nothing.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterable, Sequence
from pathlib import Path

from conformance.descriptors import BackendDescriptor, DescriptorError, TrustLevel, load_descriptor

from relay.events import UpstreamEvent

__all__ = [
    "LEVELS",
    "DisplayOnPR",
    "Switches",
    "Target",
    "TrustLevel",
    "load_allowlist",
    "route",
    "shows_on_pr",
]


class DisplayOnPR(str, enum.Enum):
    always = "always"
    label_only = "label_only"
    never = "false"


@dataclasses.dataclass(frozen=True)
class Switches:
    forward_event: bool
    display_on_hud: bool
    display_on_pr: DisplayOnPR
    block_pr: bool


LEVELS: dict[TrustLevel, Switches] = {
    TrustLevel.L1: Switches(forward_event=True, display_on_hud=False, display_on_pr=DisplayOnPR.never, block_pr=False),
    TrustLevel.L2: Switches(forward_event=True, display_on_hud=True, display_on_pr=DisplayOnPR.never, block_pr=False),
    TrustLevel.L3: Switches(forward_event=True, display_on_hud=True, display_on_pr=DisplayOnPR.label_only, block_pr=False),
    TrustLevel.L4: Switches(forward_event=True, display_on_hud=True, display_on_pr=DisplayOnPR.always, block_pr=True),
}

# pull_request actions that start, restart or cancel downstream runs.
_FORWARDED_PR_ACTIONS = frozenset({"opened", "reopened", "synchronize", "closed"})
_LABEL_ACTIONS = frozenset({"labeled", "unlabeled"})
PR_ACTIONS = _FORWARDED_PR_ACTIONS | _LABEL_ACTIONS


@dataclasses.dataclass(frozen=True)
class Target:
    """One allowlisted downstream repository (a backend descriptor with a ``relay`` section)."""

    name: str
    repository: str
    level: TrustLevel
    label: str

    @property
    def switches(self) -> Switches:
        return LEVELS[self.level]

    @classmethod
    def from_descriptor(cls, descriptor: BackendDescriptor) -> "Target":
        assert descriptor.relay is not None and descriptor.relay_label is not None
        return cls(
            name=descriptor.name, repository=descriptor.relay.repository, level=descriptor.relay.level,
            label=descriptor.relay_label,
        )


def load_allowlist(backends_dir: Path) -> tuple[Target, ...]:
    """load_allowlist(dir) -> the targets of every ``*.yaml`` in ``dir`` that has a ``relay`` section.

    Raises DescriptorError (naming the file and field) for an invalid descriptor, or when two
    backends name the same downstream repository or label.
    """
    if not backends_dir.is_dir():
        raise DescriptorError(f"RELAY_BACKENDS_DIR: {backends_dir} is not a directory of backend *.yaml files")
    targets = [
        Target.from_descriptor(d)
        for d in (load_descriptor(p) for p in sorted(backends_dir.glob("*.yaml")))
        if d.relay is not None
    ]
    for attribute in ("repository", "label"):
        seen: dict[str, str] = {}
        for target in targets:
            value = getattr(target, attribute).lower()
            if value in seen:
                raise DescriptorError(
                    f"{backends_dir}: backends {seen[value]!r} and {target.name!r} both use relay "
                    f"{attribute} {getattr(target, attribute)!r}; each backend needs its own"
                )
            seen[value] = target.name
    return tuple(targets)


def route(event: UpstreamEvent, targets: Iterable[Target]) -> tuple[list[Target], str | None]:
    """route(event, targets) -> (targets to dispatch to, reason when there are none)."""
    forwarding = [t for t in targets if t.switches.forward_event]
    if event.event == "push" and event.deleted:
        return [], f"push deleted {event.head_ref}; there is no commit to test"
    if event.event == "push":
        chosen = forwarding
    elif event.event == "pull_request" and event.action in _FORWARDED_PR_ACTIONS:
        chosen = forwarding
    elif event.event == "pull_request" and event.action in _LABEL_ACTIONS:
        chosen = [t for t in forwarding if t.label == event.changed_label]
        if not chosen:
            return [], f"label {event.changed_label!r} belongs to no allowlisted backend"
    else:
        return [], f"{event.kind} is not forwarded"
    if not chosen:
        return [], "no backend in the allowlist forwards events"
    return chosen, None


def shows_on_pr(target: Target, pr_labels: Sequence[str]) -> bool:
    """Whether ``target``'s results appear on the upstream PR, given the PR's current labels."""
    mode = target.switches.display_on_pr
    return mode is DisplayOnPR.always or (mode is DisplayOnPR.label_only and target.label in pr_labels)
