"""The calls edgelm makes into one system's C library, each found by feature detection, and the portable path
taken where it is missing.

    call                    where it exists                  what is done without it
    malloc_trim             glibc (Linux)                    malloc_zone_pressure_relief (macOS), else nothing
    mallopt                 glibc (Linux)                    nothing (the allocator's own arenas and thresholds)
    madvise + pagemap       Linux                            nothing (the pages stay resident)
    renameat2 EXCHANGE      Linux >= 3.15, glibc >= 2.28     renamex_np RENAME_SWAP (macOS), else two renames

EDGELM_PORTABLE=1 takes the portable path for each of them (no C library call at all), so the tests run those
paths on Linux too (docs/install.md says what runs where).
"""

import ctypes
import os

PORTABLE = "EDGELM_PORTABLE"


def portable_only() -> bool:
    """Whether EDGELM_PORTABLE=1 asks for the portable paths."""
    return os.environ.get(PORTABLE) == "1"


def c_function(name: str, use_errno: bool = False):
    """The C library's function `name` from this process's own symbols, or None: absent, no C library to
    look in (Windows), or EDGELM_PORTABLE=1."""
    if portable_only():
        return None
    try:
        return getattr(ctypes.CDLL(None, use_errno=use_errno), name, None)
    except (OSError, TypeError):  # TypeError: CDLL(None) on Windows
        return None


def release_freed_memory() -> str:
    """Hand freed heap memory back to the system; returns the call made ("" for none)."""
    trim = c_function("malloc_trim")
    if trim is not None:
        trim(0)
        return "malloc_trim"
    relief = c_function("malloc_zone_pressure_relief")  # macOS: every malloc zone (NULL), as much as it can (0)
    if relief is not None:
        relief.argtypes, relief.restype = (ctypes.c_void_p, ctypes.c_size_t), ctypes.c_size_t
        relief(None, 0)
        return "malloc_zone_pressure_relief"
    return ""


M_TRIM_THRESHOLD, M_MMAP_THRESHOLD, M_ARENA_MAX = -1, -3, -8  # glibc's mallopt parameters (malloc.h)
HEAP_ARENAS = 2  # malloc arenas the server's threads share
OWN_MAPPING_BYTES = 1 << 20  # a block this large or larger is a mapping of its own, unmapped when freed
TRIM_BYTES = 128 << 10  # free space at an arena's top past which a free gives it back (glibc's own default)


def bound_freed_heap() -> str:
    """Make freed heap go back to the system in a long-running process (the server): at most HEAP_ARENAS malloc
    arenas, every block of OWN_MAPPING_BYTES or more mapped on its own, and an arena's top given back past
    TRIM_BYTES; returns the call made ("" for none).

    glibc gives each thread that allocates at once an arena of its own, and raises its mapping and trim thresholds
    (up to 32 and 64 MiB) each time a large block is freed, so that the next large blocks come from an arena's
    top, which malloc_trim does not shrink outside the main arena: after a burst of heavy constraint compiles in
    the worker threads, tens of MB stayed resident in their arenas (benchmarks/hostile_bursts.py, slow_compile)."""
    mallopt = c_function("mallopt")
    if mallopt is None:
        return ""
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    mallopt(M_ARENA_MAX, HEAP_ARENAS)
    mallopt(M_MMAP_THRESHOLD, OWN_MAPPING_BYTES)  # fixed thresholds: glibc no longer raises them
    mallopt(M_TRIM_THRESHOLD, TRIM_BYTES)
    return "mallopt"
