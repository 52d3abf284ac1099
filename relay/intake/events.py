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
    pull_request {"number", "labels", "changed_label", "html_url", "draft"} | null for push; with
                "labels_omitted" (how many) when labels had to be left out to stay under 64 KB
"""

from __future__ import annotations

import dataclasses
import json
import re
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
    """A field the relay keeps is missing, of the wrong type, out of range or too long; the message names it."""


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


_SHA = re.compile(r"[0-9a-f]{40}")
_PR_STATES = frozenset({"open", "closed"})
# Limits of what GitHub sends (and of the columns that keep it): anything beyond is refused, not cut,
# except display text (titles, labels, logins), which is cut to _MAX_TEXT.
_INT_MAX = 2**31 - 1  # GitHub's PR and issue numbers, and the store's integer columns
_MAX_REF = 255
_MAX_REPOSITORY = 200
_MAX_ACTION = 64
_MAX_TIMESTAMP = 32
_MAX_URL = 255
_MAX_LABEL_COUNT = 1000


def _lookup(payload: dict[str, Any], path: str) -> Any:
    value: Any = payload
    for part in path.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def _get(payload: dict[str, Any], path: str, kind: type | tuple[type, ...] = str, optional: bool = False) -> Any:
    value = _lookup(payload, path)
    if value is None and optional:
        return None
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise PayloadError(f"payload field {path!r} is missing or not a {getattr(kind, '__name__', kind)}")
    return value


def _text(payload: dict[str, Any], path: str, max_chars: int, *, optional: bool = False, cut: bool = False) -> str | None:
    """A string field: at most ``max_chars`` (``cut``: longer display text is shortened instead of refused)."""
    value = _get(payload, path, str, optional)
    if value is None:
        return None
    if len(value) > max_chars:
        if cut:
            return value[:max_chars]
        raise PayloadError(f"payload field {path!r} is {len(value)} characters long; at most {max_chars} are accepted")
    return value


def _sha(payload: dict[str, Any], path: str, *, optional: bool = False) -> str | None:
    value = _get(payload, path, str, optional)
    if value is not None and not _SHA.fullmatch(value):
        raise PayloadError(f"payload field {path!r} is not a commit sha (40 lower-case hex digits): {value[:50]!r}")
    return value


def _number(payload: dict[str, Any], path: str, *, optional: bool = False) -> int | None:
    value = _get(payload, path, int, optional)
    if value is not None and not 1 <= value <= _INT_MAX:
        raise PayloadError(f"payload field {path!r} is {value}; a number from 1 to {_INT_MAX} is expected")
    return value


def _flag(payload: dict[str, Any], path: str) -> bool:
    return bool(_get(payload, path, bool, optional=True))


def _cut(value: str | None) -> str | None:
    return None if value is None else value[:_MAX_TEXT]


def repository_of(payload: dict[str, Any]) -> str | None:
    repository = payload.get("repository")
    if isinstance(repository, dict) and isinstance(repository.get("full_name"), str):
        return repository["full_name"]
    return None


def _labels(pr: dict[str, Any]) -> tuple[str, ...]:
    labels = pr.get("labels") or []
    if not isinstance(labels, list) or len(labels) > _MAX_LABEL_COUNT:
        raise PayloadError(f"payload field 'pull_request.labels' must be a list of at most {_MAX_LABEL_COUNT} labels")
    return tuple(
        _cut(label["name"]) for label in labels if isinstance(label, dict) and isinstance(label.get("name"), str)
    )


def normalise(event: str, delivery: str, payload: dict[str, Any]) -> UpstreamEvent:
    """normalise(event, delivery, payload) -> UpstreamEvent; raises PayloadError naming a missing or bad field.

    Every field the relay keeps is checked here (types, integer ranges, lengths, 40-hex shas), so that
    nothing stored can later fail a database write; :mod:`relay.web.json_input` has already refused text
    that is not valid Unicode.
    """
    repository = _text(payload, "repository.full_name", _MAX_REPOSITORY)
    action = _text(payload, "action", _MAX_ACTION, optional=True)
    sender = _text(payload, "sender.login", _MAX_TEXT, optional=True)
    common = dict(event=event, action=action, delivery=delivery, repository=repository, sender=sender)
    if event == "pull_request":
        pr = _get(payload, "pull_request", dict)
        state = _get(payload, "pull_request.state")
        if state not in _PR_STATES:
            raise PayloadError(f"payload field 'pull_request.state' is {state[:50]!r}; expected open or closed")
        info = PullRequestInfo(
            number=_number(payload, "pull_request.number"),
            head_sha=_sha(payload, "pull_request.head.sha"),
            head_ref=_text(payload, "pull_request.head.ref", _MAX_REF),
            base_sha=_sha(payload, "pull_request.base.sha"),
            base_ref=_text(payload, "pull_request.base.ref", _MAX_REF),
            state=state,
            labels=_labels(pr),
            html_url=_text(payload, "pull_request.html_url", _MAX_URL, optional=True) or "",
            draft=_flag(payload, "pull_request.draft"),
            updated_at=_text(payload, "pull_request.updated_at", _MAX_TIMESTAMP, optional=True) or "",
            title=_text(payload, "pull_request.title", _MAX_TEXT, optional=True, cut=True) or "",
        )
        changed = None
        if action in ("labeled", "unlabeled"):
            changed = _text(payload, "label.name", _MAX_TEXT, optional=True, cut=True)
            if changed is None:
                raise PayloadError(f"payload field 'label.name' is missing from a pull_request.{action} event")
        return UpstreamEvent(
            **common, pull_request=info, changed_label=changed, head_sha=info.head_sha, head_ref=info.head_ref,
            base_sha=info.base_sha, base_ref=info.base_ref,
        )
    if event == "push":
        ref = _text(payload, "ref", _MAX_REF)
        return UpstreamEvent(
            **common, head_sha=_sha(payload, "after"), head_ref=ref, base_sha=_sha(payload, "before"),
            base_ref=_text(payload, "base_ref", _MAX_REF, optional=True) or ref,
            deleted=_flag(payload, "deleted"),
        )
    if event == "check_run":
        _text(payload, "check_run.name", _MAX_TEXT, optional=True)
        _text(payload, "check_run.external_id", _MAX_TEXT, optional=True)
        _number(payload, "check_run.app.id", optional=True)
        return UpstreamEvent(**common, head_sha=_sha(payload, "check_run.head_sha", optional=True))
    if event == "check_suite":
        _number(payload, "check_suite.app.id", optional=True)
        return UpstreamEvent(**common, head_sha=_sha(payload, "check_suite.head_sha", optional=True))
    if event == "issue_comment":
        _number(payload, "issue.number", optional=True)
        _get(payload, "comment.body", optional=True)
        _text(payload, "comment.author_association", _MAX_ACTION, optional=True)
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
        # JSON escapes other characters (up to 12 bytes each), so the size is still measured, and labels
        # that do not fit are left out (the others are still a PR's labels, not a reason to test nothing).
        size = _size(longest)
        if size >= CLIENT_PAYLOAD_MAX_BYTES and longest["pull_request"] is not None:
            kept, omitted = _labels_that_fit(longest)
            for body in bodies:
                body["pull_request"].update(labels=kept, labels_omitted=omitted)
            size = _size(longest)
        if size >= CLIENT_PAYLOAD_MAX_BYTES:
            raise PayloadError(f"client_payload would be {size} bytes, over GitHub's limit of {CLIENT_PAYLOAD_MAX_BYTES}")
    return bodies


def _size(body: dict[str, Any]) -> int:
    return len(json.dumps(body, separators=(",", ":")).encode())  # as sent: ASCII JSON, escapes included


def _labels_that_fit(body: dict[str, Any]) -> tuple[list[str], int]:
    """The PR's labels in their order, each kept while the body stays under the limit (a long escaped
    label is left out, the short ones after it, like routing labels, still kept), and how many were left out."""
    labels = body["pull_request"]["labels"]
    room = CLIENT_PAYLOAD_MAX_BYTES - 1 - _size({**body, "pull_request": {**body["pull_request"], "labels": [],
                                                                           "labels_omitted": len(labels)}})
    kept = []
    for label in labels:
        cost = len(json.dumps(label).encode()) + (1 if kept else 0)  # and its comma
        if cost <= room:
            kept.append(label)
            room -= cost
    return kept, len(labels) - len(kept)


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
