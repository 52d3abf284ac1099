"""Trust levels: the four switches per level, the allowlist from descriptors, routing and PR display rules."""

from __future__ import annotations

import pytest

from conformance.descriptors import DescriptorError, TrustLevel, packaged_backends_dir
from relay.intake.events import normalise
from relay.trust import LEVELS, BackendTarget, DisplayOnPR, Switches, load_allowlist, route
from relay.testing import loopback_client
from tests.relay.helpers import pr_payload, push_payload, write_backend
from tests.relay.results_fixtures import oidc_issuer, results_backends, results_relay  # noqa: F401


def test_level_table_matches_rfc_0050():
    assert LEVELS == {
        TrustLevel.L1: Switches(True, False, DisplayOnPR.never, False),
        TrustLevel.L2: Switches(True, True, DisplayOnPR.never, False),
        TrustLevel.L3: Switches(True, True, DisplayOnPR.label_only, False),
        TrustLevel.L4: Switches(True, True, DisplayOnPR.always, True),
    }
    assert DisplayOnPR.never.value == "false"


def test_allowlist_reads_relay_sections_with_default_labels(backends_dir):
    targets = {t.name: t for t in load_allowlist(backends_dir)}
    assert sorted(targets) == ["l1", "l2", "l3", "l4"]  # "local" has no relay section
    assert targets["l3"] == BackendTarget("l3", "org/l3-ci", TrustLevel.L3, "ciflow/crcr/l3")


def test_packaged_descriptors_allowlist_nothing():
    assert load_allowlist(packaged_backends_dir()) == ()


@pytest.mark.parametrize("clash", ["repository", "label"])
def test_two_backends_cannot_share_a_repository_or_label(tmp_path, clash):
    write_backend(tmp_path, "a", "org/a-ci", "L1", label="shared")
    write_backend(tmp_path, "b", "org/a-ci" if clash == "repository" else "org/b-ci", "L2",
                  label="shared" if clash == "label" else None)
    with pytest.raises(DescriptorError, match=f"'a' and 'b' both use relay {clash}"):
        load_allowlist(tmp_path)


def test_invalid_descriptor_names_the_file(tmp_path):
    write_backend(tmp_path, "a", "not-a-repo", "L1")
    with pytest.raises(DescriptorError, match=r"(?s)a\.yaml.*relay\.repository: .not-a-repo. is not .owner/name."):
        load_allowlist(tmp_path)


def test_routing_rules(backends_dir):
    targets = load_allowlist(backends_dir)

    def names(event, payload):
        chosen, reason = route(normalise(event, "d", payload), targets)
        return sorted(t.name for t in chosen), reason

    assert names("pull_request", pr_payload("opened")) == (["l1", "l2", "l3", "l4"], None)
    assert names("pull_request", pr_payload("closed")) == (["l1", "l2", "l3", "l4"], None)
    assert names("push", push_payload()) == (["l1", "l2", "l3", "l4"], None)
    assert names("pull_request", pr_payload("labeled", label="ciflow/crcr/l1"))[0] == ["l1"]
    assert names("pull_request", pr_payload("unlabeled", label="ciflow/crcr/l4"))[0] == ["l4"]
    chosen, reason = names("pull_request", pr_payload("labeled", label="topic: cuda"))
    assert chosen == [] and "'topic: cuda' belongs to no allowlisted backend" in reason
    chosen, reason = names("push", push_payload(deleted=True, after="0" * 40))
    assert chosen == [] and "no commit to test" in reason
    assert route(normalise("push", "d", push_payload()), ()) == ([], "no backend in the allowlist forwards events")


def target(level):
    return BackendTarget("npu", "org/npu-ci", level, "ciflow/crcr/npu")


def test_display_on_pr_per_level():
    for labels in ((), ("ciflow/crcr/npu",), None):
        assert not target(TrustLevel.L1).shows_on_pr(labels)
        assert not target(TrustLevel.L2).shows_on_pr(labels)
        assert target(TrustLevel.L4).shows_on_pr(labels)
    assert not target(TrustLevel.L3).shows_on_pr(())
    assert not target(TrustLevel.L3).shows_on_pr(None)  # a push has no PR, so no label
    assert target(TrustLevel.L3).shows_on_pr(("bug", "ciflow/crcr/npu"))


def test_every_question_is_answered_by_the_levels_table():
    answers = {level: (t.forwards, t.on_dashboard, t.accepts_results, t.blocks)
               for level, t in ((level, target(level)) for level in TrustLevel)}
    assert answers == {
        TrustLevel.L1: (True, False, False, False),
        TrustLevel.L2: (True, True, True, False),
        TrustLevel.L3: (True, True, True, False),
        TrustLevel.L4: (True, True, True, True),
    }


def test_relay_with_github_app_auth_dispatches(tmp_path, database_url, backends_dir):
    """End to end with RELAY_GITHUB_APP_ID: one installation token per downstream repository."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    from relay.testing import FakeGitHub
    from tests.relay.helpers import RelayUnderTest

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = tmp_path / "app.pem"
    pem.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL,
                                      serialization.NoEncryption()))
    public = key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    with FakeGitHub(app_id="77", app_public_key_pem=public) as fake:
        installations = {f"org/{n}-ci": fake.install_app(f"org/{n}-ci") for n in ("l1", "l2", "l3")}
        relay = RelayUnderTest.start(database_url, fake, backends_dir, github_token=None, github_app_id="77",
                                     github_private_key_file=str(pem))
        try:
            assert relay.post("push", push_payload()).status_code == 202
            relay.wait_settled()
            states = {d.backend: (d.state, d.last_status) for d in relay.store.dispatches()}
        finally:
            relay.stop()
        assert states["l1"] == states["l2"] == states["l3"] == ("sent", 204)
        assert states["l4"][0] == "failed" and states["l4"][1] == 404  # the app is not installed there
        tokens = {r.repository: r.headers["authorization"] for r in fake.requests if r.endpoint == "dispatches"}
        assert len({tokens[repo] for repo in installations}) == 3  # a token per installation
        assert sum(r.endpoint == "access_tokens" for r in fake.requests) == 3


def test_changing_a_row_of_the_levels_table_changes_what_the_relay_does(
    database_url, results_relay, monkeypatch, wait,  # noqa: F811
):
    """Every part asks the table: swap rows, and forwarding, callbacks, the PR check, its blocking and
    the dashboard all follow (l2 gets L4's row, l3 L1's, l4 a row that forwards nothing)."""

    from tests.relay.results_support import REPOS

    monkeypatch.setitem(LEVELS, TrustLevel.L2, LEVELS[TrustLevel.L4])
    monkeypatch.setitem(LEVELS, TrustLevel.L3, LEVELS[TrustLevel.L1])
    monkeypatch.setitem(LEVELS, TrustLevel.L4, Switches(False, False, DisplayOnPR.never, False))
    relay, drive = results_relay(database_url)
    delivery = drive.open_pr(31)
    dispatched = {name for name, repo in REPOS.items()
                  if any(d["client_payload"]["delivery"] == delivery for d in relay.fake.dispatches(repo))}
    assert dispatched == {"l1", "l2", "l3"}  # l4's row no longer forwards

    refused = drive.start("l3", drive.nonce("l3", delivery))  # l3's row accepts no results now
    assert refused.status_code == 403 and refused.json()["error"] == "level_too_low"

    nonce = drive.nonce("l2", delivery)  # l2's row shows on every PR and blocks: the real conclusion
    assert drive.start("l2", nonce).status_code == 200
    assert drive.complete("l2", nonce, "failure").status_code == 200
    final = wait(lambda: [s for s in relay.fake.statuses if s["context"] == "crcr/l2" and s["state"] != "pending"],
                 what="l2's final status")
    assert final[-1]["state"] == "failure"

    overview = loopback_client().get(f"{relay.url}/api/overview", timeout=30).json()
    assert [b["name"] for b in overview["backends"]] == ["l2"]
    assert sorted(overview["hidden_backends"]) == ["l1", "l3", "l4"]
