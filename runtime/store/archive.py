"""One package as one file: `edgelm pack` writes it, `edgelm install` checks it and installs it into the store.

The archive is a zip file: NAME/manifest.json, then NAME/<every file the manifest lists>, one top folder so
that unzip makes one folder. Zip rather than tar because its central directory names every member with its type
and size up front, so install checks the whole archive against the manifest before it writes a byte, and reads
members one at a time; and because every OS opens it (Explorer, Finder, unzip) with nothing to install. Weights
are stored, not deflated: float and int8 weights barely compress, and stored members extract at disk speed.

What proves the archive: its sha256 (printed by pack, written beside it as FILE.sha256 in `sha256sum -c`
format, checked by `install --sha256` or from a FILE.sha256 beside a local file), and, inside it, the
manifest's size and sha256 for every other member, checked after extraction.

Install treats the archive as hostile: a member that is absolute, climbs out with '..', is a link, a device or a
FIFO, appears twice, is not in the manifest, or is bigger than the manifest records is refused before anything
lands in the store; an archive that decompresses past its recorded sizes stops at the first extra byte.
"""

import hashlib
import http.client
import os
import stat
import time
import urllib.error
import urllib.parse
import urllib.request
import zipfile
from dataclasses import dataclass
from pathlib import Path

from .. import untrusted
from ..errors import PackageError, StoreError
from ..package.open import MANIFEST
from . import signing
from .local import (
    MANIFEST_LIMIT,
    META,
    NAME,
    check_free_space,
    check_name,
    check_package,
    free_space,
    install_folder,
    read_manifest,
    refuse_taken,
    resolve_package,
    staging,
    store_dir,
)

CHUNK = 1 << 20
SIDECAR_LIMIT = 4096  # ARCHIVE.sha256: one digest and a name
STORED_SUFFIXES = (".onnx", ".data", ".bin")  # weights: stored as they are
ZIP_EPOCH = (1980, 1, 1, 0, 0, 0)  # fixed member times: the same package always packs to the same bytes


@dataclass(frozen=True)
class Packed:
    path: Path
    sha256: str
    size: int
    signature: Path | None = None


def pack(package=None, output=None, force: bool = False, sign_key=None, password: str | None = None) -> Packed:
    """Verify a package (a path or a store name) and write it as one zip file, with FILE.sha256 beside it, and
    with sign_key (a minisign secret key file) FILE.minisig, its signature (signing.py)."""
    package = check_package(resolve_package(package))
    name = check_name(package.name)
    output = Path(output) if output is not None else Path(f"{name}.zip")
    if output.exists() and not force:
        raise StoreError(f"{output} already exists; pass --force to replace it, or choose another file with -o.")
    partial = output.with_name(f".{output.name}.partial-{os.getpid()}")
    members = [MANIFEST, *sorted(package.manifest.files)]
    try:
        with zipfile.ZipFile(partial, "w") as archive:
            for member in members:
                info = zipfile.ZipInfo(f"{name}/{member}", ZIP_EPOCH)
                info.external_attr = (stat.S_IFREG | 0o644) << 16
                info.compress_type = zipfile.ZIP_STORED if member.endswith(STORED_SUFFIXES) else zipfile.ZIP_DEFLATED
                with open(package.folder / member, "rb") as src, archive.open(info, "w", force_zip64=True) as dst:
                    for chunk in iter(lambda: src.read(CHUNK), b""):
                        dst.write(chunk)
        digest = sha256_file(partial)
        os.replace(partial, output)
        output.with_name(output.name + ".sha256").write_text(f"{digest}  {output.name}\n", encoding="utf-8")
        if sign_key is not None:
            signing.sign(output, sign_key, password)
    except BaseException as error:  # a full disk, or Ctrl-C: no partial archive is left behind
        partial.unlink(missing_ok=True)
        if isinstance(error, OSError):
            raise StoreError(f"cannot write {output}: {error.strerror or error}. Nothing was written.") from None
        raise
    signature = output.with_name(output.name + signing.SUFFIX)
    return Packed(output, digest, output.stat().st_size, signature if sign_key is not None else None)


def install(
    source: str, name: str | None = None, sha256: str | None = None, force: bool = False, progress=None, trust=()
):
    """Install an archive made by pack, from a file or an http(s) URL, into the store; returns the Installed.

    trust: public keys (minisign's "RW..." or .pub files) to trust besides the store's list; once any key is
    trusted the archive must carry a signature one of them made (FILE.minisig, or URL.minisig).

    progress: a factory `progress(total_bytes or None)` returning an object with update(n) and close(), used for
    a URL's download (the CLI passes a tqdm bar). Nothing is installed unless every check passes."""
    if name is not None:
        refuse_taken(name, force)  # cheap, so before any download
    expected = _check_hex(sha256) if sha256 else None
    is_url = source.startswith(("http://", "https://"))
    if not is_url:
        path = Path(source).expanduser()
        if path.is_dir():
            raise StoreError(f"{path} is a folder; install takes one file made by edgelm pack (pack the folder first).")
        if not path.is_file():
            raise StoreError(f"no archive at {path}; give a file made by edgelm pack, or an http(s) URL.")
        sidecar = path.with_name(path.name + ".sha256")
        if expected is None and sidecar.is_file():
            text = untrusted.read_text(sidecar, SIDECAR_LIMIT, StoreError, what="a sha256 file")
            expected = _check_hex((text.split() or [""])[0])
    keys = signing.trusted_keys(trust, store_dir() / META)
    with staging() as work:
        if is_url:
            path = work / "download.zip"
            download(source, path, progress)
        signed_by = None
        if keys:
            signature = path.with_name(path.name + signing.SUFFIX)
            if is_url:
                signature = work / "download.zip.minisig"
                try:
                    download(source + signing.SUFFIX, signature, limit=signing.MAX_SIGNATURE_BYTES)
                except StoreError:
                    signature.unlink(missing_ok=True)  # none: verify says so
            signed_by = signing.verify(path, signing.read_signature(signature), keys, source)
        digest = sha256_file(path)
        if expected is not None and digest != expected:
            raise PackageError(
                f"{source} has sha256 {digest}, not the expected {expected}: the file is altered or incomplete. Nothing was installed; download it again."
            )
        folder = work / "package"
        folder.mkdir()
        manifest = extract(
            path, folder, source, before_writing=lambda m: refuse_taken(name or _manifest_name(m, source), force)
        )
        name = name or _manifest_name(manifest, source)
        origin = source if is_url else str(path.resolve())
        record = {"archive": origin, "sha256": digest, **({"signed_by": signed_by} if signed_by else {})}
        return install_folder(folder, name, record, force)


def extract(archive_path: Path, folder: Path, source: str, before_writing=None) -> dict:
    """Check every member of the zip against its manifest, then write the members into folder. Returns the manifest.
    before_writing(manifest), if given, runs once the checks pass: its error stops the extraction."""
    try:
        archive = zipfile.ZipFile(archive_path)
    except (zipfile.BadZipFile, OSError) as error:
        raise PackageError(
            f"{source} is not a complete zip archive ({error}): it is damaged or the download was cut short. Nothing was installed."
        ) from None
    with archive:
        infos = archive.infolist()
        for info in infos:
            _check_member(info, source)
        top = _top_folder(infos, source)
        members = {}
        for info in infos:
            parts = info.filename.rstrip("/").split("/")
            if info.is_dir() and parts == [top]:
                continue
            if info.is_dir() or len(parts) != 2 or not NAME.fullmatch(top) or not NAME.fullmatch(parts[1]):
                raise PackageError(
                    f"{source} holds {info.filename!r}, which is not a file of one flat package folder. Nothing was installed."
                )
            if parts[1] in members:
                raise PackageError(f"{source} holds {info.filename!r} twice; the archive is not one package.")
            members[parts[1]] = info
        if MANIFEST not in members:
            raise PackageError(f"{source} holds no {top}/{MANIFEST}: it is not an archive made by edgelm pack.")
        if members[MANIFEST].file_size > MANIFEST_LIMIT:
            raise PackageError(f"{source}: {MANIFEST} is too large to be a package manifest.")
        manifest = read_manifest(_read(archive, members[MANIFEST], MANIFEST_LIMIT, source), f"{MANIFEST} in {source}")
        listed = manifest.files
        extra = sorted(set(members) - set(listed) - {MANIFEST})
        if extra:
            raise PackageError(
                f"{source} holds {', '.join(extra)}, which its manifest does not list. Nothing was installed."
            )
        missing = sorted(set(listed) - set(members))
        if missing:
            raise PackageError(
                f"{source} lacks {', '.join(missing)}, which its manifest lists: the archive is incomplete. Nothing was installed."
            )
        for member, record in listed.items():
            if members[member].file_size != record.size:
                raise PackageError(
                    f"{source}: {member} is {members[member].file_size} bytes in the archive but {record.size} in the manifest. Nothing was installed."
                )
        if before_writing is not None:
            before_writing(manifest)
        check_free_space(sum(r.size for r in listed.values()) + members[MANIFEST].file_size)
        for member, info in members.items():
            limit = MANIFEST_LIMIT if member == MANIFEST else listed[member].size
            _extract_member(archive, info, folder / member, limit, source)
    return manifest


def download(url: str, destination: Path, progress=None, limit: int | None = None) -> None:
    """Fetch url into destination, at most `limit` bytes (default: the store's free space), within
    DOWNLOAD_DEADLINE_S in all and DOWNLOAD_STALL_S without a byte; StoreError naming the cause when it fails
    or stops short (the partial file is the caller's)."""
    limit = free_space() if limit is None else limit
    deadline = time.monotonic() + DOWNLOAD_DEADLINE_S
    try:
        response = urllib.request.build_opener(_Redirects()).open(url, timeout=DOWNLOAD_STALL_S)
    except StoreError:
        raise
    except urllib.error.HTTPError as error:
        raise StoreError(
            f"cannot download {url}: the server answered {error.code} {_one_line(error.reason)}."
        ) from None
    except (urllib.error.URLError, OSError, http.client.HTTPException, ValueError, RecursionError) as error:
        reason = _one_line(getattr(error, "reason", None) or error)
        raise StoreError(f"cannot download {url}: {reason}. Check the address and the connection.") from None
    length = response.headers.get("Content-Length")
    total = int(length) if length and length.isdigit() else None  # None: chunked or until the connection closes
    if total is not None and total > limit:
        response.close()
        raise StoreError(
            f"{url} is {total:,} bytes, more than the {limit:,} the store has room for; nothing was installed."
        )
    bar = progress(total) if progress else None
    received = 0
    try:
        with response, open(destination, "wb") as out:
            while chunk := response.read(CHUNK):
                received += len(chunk)
                if received > limit:
                    raise StoreError(
                        f"the download of {url} passed {limit:,} bytes, more than the store has room for; nothing was installed."
                    )
                if time.monotonic() > deadline:
                    raise StoreError(
                        f"the download of {url} took over {DOWNLOAD_DEADLINE_S:g} s; nothing was installed. Run the command again."
                    )
                out.write(chunk)  # a full disk raises OSError; staging() turns it into one line
                if bar is not None:  # a bar without a total is falsy
                    bar.update(len(chunk))
    except (http.client.HTTPException, TimeoutError, ConnectionError) as error:
        stalled = f" (no data for {DOWNLOAD_STALL_S:g} s)" if isinstance(error, TimeoutError) else ""
        raise StoreError(
            f"the download of {url} broke off after {received} bytes ({type(error).__name__}{stalled}); nothing was installed. Run the command again."
        ) from None
    finally:
        if bar is not None:
            bar.close()
    if total is not None and received != total:
        raise StoreError(
            f"the download of {url} broke off after {received} of {total} bytes; nothing was installed. Run the command again."
        )


# install URL and pull (hub.py) both read these at call time, so one setting bounds every download
DOWNLOAD_STALL_S = 60.0  # seconds without a byte before a download is given up
DOWNLOAD_DEADLINE_S = 6 * 3600.0  # one install download, or one whole pull, in all
MAX_REDIRECTS = 5


class _Redirects(urllib.request.HTTPRedirectHandler):
    """Redirects to http(s) only, at most MAX_REDIRECTS, each refusal saying what the server redirected to."""

    max_redirections = MAX_REDIRECTS

    def http_error_302(self, req, fp, code, msg, headers):
        where = urllib.parse.urljoin(req.full_url, headers.get("location") or headers.get("uri") or "")
        if urllib.parse.urlsplit(where).scheme.lower() not in ("http", "https"):
            raise StoreError(
                f"cannot download {req.full_url}: the server redirected to {where[:200]!r}, which is not an http(s) "
                "address; edgelm follows http(s) redirects only."
            )
        return super().http_error_302(req, fp, code, msg, headers)

    http_error_301 = http_error_303 = http_error_307 = http_error_308 = http_error_302

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        visited = getattr(req, "redirect_dict", {})
        if len(visited) >= MAX_REDIRECTS or newurl in visited:
            raise StoreError(
                f"cannot download {req.full_url}: the server redirects in a loop (or over {MAX_REDIRECTS} times), "
                f"last to {newurl[:200]!r}."
            )
        return super().redirect_request(req, fp, code, msg, headers, newurl)


def _one_line(reason) -> str:
    return " ".join(str(reason).split())[:300]


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with untrusted.open_regular(path, StoreError) as f:
        for chunk in iter(lambda: f.read(CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _top_folder(infos, source: str) -> str:
    """The one folder every member sits in (NAME/ as pack writes it)."""
    tops = {info.filename.replace("\\", "/").split("/")[0] for info in infos}
    if len(tops) != 1:
        raise PackageError(
            f"{source} does not hold one package folder (it has {len(tops)} top-level entries); make it with edgelm pack."
        )
    return tops.pop()


def _check_member(info: zipfile.ZipInfo, source: str) -> None:
    """Refuse a member that points outside the archive's folder, or is anything but a plain file or folder."""
    name = info.filename
    if name.startswith(("/", "\\")) or ".." in name.replace("\\", "/").split("/") or ":" in name or "\\" in name:
        raise PackageError(f"{source} holds {name!r}, a path outside its package folder. Nothing was installed.")
    kind = stat.S_IFMT(info.external_attr >> 16)
    if kind == stat.S_IFLNK:
        raise PackageError(
            f"{source} holds {name!r}, a symbolic link; a package holds only files. Nothing was installed."
        )
    if kind not in (0, stat.S_IFREG, stat.S_IFDIR) or (kind == stat.S_IFDIR) != info.is_dir():
        raise PackageError(
            f"{source} holds {name!r}, which is not a regular file (a device, FIFO or link). Nothing was installed."
        )
    if info.flag_bits & 0x1:
        raise PackageError(f"{source} holds {name!r} encrypted; edgelm archives are not encrypted.")


def _read(archive, info, limit: int, source: str) -> bytes:
    try:
        with archive.open(info) as f:
            data = f.read(limit + 1)
    except (zipfile.BadZipFile, EOFError, ValueError, NotImplementedError) as error:
        raise PackageError(f"{source}: cannot read {info.filename} ({error}); the archive is damaged.") from None
    if len(data) > limit:
        raise PackageError(f"{source}: {info.filename} is larger than its manifest records. Nothing was installed.")
    return data


def _extract_member(archive, info, path: Path, limit: int, source: str) -> None:
    """Copy one member, stopping at the first byte past what the manifest records (a zip bomb stops here)."""
    written = 0
    try:
        with archive.open(info) as src, open(path, "xb") as dst:
            while chunk := src.read(min(CHUNK, limit + 1 - written)):
                written += len(chunk)
                if written > limit:
                    raise PackageError(
                        f"{source}: {info.filename} decompresses to more than its manifest records (a zip bomb, or a damaged archive). Nothing was installed."
                    )
                dst.write(chunk)
    except (zipfile.BadZipFile, EOFError, NotImplementedError, zipfile.LargeZipFile) as error:
        raise PackageError(f"{source}: cannot extract {info.filename} ({error}); the archive is damaged.") from None


def _check_hex(text: str) -> str:
    text = text.strip().lower()
    if len(text) != 64 or any(c not in "0123456789abcdef" for c in text):
        raise StoreError(f"{text!r} is not a sha256 (64 hexadecimal digits).")
    return text


def _manifest_name(manifest, source: str) -> str:
    try:
        return check_name(manifest.name)
    except StoreError:
        raise StoreError(
            f"the package in {source} is named {manifest.name!r}, which is not a valid store name; install it with --name NAME."
        ) from None
