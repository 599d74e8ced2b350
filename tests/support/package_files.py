"""A package's files as someone crafting a package edits them: a copy, its manifest, a file's record."""

import hashlib
import json
import shutil
from pathlib import Path


def record(path: Path) -> dict:
    data = path.read_bytes()
    return {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def read_manifest(folder: Path) -> dict:
    return json.loads((folder / "manifest.json").read_text())


def write_manifest(folder: Path, manifest: dict) -> None:
    (folder / "manifest.json").write_text(json.dumps(manifest))


def rerecord(folder: Path, name: str) -> None:
    """Record a file's present bytes in the manifest, as someone crafting a package would."""
    manifest = read_manifest(folder)
    manifest["files"][name] = record(folder / name)
    write_manifest(folder, manifest)


def copy(package: Path, tmp_path: Path) -> Path:
    return shutil.copytree(package, tmp_path / "pkg")
