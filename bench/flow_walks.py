"""The relay's two walks, traced: which of its files run while a webhook becomes a ``repository_dispatch``,
and while a ``completed`` callback becomes the upstream check (a commit status: the relay holds a token,
not an App).

A real app served by uvicorn on 127.0.0.1 in this process, SQLite, the fake GitHub; every Python call in
every thread is recorded (``threading.setprofile``) in two windows: from the webhook's POST until the fake
GitHub holds the dispatch, and from the callback's POST until the commit status has its conclusion. Files of
``relay/testing/`` (the fake itself) are left out; the workers that play no part in either flow (sweeper,
re-runs, level watch, descriptor reload) are listed apart so an idle tick cannot pad a walk.

Run: ``python bench/flow_walks.py``. It prints each walk's files, grouped by the folder they live in,
and the count of those outside the flow's folders, ``store/``, ``trust.py`` and ``github.py``, with the
functions each of those ran, and how many of those are not the shared plumbing (``web/``, ``periodic.py``).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import sys
import tempfile
import threading
import time
import uuid
from collections import defaultdict
from pathlib import Path

import httpx
import uvicorn

from relay import create_app, load_settings
from relay.testing import FakeGitHub
from relay.testing.sample_report import conformance_report

ROOT = Path(__file__).resolve().parents[1]
RELAY = ROOT / "relay"
SECRET = "walk-secret"
TOKEN = "walk-callback-token-0123456789abcdef"
BACKEND, REPOSITORY = "walk", "org/walk-ci"
HEAD = "a" * 40
# Workers that take no part in a walk; their polls during it are shown, not counted. The reporting
# worker's pass after a webhook, and the dispatcher's polls during a callback, belong to the other walk.
BYSTANDERS = ("relay-sweeper", "relay-reruns", "relay-level-watch", "relay-descriptor-reload", "relay-proposals")
OTHER_FLOW = {"webhook": ("relay-reporting",), "callback": ("relay-dispatcher",)}
# Each walk's folders, and where any walk may go besides (the store, the trust levels, GitHub).
FLOW_FOLDERS = {"webhook": ("intake/", "dispatch/"), "callback": ("results/",)}
SHARED = ("store/", "trust.py", "github.py")
# The plumbing every flow runs on by design (the layout's shared vocabulary): the HTTP layer each route
# sits behind, and the one background-thread mechanism whose ``wake`` a flow is handed. Counted apart, so
# a flow calling into another flow's code still shows.
PLUMBING = ("web/", "periodic.py")

_window: list[str | None] = [None]
_seen: dict[tuple[str, str], set[str]] = defaultdict(set)
_functions: dict[tuple[str, str], set[str]] = defaultdict(set)  # (window, file) -> functions called


def _profile(frame, event, _arg):
    if event != "call" or _window[0] is None:
        return
    path = frame.f_code.co_filename
    if path.startswith(str(RELAY)) and "/testing/" not in path:
        file = str(Path(path).relative_to(RELAY))
        _seen[(_window[0], threading.current_thread().name)].add(file)
        _functions[(_window[0], file)].add(frame.f_code.co_qualname)


def _wait(predicate, what: str, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while not (found := predicate()):
        if time.monotonic() > deadline:
            raise SystemExit(f"flow_walks: {what} did not happen in {timeout:.0f} s")
        time.sleep(0.01)
    return found


def _descriptors(folder: Path) -> Path:
    digest = hashlib.sha256(TOKEN.encode()).hexdigest()
    (folder / f"{BACKEND}.yaml").write_text(
        f"name: {BACKEND}\ndevice_type: cpu\ndetect: {{accelerator: none}}\ndistributed_backend: gloo\n"
        "capabilities: {collectives: true, dtensor: true, compile: false, aot_compile: false, symmetric_memory: false, "
        "put_signal: false, bf16: true, parallelisms: true}\n"
        f"relay: {{repository: {REPOSITORY}, level: L4, callback_token_sha256: '{digest}'}}\n")
    return folder


def _pull_request() -> dict:
    return {
        "action": "opened", "number": 7,
        "pull_request": {
            "number": 7, "state": "open", "title": "Walk", "body": "", "draft": False, "labels": [],
            "html_url": "https://github.com/pytorch/pytorch/pull/7", "updated_at": "2024-05-01T10:00:00Z",
            "head": {"sha": HEAD, "ref": "feature", "repo": {"full_name": "someone/fork"}},
            "base": {"sha": "b" * 40, "ref": "main", "repo": {"full_name": "pytorch/pytorch"}},
        },
        "repository": {"full_name": "pytorch/pytorch", "name": "pytorch"}, "sender": {"login": "octocat"},
    }


def trace() -> dict[str, dict[str, set[str]]]:
    with tempfile.TemporaryDirectory() as tmp, FakeGitHub(tokens=("walk-github-token",)) as fake:
        settings = load_settings(
            webhook_secrets=SECRET, upstream_repo="pytorch/pytorch", github_api_url=fake.url, github_token="walk-github-token",
            database_url=f"sqlite:///{tmp}/relay.db", backends_dir=str(_descriptors(Path(tmp))), log_level="WARNING",
            dispatch_poll_seconds=0.05, reporting_poll_seconds=0.05)
        app = create_app(settings)
        threading.setprofile(_profile)
        server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", access_log=False))
        thread = threading.Thread(target=server.run, name="relay-http", daemon=True)
        thread.start()
        _wait(lambda: server.started, "the relay's start")
        url = f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"
        try:
            body = json.dumps(_pull_request()).encode()
            _window[0] = "webhook"
            answer = httpx.post(f"{url}/github/webhook", content=body, timeout=30, headers={
                "X-GitHub-Event": "pull_request", "X-GitHub-Delivery": str(uuid.uuid4()),
                "X-Hub-Signature-256": "sha256=" + hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest(),
                "Content-Type": "application/json", "User-Agent": "GitHub-Hookshot/walk"})
            assert answer.status_code == 202, answer.text
            nonce = _wait(lambda: [d["client_payload"]["nonce"] for d in fake.dispatches(REPOSITORY)],
                          "the repository_dispatch")[0]
            _window[0] = None

            def callback(state: str, **fields) -> None:
                answer = httpx.post(f"{url}/github/callback", timeout=30, headers={"Authorization": f"Token {TOKEN}"},
                                    json={"nonce": nonce, "state": state, "run_id": 5001, "run_attempt": 1, **fields})
                assert answer.status_code in (200, 202), answer.text

            callback("in_progress", run_url=f"https://github.com/{REPOSITORY}/actions/runs/5001")
            _wait(lambda: fake.statuses, "the pending commit status")
            time.sleep(0.3)  # the run's start is reported outside both windows

            _window[0] = "callback"
            callback("completed", conclusion="failure", report=conformance_report(BACKEND, git_version=HEAD))
            _wait(lambda: [s for s in fake.statuses if s["state"] != "pending"], "the concluded commit status")
            _window[0] = None
        finally:
            threading.setprofile(None)
            server.should_exit = True
            thread.join(30)
    walks: dict[str, dict[str, set[str]]] = defaultdict(dict)
    for (window, thread_name), files in _seen.items():
        walks[window][thread_name] = files
    return walks


def main() -> int:
    walks = trace()
    for window, folders in FLOW_FOLDERS.items():
        by_thread = walks.get(window, {})
        apart = BYSTANDERS + OTHER_FLOW[window]
        files = set().union(*(f for name, f in by_thread.items() if not name.startswith(apart)))
        outside = sorted(f for f in files if not f.startswith((*folders, *SHARED)))
        other_flows = [f for f in outside if not f.startswith(PLUMBING)]
        print(f"{window} walk: {len(files)} relay files; {len(outside)} outside {', '.join(folders + SHARED)}; "
              f"{len(other_flows)} of them outside the plumbing ({', '.join(PLUMBING)})")
        groups: dict[str, list[str]] = defaultdict(list)
        for f in sorted(files):
            groups[f.split("/")[0] + "/" if "/" in f else "relay/"].append(f)
        for group, members in sorted(groups.items()):
            print(f"  {group:<12} {len(members):>2}  {' '.join(members)}")
        if outside:
            print("  outside:")
            for f in outside:
                print(f"    {f}: {', '.join(sorted(_functions[(window, f)]))}")
        for name, f in sorted(by_thread.items()):
            if name.startswith(apart):
                print(f"  (not counted: {name} ran {len(f)} files)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
