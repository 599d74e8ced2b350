"""The calls edgelm makes into one system's C library, each found by feature detection, and the portable path
taken where it is missing.

    call                    where it exists                  what is done without it
    malloc_trim             glibc (Linux)                    malloc_zone_pressure_relief (macOS), else nothing
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
