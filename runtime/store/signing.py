"""Who published an archive: `edgelm pack --sign KEY` writes ARCHIVE.minisig beside it, an ed25519 signature in
minisign's format (`minisign -Vm ARCHIVE -P PUBKEY` verifies it), and `edgelm install --trust PUBKEY` installs
only an archive one of the trusted keys signed. The keys a fleet trusts can also live in the store, one
minisign public key per line in STORE/.meta/trusted-keys (lines starting with '#' and minisign's "untrusted
comment:" lines are skipped); once any key is trusted, an unsigned archive is refused.

py-minisign (the `sign` extra, over `cryptography`) reads and writes the format; only this module imports it."""

import os
from pathlib import Path

from .. import untrusted
from ..errors import PackageError, StoreError, install_hint

SUFFIX = ".minisig"
MAX_SIGNATURE_BYTES = 4096  # a minisign signature file is ~300 bytes
MAX_KEYS_BYTES = 1 << 20
MAX_SECRET_KEY_BYTES = 4096  # a minisign secret key file is ~250 bytes
KEYS_FILE = "trusted-keys"  # in STORE/.meta
KEY_ADVICE = "; give the secret key file minisign -G wrote"


def _minisign():
    try:
        import minisign
    except ImportError:
        raise StoreError(f"signing and checking signatures need py-minisign: {install_hint('sign')}") from None
    return minisign


def sign(archive: Path, key_file, password: str | None = None) -> Path:
    """Sign `archive` with the minisign secret key in `key_file` (decrypted with `password` if it is encrypted);
    returns the signature file, ARCHIVE.minisig."""
    minisign = _minisign()
    try:
        data = untrusted.read_bytes(
            Path(key_file).expanduser(), MAX_SECRET_KEY_BYTES, StoreError, KEY_ADVICE, what="a minisign secret key"
        )
        key = minisign.SecretKey.from_bytes(data)
        if key.is_encrypted():
            if password is None:
                raise StoreError(f"the key {key_file} is encrypted; give its password (EDGELM_SIGN_PASSWORD)")
            key.decrypt(password)
        with open(archive, "rb") as data:
            signature = key.sign(data, prehash=True, trusted_comment=f"edgelm archive {archive.name}")
    except OSError as error:
        raise StoreError(f"cannot read the key {key_file}: {error.strerror or error}") from None
    except (minisign.Error, ValueError) as error:
        raise StoreError(f"cannot sign with {key_file}: {error} (is it a minisign secret key?)") from None
    path = archive.with_name(archive.name + SUFFIX)
    path.write_bytes(bytes(signature))
    return path


def trusted_keys(given=(), store: Path | None = None) -> list:
    """The public keys to trust: each of `given` (a key as minisign prints it, "RW...", or a .pub file), then
    the store's list (STORE/.meta/trusted-keys)."""
    listed = store / KEYS_FILE if store is not None else None
    sources = [*given, *([listed] if listed is not None and os.path.lexists(listed) else [])]
    if not sources:
        return []
    minisign = _minisign()
    keys = []
    for item in sources:
        path = Path(item).expanduser()
        if _names_a_file(path):
            lines = _key_lines(_read(path, MAX_KEYS_BYTES, "a list of public keys"))
        else:
            lines = [str(item).strip()]
        if not lines:
            raise StoreError(f"{item} holds no minisign public key")
        keys += [_public_key(minisign, line, item) for line in lines]
    return keys


def verify(archive: Path, signature: bytes | None, keys: list, source: str) -> str:
    """Check `signature` (ARCHIVE.minisig's bytes, None when there is none) of `archive` against `keys`;
    returns the public key that signed it (as minisign prints it), PackageError when no trusted key did."""
    minisign = _minisign()
    if signature is None:
        raise PackageError(f"{source} is not signed (no {SUFFIX} beside it) and this store trusts signed archives only")
    try:
        parsed = minisign.Signature.from_bytes(signature)
    except minisign.Error as error:
        raise PackageError(f"the signature of {source} is not a minisign signature ({error})") from None
    for key in keys:
        try:
            with untrusted.open_regular(archive, PackageError) as data:
                key.verify(data, parsed)
            return key.to_base64().decode("ascii")
        except minisign.Error:
            continue
    raise PackageError(
        f"{source} is not signed by a trusted key: the signature does not match it, or another key made it "
        "(the archive may have been altered). Nothing was installed."
    )


def read_signature(path: Path) -> bytes | None:
    """ARCHIVE.minisig's bytes, None where there is none (a FIFO or a device there is refused, not read)."""
    if not os.path.lexists(path):
        return None
    return _read(path, MAX_SIGNATURE_BYTES, "the signature").encode("utf-8", "replace")


def _key_lines(text: str) -> list:
    return [
        line.strip()
        for line in text.splitlines()
        if line.strip() and not line.lstrip().startswith(("#", "untrusted comment:"))
    ]


def _public_key(minisign, line: str, where):
    try:
        return minisign.PublicKey.from_base64(line)
    except (minisign.Error, ValueError) as error:
        raise StoreError(
            f"{where} is not a minisign public key ({error}); give the RW... line minisign prints"
        ) from None


def _names_a_file(path: Path) -> bool:
    """Whether a trusted key given on the command line names a file (anything there, a FIFO too: it is then
    refused as one) rather than being a key itself."""
    try:
        return os.path.lexists(path)
    except (OSError, ValueError):  # a key's text is no name the system can look up
        return False


def _read(path: Path, limit: int, what: str) -> str:
    return untrusted.read_text(path, limit, StoreError, "", what=what)


def key_password() -> str | None:
    """The signing key's password, from EDGELM_SIGN_PASSWORD (a prompt is the CLI's business)."""
    return os.environ.get("EDGELM_SIGN_PASSWORD")
