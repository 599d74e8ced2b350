"""The `edgelm` command: the only place click is imported. launch.py runs first and decides, before click and
onnxruntime load, whether to restart with huge pages; main.py holds the group and each command's module its
options."""
