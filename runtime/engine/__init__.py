"""The forward pass on onnxruntime, on token ids only: the decode loop and its decoders (decode.py), the session
and its devices, the fast path, the token table read from the weights file, and memory (huge pages, freed pages)."""

from ..package.onnxruntime_compat import check_cpu_before_import

# Before any module here imports onnxruntime: a release that this CPU cannot run would end the process at that
# import with "Illegal instruction" and no word of why (onnxruntime_compat.NEEDS_DOT_PRODUCT).
check_cpu_before_import()
