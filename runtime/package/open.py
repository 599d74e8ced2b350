"""Read a model package folder: the manifest, its checksums, and everything the engine needs to know.

Two kinds of folder load:
- an edgelm package (manifest.json written by `edgelm export`), checked against the format (format.py)
  and file by file against its sizes and sha256;
- a plain folder from `optimum-cli export onnx --task text-generation-with-past` (model.onnx, config.json,
  tokenizer.json), whose input and output names are read from the graph itself.

A package is untrusted input: every file is opened through files.py (inside the folder, regular,
bounded), and every file the runtime reads must be listed in the manifest, the graph's external data included.
"""

import os
from dataclasses import dataclass, field
from pathlib import Path

from . import onnxruntime_compat
from .onnxruntime_compat import minimum_here
from ..errors import GenerationOptionError, PackageError
from . import verified
from .files import file_record, inside, read_bytes, read_json, sha256_of
from .format import (
    GENERATION_CONFIG,
    GRAPH_FILE,
    HF_CONFIG,
    MANIFEST,
    MAX_JSON_BYTES,
    MAX_MANIFEST_BYTES,
    TOKENIZER_FILE,
    WEIGHTS_FILE,
    Architecture,
    FormatError,
    Manifest,
    describe,
    file_name,
)
from .graph_scan import MAX_DEPTH, ScanError, TooDeep, scan_model
from .graph_section import TokenTable

DEFAULT_PACKAGE = Path("models") / "distilgpt2"  # what every command and load() open when given no folder
DAMAGED = "The manifest is damaged or was not written by edgelm export; export the package again."

__all__ = ["DEFAULT_PACKAGE", "Package", "file_record", "open_package", "sha256_of", "verify_files"]


@dataclass(frozen=True)
class Package:
    """A loadable model folder, described by its own files."""

    folder: Path
    arch: Architecture
    model_file: Path
    tokenizer_file: Path
    generation_defaults: dict  # the package's generation_config.json
    manifest: Manifest | None = None  # None for an optimum folder
    kind: str = "edgelm"  # "edgelm" or "optimum"
    weights_file: Path | None = None  # the graph's external data, where it has one
    verified: bool = False  # every listed file had its recorded size and sha256 when the folder was opened
    min_onnxruntime: str | None = None  # the oldest onnxruntime that runs the graph on this machine (minimum_here)
    uses: frozenset = field(default=frozenset(), repr=False)  # the graph's operators and attributes (GraphFacts)

    @property
    def name(self) -> str:
        return (self.manifest.name if self.manifest else "") or self.folder.name

    @property
    def weight_bytes(self) -> int:
        """The graph's bytes on disk: model.onnx, and its external weights file where it has one."""
        return sum(p.stat().st_size for p in (self.model_file, self.weights_file) if p is not None)

    def read_limit(self, path: Path) -> int:
        """The most bytes the runtime reads from one of the package's files: its recorded size."""
        if self.manifest is not None and self.verified:
            record = self.manifest.files.get(path.name)
            if record is None:  # a link inside the folder to a file the manifest does not list
                raise PackageError(
                    f"{path} is not one of the files the manifest lists (a link inside the package leads to it); "
                    "a package reads only its listed files. Export it again."
                )
            return record.size
        return MAX_JSON_BYTES

    def path(self, name: str) -> Path:
        """The real path of one of the package's files, refused unless it is a regular file inside the folder."""
        return inside(self.folder, name)

    def tokenizer_data(self) -> bytes:
        """tokenizer.json's bytes, at most its recorded size (the tokenizer is built from them: load_tokenizer)."""
        return read_bytes(self.tokenizer_file, self.read_limit(self.tokenizer_file))

    def tokenizer_text(self) -> str:
        data = self.tokenizer_data()
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            raise PackageError(f"{self.tokenizer_file} is not UTF-8 text; the package is damaged.") from None

    def describe(self) -> str:
        """What `edgelm info` prints."""
        from ..generation_config import GenerationConfig  # only here: a load reaches its session without it

        eos = self.generation_defaults.get("eos_token_id") if isinstance(self.generation_defaults, dict) else None
        try:
            ids = GenerationConfig(eos_token_id=eos).eos_token_id
        except GenerationOptionError:  # a damaged file: `edgelm info` still describes the rest
            ids = None
        recorded = self.manifest.graph.min_onnxruntime if self.manifest else None
        raised = recorded is not None and self.min_onnxruntime != recorded  # by this machine's architecture
        here = (self.min_onnxruntime, onnxruntime_compat.this_machine()) if raised else None
        return describe(self.name, self.kind, self.folder, self.arch, self.manifest, ids, here)

    def to_dict(self) -> dict:
        """The manifest as JSON (`edgelm info --json`); for an optimum folder, what was read from it."""
        return self.manifest.to_dict() if self.manifest else {"kind": self.kind, "architecture": self.arch.to_dict()}


def open_package(path, verify: bool | str = True) -> Package:
    """Read a package folder; with verify, refuse it unless every listed file has its recorded size and sha256.
    True hashes only the files changed since the last full check (package/verified.py), "full" hashes every
    file. Without verify the checksums are skipped, never the format, the paths or the file types."""
    if not any(verify is mode for mode in verified.MODES):
        raise PackageError(f"verify must be True, False or 'full', got {str(verify)[:40]!r}")
    folder = Path(path).expanduser()
    if not folder.exists():
        raise PackageError(f"no model package at {folder}. Make one with: edgelm export distilgpt2 -o {folder}")
    if not folder.is_dir():
        raise PackageError(f"{folder} is a file; a model package is a folder (made by edgelm export).")
    if not (folder / MANIFEST).exists() and not (folder / MANIFEST).is_symlink():
        if (folder / GRAPH_FILE).exists() and (folder / HF_CONFIG).exists():
            return _open_optimum_folder(folder)
        raise PackageError(
            f"{folder} is not a model package: it has no {MANIFEST} (and is not an optimum ONNX export). Make one with: edgelm export MODEL -o {folder}"
        )
    manifest = read_manifest(folder)
    if verify:  # every listed path is checked (inside, regular) before any is read
        verify_files(folder, manifest, full=verify == "full")
    else:  # no checksums, but no listed path may lead out of the folder or to a FIFO or device either
        for name in manifest.files:
            if os.path.lexists(folder / name):
                inside(folder, name)
    paths = {name: inside(folder, name) for name in manifest.required_files().values()}
    arch = manifest.architecture
    model_file = paths[manifest.graph.file]
    uses = _check_graph(
        model_file,
        arch,
        lambda name: name in manifest.files,
        f"{folder / MANIFEST} does not list it",
        manifest.graph.token_embeddings,
    )
    generation = read_json(
        paths[GENERATION_CONFIG], manifest.files[GENERATION_CONFIG].size if verify else MAX_JSON_BYTES
    )
    weights = paths.get(manifest.graph.weights_file) if manifest.graph.weights_file else None
    minimum = minimum_here(manifest.graph.min_onnxruntime, uses)  # no field (an older manifest): the graph's
    tokenizer = paths[manifest.tokenizer]
    return Package(
        folder, arch, model_file, tokenizer, generation, manifest, "edgelm", weights, verify, minimum, frozenset(uses)
    )


def read_manifest(folder: Path) -> Manifest:
    """The folder's manifest.json, checked against the format; PackageError naming the first field that is wrong."""
    path = inside(folder, MANIFEST)
    try:
        return Manifest.from_dict(read_json(path, MAX_MANIFEST_BYTES))
    except FormatError as error:
        raise PackageError(
            f"{folder / MANIFEST}: {error}. {DAMAGED if error.advice is None else error.advice}".rstrip()
        ) from None


def verify_files(folder: Path, manifest: Manifest, full: bool = True) -> None:
    """Raise PackageError naming the first file that is missing, resized or altered. Unless full, a file whose
    identity is what the last check recorded for that sha256 is not hashed again (package/verified.py)."""
    known = {} if full else verified.read(folder)
    found = {}
    for name, record in manifest.files.items():
        path = inside(folder, name)
        now = verified.identity(path.stat())  # before hashing: a write during the hash changes it for next time
        if now[0] != record.size:
            raise PackageError(
                f"{folder / name} has {now[0]} bytes but the manifest records {record.size}: the file is truncated or replaced. Export it again."
            )
        entry = {"identity": now, "sha256": record.sha256}
        if known.get(name) != entry and sha256_of(path, record.size) != record.sha256:
            raise PackageError(
                f"{folder / name} does not match its sha256 in the manifest: the file was altered. Export it again."
            )
        found[name] = entry
    if found != known:
        verified.write(folder, found)


def _check_graph(model_file: Path, arch: Architecture, listed, unlisted: str, table: TokenTable | None = None) -> set:
    """The graph reads only listed files, its position table covers the architecture's n_positions, and a token
    table in blocks is laid out as the LM head's weights that share its bytes. Returns the operators and
    attributes it uses (graph_scan.GraphFacts.uses)."""
    blocked = table is not None and table.block
    regions = [(table.file, r.offset, r.offset + r.nbytes) for r in (table.rows, table.scale)] if blocked else []
    try:
        facts = scan_model(model_file, regions)
    except TooDeep:
        raise PackageError(
            f"{model_file} nests graphs or protobuf groups more than {MAX_DEPTH} deep, which no decoder graph does; edgelm does not load it. Export the package again."
        ) from None
    except ScanError:
        return set()  # not a model this scan reads: onnxruntime refuses it at load with its own message
    for location in sorted(facts.external_files):
        if not listed(location):
            raise PackageError(
                f"{model_file} reads its weights from {location!r}, but {unlisted}; a package's graph may only read the package's own files. Export it again."
            )
    if facts.position_rows is not None and arch.n_positions > facts.position_rows:
        raise PackageError(
            f"the package says n_positions is {arch.n_positions} but its graph has {facts.position_rows} positions; the manifest is damaged. Export the package again."
        )
    if blocked:
        _check_blocked_table(facts, table, model_file)
    return facts.uses


def _check_blocked_table(facts, table: TokenTable, model_file: Path) -> None:
    """The int8 recipe's token table is the LM head's MatMulNBits weights: where the graph stores tensors in the
    manifest's rows [V, C / B, B] and scales [V, C / B], they must tile those bytes exactly, with the same element
    type and trailing dimensions, or the runtime's lookup would read the head's bytes in the wrong blocks. A graph
    with no tensor there (a variant that stores its head elsewhere) leaves the table to the runtime alone."""
    if table.file in facts.odd_numbers:
        raise PackageError(
            f"{model_file} gives a tensor in {table.file} an offset or length that is not a plain decimal number; edgelm does not load it. Export the package again."
        )
    for part, region in (("rows", table.rows), ("scale", table.scale)):
        start, end = region.offset, region.offset + region.nbytes
        overlapping = (t for t in facts.stored if t.location == table.file and t.offset < end and t.end > start)
        tensors, at = sorted(overlapping, key=lambda t: t.offset), start
        for t in tensors:
            if t.offset != at or t.nbytes is None or t.dtype != region.dtype or t.dims[1:] != region.shape[1:]:
                raise PackageError(
                    f"the manifest's graph.token_embeddings.{part} is {region.dtype} {list(region.shape)} (blocks of {table.block}) at byte {region.offset} of {table.file}, but {model_file} stores a {t.dtype or 'tensor'} {list(t.dims)} at byte {t.offset}; the manifest does not match the graph. Export the package again."
                )
            at += t.nbytes
        if tensors and at != end:
            raise PackageError(
                f"the manifest's graph.token_embeddings.{part} covers bytes {start}-{end} of {table.file}, but {model_file}'s tensors there end at {at}; the manifest does not match the graph. Export the package again."
            )


def _open_optimum_folder(folder: Path) -> Package:
    config = read_json(inside(folder, HF_CONFIG), MAX_JSON_BYTES)
    if config.get("model_type") != "gpt2":
        raise PackageError(
            f"{folder} holds a {str(config.get('model_type'))[:40]!r} model; edgelm runs optimum's exports of GPT-2 models only: export other models with edgelm export."
        )
    if not (folder / TOKENIZER_FILE).exists():
        raise PackageError(f"{folder} has no tokenizer.json; save the fast tokenizer next to model.onnx.")
    try:
        arch = Architecture.from_hf_config(config)
    except FormatError as error:
        raise PackageError(f"{folder / HF_CONFIG}: {error}. Export the model again.") from None
    model_file, tokenizer_file = inside(folder, GRAPH_FILE), inside(folder, TOKENIZER_FILE)
    has_defaults = (folder / GENERATION_CONFIG).exists() or (folder / GENERATION_CONFIG).is_symlink()
    generation = read_json(inside(folder, GENERATION_CONFIG), MAX_JSON_BYTES) if has_defaults else {}

    def regular_file_here(name: str) -> bool:
        try:
            return inside(folder, file_name("location", name)) is not None
        except (FormatError, PackageError):
            return False

    def absent_or_regular_here(name: str) -> bool:  # an absent one: onnxruntime says it is missing
        return regular_file_here(name) or not ((folder / name).exists() or (folder / name).is_symlink())

    uses = _check_graph(model_file, arch, absent_or_regular_here, "that is not a regular file of the folder")
    weights = inside(folder, WEIGHTS_FILE) if regular_file_here(WEIGHTS_FILE) else None
    minimum = minimum_here(None, uses)
    return Package(
        folder, arch, model_file, tokenizer_file, generation, None, "optimum", weights, False, minimum, frozenset(uses)
    )
