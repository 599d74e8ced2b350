"""The forward pass on onnxruntime, on token ids only: the decode loop and its decoders (decode.py), the session
and its devices, the fast path, onnxruntime's version facts, the token table read from the weights file, and
memory (huge pages, freed pages)."""
