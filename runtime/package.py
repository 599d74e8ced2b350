"""Read a model package folder: the manifest, its checksums, and everything the engine needs to know.

Two kinds of folder load:
- an edgelm package (manifest.json written by `edgelm export`), checked file by file against its sha256;
- a plain folder from `optimum-cli export onnx --task text-generation-with-past` (model.onnx, config.json,
  tokenizer.json), whose input and output names are read from the graph itself.
"""

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

from .architecture import Architecture
from .errors import PackageError

DEFAULT_PACKAGE = Path("models") / "distilgpt2"  # what every command and load() open when given no folder

MANIFEST = "manifest.json"
FORMAT = "edgelm-package"
FORMAT_VERSION = 2  # 2: weights in model.onnx.data; int8 graphs take inputs_embeds (graph.token_embeddings)


@dataclass(frozen=True)
class Package:
    """A loadable model folder, described by its own files."""

    folder: Path
    arch: Architecture
    model_file: Path
    tokenizer_file: Path
    generation_defaults: dict  # the package's generation_config.json
    manifest: dict = field(default_factory=dict)  # empty for an optimum folder
    kind: str = "edgelm"  # "edgelm" or "optimum"

    @property
    def name(self) -> str:
        return self.manifest.get("name") or self.folder.name

    @property
    def weight_bytes(self) -> int:
        """The graph's bytes on disk: model.onnx, and its external weights file where the manifest names one."""
        data = self.manifest.get("graph", {}).get("weights_file")
        return self.model_file.stat().st_size + ((self.folder / data).stat().st_size if data else 0)


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            digest.update(chunk)
    return digest.hexdigest()


def file_record(path: Path) -> dict:
    return {"size": path.stat().st_size, "sha256": sha256_of(path)}


def open_package(path, verify: bool = True) -> Package:
    """Read a package folder; with verify, refuse it unless every listed file has its recorded size and sha256."""
    folder = Path(path).expanduser()
    if not folder.exists():
        raise PackageError(f"no model package at {folder}. Make one with: edgelm export distilgpt2 -o {folder}")
    if not folder.is_dir():
        raise PackageError(f"{folder} is a file; a model package is a folder (made by edgelm export).")
    if not (folder / MANIFEST).exists():
        if (folder / "model.onnx").exists() and (folder / "config.json").exists():
            return _open_optimum_folder(folder)
        raise PackageError(
            f"{folder} is not a model package: it has no {MANIFEST} (and is not an optimum ONNX export). Make one with: edgelm export MODEL -o {folder}"
        )
    manifest = _read_json(folder / MANIFEST)
    if manifest.get("format") != FORMAT:
        raise PackageError(f"{folder / MANIFEST} is not an edgelm manifest (format is {manifest.get('format')!r}).")
    version = manifest.get("format_version")
    if not isinstance(version, int) or isinstance(version, bool):
        raise PackageError(
            f"{folder / MANIFEST} has no valid format_version (got {version!r}); the manifest is damaged. Export the package again."
        )
    if version > FORMAT_VERSION:
        raise PackageError(
            f"{folder} uses package format {version}, newer than this edgelm reads ({FORMAT_VERSION}). Upgrade edgelm: pip install -U edgelm"
        )
    files = manifest.get("files") or {}
    for name in (manifest.get("graph", {}).get("file"), manifest.get("tokenizer")):
        if name not in files:
            raise PackageError(f"{folder / MANIFEST} does not list {name!r} among its files; the manifest is damaged.")
    if verify:
        verify_files(folder, files)
    try:
        arch = Architecture.from_dict(manifest["architecture"])
    except (KeyError, TypeError) as error:
        raise PackageError(f"{folder / MANIFEST} has an incomplete architecture section (missing {error}).") from None
    generation = _read_json(folder / "generation_config.json") if (folder / "generation_config.json").exists() else {}
    return Package(
        folder, arch, folder / manifest["graph"]["file"], folder / manifest["tokenizer"], generation, manifest
    )


def verify_files(folder: Path, files: dict) -> None:
    """Raise PackageError naming the first file that is missing, resized or altered."""
    for name, record in files.items():
        path = folder / name
        if not path.exists():
            raise PackageError(f"{path} is missing; the package is incomplete. Export it again.")
        size = path.stat().st_size
        if size != record.get("size"):
            raise PackageError(
                f"{path} has {size} bytes but the manifest records {record.get('size')}: the file is truncated or replaced. Export it again."
            )
        if sha256_of(path) != record.get("sha256"):
            raise PackageError(
                f"{path} does not match its sha256 in the manifest: the file was altered. Export it again."
            )


def _open_optimum_folder(folder: Path) -> Package:
    config = _read_json(folder / "config.json")
    if config.get("model_type") != "gpt2":
        raise PackageError(f"{folder} holds a '{config.get('model_type')}' model; edgelm runs GPT-2-family decoders.")
    if not (folder / "tokenizer.json").exists():
        raise PackageError(f"{folder} has no tokenizer.json; save the fast tokenizer next to model.onnx.")
    generation = _read_json(folder / "generation_config.json") if (folder / "generation_config.json").exists() else {}
    return Package(
        folder,
        Architecture.from_hf_config(config),
        folder / "model.onnx",
        folder / "tokenizer.json",
        generation,
        {},
        "optimum",
    )


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise PackageError(f"cannot read {path}: {error}. The package is damaged; export it again.") from None
    if not isinstance(data, dict):
        raise PackageError(f"{path} does not hold a JSON object; the package is damaged.")
    return data
