"""Level-change and quarantine-release proposals: pull requests on the descriptor repository, through
relay/github.py against the fake GitHub over HTTP, from runs and test results in a real store."""

from __future__ import annotations

import dataclasses
import datetime as dt
import difflib
import hashlib
import time

import pytest

from relay.levels.descriptor_text import DescriptorEditError, remove_quarantine_entry, set_level
from relay.github import GitHubClient, PermanentError
from relay.levels.proposals import CLOSED_MARK, Proposer, level_branch, release_branch
from relay.store.base import utcnow
from relay.trust import LEVEL_CRITERIA, QuarantinedTest, TrustLevel, load_allowlist
from tests.relay.results_fixtures import oidc_issuer, results_backends, results_relay  # noqa: F401
from tests.relay.results_support import TOKENS, report

DESCRIPTORS = "org/descriptors"
SINCE = dt.date(2026, 12, 1)

DESCRIPTOR = """\
# A backend kept by hand: comments, quoting, anchors and order must survive an edit.
name: l4
device_type: cpu
detect: {accelerator: none}
distributed_backend: gloo
capabilities: {collectives: true, dtensor: true, compile: false, aot_compile: false, symmetric_memory: false, put_signal: false, bf16: true, parallelisms: true}
relay:
  repository: org/l4-ci          # the downstream repository
  level: "L4"                    # mature: the check is required
  quarantine:
    # collectives that time out on the ring
    - match: "collectives::test_all_reduce[*]"
      reason: &ring ring time-out under load, tracked in org/l4-ci#12
      expires: 2099-12-31
    - {match: "collectives::test_broadcast", reason: *ring, expires: 2099-12-31}
  callback_token_sha256: '%s'
# trailing comment
""" % hashlib.sha256(TOKENS["l4"].encode()).hexdigest()


def changed_lines(before: str, after: str) -> list[str]:
    return [line for line in difflib.unified_diff(before.splitlines(), after.splitlines(), lineterm="", n=0)
            if line[:1] in "+-" and not line.startswith(("+++", "---"))]


# --- editing the descriptor --------------------------------------------------------------------
def test_a_level_edit_changes_only_the_level_lines():
    after = set_level(DESCRIPTOR, "L3", SINCE)
    assert changed_lines(DESCRIPTOR, after) == [
        '-  level: "L4"                    # mature: the check is required',
        "+  level: L3                    # mature: the check is required",
        "+  level_since: 2026-12-01",
    ]
    again = set_level(after, "L2", dt.date(2027, 1, 2))
    assert changed_lines(after, again) == [
        "-  level: L3                    # mature: the check is required", "-  level_since: 2026-12-01",
        "+  level: L2                    # mature: the check is required", "+  level_since: 2027-01-02",
    ]


def test_a_release_removes_one_entry_and_keeps_the_rest():
    after = remove_quarantine_entry(DESCRIPTOR, "collectives::test_broadcast")
    assert changed_lines(DESCRIPTOR, after) == [
        '-    - {match: "collectives::test_broadcast", reason: *ring, expires: 2099-12-31}']
    last = remove_quarantine_entry(after, "collectives::test_all_reduce[*]")
    assert changed_lines(after, last) == [
        "-  quarantine:", "-    # collectives that time out on the ring",
        '-    - match: "collectives::test_all_reduce[*]"',
        "-      reason: &ring ring time-out under load, tracked in org/l4-ci#12", "-      expires: 2099-12-31"]


def test_edits_that_cannot_be_made_safely_are_refused():
    with pytest.raises(DescriptorEditError, match="relay.quarantine has no entry with match 'nope::x'"):
        remove_quarantine_entry(DESCRIPTOR, "nope::x")
    # The first entry defines the anchor the second uses: removing it alone would break the file.
    with pytest.raises(DescriptorEditError, match="the edit left invalid YAML"):
        remove_quarantine_entry(DESCRIPTOR, "collectives::test_all_reduce[*]")
    flow = "name: l4\nrelay: {repository: org/l4-ci, level: L4}\n"
    with pytest.raises(DescriptorEditError, match=r"backends/l4.yaml: the relay section is written in flow style"):
        set_level(flow, "L3", SINCE, where="backends/l4.yaml")
    with pytest.raises(DescriptorEditError, match="has no relay section"):
        set_level("name: l4\n", "L3", SINCE)


# --- the GitHub calls --------------------------------------------------------------------------
def test_files_branches_and_pull_requests_through_the_client(fake_github):
    gh = GitHubClient(fake_github.url, token="test-token")
    fake_github.add_file(DESCRIPTORS, "backends/l4.yaml", DESCRIPTOR)
    found = gh.file_at(DESCRIPTORS, "backends/l4.yaml", "main")
    blob = hashlib.sha1(b"blob %d\0" % len(DESCRIPTOR.encode()) + DESCRIPTOR.encode()).hexdigest()
    assert (found.content.decode(), found.sha) == (DESCRIPTOR, blob)  # git's blob id, as GitHub gives it
    assert gh.file_at(DESCRIPTORS, "backends/none.yaml", "main") is None
    assert gh.branch_head(DESCRIPTORS, "relay/level/l4") is None
    head = gh.branch_head(DESCRIPTORS, "main")
    gh.create_branch(DESCRIPTORS, "relay/level/l4", head)
    with pytest.raises(PermanentError, match="422 Reference already exists"):
        gh.create_branch(DESCRIPTORS, "relay/level/l4", head)
    with pytest.raises(PermanentError, match="409 backends/l4.yaml does not match"):
        gh.put_file(DESCRIPTORS, "backends/l4.yaml", content=b"x", message="m", branch="relay/level/l4", sha="0" * 40)
    gh.put_file(DESCRIPTORS, "backends/l4.yaml", content=b"changed\n", message="m", branch="relay/level/l4", sha=blob)
    assert fake_github.file(DESCRIPTORS, "backends/l4.yaml", "relay/level/l4") == b"changed\n"
    assert fake_github.file(DESCRIPTORS, "backends/l4.yaml", "main") == DESCRIPTOR.encode()
    with pytest.raises(PermanentError, match="422 Update is not a fast forward"):
        gh.move_branch(DESCRIPTORS, "relay/level/l4", head)  # back to main's commit: not without force
    created = gh.create_pull_request(DESCRIPTORS, title="t", head="relay/level/l4", base="main", body="b")
    with pytest.raises(PermanentError, match="A pull request already exists for org:relay/level/l4"):
        gh.create_pull_request(DESCRIPTORS, title="t", head="relay/level/l4", base="main", body="b")
    (listed,) = gh.pull_requests_from(DESCRIPTORS, "relay/level/l4", base="main")
    assert (listed["number"], listed["state"], listed["head"]["ref"]) == (created.data["number"], "open", "relay/level/l4")
    gh.update_pull_request(DESCRIPTORS, listed["number"], body="new", state="closed")
    assert gh.pull_requests_from(DESCRIPTORS, "relay/level/l4", base="main")[0]["state"] == "closed"
    assert gh.pull_requests_from(DESCRIPTORS, "relay/other", base="main") == []
    assert fake_github.schema_violations == [] and fake_github.answer_violations == []


# --- the pass, end to end ----------------------------------------------------------------------
L2_DESCRIPTOR = """\
name: l2
device_type: cpu
detect: {accelerator: none}
distributed_backend: gloo
capabilities: {collectives: true, dtensor: true, compile: false, aot_compile: false, symmetric_memory: false, put_signal: false, bf16: true, parallelisms: true}
relay:
  repository: org/l2-ci   # observation for now
  level: L2
  callback_token_sha256: '%s'
""" % hashlib.sha256(TOKENS["l2"].encode()).hexdigest()

ALL_REDUCE = "conformance/suites/test_collectives.py::test_all_reduce[sum]"
BROADCAST = "conformance/suites/test_collectives.py::test_broadcast"
# L3 without its entry criteria (a month at L2, 14 days of data), so that runs of a test qualify now.
PROMPT = {**LEVEL_CRITERIA, TrustLevel.L3: dataclasses.replace(LEVEL_CRITERIA[TrustLevel.L3], entry=())}


HOSTILE = "x` [link](https://evil.example) ![img](https://evil.example/i.png) <img src=x onerror=alert(1)> @octocat #1"


def markdown_dangers(markdown: str) -> list[str]:
    """What GitHub would render as more than text, other than the relay's own links to its dashboard."""
    from markdown_it import MarkdownIt

    found = []
    for block in MarkdownIt("commonmark").enable("table").parse(markdown):
        if block.type == "html_block" and not block.content.startswith("<!-- relay-proposal"):
            found.append(f"html block {block.content!r}")
        for token in block.children or ():
            href = (token.attrs or {}).get("href", "")
            if token.type == "link_open" and not str(href).startswith("http://dashboard.test/"):
                found.append(f"link {href!r}")
            elif token.type in ("image", "html_inline"):
                found.append(f"{token.type} {token.content!r}")
            elif token.type == "text" and any(m in token.content.replace("http://dashboard.test/", "")
                                               for m in ("://", "@", "#1", "<")):
                found.append(f"live text {token.content!r}")
    return found


def writes(fake) -> list[tuple[str, str]]:
    return [(r.method, r.path) for r in fake.requests if r.method != "GET" and r.path.startswith(f"/repos/{DESCRIPTORS}")]


def pr_of(fake, branch):
    (pr,) = [p for p in fake.pull_requests(DESCRIPTORS) if p["head"]["ref"] == branch and p["state"] == "open"]
    return pr


@pytest.fixture
def driven(database_url, results_relay, results_backends):  # noqa: F811
    """A relay whose store holds 10 finished runs: l2 all green, l4 all red but ALL_REDUCE passing in
    each; l3 has none. The descriptor repository holds l2's file (l4's is added by the test)."""
    relay, drive = results_relay(database_url)
    for number in range(60, 70):
        delivery = drive.open_pr(number)
        for backend, conclusion in (("l2", "success"), ("l4", "failure")):
            nonce = drive.nonce(backend, delivery)
            assert drive.start(backend, nonce).status_code == 200
            tests = [(ALL_REDUCE, "passed", ""), (BROADCAST, "failed" if backend == "l4" else "passed", "rank 1 got 0")]
            assert drive.complete(backend, nonce, conclusion, report_body=report(backend, tests)).status_code == 200
    relay.fake.add_file(DESCRIPTORS, "backends/l2.yaml", L2_DESCRIPTOR)
    relay.store.start_level_hold("l4", "L4", "success rate 0% (above 90% over 7 days) misses the L4 bar")
    quarantine = (QuarantinedTest(match="collectives::test_all_reduce[*]", reason=f"ring time-out {HOSTILE}",
                                  expires=dt.date(2099, 12, 31)),
                  QuarantinedTest(match="collectives::test_broadcast", reason="ring time-out", expires=dt.date(2099, 12, 31)))
    targets = [dataclasses.replace(t, quarantine=quarantine) if t.name == "l4" else t
               for t in load_allowlist(results_backends)]
    later = utcnow() + dt.timedelta(hours=1)

    def proposer(**kw) -> Proposer:
        values = dict(repository=DESCRIPTORS, criteria=PROMPT, demote_after_seconds=1800,
                      dashboard_url="http://dashboard.test", clock=lambda: later)
        values.update(kw)
        return Proposer(relay.store, GitHubClient(relay.fake.url, token="test-token"), targets, **values)

    return relay, proposer, later.date()


def test_proposals_open_update_close_and_respect_a_person(driven):
    relay, proposer, today = driven
    fake = relay.fake
    # Pass 1: l4's descriptor is missing; its subjects fail, naming the fix, and l2's proposal opens.
    outcomes = {(o.backend, o.kind, o.branch): o for o in proposer().propose_once()}
    assert outcomes[("l2", "level", level_branch("l2"))].action == "opened"
    failed = outcomes[("l4", "level", level_branch("l4"))]
    assert failed.action == "failed" and "backends/l4.yaml is not on main of org/descriptors" in failed.detail
    assert "RELAY_PROPOSALS_DESCRIPTOR_PATH" in failed.detail
    assert outcomes[("l3", "level", level_branch("l3"))].action == "none"  # insufficient data

    promotion = pr_of(fake, level_branch("l2"))
    assert promotion["title"] == "l2: promote from L2 to L3"
    body = promotion["body"]
    assert "| success rate | to hold L2 | 100% | above 70% over 7 days | yes |" in body
    assert "| end-to-end p50 | to enter L3 |" in body and "Backend page: http://dashboard.test/backends/l2" in body
    proposed = fake.file(DESCRIPTORS, "backends/l2.yaml", level_branch("l2")).decode()
    assert changed_lines(L2_DESCRIPTOR, proposed) == ["-  level: L2", "+  level: L3", f"+  level_since: {today}"]

    # Pass 2, bounded to one write: l4's demotion opens; its releases wait for the next pass.
    fake.add_file(DESCRIPTORS, "backends/l4.yaml", DESCRIPTOR.replace('reason: *ring', 'reason: "ring time-out"'))
    bounded = proposer(max_per_pass=1)
    first = [o.action for o in bounded.propose_once()]
    assert first.count("opened") == 1 and first.count("unchanged") == 1
    second = {(o.backend, o.kind, o.branch): o.action for o in bounded.propose_once()}
    release = release_branch("l4", "collectives::test_all_reduce[*]")
    assert second == {("l4", "release", release): "opened"}  # the pass started where the last one stopped
    demotion = pr_of(fake, level_branch("l4"))
    assert demotion["title"] == "l4: demote from L4 to L3"
    assert "| success rate | to hold L4 | 0% | above 90% over 7 days | **no** |" in demotion["body"]
    assert "it has been below its L4 bar since " in demotion["body"]
    assert "as its level hold records (a demotion is proposed after 30 minutes below)" in demotion["body"]
    freed = pr_of(fake, release)
    assert "release ` collectives::test_all_reduce[*] ` from **l4**'s quarantine" in freed["body"]
    assert "| 10 passed |" in freed["body"] and "http://dashboard.test/runs/" in freed["body"]
    assert "(http://dashboard.test/tests/collectives%3A%3Atest_all_reduce%5Bsum%5D)" in freed["body"]
    assert HOSTILE in freed["body"] and markdown_dangers(freed["body"]) == []  # the reason is an inert code span
    assert markdown_dangers(demotion["body"]) == [] and markdown_dangers(promotion["body"]) == []
    released = fake.file(DESCRIPTORS, "backends/l4.yaml", release).decode()
    assert changed_lines(fake.file(DESCRIPTORS, "backends/l4.yaml").decode(), released) == [
        '-    - match: "collectives::test_all_reduce[*]"',
        "-      reason: &ring ring time-out under load, tracked in org/l4-ci#12", "-      expires: 2099-12-31"]

    # Pass 3: nothing changed, so nothing is written (the same numbers, the same files).
    before = len(writes(fake))
    still = {(o.backend, o.kind, o.branch): o.action for o in proposer().propose_once()}
    assert set(still.values()) == {"unchanged", "none"}
    assert still[("l4", "release", release_branch("l4", "collectives::test_broadcast"))] == "none"  # it fails
    assert len(writes(fake)) == before

    # A person merges the promotion and closes the release: applied, declined, and never reopened.
    fake.merge_pull_request(DESCRIPTORS, promotion["number"])
    fake.close_pull_request(DESCRIPTORS, freed["number"])
    after = {o.branch: o.action for o in proposer().propose_once()}
    assert after[level_branch("l2")] == "applied" and after[release] == "declined"
    assert len(writes(fake)) == before and len(fake.pull_requests(DESCRIPTORS)) == 3

    # The demotion's reason goes (below the bar for 1 h, not 2 h): the relay closes it, saying why.
    assert {o.branch: o.action for o in proposer(demote_after_seconds=7200).propose_once()}[level_branch("l4")] == "closed"
    closed = [p for p in fake.pull_requests(DESCRIPTORS) if p["number"] == demotion["number"]][0]
    assert closed["state"] == "closed" and CLOSED_MARK in closed["body"]
    assert "**The relay closed this proposal: it has been below its bar for less than 2 hours.**" in closed["body"]
    # ... and once it holds again, a new one opens (a close by the relay is no person's "no").
    assert {o.branch: o.action for o in proposer().propose_once()}[level_branch("l4")] == "opened"
    reopened = pr_of(fake, level_branch("l4"))
    assert reopened["number"] != demotion["number"]
    # A person restores the backend (ends its hold): the demotion is withdrawn.
    relay.store.end_level_hold("l4", "restored: the runner was fixed")
    assert {o.branch: o.action for o in proposer().propose_once()}[level_branch("l4")] == "closed"
    assert "no active level hold has it below its bar" in fake.pull_requests(DESCRIPTORS)[reopened["number"] - 1]["body"]
    assert fake.schema_violations == [] and fake.answer_violations == []


def test_nothing_is_proposed_without_a_descriptor_repository(database_url, results_relay, monkeypatch, capsys,  # noqa: F811
                                                             results_backends):
    relay, _ = results_relay(database_url)
    assert relay.parts.results.proposals is None
    from relay.cli import main

    for name, value in {"RELAY_WEBHOOK_SECRETS": "s", "RELAY_GITHUB_TOKEN": "test-token", "RELAY_DATABASE_URL": database_url,
                        "RELAY_BACKENDS_DIR": str(results_backends), "RELAY_GITHUB_API_URL": relay.fake.url}.items():
        monkeypatch.setenv(name, value)
    assert main(["levels", "propose"]) == 2
    assert "RELAY_PROPOSALS_REPOSITORY is not set" in capsys.readouterr().err
    assert [r for r in relay.fake.requests if "/pulls" in r.path or "/contents/" in r.path] == []


def test_the_background_pass_and_the_cli_propose(database_url, results_relay, monkeypatch, capsys,  # noqa: F811
                                                 results_backends):
    relay, drive = results_relay(database_url, proposals_repository=DESCRIPTORS, proposals_interval_seconds=0.2)
    for number in range(80, 86):  # l4: six failures -> demote, once below its bar (a level hold) for 3 days
        nonce = drive.nonce("l4", drive.open_pr(number))
        assert drive.start("l4", nonce).status_code == 200
        assert drive.complete("l4", nonce, "failure").status_code == 200
    relay.fake.add_file(DESCRIPTORS, "backends/l4.yaml", DESCRIPTOR.replace('reason: *ring', 'reason: "x"'))
    proposals = relay.parts.results.proposals
    passes = proposals.totals["none"]

    deadline = time.monotonic() + 30
    while proposals.totals["none"] < passes + 8 and time.monotonic() < deadline:  # two more passes of 4 subjects
        time.sleep(0.05)
    assert proposals.totals["none"] >= passes + 8 and proposals.totals["failed"] == 0
    assert relay.fake.pull_requests(DESCRIPTORS) == []  # below the bar for minutes, not 3 days
    proposals.stop()  # the CLI's pass, with a shorter delay, is the only one from here on
    assert relay.parts.results.level_watch.watch_once()["l4"] in ("held", "still_held")  # below its bar: held
    hold = relay.store.current_level_hold("l4")
    assert hold is not None and hold.level == "L4"
    for name, value in {"RELAY_WEBHOOK_SECRETS": "s", "RELAY_GITHUB_TOKEN": "test-token", "RELAY_DATABASE_URL": database_url,
                        "RELAY_BACKENDS_DIR": str(results_backends), "RELAY_GITHUB_API_URL": relay.fake.url,
                        "RELAY_PROPOSALS_REPOSITORY": DESCRIPTORS, "RELAY_PROPOSALS_DEMOTE_AFTER_SECONDS": "0.001"}.items():
        monkeypatch.setenv(name, value)
    from relay.cli import main

    assert main(["levels", "propose"]) == 0
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()}
    assert "opened" in lines["l4"] and "/org/descriptors/pull/" in lines["l4"]
    assert [p["title"] for p in relay.fake.pull_requests(DESCRIPTORS)] == ["l4: demote from L4 to L3"]
    assert f"below its L4 bar since {hold.started_at:%Y-%m-%d %H:%M} UTC" in relay.fake.pull_requests(DESCRIPTORS)[0]["body"]
    content = relay.fake.file(DESCRIPTORS, "backends/l4.yaml", level_branch("l4")).decode()
    assert changed_lines(relay.fake.file(DESCRIPTORS, "backends/l4.yaml").decode(), content)[:2] == [
        '-  level: "L4"                    # mature: the check is required',
        "+  level: L3                    # mature: the check is required"]


def test_a_failing_subject_never_stops_the_others_and_a_rate_limit_ends_the_pass(store, fake_github,
                                                                                  results_backends):  # noqa: F811
    from relay.testing import Fault

    proposer = Proposer(store, GitHubClient(fake_github.url, token="test-token"), load_allowlist(results_backends),
                        repository=DESCRIPTORS, criteria=LEVEL_CRITERIA)
    fake_github.script(Fault.server_error(), endpoint="pulls")
    first = [(o.backend, o.action) for o in proposer.propose_once()]
    assert first == [("l1", "failed"), ("l2", "none"), ("l3", "none"), ("l4", "none")]  # no runs: nothing wanted
    fake_github.script(Fault.rate_limited(retry_after=60), endpoint="pulls")
    assert [(o.backend, o.action) for o in proposer.propose_once()] == [("l1", "failed")]
    assert [o.backend for o in proposer.propose_once()] == ["l1", "l2", "l3", "l4"]


def test_proposal_settings(monkeypatch):
    from relay.settings import SettingsError, load_settings

    base = dict(webhook_secrets="s", github_token="t", database_url="sqlite://")
    assert load_settings(**base).proposals_repository is None  # off unless set
    monkeypatch.setenv("RELAY_PROPOSALS_DESCRIPTOR_PATHS", '{"l4": "ci/l4.yaml"}')
    settings = load_settings(**base, proposals_repository=DESCRIPTORS)
    proposer = Proposer.from_settings(settings, None, None, [])
    assert (proposer.path_of("l4"), proposer.path_of("cuda")) == ("ci/l4.yaml", "backends/cuda.yaml")
    with pytest.raises(SettingsError, match=r"RELAY_PROPOSALS_DESCRIPTOR_PATH: 'backends/x.yaml' must be a path "
                                            r"inside the repository containing \{name\}"):
        load_settings(**base, proposals_descriptor_path="backends/x.yaml")
    with pytest.raises(SettingsError, match="RELAY_PROPOSALS_REPOSITORY: String should match pattern"):
        load_settings(**base, proposals_repository="not a repository")
