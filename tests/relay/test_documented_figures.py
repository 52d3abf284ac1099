"""The figures the docs give for the relay are the ones it uses: every setting's default in a settings
table or in prose (``RELAY_X`` (default N) or (N by default)), the callback limits ``GET
/github/callback`` publishes, and the limits of a dispatch's ``client_payload``."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from relay.intake import events
from relay.settings import ENV_PREFIX, Settings

DOCS = sorted((Path(__file__).resolve().parents[2] / "docs").glob("*.md"))
_UNITS = {"KiB": 1024, "MiB": 1024 ** 2, "GiB": 1024 ** 3, "KB": 1024, "MB": 1024 ** 2}
_NUMBER = re.compile(r"^(\d[\d ]*(?:\.\d+)?)(?:\s*(KiB|MiB|GiB|KB|MB)\b)?")


def _field(env_name: str):
    name = env_name.removeprefix(ENV_PREFIX).lower()
    assert name in Settings.model_fields, f"the docs name {env_name}, which is no setting"
    return Settings.model_fields[name]


def _figure(text: str) -> float | None:
    """The number a default's text starts with (``20 000``, ``8 MiB``, ``259200 (3 days)``), or None."""
    match = _NUMBER.match(text.strip().strip("`"))
    if match is None:
        return None
    return float(match.group(1).replace(" ", "")) * _UNITS.get(match.group(2), 1)


def _documented_defaults() -> list[tuple[str, str, str]]:
    """(where, RELAY_X, the default as written) from settings tables and from prose."""
    found = []
    for doc in DOCS:
        for number, line in enumerate(doc.read_text().splitlines(), 1):
            where = f"{doc.name}:{number}"
            table = re.match(r"^\| `(RELAY_[A-Z0-9_]+)` \| ([^|]*) \|", line)
            if table:
                found.append((where, table.group(1), table.group(2).strip()))
            for prose in re.finditer(r"`(RELAY_[A-Z0-9_]+)`[^(|]{0,40}\((?:default ([^,;)]+)|([^,;)]+?) by default)",
                                     line):
                found.append((where, prose.group(1), (prose.group(2) or prose.group(3)).strip()))
    return [f for f in found if not f[1].startswith("RELAY_TEST_")]  # the project's tests' variables, no setting


DEFAULTS = _documented_defaults()


def test_the_docs_give_defaults_for_many_settings():
    assert len({name for _, name, _ in DEFAULTS}) >= 40  # the parser still finds the tables and the prose


@pytest.mark.parametrize("where, name, written", DEFAULTS, ids=[f"{w}-{n}" for w, n, _ in DEFAULTS])
def test_a_documented_default_is_the_settings_default(where, name, written):
    field = _field(name)
    default = field.default
    if isinstance(default, bool) or written in ("true", "false"):
        assert written == str(default).lower(), f"{where}: {name} is documented as {written!r}, its default is {default!r}"
        return
    figure = _figure(written)
    if isinstance(default, (int, float)) and not isinstance(default, bool):
        assert figure == pytest.approx(default), f"{where}: {name} is documented as {written!r}, its default is {default!r}"
    elif figure is not None and default is not None:
        pytest.fail(f"{where}: {name} is documented as {written!r}, its default is {default!r}")


def test_the_published_callback_limits_are_the_defaults_the_docs_give():
    text = (Path(__file__).resolve().parents[2] / "docs" / "callback-contract.md").read_text()
    published = json.loads(re.search(r'`(\{"max_bytes": [^`]+\})`', text).group(1))
    fields = Settings.model_fields
    assert published == {"max_bytes": fields["callback_max_bytes"].default,
                         "max_tests": fields["callback_max_tests"].default,
                         "max_message_chars": fields["callback_max_message_chars"].default}


def test_the_documented_client_payload_limits_are_the_ones_intake_applies():
    text = (Path(__file__).resolve().parents[2] / "docs" / "callback-contract.md").read_text().replace("\n", " ")
    claim = re.search(r"trimmed to (\d+) top-level keys and under GitHub's (\d+) KB .*? strings are cut to (\d+) "
                      r"characters and the PR's labels to its first (\d+)", text)
    assert claim is not None, "the dispatch section no longer states the client_payload's limits"
    keys, kilobytes, text_chars, labels = map(int, claim.groups())
    assert kilobytes * 1024 == events.CLIENT_PAYLOAD_MAX_BYTES
    assert (text_chars, labels) == (events._MAX_TEXT, events._MAX_LABELS)
    from relay.intake.events import client_payloads, normalise
    from tests.relay.helpers import pr_payload

    (body,) = client_payloads(normalise("pull_request", "d-1", pr_payload()), ["n" * 32])
    assert len(body) == keys < events.CLIENT_PAYLOAD_MAX_KEYS
