"""The package folder: opening and verifying it (open.py), its format and manifest (format.py, sections.py),
reading its files inside their folder (files.py), the graph's facts read without onnx (graph_scan.py) and the
onnxruntime release a package needs and the one installed (onnxruntime_compat.py)."""
