"""A fake GitHub API server on 127.0.0.1, for the relay's tests and for backend owners' own tests.

Started by a test (``with FakeGitHub() as gh: ...``); real HTTP, so github3.py and the relay talk to it
exactly as to api.github.com (point ``RELAY_GITHUB_API_URL`` at ``gh.url``). It records every request
(``gh.requests``) and implements what the relay uses:

    POST  /repos/{o}/{r}/dispatches                   204; 422 beyond GitHub's event_type/client_payload limits
    GET   /repos/{o}/{r}                              repository, with absolute URLs pointing here
    GET   /repos/{o}/{r}/installation                 the GitHub App installation (app JWT)
    POST  /app/installations/{id}/access_tokens       installation token (app JWT), 201
    POST  /repos/{o}/{r}/statuses/{sha}               commit status, 201 (state and 140-char description checked)
    POST  /repos/{o}/{r}/check-runs                   check run (installation token only), 201
    GET|PATCH /repos/{o}/{r}/check-runs/{id}          read / update a check run
    POST  /repos/{o}/{r}/check-runs/{id}/rerequest    re-run a check run, 201
    POST  /repos/{o}/{r}/actions/runs/{id}/rerun      re-run a workflow run, 201
    GET|PUT /repos/{o}/{r}/contents/{path}            a file at ?ref= (base64) / commit a file on a branch
    GET   /repos/{o}/{r}/git/ref/heads/{branch}       a branch's commit
    POST  /repos/{o}/{r}/git/refs                     create a branch, 201 (422 if it exists)
    PATCH /repos/{o}/{r}/git/refs/heads/{branch}      move a branch (fast-forward unless force)
    GET|POST /repos/{o}/{r}/pulls                     list (state, head, base, sort, direction, per_page) / open
    GET|PATCH /repos/{o}/{r}/pulls/{number}           read / update (title, body, state)

Repositories hold files in branches of commits (``add_file``, ``file``); pull requests can be merged or
closed by a person (``merge_pull_request``, ``close_pull_request``). Blob shas are git's, so a test can
compare them with ``git hash-object``.

Request bodies are checked against GitHub's published REST description when it is installed
(``relay.testing.github_openapi``): a body GitHub would refuse gets GitHub's 422.

Scripting: ``gh.script(Fault.server_error(), Fault.rate_limited(retry_after=1), repository="o/r")``
queues faults; each matching request consumes the next one. ``gh.latency`` adds a delay to every call.
Faults: slow, server_error (5xx), rate_limited (429 + retry-after), secondary_limit (403),
primary_exhausted (403, x-ratelimit-remaining 0), unprocessable (422), not_found (404),
bad_credentials (401), disconnect (connection closed without an answer).

The server and its routes are :mod:`.server`; each API area answers in a module of its own (:mod:`.apps`,
:mod:`.dispatches`, :mod:`.checks`, :mod:`.git_data`, :mod:`.pulls`); :mod:`.faults` is what tests script.
"""

from relay.testing.fake_github.faults import Fault, RecordedRequest
from relay.testing.fake_github.server import FakeGitHub

__all__ = ["FakeGitHub", "Fault", "RecordedRequest"]
