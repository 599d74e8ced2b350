"""The token-embedding lookup for graphs that take `inputs_embeds` (int8 packages): rows are read from the
package's weights file as tokens come, so the [V, C] table is never resident in this process.

Why outside the graph: the tied matrix serves the LM head and the lookup. onnxruntime keeps an initializer
that a plain Gather reads next to the copy it prepacks for the LM head, so an in-graph lookup holds the table
twice (38.6 MB more for distilgpt2 int8). The LM head names the same bytes of model.onnx.data as ONNX external
data: one copy on disk, one prepacked copy in memory, and a few rows read per step here. An untied model's
LM head is a matrix of its own; its token rows are read the same way, and no node of the graph reads them.

The manifest's graph.token_embeddings (package_format.TokenTable) says where: int8 rows [V, C] at `rows.offset` and
one float32 scale per row [V] at `scale.offset`, an embedding row * scale; or, with `block` (the int8 recipe's tied
table, the LM head's MatMulNBits weights), uint8 rows around 128 and one scale per block of the row [V, C / block],
an embedding (row - 128) * scale.
"""

import math
import os
import threading
from pathlib import Path

import numpy as np

from ..errors import PackageError
from ..package.files import open_regular
from ..package.format import TokenTable


class TokenEmbeddings:
    """ids (any integer shape) -> float32 embeddings (shape + [C])."""

    def __init__(self, read_row, scale: np.ndarray, width: int, block: int = 0):
        """scale: [V] (one per row), or [V, width / block] with block (one per block, the rows uint8 around 128)."""
        self._read_row, self.scale, self.width, self.block = read_row, scale, width, block

    @classmethod
    def from_arrays(cls, rows: np.ndarray, scale: np.ndarray) -> "TokenEmbeddings":
        """In memory (the export's validation runs the graph before any file exists): int8 rows [V, C], or uint8
        rows in blocks [V, C / B, B] with scale [V, C / B]."""
        block = rows.shape[2] if rows.ndim == 3 else 0
        rows = rows.reshape(len(rows), -1)

        def read_row(token, out):
            out[:] = rows[token]

        return cls(read_row, np.asarray(scale, dtype=np.float32), rows.shape[1], block)

    @classmethod
    def open(cls, path: Path, table: TokenTable) -> "TokenEmbeddings":
        """The rows and scales of `table` (checked against the format already) in the file at `path`."""
        vocab_size, width = table.rows.shape[0], math.prod(table.rows.shape[1:])
        handle = open_regular(path)
        try:
            if os.fstat(handle.fileno()).st_size < max(r.offset + r.nbytes for r in (table.rows, table.scale)):
                raise PackageError(f"{path} is shorter than its manifest says; export the package again.")
            handle.seek(table.scale.offset)
            scale_values = np.frombuffer(handle.read(table.scale.nbytes), dtype=np.float32)
        except OSError as error:
            handle.close()
            raise PackageError(f"cannot read {path}: {error.strerror}. Export the package again.") from None
        except PackageError:
            handle.close()
            raise
        if scale_values.size != math.prod(table.scale.shape):
            handle.close()
            raise PackageError(f"{path} is shorter than its manifest says; export the package again.")
        scale_values = scale_values.reshape(table.scale.shape)
        return cls(_row_reader(handle, path, table.rows.offset, width), scale_values, width, table.block)

    def __call__(self, ids: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """out: a float32 array of the result's shape to write into (a decode step's input), or None."""
        ids = np.asarray(ids, dtype=np.int64)
        flat = ids.reshape(-1).tolist()
        rows = np.empty((len(flat), self.width), dtype=np.uint8 if self.block else np.int8)
        for k, token in enumerate(flat):
            self._read_row(token, rows[k])
        if out is None:
            out = np.empty((*ids.shape, self.width), dtype=np.float32)
        flat_out = out.reshape(len(flat), self.width)
        if not self.block:  # [n, C] int8 * [n, 1] float32 -> float32, computed once in float32 (every decode step)
            np.multiply(rows, self.scale.take(flat)[:, None], out=flat_out)
            return out
        np.subtract(rows, np.float32(128), out=flat_out)  # exact: codes 1..255
        blocks = flat_out.reshape(len(flat), self.width // self.block, self.block)
        np.multiply(blocks, self.scale.take(flat, axis=0)[:, :, None], out=blocks)
        return out


def _row_reader(handle, path: Path, offset: int, width: int):
    """read_row(token, out): positioned reads, safe from any number of threads."""
    if hasattr(os, "preadv"):
        fd = handle.fileno()

        def read_row(token, out):
            if os.preadv(fd, [out], offset + token * width) != width:
                raise PackageError(f"{path} is shorter than its manifest says; export the package again.")
    else:  # Windows: no positioned reads in os; one lock around seek + read
        lock = threading.Lock()

        def read_row(token, out):
            with lock:
                handle.seek(offset + token * width)
                if handle.readinto(out) != width:
                    raise PackageError(f"{path} is shorter than its manifest says; export the package again.")

    read_row.handle = handle  # keeps the file open as long as the reader lives
    return read_row
