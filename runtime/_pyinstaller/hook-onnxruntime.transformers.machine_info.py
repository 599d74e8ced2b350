"""PyInstaller hook for onnxruntime.transformers.machine_info, which onnxruntime's own print_debug_info imports.

It imports torch and tensorflow (inside functions) to report their versions; without this hook, freezing an
edgelm app where the export extra is installed pulls all of PyTorch into the app. An app that imports torch
itself still gets it: this only cuts machine_info's edge.
"""

excludedimports = ["torch", "tensorflow"]
