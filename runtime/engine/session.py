"""Create the onnxruntime session on the chosen device and learn the graph's inputs and outputs from it."""

import ctypes
import mmap
import os
from dataclasses import dataclass

import numpy as np
import onnxruntime as ort

from ..errors import DeviceError, PackageError
from ..package.format import (
    ATTENTION_MASK,
    INPUT_IDS,
    INPUTS_EMBEDS,
    LOGITS,
    LOGITS_TO_KEEP,
    PAST,
    POSITION_IDS,
    past_name,
    SAMPLING_TEMPERATURE,
    present_name,
)
from . import native
from .fast_path import first_line
from ..package.onnxruntime_compat import cuda_missing_error, installed_wheel, warn_if_shadowed

DEVICES = ("auto", "cpu", "cuda")
CUDA = "CUDAExecutionProvider"
CPU = "CPUExecutionProvider"
# float32 means float32 on the GPU too: onnxruntime's CUDA products default to TF32 (10-bit mantissas), which moved
# distilgpt2-shaped log-probs by up to 1.3e-3 against the CPU (benchmarks/results/2026-11-30-cuda.md).
CUDA_OPTIONS = {"use_tf32": "0"}


@dataclass(frozen=True)
class GraphIO:
    """The names the decoder graph uses, read from the session (never assumed)."""

    past_keys: tuple[str, ...]  # past_key_values.{i}.key, in layer order
    past_values: tuple[str, ...]
    present_keys: tuple[str, ...]  # present.{i}.key
    present_values: tuple[str, ...]
    has_position_ids: bool
    has_logits_to_keep: bool  # False for optimum graphs: they return logits for every position
    kv_cache_in_place: bool = False  # the package says past and present may share one preallocated buffer
    cache_dtype: str = "float32"  # "int8" or "float16" for a graph whose KV cache is
    takes_embeddings: bool = False  # the graph's first input is inputs_embeds: the runtime looks tokens up
    # an older package's sampling temperature (package/format.py), an overridable float32 [rows, 1]: fed zero rows
    idle_sampling: bool = False

    def idle_inputs(self, runner) -> dict:
        """What every pass feeds beside the contract's inputs: OrtValues by name. An older package's graph makes
        sampling outputs for the rows of its sampling temperature, which the runtime never reads: zero rows, none."""
        return {SAMPLING_TEMPERATURE: runner.value(NO_ROWS)} if self.idle_sampling else {}


NO_ROWS = np.ones((0, 1), dtype=np.float32)  # a sampling temperature for no row (OrtValues borrow it: kept here)


def cuda_available() -> bool:
    return CUDA in ort.get_available_providers()


def choose_providers(device: str, quantized: bool = False) -> list:
    """Map a device name to onnxruntime providers; asking for CUDA where it is absent is an error.

    "auto" keeps a quantized graph on the CPU: its int8 and int4 products have CPU kernels (or none faster on
    CUDA), so onnxruntime would copy every layer's activations between the two and run slower than the CPU alone
    (benchmarks/results/2026-11-30-cuda.md). --device cuda still runs it there, as asked."""
    if device not in DEVICES:
        raise DeviceError(f"unknown device {device!r}; choose one of {', '.join(DEVICES)}.")
    if device == "cuda" and not cuda_available():
        raise cuda_missing_error()
    if (device == "cuda" or (device == "auto" and not quantized)) and cuda_available():
        return [(CUDA, CUDA_OPTIONS), CPU]
    return [CPU]


# onnxruntime starts every intra-op thread up front: a count far past the cores only stalls the load.
MAX_THREADS = 1024


def check_threads(threads):
    """The `threads` option (None: every core), checked where it enters (load(), the CLI's --threads): onnxruntime
    would start an absurd count of threads as asked."""
    if threads is not None and (
        not isinstance(threads, int) or isinstance(threads, bool) or not 1 <= threads <= MAX_THREADS
    ):
        raise DeviceError(
            f"threads must be an integer from 1 to {MAX_THREADS} (this machine has {os.cpu_count()} cores), "
            f"got {str(threads)[:40]}"
        )
    return threads


SPIN_US = 1000  # how long an idle onnxruntime worker spins before it sleeps, in microseconds


def create_session(
    model_file, device: str = "auto", threads: int | None = None, quantized: bool = False, spinning: bool = True
) -> tuple[ort.InferenceSession, str]:
    """Returns the session and the device it really runs on ("cuda" or "cpu"). quantized: the graph's weights
    are int8 or int4 (see choose_providers). spinning: onnxruntime's worker threads spin between parallel
    sections (fastest for one stream on cores of its own); False makes them sleep, which gives the cores back to
    whatever shares them: a server's event loop, its clients (benchmarks/NOTES.md)."""
    warn_if_shadowed()
    providers = choose_providers(device, quantized)
    if device == "auto" and providers != [CPU]:
        # onnxruntime-gpu without a usable GPU logs errors through its process-wide logger before "auto" falls
        # back to the CPU, which is what auto means; --device cuda keeps that line, which names what is missing.
        ort.set_default_logger_severity(4)
    options = ort.SessionOptions()
    # EXTENDED: every fusion this graph gets (ALL adds only layout passes, which find nothing in a decoder and
    # cost ~0.1 s of each process start: 0.29 -> 0.18 s for the distilgpt2-shaped int8 graph).
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    # Fatal only: the overridable logits_to_keep initializer is intended, and a failed load or run reaches the user
    # as one of edgelm's errors (fast_path.py), not as onnxruntime's log lines besides it.
    options.log_severity_level = 4
    if threads is not None:
        options.intra_op_num_threads = check_threads(threads)
    options.inter_op_num_threads = 1
    if spinning:
        # spin through the gaps between a step's parallel sections and the loop's Python between steps, then sleep:
        # onnxruntime's default keeps its workers spinning ~40 ms of CPU after every run, on the core that the
        # sampler's second thread (sampling/draw.py) and the app itself would use (benchmarks/spin_after_run.py).
        # onnxruntime 1.32 knows the entry; 1.22 does not, ignores it and spins as by default
        options.add_session_config_entry("session.intra_op.spin_duration_us", str(SPIN_US))
    else:
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    try:
        session = ort.InferenceSession(os.fspath(model_file), sess_options=options, providers=providers)
    except Exception as error:  # onnxruntime raises its own Fail/InvalidGraph/InvalidProtobuf types for a bad file
        raise PackageError(
            f"onnxruntime cannot load the graph {model_file}: {first_line(error)}. The file is damaged (edgelm "
            f"verify checks it; export the package again) or needs a newer onnxruntime than {ort.__version__} "
            f"(pip install -U {installed_wheel()})."
        ) from None
    running = "cuda" if CUDA in session.get_providers() else "cpu"
    if running == "cuda" and quantized:
        import logging

        logging.getLogger("edgelm").warning(
            "this package's int8/int4 products run on the CPU's kernels, with copies to and from the GPU around "
            "them: --device cpu is faster for it; CUDA speeds up float32 packages."
        )
    if device == "cuda" and running != "cuda":
        raise DeviceError(
            "device 'cuda' was asked for, but onnxruntime could not start CUDA here (no GPU or no matching CUDA/cuDNN libraries). Use --device cpu."
        )
    return session, running


_CACHE_TYPES = {"tensor(float)": "float32", "tensor(float16)": "float16", "tensor(int8)": "int8"}


def graph_io(session: ort.InferenceSession, n_layer: int, kv_cache_in_place: bool = False) -> GraphIO:
    input_types = {i.name: i.type for i in session.get_inputs()}
    inputs = set(input_types)
    outputs = {o.name for o in session.get_outputs()}
    overridable = {i.name: i for i in session.get_overridable_initializers()}
    temperature = overridable.get(SAMPLING_TEMPERATURE)
    names = GraphIO(
        past_keys=tuple(past_name(i, "key") for i in range(n_layer)),
        past_values=tuple(past_name(i, "value") for i in range(n_layer)),
        present_keys=tuple(present_name(i, "key") for i in range(n_layer)),
        present_values=tuple(present_name(i, "value") for i in range(n_layer)),
        has_position_ids=POSITION_IDS in inputs,
        has_logits_to_keep=LOGITS_TO_KEEP in inputs | set(overridable),
        kv_cache_in_place=kv_cache_in_place,
        cache_dtype=_CACHE_TYPES.get(input_types.get(past_name(0, "key")), "float32"),
        takes_embeddings=INPUTS_EMBEDS in inputs,
        idle_sampling=temperature is not None and temperature.type == "tensor(float)" and len(temperature.shape) == 2,
    )
    tokens = INPUTS_EMBEDS if names.takes_embeddings else INPUT_IDS
    missing = [n for n in (tokens, ATTENTION_MASK, *names.past_keys, *names.past_values) if n not in inputs]
    missing += [n for n in (LOGITS, *names.present_keys, *names.present_values) if n not in outputs]
    if missing:
        raise PackageError(
            f"the graph lacks {missing[0]} (and {len(missing) - 1} more): it is not a decoder with a key/value cache. Export with edgelm export, or optimum-cli export onnx --task text-generation-with-past."
        )
    return names


def release_freed_memory() -> None:
    """Hand memory that loading freed back to the system (glibc's malloc_trim, macOS's pressure relief;
    elsewhere nothing to do: engine/native.py).

    Parsing tokenizer.json and the ONNX file leaves ~15 MB of freed heap resident that the arena-managed
    decode work never reuses; trimming lowers every later peak (benchmarks/NOTES.md)."""
    native.release_freed_memory()


def drop_mapped_pages(folder) -> int:
    """Drop this process's resident pages of the file mappings inside `folder` that hold no written page
    (Linux; elsewhere nothing to do). Returns how many mappings were advised.

    onnxruntime maps large initializers from model.onnx.data and keeps some mapped after prepacking: an int4
    graph's MatMulNBits scales (copied into the packed weights, never read again) and the 4-bit token table
    that GatherBlockQuantized shares with the LM head. Prepacking read every one of those pages, so they stay
    resident: 30 MB for SmolLM2-135M's shape. MADV_DONTNEED drops them from this process; a page a later step
    reads (a token's row) comes back from the page cache on that read. onnxruntime maps them writable and
    private, so a mapping with a page of its own (written, so no longer the file's: /proc/self/pagemap) is left
    alone: dropping it would undo the write."""
    madvise = native.c_function("madvise") if os.path.exists("/proc/self/pagemap") else None
    if madvise is None or not hasattr(mmap, "MADV_DONTNEED"):
        return 0
    madvise.argtypes, madvise.restype = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int), ctypes.c_int
    inside, page = os.path.join(os.path.realpath(folder), ""), mmap.PAGESIZE
    mappings = []  # (start, end) of the mappings of files inside the folder
    with open("/proc/self/maps") as maps:  # "start-end perms offset dev inode path"
        for line in maps:
            fields = line.split(maxsplit=5) if inside in line else ()
            if len(fields) == 6 and fields[5].startswith(inside):
                mappings.append(tuple(int(address, 16) for address in fields[0].split("-")))
    advised = 0
    with open("/proc/self/pagemap", "rb") as pagemap:  # 8 bytes per page: bit 63 present, bit 61 the file's page
        for start, end in mappings:
            pagemap.seek(start // page * 8)
            flags = np.frombuffer(pagemap.read((end - start) // page * 8), dtype=np.uint64)
            if np.any((flags >> np.uint64(63)) & ~(flags >> np.uint64(61)) & np.uint64(1)):
                continue  # a present page that is not the file's: written
            advised += madvise(start, end - start, mmap.MADV_DONTNEED) == 0
    return advised


def check_graph_shapes(session, package) -> None:
    """The graph must be the one the package describes: one logit per vocabulary entry, a cache input pair per
    layer, each [batch, kv_heads, past, head_size], wherever the graph gives those sizes as numbers (package: an
    open package.open.Package)."""
    arch, inputs = package.arch, session.get_inputs()
    columns = next((o.shape[-1] for o in session.get_outputs() if o.name == LOGITS and o.shape), None)
    past = [i for i in inputs if i.name.startswith(PAST)]
    expected = (arch.kv_heads, arch.head_size)
    wrong = next(
        (
            i
            for i in past
            if len(i.shape) != 4 or any(isinstance(d, int) and d != e for d, e in zip(i.shape[1::2], expected))
        ),
        None,
    )
    problem = (
        f"gives {columns} logits per token but the package says its vocabulary has {arch.vocab_size} entries"
        if isinstance(columns, int) and columns != arch.vocab_size
        else f"has {len(past) // 2} cache layers but the package says {arch.n_layer}"
        if len(past) != 2 * arch.n_layer
        else f"takes {wrong.name} of shape {wrong.shape}, not [batch, {arch.kv_heads}, past, {arch.head_size}] as the package says"
        if wrong is not None
        else None
    )
    if problem:
        raise PackageError(f"{package.model_file} {problem}; the package is damaged. Export it again.")
