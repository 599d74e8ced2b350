"""`edgelm pull`: an edgelm package from the Hugging Face hub into the store, every file checked against its manifest.

huggingface_hub does the transfer (progress bars, resume, HF_TOKEN, HF_HUB_OFFLINE); this module decides what
may be downloaded and what may be installed. The repo must hold an edgelm manifest.json; only the files that
manifest lists are fetched, and a repo holding other files (beyond the hub's own README.md and .gitattributes) is
refused, since nothing unverified is installed, and so is a file whose size the hub announces other than the
manifest records (manifest.json itself over its limit), before it is downloaded. Files collect in
STORE/.pull-<repo hash>-<pid>, which an interrupted pull leaves behind so the next one takes it over and resumes;
checks that fail remove it. HF_ENDPOINT is read when pull runs.
"""

import importlib
import os
import shutil
from pathlib import Path

from ..errors import PackageError, StoreError
from ..package.format import MANIFEST
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


def pull(repo_id: str, revision: str | None = None, name: str | None = None, force: bool = False):
    """Download, verify and install the package in hub repo `repo_id` at `revision` (default main); returns the
    Installed. The store records the repo and the commit it came from."""
    import huggingface_hub
    from huggingface_hub import HfApi, hf_hub_download, snapshot_download

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
    try:
        with store_writes(), _hub_errors(repo_id, revision):
            path = hf_hub_download(repo_id, MANIFEST, revision=info.sha, local_dir=folder, endpoint=endpoint)
        manifest = read_manifest_file(Path(path), f"{MANIFEST} of {repo_id}")
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
    with store_writes(discard=folder), _hub_errors(repo_id, revision, transfer=True):
        for leftover in folder.iterdir():  # from an earlier pull of another commit: not this package's files
            if leftover.name not in listed | {MANIFEST, ".cache"}:
                shutil.rmtree(leftover) if leftover.is_dir() else leftover.unlink()
        snapshot_download(
            repo_id,
            revision=info.sha,
            local_dir=folder,
            allow_patterns=[_literal(file) for file in sorted(listed)],
            endpoint=endpoint,
        )
    shutil.rmtree(folder / ".cache", ignore_errors=True)  # huggingface_hub's resume bookkeeping, not package files
    source = {"hub": repo_id, "revision": revision or huggingface_hub.constants.DEFAULT_REVISION, "commit": info.sha}
    try:
        return install_folder(folder, name, source, force)
    finally:
        shutil.rmtree(folder, ignore_errors=True)  # installed (renamed away), or refused: nothing to resume


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


def _literal(file_name: str) -> str:
    """An allow_patterns entry (fnmatch) that matches exactly this file name."""
    return "".join(f"[{c}]" if c in "*?[" else c for c in file_name)
