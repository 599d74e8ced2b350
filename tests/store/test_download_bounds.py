"""Downloads are bounded and say what went wrong: `edgelm install URL` takes a response without Content-Length,
stops at the store's free space, a stall or its deadline, follows only http(s) redirects and no loop, and
leaves no staging folder; `edgelm pull` refuses, before downloading it, a file the hub announces at another
size than the manifest records. Two installs under one name cannot both win, two pulls never share a staging
folder, and what a killed removal left aside is swept."""

import os
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from edgelm.runtime.store import archive, local
from store_support import assert_clean_failure, invoke, listing


@pytest.fixture
def packed(tiny_package, tmp_path, store):
    path = tmp_path / "tiny.zip"
    assert invoke("pack", tiny_package, "-o", path).exit_code == 0
    return path.read_bytes()


@pytest.fixture
def web(packed):
    """/chunked (no Content-Length), /close (until the connection closes), /loop (a relative redirect loop),
    /file (a redirect to file://), /stall (headers, then nothing), /zip (with Content-Length)."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def do_GET(self):
            if self.path in ("/loop", "/loop2"):
                return self._redirect("loop2" if self.path == "/loop" else "loop")  # relative, back and forth
            if self.path == "/file":
                return self._redirect("file:///etc/passwd")
            if self.path not in ("/chunked", "/close", "/stall", "/zip"):
                self.send_response(404)
                self.send_header("Content-Length", "0")
                return self.end_headers()
            self.send_response(200)
            if self.path == "/chunked":
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                for start in range(0, len(packed), 4096):
                    piece = packed[start : start + 4096]
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                self.wfile.write(b"0\r\n\r\n")
            elif self.path == "/close":
                self.send_header("Connection", "close")
                self.end_headers()
                self.wfile.write(packed)
                self.close_connection = True
            elif self.path == "/stall":
                self.send_header("Content-Length", str(len(packed)))
                self.end_headers()
                self.wfile.write(packed[:10])
                self.wfile.flush()
                time.sleep(3)
            else:
                self.send_header("Content-Length", str(len(packed)))
                self.end_headers()
                self.wfile.write(packed)

        def _redirect(self, where):
            self.send_response(302)
            self.send_header("Location", where)
            self.send_header("Content-Length", "0")
            self.end_headers()

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, args=(0.01,), daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("path", ["/chunked", "/close"])
def test_a_response_without_content_length_installs(web, store, path):
    result = invoke("install", web + path, "--name", "tiny")
    assert result.exit_code == 0, result.output
    assert "installed tiny" in result.output


@pytest.mark.parametrize(
    "path, fragment",
    [("/loop", "redirects in a loop"), ("/file", "not an http(s) address"), ("/missing", "answered 404")],
)
def test_a_bad_redirect_or_answer_names_its_cause_and_leaves_no_staging(web, store, path, fragment):
    before = listing(store)
    result = invoke("install", web + path)
    assert_clean_failure(result, fragment)
    assert listing(store) == before and not list(store.glob(".tmp-*"))


@pytest.mark.parametrize("path", ["/zip", "/chunked"])
def test_a_download_stops_at_the_free_space(web, store, monkeypatch, path):
    monkeypatch.setattr(archive, "free_space", lambda: 5000)
    result = invoke("install", web + path)
    assert_clean_failure(result, "more than the")
    assert not list(store.glob(".tmp-*"))


def test_a_stalled_download_and_one_past_its_deadline_stop(web, store, monkeypatch):
    monkeypatch.setattr(archive, "DOWNLOAD_STALL_S", 0.5)
    assert_clean_failure(invoke("install", web + "/stall"), "no data for 0.5 s")
    monkeypatch.setattr(archive, "DOWNLOAD_DEADLINE_S", 0.0)
    assert_clean_failure(invoke("install", web + "/zip"), "took over 0 s")


def test_pull_refuses_a_file_announced_at_another_size_before_downloading_it(tiny_package, hub, store):
    repo = hub.add_folder("owner/tiny", tiny_package)
    repo.announced["model.onnx"] = 5 << 30
    assert_clean_failure(invoke("pull", "owner/tiny"), "announces 5,368,709,120 bytes for model.onnx")
    assert not [r for r in repo.requests if r[:2] == ("GET", "model.onnx")]
    repo.announced, repo.requests = {"manifest.json": 1 << 30}, []
    assert_clean_failure(invoke("pull", "owner/tiny"), "manifest.json is 1,073,741,824 bytes")
    assert not [r for r in repo.requests if r[:2] == ("GET", "manifest.json")]


def _dead_pid() -> int:
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    return int(done.stdout)


def test_pulls_stage_apart_and_a_dead_pulls_folder_is_taken_over(store):
    mine = local.pull_folder("owner/tiny")
    assert mine.name.endswith(f"-{os.getpid()}") and mine != local.pull_folder("owner/other")
    left = mine.with_name(mine.name.rsplit("-", 1)[0] + f"-{_dead_pid()}")
    left.mkdir()
    (left / "model.onnx").write_bytes(b"partial")
    assert local.pull_folder("owner/tiny") == mine and (mine / "model.onnx").read_bytes() == b"partial"
    assert not left.exists()


def test_two_installs_under_one_name_cannot_both_install(packed, tmp_path, store, monkeypatch):
    archive_path = tmp_path / "tiny.zip"
    assert invoke("install", archive_path, "--name", "tiny").exit_code == 0
    first = listing(store)
    monkeypatch.setattr(local, "refuse_taken", lambda name, force: None)  # the second checked before the first won
    monkeypatch.setattr(archive, "refuse_taken", lambda name, force: None)
    result = invoke("install", archive_path, "--name", "tiny")
    assert_clean_failure(result, "was installed meanwhile")
    assert listing(store) == first


def test_what_a_killed_removal_left_aside_is_swept(packed, tmp_path, store):
    aside = store / f".trash-{_dead_pid()}-old"
    aside.mkdir()
    (aside / "model.onnx").write_bytes(b"x" * 100)
    assert invoke("install", tmp_path / "tiny.zip", "--name", "tiny").exit_code == 0
    assert not aside.exists()
