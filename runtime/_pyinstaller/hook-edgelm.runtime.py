"""PyInstaller hook for edgelm.runtime, run by PyInstaller when a frozen app imports it.

runtime/__init__.py imports its public names (load, Model, ...) on first use, so that the `edgelm` command can
restart itself before it pays for NumPy and onnxruntime; PyInstaller's analysis cannot see those imports, so
they are listed here. The HTTP server (edgelm.runtime.server) needs the [server] extra and is left to apps that
import it themselves. onnxruntime's libraries come with its own hook (pyinstaller-hooks-contrib); tokenizers
needs no data files.
"""

from PyInstaller.utils.hooks import collect_submodules, copy_metadata

hiddenimports = collect_submodules(
    "edgelm.runtime",
    filter=lambda name: not name.startswith(("edgelm.runtime.server", "edgelm.runtime._pyinstaller")),
)

try:
    datas = copy_metadata("edgelm")  # the version `edgelm --version` reports
except Exception:  # PackageNotFoundError: edgelm is on the path without being installed
    datas = []
