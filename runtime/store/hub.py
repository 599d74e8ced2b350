"""`edgelm pull`: an edgelm package from the Hugging Face hub into the store, every file checked against its manifest.

The repo must hold an edgelm manifest.json; only the files that manifest lists are fetched, and a repo holding
other files (beyond the hub's own README.md and .gitattributes) is refused, since nothing unverified is installed,
and so is a file whose size the hub announces other than the manifest records (manifest.json itself over its
limit), before it is downloaded. Each file is then streamed here, not by hf_hub_download, because what the hub
announces bounds nothing: a body that runs past the size the manifest records (manifest.json past its limit)
stops at the first extra byte, whatever Content-Length or chunking the server sends. The stream goes through
huggingface_hub's own HTTP session, URL and headers (HF_TOKEN, HF_ENDPOINT read when pull runs, HF_HUB_OFFLINE,
proxies, redirects to the hub's CDN), and the whole pull has install's deadline and stall timeout
(archive.DOWNLOAD_DEADLINE_S, DOWNLOAD_STALL_S). Files collect in STORE/.pull-<repo hash>-<pid>, which an
interrupted pull leaves behind so the next one takes it over and resumes (a Range request for the rest); checks
that fail remove it.
"""

import contextlib
import importlib
import os
import shutil
import time
from pathlib import Path

from .. import untrusted
from ..errors import EdgelmError, PackageError, StoreError
from ..package.format import MANIFEST
from . import archive
from .local import (
    MANIFEST_LIMIT,
    check_free_space,
    check_name,
    install_folder,
    pull_folder,
    read_manifest_file,
    refuse_taken,
    store_writes,
)

HUB_FILES = {".gitattributes", "README.md"}  # the hub adds these to every repo; they are not part of the package
COMMIT_MARK = ".commit"  # in the pull folder: the commit its files belong to, so a resume never mixes two commits


def pull(repo_id: str, revision: str | None = None, name: str | None = None, force: bool = False):
    """Download, verify and install the package in hub repo `repo_id` at `revision` (default main); returns the
    Installed. The store records the repo and the commit it came from."""
    import huggingface_hub
    from huggingface_hub import HfApi

    if name is not None:
        refuse_taken(name, force)
    endpoint = os.environ.get("HF_ENDPOINT") or None  # honoured even when set after huggingface_hub was imported
    with _hub_errors(repo_id, revision):
        info = HfApi(endpoint=endpoint).model_info(repo_id, revision=revision, files_metadata=True)
    repo_files = {sibling.rfilename for sibling in info.siblings or []}
    announced = {s.rfilename: s.size for s in info.siblings or [] if isinstance(getattr(s, "size", None), int)}
    if announced.get(MANIFEST, 0) > MANIFEST_LIMIT:  # before a byte of it is downloaded
        raise PackageError(
            f"{repo_id}'s {MANIFEST} is {announced[MANIFEST]:,} bytes, over {MANIFEST_LIMIT >> 20} MB: it is not a package manifest."
        )
    if MANIFEST not in repo_files:
        raise PackageError(
            f"{repo_id} is not an edgelm package: it has no {MANIFEST}. Pull a repo that holds a folder made by edgelm export."
        )
    folder = pull_folder(repo_id)
    fetch = _Fetch(repo_id, info.sha, folder, endpoint)
    try:
        with store_writes(), _hub_errors(repo_id, revision):
            fetch.start()
            path = fetch(MANIFEST, MANIFEST_LIMIT, exact=False)
        manifest = read_manifest_file(path, f"{MANIFEST} of {repo_id}")
        listed = set(manifest.files)
        if missing := sorted(listed - repo_files):
            raise PackageError(
                f"{repo_id} lacks {', '.join(missing)}, which its manifest lists; the repo is incomplete."
            )
        if wrong := sorted(f for f in listed if announced.get(f, manifest.files[f].size) != manifest.files[f].size):
            raise PackageError(
                f"the hub announces {announced[wrong[0]]:,} bytes for {wrong[0]} of {repo_id}, but its manifest records "
                f"{manifest.files[wrong[0]].size:,}; nothing was downloaded that the manifest does not vouch for."
            )
        if extra := sorted(repo_files - listed - {MANIFEST} - HUB_FILES):
            raise PackageError(
                f"{repo_id} holds {', '.join(extra)}, which its manifest does not list; edgelm installs only verified files."
            )
        try:
            name = name or check_name(manifest.name)
        except StoreError:
            raise StoreError(
                f"the package in {repo_id} is named {manifest.name!r}, which is not a valid store name; pull it with --name NAME."
            ) from None
        refuse_taken(name, force)
        check_free_space(sum(record.size for record in manifest.files.values()))
    except (PackageError, StoreError):
        shutil.rmtree(folder, ignore_errors=True)
        raise
    try:
        with store_writes(discard=folder), _hub_errors(repo_id, revision, transfer=True):
            for leftover in folder.iterdir():  # not this package's files (an older huggingface_hub's .cache)
                if leftover.name not in listed | {MANIFEST, COMMIT_MARK}:
                    shutil.rmtree(leftover) if leftover.is_dir() else leftover.unlink()
            for file in sorted(listed):
                fetch(file, manifest.files[file].size)
    except PackageError:  # a file past its recorded size: what this hub sends is not to be resumed
        shutil.rmtree(folder, ignore_errors=True)
        raise
    (folder / COMMIT_MARK).unlink(missing_ok=True)
    source = {"hub": repo_id, "revision": revision or huggingface_hub.constants.DEFAULT_REVISION, "commit": info.sha}
    try:
        return install_folder(folder, name, source, force)
    finally:
        shutil.rmtree(folder, ignore_errors=True)  # installed (renamed away), or refused: nothing to resume


class _Fetch:
    """Stream the files of repo_id at commit into folder, each bounded as it arrives, within one deadline for the
    whole pull and archive.DOWNLOAD_STALL_S without a byte."""

    def __init__(self, repo_id: str, commit: str, folder: Path, endpoint: str | None):
        self.repo_id, self.commit, self.folder, self.endpoint = repo_id, commit, folder, endpoint
        self.deadline = time.monotonic() + archive.DOWNLOAD_DEADLINE_S

    def start(self) -> None:
        """Make the folder, emptied if what it holds came from another commit (an older pull of the repo)."""
        mark = self.folder / COMMIT_MARK
        if self.folder.is_dir() and _marked(mark) != self.commit:
            shutil.rmtree(self.folder)
        self.folder.mkdir(exist_ok=True)
        mark.write_text(self.commit, encoding="utf-8")

    def __call__(self, file: str, limit: int, exact: bool = True) -> Path:
        """folder/file, at most `limit` bytes (exactly `limit` when exact: the size the manifest records); what an
        interrupted pull left of it is resumed. Past the limit: the partial is removed and PackageError."""
        from huggingface_hub import constants, hf_hub_url
        from huggingface_hub.utils import build_hf_headers, hf_raise_for_status
        from huggingface_hub.utils import tqdm as hub_tqdm  # off under HF_HUB_DISABLE_PROGRESS_BARS

        path = self.folder / file
        have = path.stat().st_size if path.is_file() and exact else 0
        if exact and have == limit:
            return path  # complete before an interruption; its sha256 is checked at install
        if have > limit:
            have = 0
        headers = build_hf_headers(headers={"Range": f"bytes={have}-"} if have else None)
        url = hf_hub_url(self.repo_id, file, revision=self.commit, endpoint=self.endpoint)
        with _stream(url, headers, archive.DOWNLOAD_STALL_S) as (response, read):
            hf_raise_for_status(response)
            if response.status_code != 206:
                have = 0  # the server ignored the Range: the whole file again
            length = response.headers.get("Content-Length", "")
            if length.isdigit() and have + int(length) > limit:
                self._refuse(path, file, limit)
            received = have
            with (
                open(path, "ab" if have else "wb") as out,
                hub_tqdm(total=limit if exact else None, initial=have, unit="B", unit_scale=True, desc=file) as bar,
            ):
                for chunk in read(constants.DOWNLOAD_CHUNK_SIZE):
                    received += len(chunk)
                    if received > limit:
                        out.close()
                        self._refuse(path, file, limit)
                    out.write(chunk)
                    bar.update(len(chunk))
                    if time.monotonic() > self.deadline:
                        raise StoreError(
                            f"the pull of {self.repo_id} took over {archive.DOWNLOAD_DEADLINE_S:g} s; "
                            "run the same command again to resume it."
                        )
        if exact and received != limit:
            raise StoreError(f"{file} of {self.repo_id} arrived incomplete; run the same command again to resume it.")
        return path

    def _refuse(self, path: Path, file: str, limit: int):
        path.unlink(missing_ok=True)
        bound = "the most a manifest may hold" if file == MANIFEST else "the size its manifest records"
        raise PackageError(
            f"the hub sends more than {limit:,} bytes for {file} of {self.repo_id}, {bound}; the download was "
            "stopped and nothing was kept. The repo is not a faithful copy of its package."
        )


@contextlib.contextmanager
def _stream(url: str, headers: dict, stall: float):
    """(response, read(n) -> chunks) of a GET through huggingface_hub's session, which follows redirects (the
    hub sends large files to its CDN) and drops the token when one leads to another host. `stall`: seconds
    without a byte. huggingface_hub < 1.0 uses requests, 1.x httpx."""
    from huggingface_hub.utils import get_session

    session = get_session()
    if type(session).__module__.startswith("httpx"):
        with session.stream("GET", url, headers=headers, timeout=stall, follow_redirects=True) as response:
            yield response, response.iter_bytes
    else:
        with session.get(url, headers=headers, stream=True, timeout=stall) as response:
            yield response, response.iter_content


class _hub_errors:
    """One line for each way the hub can fail; the partial download stays for the next pull to resume."""

    def __init__(self, repo_id, revision, transfer=False):
        self.repo_id, self.revision, self.transfer = repo_id, revision, transfer  # transfer: files are arriving

    def __enter__(self):
        return self

    def __exit__(self, kind, error, traceback):
        if error is None or isinstance(error, (PackageError, StoreError)):
            return False
        import huggingface_hub.constants
        from huggingface_hub import errors

        repo = self.repo_id
        if isinstance(error, errors.HFValidationError):
            raise StoreError(f"{repo!r} is not a hub repo id; give it as OWNER/NAME, e.g. edgelm pull OWNER/NAME.")
        if isinstance(error, errors.RevisionNotFoundError):
            raise StoreError(f"{repo} has no revision {self.revision!r}; give a branch, tag or commit with --revision.")
        if isinstance(error, errors.GatedRepoError):
            raise StoreError(
                f"{repo} is gated: accept its terms on the hub, then log in (hf auth login) and pull again."
            )
        if isinstance(error, errors.RepositoryNotFoundError):
            raise StoreError(f"no repo {repo} on the hub (or it is private: log in with hf auth login and pull again).")
        if isinstance(error, errors.OfflineModeIsEnabled) or isinstance(error.__cause__, errors.OfflineModeIsEnabled):
            raise StoreError(f"cannot pull {repo}: HF_HUB_OFFLINE is set. Unset it to download, or install a file.")
        if isinstance(error, errors.LocalEntryNotFoundError):
            raise StoreError(f"cannot reach the hub to pull {repo}; check the connection and run the command again.")
        if isinstance(error, errors.HfHubHTTPError):
            status = error.response.status_code if error.response is not None else "?"
            raise StoreError(f"the hub refused the download of {repo} (HTTP {status}); run the command again later.")
        network = _network_errors()
        if isinstance(error, network) and _timed_out(error):
            raise StoreError(
                f"the hub sent no data for {archive.DOWNLOAD_STALL_S:g} s while pulling {repo}; check the connection "
                "and run the same command again to resume."
            )
        if isinstance(error, network) and not self.transfer:
            endpoint = os.environ.get("HF_ENDPOINT") or huggingface_hub.constants.ENDPOINT
            raise StoreError(f"cannot reach the hub at {endpoint} to pull {repo}; check the connection and run again.")
        if isinstance(error, network):
            raise StoreError(
                f"the download of {repo} broke off ({type(error).__name__}); run the same command again to resume it."
            )
        if isinstance(error, OSError) and "onsistency check failed" in str(error):
            raise StoreError(f"a file of {repo} arrived incomplete; run the same command again to resume it.")
        return False


def _network_errors() -> tuple:
    """A connection that failed or broke off, whichever HTTP client this huggingface_hub uses (requests before 1.0,
    httpx from 1.0)."""
    found = [ConnectionError, TimeoutError]
    for module, name in (("requests", "RequestException"), ("httpx", "TransportError")):
        try:
            found.append(getattr(importlib.import_module(module), name))
        except (ImportError, AttributeError):
            pass
    return tuple(found)


def _timed_out(error: BaseException) -> bool:
    """Whether a network error is a read or connect timeout: requests wraps urllib3's ReadTimeoutError, raised
    while streaming, in a ConnectionError, so the cause is looked for down the chain and in the arguments."""
    seen, todo = set(), [error]
    while todo:
        e = todo.pop()
        if not isinstance(e, BaseException) or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, TimeoutError) or "Timeout" in type(e).__name__:
            return True
        todo += [e.__cause__, e.__context__, *e.args]
    return False


def _marked(mark: Path) -> str | None:
    """The commit a pull folder's files belong to, None where its mark is missing or not one (a FIFO, a big file)."""
    try:
        return untrusted.read_text(mark, 256).strip()
    except EdgelmError:
        return None
