"""Servers on 127.0.0.1 for the store tests: a hub-shaped endpoint that answers the calls huggingface_hub 0.3x makes
for snapshot_download, and a plain file server for `edgelm install URL`.

Hub calls answered:
    GET  /api/models/{repo}[/revision/{rev}]   -> {"id", "sha", "siblings": [{"rfilename", "size"}]}
    GET  /api/models/{repo}/tree/{rev}         -> [{"type", "path", "size", "oid"}] (huggingface_hub 1.x)
    HEAD /{repo}/resolve/{rev}/{file}          -> X-Repo-Commit, ETag, Content-Length (hf_hub_download's metadata)
    GET  /{repo}/resolve/{rev}/{file}          -> the bytes (a Range request from a resumed download gets 206)
A missing repo, revision or file answers 404 with the X-Error-Code huggingface_hub turns into its typed errors.

A hub that lies (Repo.lies: file name -> mode) lists a file at its own size, then GET sends it followed by
Repo.padding bytes: "long" with a Content-Length that says so (HEAD too), "lying" with that Content-Length on
GET only (HEAD gives the listed size), "chunked" with no length at all; "stall" sends half the file, then
nothing for STALL_S seconds. A file in Repo.cdn is redirected, as the hub sends LFS files to its CDN, to
http://localhost:PORT/cdn/{repo}/{file} (another host name, so a client must drop the token there).
"""

import hashlib
import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlparse

STALL_S = 3.0
PIECE = 1 << 16


class Repo:
    def __init__(self, files: dict, sha: str, revisions=("main",)):
        self.files, self.sha, self.revisions = files, sha, set(revisions) | {sha}
        self.cut_short = set()  # file names served with their full Content-Length but half their bytes
        self.announced = {}  # file name -> the size the listing gives instead of its own
        self.requests = []  # (method, file, Range header) of every file request
        self.lies = {}  # file name -> "long", "lying", "chunked" or "stall" (see the module's docstring)
        self.padding = 8 << 20  # bytes a lying GET sends past the file
        self.cdn = set()  # file names redirected to the CDN-shaped path
        self.tokens = []  # (resolve or cdn, Authorization header) of every GET


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
        if m := re.fullmatch(r"/api/models/((?:[^/]+/)?[^/]+)(?:/revision/(.+))?", path):
            repo, revision = self.repos.get(m[1]), m[2] or "main"
            if repo is None:
                return _error(handler, "RepoNotFound")
            if revision not in repo.revisions:
                return _error(handler, "RevisionNotFound")
            siblings = [
                {"rfilename": name, "size": repo.announced.get(name, len(data))} for name, data in repo.files.items()
            ]
            return _send(handler, json.dumps({"id": m[1], "sha": repo.sha, "siblings": siblings}).encode(), body)
        if m := re.fullmatch(r"/api/models/((?:[^/]+/)?[^/]+)/tree/([^/]+)", path):  # huggingface_hub 1.x lists files
            repo = self.repos.get(m[1])
            if repo is None or m[2] not in repo.revisions:
                return _error(handler, "RepoNotFound" if repo is None else "RevisionNotFound")
            tree = [
                {"type": "file", "path": name, "size": len(data), "oid": hashlib.sha1(data).hexdigest()}
                for name, data in repo.files.items()
            ]
            return _send(handler, json.dumps(tree).encode(), body)
        if (m := re.fullmatch(r"/cdn/((?:[^/]+/)?[^/]+)/(.+)", path)) and m[1] in self.repos:
            self.repos[m[1]].tokens.append(("cdn", handler.headers.get("Authorization")))
            return self._file(handler, self.repos[m[1]], m[2], body)
        if m := re.fullmatch(r"/((?:[^/]+/)?[^/]+)/resolve/([^/]+)/(.+)", path):
            repo = self.repos.get(m[1])
            if repo is None:
                return _error(handler, "RepoNotFound")
            if m[2] not in repo.revisions:
                return _error(handler, "RevisionNotFound")
            if m[3] not in repo.files:
                return _error(handler, "EntryNotFound", repo.sha)
            repo.requests.append((handler.command, m[3], handler.headers.get("Range")))
            if m[3] in repo.lies:
                return _lie(handler, repo, repo.files[m[3]], repo.lies[m[3]], body)
            if m[3] in repo.cdn:
                repo.tokens.append(("resolve", handler.headers.get("Authorization")))
                port, data = self.server.server_address[1], repo.files[m[3]]
                headers = {"Location": f"http://localhost:{port}/cdn/{m[1]}/{m[3]}", "X-Repo-Commit": repo.sha}
                headers |= {"X-Linked-Etag": f'"{hashlib.sha256(data).hexdigest()}"', "X-Linked-Size": str(len(data))}
                return _send(handler, b"", body, headers, 302)
            return self._file(handler, repo, m[3], body)
        _error(handler, "RepoNotFound")

    def _file(self, handler, repo, name: str, body: bool):
        data = repo.files[name]
        headers = {"X-Repo-Commit": repo.sha, "ETag": f'"{hashlib.sha256(data).hexdigest()}"'}
        start = int(re.fullmatch(r"bytes=(\d+)-", handler.headers.get("Range", "bytes=0-"))[1])
        if start:
            headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
        sent = data[start:]
        if body and name in repo.cut_short:
            sent = sent[: len(sent) // 2]
        return _send(handler, data[start:], body, headers, status=206 if start else 200, sent=sent)


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


def _lie(handler, repo, data: bytes, mode: str, body: bool):
    """Answer a file request with more than the file (or a stall), as a hostile hub would."""
    sent = data + b" " * repo.padding  # spaces: a manifest stays valid JSON however long it runs
    handler.send_response(200)
    handler.send_header("X-Repo-Commit", repo.sha)
    handler.send_header("ETag", f'"{hashlib.sha256(data).hexdigest()}"')
    if mode == "chunked" and body:
        handler.send_header("Transfer-Encoding", "chunked")
    else:
        honest = mode == "long" or (mode == "lying" and body)
        handler.send_header("Content-Length", str(len(sent) if honest else len(data)))
    handler.end_headers()
    if not body:
        return
    handler.close_connection = True
    try:
        if mode == "stall":
            handler.wfile.write(data[: len(data) // 2])
            handler.wfile.flush()
            return time.sleep(STALL_S)
        for start in range(0, len(sent), PIECE):
            piece = sent[start : start + PIECE]
            handler.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece) if mode == "chunked" else piece)
        if mode == "chunked":
            handler.wfile.write(b"0\r\n\r\n")
    except (BrokenPipeError, ConnectionResetError):  # the client stopped reading at its bound
        pass


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
