"""The app hands its parts over as one typed record: ``app.state`` holds ``parts`` and nothing else,
and the results side is built whole (no member filled in later)."""

from __future__ import annotations

import dataclasses

from tests.relay.helpers import SECRET, UPSTREAM


def test_the_app_state_holds_one_typed_record_built_whole(fake_github, backends_dir, sqlite_url):
    from relay import create_app, load_settings
    from relay.assembly import RelayParts, parts_of
    from relay.assembly import ResultsSide

    app = create_app(load_settings(webhook_secrets=SECRET, upstream_repo=UPSTREAM, github_api_url=fake_github.url,
                                   github_token="test-token", database_url=sqlite_url, backends_dir=str(backends_dir)))
    assert set(vars(app.state)["_state"]) == {"parts"}
    parts = parts_of(app)
    assert isinstance(parts, RelayParts) and isinstance(parts.results, ResultsSide)
    assert parts.callbacks is parts.results.callbacks and parts.dispatcher is not None
    # Built in order: the parts every relay has are there from the start (only switched-off ones are None).
    assert parts.results.reruns is not None and parts.results.reporting is not None
    assert parts.results.sweeper is not None and parts.results.callbacks.on_run_changed is not None
    assert parts.dispatcher.on_sent is not None
    assert all(getattr(parts, f.name) is not None for f in dataclasses.fields(RelayParts))
    parts.store.close()
