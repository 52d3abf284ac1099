"""Upstream events: a webhook payload reduced to the fields the relay and downstream runs need.

Triggered by intake for every verified webhook. Reads the parsed JSON payload; writes nothing.
``normalise`` turns a payload into an :class:`UpstreamEvent`; ``client_payloads`` builds the trimmed
``repository_dispatch`` body for each downstream repository. GitHub limits that body to 10 top-level
keys and 64 KB and ``event_type`` to 100 characters, while a webhook can be 25 MB: only the fields
below are forwarded, and long strings are cut.

client_payload (9 top-level keys)::

    event       "pull_request" | "push"
    action      "opened" | ... | null for push
    delivery    X-GitHub-Delivery of the upstream webhook
    nonce       a secret per dispatch: a callback quotes it to prove which dispatch it answers
    repository  upstream "owner/name"
    sender      login of who triggered the event
    head        {"sha", "ref"}   (push: the new commit and the pushed ref)
    base        {"sha", "ref"}   (push: the previous commit and the pushed ref)
    pull_request {"number", "labels", "changed_label", "html_url", "draft"} | null for push
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from typing import Any

__all__ = [
    "CLIENT_PAYLOAD_MAX_BYTES",
    "CLIENT_PAYLOAD_MAX_KEYS",
    "EVENT_TYPE_MAX_CHARS",
    "PayloadError",
    "PullRequestInfo",
    "UpstreamEvent",
    "client_payloads",
    "event_type",
    "normalise",
]

CLIENT_PAYLOAD_MAX_KEYS = 10
CLIENT_PAYLOAD_MAX_BYTES = 64 * 1024
EVENT_TYPE_MAX_CHARS = 100
_MAX_TEXT = 255  # git refs and GitHub logins are shorter; anything longer is cut
_MAX_LABELS = 100


class PayloadError(ValueError):
    """The payload lacks a field its event must have; the message names the field."""


@dataclasses.dataclass(frozen=True)
class PullRequestInfo:
    number: int
    head_sha: str
    head_ref: str
    base_sha: str
    base_ref: str
    state: str
    labels: tuple[str, ...]
    html_url: str
    draft: bool
    updated_at: str
    title: str = ""  # shown on the dashboard (as text: it is untrusted)


@dataclasses.dataclass(frozen=True)
class UpstreamEvent:
    event: str
    action: str | None
    delivery: str
    repository: str
    sender: str | None
    pull_request: PullRequestInfo | None = None
    changed_label: str | None = None
    head_sha: str | None = None
    head_ref: str | None = None
    base_sha: str | None = None
    base_ref: str | None = None
    deleted: bool = False  # a push that deleted its ref (``after`` is all zeros)

    @property
    def kind(self) -> str:
        return self.event if self.action is None else f"{self.event}.{self.action}"

    def summary(self) -> dict[str, Any]:
        """A small JSON record of the event for the deliveries table."""
        data = {
            "sender": self.sender, "head_sha": self.head_sha, "head_ref": self.head_ref,
            "base_sha": self.base_sha, "base_ref": self.base_ref, "changed_label": self.changed_label,
        }
        if self.pull_request is not None:
            data["pull_request"] = self.pull_request.number
            data["title"] = self.pull_request.title
        return {k: v for k, v in data.items() if v is not None}


def _get(payload: dict[str, Any], path: str, kind: type | tuple[type, ...] = str, optional: bool = False) -> Any:
    value: Any = payload
    for part in path.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    if value is None and optional:
        return None
    if not isinstance(value, kind):
        raise PayloadError(f"payload field {path!r} is missing or not a {getattr(kind, '__name__', kind)}")
    return value


def _cut(value: str | None) -> str | None:
    return None if value is None else value[:_MAX_TEXT]


def repository_of(payload: dict[str, Any]) -> str | None:
    repository = payload.get("repository")
    if isinstance(repository, dict) and isinstance(repository.get("full_name"), str):
        return repository["full_name"]
    return None


def normalise(event: str, delivery: str, payload: dict[str, Any]) -> UpstreamEvent:
    """normalise(event, delivery, payload) -> UpstreamEvent; raises PayloadError naming a missing field."""
    repository = _get(payload, "repository.full_name")
    action = _get(payload, "action", optional=True)
    sender = _cut(_get(payload, "sender.login", optional=True))
    common = dict(event=event, action=action, delivery=delivery, repository=repository, sender=sender)
    if event == "pull_request":
        pr = _get(payload, "pull_request", dict)
        labels = tuple(
            _cut(label["name"]) for label in (pr.get("labels") or [])
            if isinstance(label, dict) and isinstance(label.get("name"), str)
        )
        info = PullRequestInfo(
            number=_get(payload, "pull_request.number", int),
            head_sha=_get(payload, "pull_request.head.sha"),
            head_ref=_cut(_get(payload, "pull_request.head.ref")),
            base_sha=_get(payload, "pull_request.base.sha"),
            base_ref=_cut(_get(payload, "pull_request.base.ref")),
            state=_get(payload, "pull_request.state"),
            labels=labels,
            html_url=_cut(_get(payload, "pull_request.html_url", optional=True)) or "",
            draft=bool(pr.get("draft", False)),
            updated_at=_get(payload, "pull_request.updated_at", optional=True) or "",
            title=_cut(_get(payload, "pull_request.title", optional=True)) or "",
        )
        changed = _cut(_get(payload, "label.name", optional=True)) if action in ("labeled", "unlabeled") else None
        if action in ("labeled", "unlabeled") and changed is None:
            raise PayloadError(f"payload field 'label.name' is missing from a pull_request.{action} event")
        return UpstreamEvent(
            **common, pull_request=info, changed_label=changed, head_sha=info.head_sha, head_ref=info.head_ref,
            base_sha=info.base_sha, base_ref=info.base_ref,
        )
    if event == "push":
        ref = _cut(_get(payload, "ref"))
        return UpstreamEvent(
            **common, head_sha=_get(payload, "after"), head_ref=ref, base_sha=_get(payload, "before"),
            base_ref=_cut(_get(payload, "base_ref", optional=True)) or ref,
            deleted=bool(payload.get("deleted", False)),
        )
    if event == "check_run":
        return UpstreamEvent(**common, head_sha=_get(payload, "check_run.head_sha", optional=True))
    if event == "check_suite":
        return UpstreamEvent(**common, head_sha=_get(payload, "check_suite.head_sha", optional=True))
    return UpstreamEvent(**common)


def event_type(event: UpstreamEvent) -> str:
    """The ``repository_dispatch`` event_type a downstream workflow listens for: ``pull_request.opened``, ``push``."""
    return event.kind[:EVENT_TYPE_MAX_CHARS]


def client_payloads(event: UpstreamEvent, nonces: Sequence[str]) -> list[dict[str, Any]]:
    """The trimmed body of each dispatch of ``event``, one per nonce; raises PayloadError over GitHub's limits.

    The bodies differ only in their nonce, so the size is measured once per event, with the longest
    nonce, rather than once per target (the store serialises each body again when it writes it).
    """
    bodies = [_client_payload(event, nonce) for nonce in nonces]
    if bodies:
        longest = max(bodies, key=lambda body: len(body["nonce"]))
        # Strings are cut to 255 characters and labels to 100, which keeps ASCII text far below 64 KB;
        # JSON escapes other characters (up to 12 bytes each), so the limit is still checked.
        size = len(json.dumps(longest, separators=(",", ":")).encode())
        if size >= CLIENT_PAYLOAD_MAX_BYTES:
            raise PayloadError(f"client_payload would be {size} bytes, over GitHub's limit of {CLIENT_PAYLOAD_MAX_BYTES}")
    return bodies


def _client_payload(event: UpstreamEvent, nonce: str) -> dict[str, Any]:
    pr = event.pull_request
    body: dict[str, Any] = {
        "event": event.event,
        "action": event.action,
        "delivery": event.delivery,
        "nonce": nonce,
        "repository": event.repository,
        "sender": event.sender,
        "head": {"sha": event.head_sha, "ref": event.head_ref},
        "base": {"sha": event.base_sha, "ref": event.base_ref},
        "pull_request": None if pr is None else {
            "number": pr.number,
            "labels": list(pr.labels[:_MAX_LABELS]),
            "changed_label": event.changed_label,
            "html_url": pr.html_url,
            "draft": pr.draft,
        },
    }
    assert len(body) < CLIENT_PAYLOAD_MAX_KEYS
    return body
