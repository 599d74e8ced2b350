"""The package folder: opening and verifying it (open.py), its format and manifest (format.py, sections.py),
reading its files inside their folder (files.py) and the graph's facts read without onnx (graph_scan.py)."""
