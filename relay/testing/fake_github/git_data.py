"""The fake GitHub's git data area: repositories as git: blobs, commits and branches; the contents API and branch refs.

A mixin of :class:`relay.testing.fake_github.server.FakeGitHub`, whose ``__init__`` makes the state it
uses and whose ``handle`` calls its ``_on_<endpoint>`` answers.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from typing import Any


class GitData:
    """Files in branches of commits, with git's blob shas, through the contents and refs endpoints."""

    def add_file(self, repository: str, path: str, content: bytes | str, *, branch: str = "main",
                 message: str = "add a file") -> str:
        """Commit ``content`` at ``path`` on ``branch`` (created if missing); returns the commit sha."""
        data = content.encode() if isinstance(content, str) else content
        repo = repository.lower()
        with self._lock:
            head = self.branches.setdefault(repo, {}).get(branch)
            tree = dict(self.commits[head]["tree"]) if head else {}
            tree[path] = self._store_blob(data)
            self.branches[repo][branch] = self._commit(tree, [head] if head else [], message)
            return self.branches[repo][branch]

    def file(self, repository: str, path: str, ref: str = "main") -> bytes | None:
        """The bytes of ``path`` at branch or commit ``ref`` (None: no such file)."""
        with self._lock:
            commit = self._resolve(repository.lower(), ref)
            blob = None if commit is None else self.commits[commit]["tree"].get(path)
            return None if blob is None else self.blobs[blob]

    def _store_blob(self, data: bytes) -> str:
        sha = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()  # git's blob id
        self.blobs[sha] = data
        return sha

    def _commit(self, tree: dict[str, str], parents: list[str], message: str) -> str:
        sha = hashlib.sha1(json.dumps([sorted(tree.items()), parents, message, next(self._ids)]).encode()).hexdigest()
        self.commits[sha] = {"tree": tree, "parents": parents, "message": message}
        return sha

    def _resolve(self, repo: str, ref: str) -> str | None:
        ref = ref.removeprefix("refs/").removeprefix("heads/")
        found = self.branches.get(repo, {}).get(ref)
        if found is None and ref in self.commits:
            return ref
        return found

    def _ancestors(self, sha: str) -> set[str]:
        seen, todo = set(), [sha]
        while todo:
            current = todo.pop()
            if current not in seen:
                seen.add(current)
                todo.extend(self.commits[current]["parents"])
        return seen

    def _ref_json(self, repo: str, branch: str, sha: str) -> dict[str, Any]:
        return {"ref": f"refs/heads/{branch}", "node_id": f"REF_{branch}", "url": f"{self.url}/repos/{repo}/git/refs/heads/{branch}",
                "object": {"type": "commit", "sha": sha, "url": f"{self.url}/repos/{repo}/git/commits/{sha}"}}

    def _file_json(self, repo: str, path: str, blob: str, ref: str, *, with_content: bool = True) -> dict[str, Any]:
        url = f"{self.url}/repos/{repo}/contents/{path}?ref={ref}"
        git_url = f"{self.url}/repos/{repo}/git/blobs/{blob}"
        html_url = f"{self.url}/{repo}/blob/{ref}/{path}"
        out = {"type": "file", "size": len(self.blobs[blob]), "name": path.rsplit("/", 1)[-1], "path": path,
               "sha": blob, "url": url, "git_url": git_url, "html_url": html_url,
               "download_url": f"{self.url}/raw/{repo}/{ref}/{path}",
               "_links": {"self": url, "git": git_url, "html": html_url}}
        if with_content:
            encoded = base64.b64encode(self.blobs[blob]).decode()
            # GitHub breaks the base64 into lines of 60 characters.
            out.update(encoding="base64", content="".join(encoded[i:i + 60] + "\n" for i in range(0, len(encoded), 60)))
        return out

    def _on_contents(self, params, repo, body):
        path = params["path"]
        with self._lock:
            if params["method"] == "GET":
                ref = params["query"].get("ref") or "main"
                commit = self._resolve(repo, ref)
                blob = None if commit is None else self.commits[commit]["tree"].get(path)
                if blob is None:
                    return 404, {}, {"message": "Not Found"}
                return 200, {}, self._file_json(repo, path, blob, ref)
            body = body if isinstance(body, dict) else {}
            branch = body.get("branch") or "main"
            head = self.branches.get(repo, {}).get(branch)
            if head is None:
                return 404, {}, {"message": f"Branch {branch} not found"}
            current = self.commits[head]["tree"].get(path)
            if current is not None and "sha" not in body:
                return 422, {}, {"message": "Invalid request.\n\n\"sha\" wasn't supplied."}
            if current is not None and body["sha"] != current:
                return 409, {}, {"message": f"{path} does not match {body['sha']}"}
            try:
                data = base64.b64decode(body.get("content", ""), validate=True)
            except binascii.Error:
                return 422, {}, {"message": "content is not valid Base64"}
            tree = dict(self.commits[head]["tree"])
            tree[path] = self._store_blob(data)
            commit = self._commit(tree, [head], body.get("message", ""))
            self.branches[repo][branch] = commit
            return (201 if current is None else 200), {}, {
                "content": self._file_json(repo, path, tree[path], branch, with_content=False),
                "commit": {"sha": commit, "url": f"{self.url}/repos/{repo}/git/commits/{commit}",
                           "html_url": f"{self.url}/{repo}/commit/{commit}", "message": body.get("message", ""),
                           "parents": [{"sha": head, "url": f"{self.url}/repos/{repo}/git/commits/{head}"}]},
            }

    def _on_git_ref(self, params, repo, body):
        ref = params["ref"]
        if not ref.startswith("heads/"):
            return 404, {}, {"message": "Not Found"}
        branch = ref.removeprefix("heads/")
        with self._lock:
            current = self.branches.get(repo, {}).get(branch)
            if params["method"] == "GET":
                if current is None:
                    return 404, {}, {"message": "Not Found"}
                return 200, {}, self._ref_json(repo, branch, current)
            if current is None:
                return 422, {}, {"message": "Reference does not exist"}
            sha = (body or {}).get("sha")
            if sha not in self.commits:
                return 422, {}, {"message": "Object does not exist"}
            if not (body or {}).get("force") and current not in self._ancestors(sha):
                return 422, {}, {"message": "Update is not a fast forward"}
            self.branches[repo][branch] = sha
            return 200, {}, self._ref_json(repo, branch, sha)

    def _on_git_refs(self, params, repo, body):
        ref, sha = (body or {}).get("ref", ""), (body or {}).get("sha")
        if not ref.startswith("refs/heads/") or ref.count("/") < 2:
            return 422, {}, {"message": "Reference name must start with 'refs/' and have at least two slashes."}
        branch = ref.removeprefix("refs/heads/")
        with self._lock:
            if sha not in self.commits:
                return 422, {}, {"message": "Object does not exist"}
            if branch in self.branches.setdefault(repo, {}):
                return 422, {}, {"message": "Reference already exists"}
            self.branches[repo][branch] = sha
            return 201, {}, self._ref_json(repo, branch, sha)
