"""Servers on 127.0.0.1 for the store tests: a hub-shaped endpoint that answers the calls huggingface_hub 0.3x makes
for snapshot_download, and a plain file server for `edgelm install URL`.

Hub calls answered:
    GET  /api/models/{repo}[/revision/{rev}]   -> {"id", "sha", "siblings": [{"rfilename", "size"}]}
    GET  /api/models/{repo}/tree/{rev}         -> [{"type", "path", "size", "oid"}] (huggingface_hub 1.x)
    HEAD /{repo}/resolve/{rev}/{file}          -> X-Repo-Commit, ETag, Content-Length (hf_hub_download's metadata)
    GET  /{repo}/resolve/{rev}/{file}          -> the bytes (a Range request from a resumed download gets 206)
A missing repo, revision or file answers 404 with the X-Error-Code huggingface_hub turns into its typed errors.
"""

import hashlib
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlparse


class Repo:
    def __init__(self, files: dict, sha: str, revisions=("main",)):
        self.files, self.sha, self.revisions = files, sha, set(revisions) | {sha}
        self.cut_short = set()  # file names served with their full Content-Length but half their bytes
        self.announced = {}  # file name -> the size the listing gives instead of its own
        self.requests = []  # (method, file, Range header) of every file request


class FakeHub:
    """Serve repos (name -> Repo) until stop()."""

    def __init__(self):
        self.repos = {}
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                hub._answer(self, body=True)

            def do_HEAD(self):
                hub._answer(self, body=False)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, args=(0.01,), daemon=True).start()  # shutdown waits one poll

    def add(self, repo_id: str, files: dict, revisions=("main",)) -> Repo:
        sha = hashlib.sha1(repr(sorted(files.items())).encode()).hexdigest()
        self.repos[repo_id] = Repo(dict(files), sha, revisions)
        return self.repos[repo_id]

    def add_folder(self, repo_id: str, folder: Path, extra: dict | None = None, **kwargs) -> Repo:
        files = {p.name: p.read_bytes() for p in sorted(Path(folder).iterdir()) if p.is_file()}
        return self.add(repo_id, files | (extra or {}), **kwargs)

    def stop(self):
        self.server.shutdown()
        self.server.server_close()

    def _answer(self, handler, body: bool):
        path = unquote(urlparse(handler.path).path)
        if m := re.fullmatch(r"/api/models/([^/]+/[^/]+)(?:/revision/(.+))?", path):
            repo, revision = self.repos.get(m[1]), m[2] or "main"
            if repo is None:
                return _error(handler, "RepoNotFound")
            if revision not in repo.revisions:
                return _error(handler, "RevisionNotFound")
            siblings = [
                {"rfilename": name, "size": repo.announced.get(name, len(data))} for name, data in repo.files.items()
            ]
            return _send(handler, json.dumps({"id": m[1], "sha": repo.sha, "siblings": siblings}).encode(), body)
        if m := re.fullmatch(r"/api/models/([^/]+/[^/]+)/tree/([^/]+)", path):  # huggingface_hub 1.x lists files
            repo = self.repos.get(m[1])
            if repo is None or m[2] not in repo.revisions:
                return _error(handler, "RepoNotFound" if repo is None else "RevisionNotFound")
            tree = [
                {"type": "file", "path": name, "size": len(data), "oid": hashlib.sha1(data).hexdigest()}
                for name, data in repo.files.items()
            ]
            return _send(handler, json.dumps(tree).encode(), body)
        if m := re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path):
            repo = self.repos.get(m[1])
            if repo is None:
                return _error(handler, "RepoNotFound")
            if m[2] not in repo.revisions:
                return _error(handler, "RevisionNotFound")
            if m[3] not in repo.files:
                return _error(handler, "EntryNotFound", repo.sha)
            data = repo.files[m[3]]
            repo.requests.append((handler.command, m[3], handler.headers.get("Range")))
            headers = {"X-Repo-Commit": repo.sha, "ETag": f'"{hashlib.sha256(data).hexdigest()}"'}
            start = int(re.fullmatch(r"bytes=(\d+)-", handler.headers.get("Range", "bytes=0-"))[1])
            if start:
                headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
            sent = data[start:]
            if body and m[3] in repo.cut_short:
                sent = sent[: len(sent) // 2]
            return _send(handler, data[start:], body, headers, status=206 if start else 200, sent=sent)
        _error(handler, "RepoNotFound")


def _send(handler, data: bytes, body: bool, headers=None, status=200, sent=None):
    handler.send_response(status)
    handler.send_header("Content-Length", str(len(data)))
    for key, value in (headers or {}).items():
        handler.send_header(key, value)
    handler.end_headers()
    if body:
        handler.wfile.write(data if sent is None else sent)
        if sent is not None and len(sent) < len(data):
            handler.close_connection = True


def _error(handler, code: str, commit: str | None = None):
    handler.send_response(404)
    handler.send_header("X-Error-Code", code)
    if commit:
        handler.send_header("X-Repo-Commit", commit)
    handler.send_header("Content-Length", "0")
    handler.end_headers()


class FileServer:
    """Serve a folder's files; names in cut_short get their full Content-Length but half their bytes."""

    def __init__(self, folder: Path):
        self.folder, self.cut_short = Path(folder), set()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                path = server.folder / unquote(urlparse(self.path).path).lstrip("/")
                if not path.is_file():
                    self.send_response(404)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                data = path.read_bytes()
                _send(self, data, True, sent=data[: len(data) // 2] if path.name in server.cut_short else None)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, args=(0.01,), daemon=True).start()  # shutdown waits one poll

    def stop(self):
        self.server.shutdown()
        self.server.server_close()
