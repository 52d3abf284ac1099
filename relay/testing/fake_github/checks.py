"""The fake GitHub's checks area: commit statuses, check runs and their re-runs, and workflow re-runs.

A mixin of :class:`relay.testing.fake_github.server.FakeGitHub`, whose ``__init__`` makes the state it
uses and whose ``handle`` calls its ``_on_<endpoint>`` answers.
"""

from __future__ import annotations


class Checks:
    """Commit statuses and check runs, as GitHub keeps and re-runs them."""

    def _on_statuses(self, params, repo, body):
        state = (body or {}).get("state")
        if state not in ("pending", "success", "error", "failure"):
            return 422, {}, {"message": "Validation Failed", "errors": [{"field": "state", "code": "invalid"}]}
        if len((body or {}).get("description") or "") > 140:
            return 422, {}, {"message": "Validation Failed", "errors": [{"field": "description", "code": "custom",
                                                                           "message": "description is too long (maximum is 140 characters)"}]}
        status_id = next(self._ids)
        status = {"id": status_id, "url": f"{self.url}/repos/{repo}/statuses/{params['sha']}", "sha": params["sha"],
                  "context": body.get("context", "default"), "state": state, "description": body.get("description"),
                  "target_url": body.get("target_url"), "created_at": "2024-01-01T00:00:00Z"}
        with self._lock:
            self.statuses.append({"repository": repo, **status})
        return 201, {}, status

    def _on_check_runs(self, params, repo, body):
        body = body or {}
        if not body.get("name") or not body.get("head_sha"):
            return 422, {}, {"message": "Invalid request.\n\n\"name\", \"head_sha\" wasn't supplied."}
        output = body.get("output") or {}
        if len(output.get("summary") or "") > 65535 or len(output.get("text") or "") > 65535:
            return 422, {}, {"message": "Invalid request.\n\nOnly 65535 characters are allowed"}
        run_id = next(self._ids)
        run = {
            "id": run_id, "name": body["name"], "head_sha": body["head_sha"], "status": body.get("status", "queued"),
            "conclusion": body.get("conclusion"), "external_id": body.get("external_id"),
            "details_url": body.get("details_url"), "output": output,
            "url": f"{self.url}/repos/{repo}/check-runs/{run_id}", "html_url": f"{self.url}/{repo}/runs/{run_id}",
            "repository": repo,
        }
        with self._lock:
            self.check_runs[run_id] = run
        return 201, {}, run

    def _on_check_run(self, params, repo, body):
        run = self.check_runs.get(int(params["id"]))
        if run is None or run["repository"] != repo:
            return 404, {}, {"message": "Not Found"}
        if body is not None:  # PATCH
            with self._lock:
                run.update({k: v for k, v in body.items() if k != "id"})
        return 200, {}, run

    def _on_check_run_rerequest(self, params, repo, body):
        if int(params["id"]) not in self.check_runs:
            return 404, {}, {"message": "Not Found"}
        return 201, {}, {}

    def _on_workflow_rerun(self, params, repo, body):
        return 201, {}, {}
