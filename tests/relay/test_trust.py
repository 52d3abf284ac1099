"""Trust levels: the four switches per level, the allowlist from descriptors, routing and PR display rules."""

from __future__ import annotations

import pytest

from conformance.descriptors import DescriptorError, TrustLevel, packaged_backends_dir
from relay.events import normalise
from relay.trust import LEVELS, DisplayOnPR, Switches, Target, load_allowlist, route, shows_on_pr
from tests.relay.helpers import pr_payload, push_payload, write_backend


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
    assert targets["l3"] == Target("l3", "org/l3-ci", TrustLevel.L3, "ciflow/crcr/l3")


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


def test_display_on_pr_per_level():
    def target(level):
        return Target("npu", "org/npu-ci", level, "ciflow/crcr/npu")

    for labels in ((), ("ciflow/crcr/npu",)):
        assert not shows_on_pr(target(TrustLevel.L1), labels)
        assert not shows_on_pr(target(TrustLevel.L2), labels)
        assert shows_on_pr(target(TrustLevel.L4), labels)
    assert not shows_on_pr(target(TrustLevel.L3), ())
    assert shows_on_pr(target(TrustLevel.L3), ("bug", "ciflow/crcr/npu"))


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
