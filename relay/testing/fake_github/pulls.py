"""The fake GitHub's pulls area: pull requests: list, open, read, update, and a person's merge or close.

A mixin of :class:`relay.testing.fake_github.server.FakeGitHub`, whose ``__init__`` makes the state it
uses and whose ``handle`` calls its ``_on_<endpoint>`` answers.
"""

from __future__ import annotations

from typing import Any


class PullRequests:
    """Pull requests opened, listed, updated, and merged or closed by a person."""

    def pull_requests(self, repository: str) -> list[dict[str, Any]]:
        """Every pull request of ``repository``, oldest first, as the API shows them."""
        repo = repository.lower()
        with self._lock:
            return [self._pull_json(repo, pr) for _, pr in sorted(self.pulls.get(repo, {}).items())]

    def merge_pull_request(self, repository: str, number: int) -> None:
        """A person merges it (a three-way merge of files); ValueError on a conflict. The pull request closes."""
        repo = repository.lower()
        with self._lock:
            pr = self.pulls[repo][number]
            head = self.branches[repo][pr["head_ref"]]
            base = self.branches[repo][pr["base_ref"]]
            ancestors = self._ancestors(base)
            order, todo = [], [head]  # nearest common ancestor: the first of head's history that base has too
            while todo:
                current = todo.pop(0)
                order.append(current)
                todo.extend(self.commits[current]["parents"])
            common = self.commits[next(c for c in order if c in ancestors)]["tree"]
            ours, theirs = self.commits[base]["tree"], self.commits[head]["tree"]
            merged = {}
            for path in set(ours) | set(theirs) | set(common):
                was, mine, incoming = common.get(path), ours.get(path), theirs.get(path)
                chosen = mine if incoming == was else incoming if mine == was else mine if mine == incoming else False
                if chosen is False:
                    raise ValueError(f"merge conflict in {path}")
                if chosen is not None:
                    merged[path] = chosen
            self.branches[repo][pr["base_ref"]] = self._commit(merged, [base, head], f"Merge pull request #{number}")
            pr.update(state="closed", merged=True, updated=next(self._clock))

    def close_pull_request(self, repository: str, number: int) -> None:
        """A person closes it without merging."""
        with self._lock:
            self.pulls[repository.lower()][number].update(state="closed", updated=next(self._clock))

    def _pull_json(self, repo: str, pr: dict[str, Any]) -> dict[str, Any]:
        owner = repo.split("/", 1)[0]
        number = pr["number"]
        url = f"{self.url}/repos/{repo}/pulls/{number}"

        def side(ref: str) -> dict[str, Any]:
            return {"label": f"{owner}:{ref}", "ref": ref, "sha": self.branches.get(repo, {}).get(ref),
                    "user": {"login": owner}, "repo": {"full_name": repo, "url": f"{self.url}/repos/{repo}"}}

        stamp = f"2024-01-01T00:00:{pr['updated'] % 60:02d}Z"
        return {"id": number + 5_000_000, "number": number, "state": pr["state"], "title": pr["title"],
                "body": pr["body"], "url": url, "html_url": f"{self.url}/{repo}/pull/{number}",
                "head": side(pr["head_ref"]), "base": side(pr["base_ref"]), "user": {"login": pr["user"]},
                "merged": pr["merged"], "merged_at": stamp if pr["merged"] else None,
                "closed_at": stamp if pr["state"] == "closed" else None,
                "created_at": "2024-01-01T00:00:00Z", "updated_at": stamp}

    def _head_ref(self, repo: str, head: str) -> str | None:
        """``branch`` or ``owner:branch`` of this repository (forks are not modelled)."""
        if ":" in head:
            owner, head = head.split(":", 1)
            if owner.lower() != repo.split("/", 1)[0]:
                return None
        return head

    def _on_pulls(self, params, repo, body):
        with self._lock:
            pulls = self.pulls.setdefault(repo, {})
            if params["method"] == "GET":
                query = params["query"]
                state = query.get("state", "open")
                head = self._head_ref(repo, query["head"]) if "head" in query else None
                chosen = [pr for pr in pulls.values()
                          if state in ("all", pr["state"]) and ("head" not in query or pr["head_ref"] == head)
                          and query.get("base", pr["base_ref"]) == pr["base_ref"]]
                key = "updated" if query.get("sort") == "updated" else "number"
                chosen.sort(key=lambda pr: pr[key], reverse=query.get("direction", "desc") == "desc")
                limit = int(query.get("per_page", 30))
                return 200, {}, [self._pull_json(repo, pr) for pr in chosen[:limit]]
            body = body if isinstance(body, dict) else {}
            head = self._head_ref(repo, body.get("head", ""))
            base = body.get("base", "")
            branches = self.branches.get(repo, {})
            invalid = [field for field, ref in (("head", head), ("base", base)) if ref not in branches]
            if invalid:
                return 422, {}, {"message": "Validation Failed", "errors": [
                    {"resource": "PullRequest", "field": field, "code": "invalid"} for field in invalid]}
            if any(pr["state"] == "open" and pr["head_ref"] == head and pr["base_ref"] == base for pr in pulls.values()):
                return 422, {}, {"message": "Validation Failed", "errors": [{
                    "resource": "PullRequest", "code": "custom",
                    "message": f"A pull request already exists for {repo.split('/')[0]}:{head}."}]}
            if branches[head] in self._ancestors(branches[base]):
                return 422, {}, {"message": "Validation Failed", "errors": [{
                    "resource": "PullRequest", "code": "custom", "message": f"No commits between {base} and {head}"}]}
            number = max(pulls, default=0) + 1
            pulls[number] = {"number": number, "title": body.get("title") or head, "body": body.get("body"),
                             "head_ref": head, "base_ref": base, "state": "open", "merged": False,
                             "user": "relay-bot", "updated": next(self._clock)}
            return 201, {}, self._pull_json(repo, pulls[number])

    def _on_pull(self, params, repo, body):
        with self._lock:
            pr = self.pulls.get(repo, {}).get(int(params["number"]))
            if pr is None:
                return 404, {}, {"message": "Not Found"}
            if params["method"] == "PATCH":
                body = body if isinstance(body, dict) else {}
                if body.get("state", "open") not in ("open", "closed"):
                    return 422, {}, {"message": "Validation Failed", "errors": [{"field": "state", "code": "invalid"}]}
                if pr["merged"] and body.get("state") == "open":
                    return 422, {}, {"message": "Validation Failed", "errors": [{
                        "resource": "PullRequest", "code": "custom", "message": "Cannot reopen a merged pull request"}]}
                pr.update({k: body[k] for k in ("title", "body", "state") if k in body}, updated=next(self._clock))
            return 200, {}, self._pull_json(repo, pr)
