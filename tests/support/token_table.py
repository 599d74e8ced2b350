"""The token table a package's manifest describes (graph.token_embeddings), read from its weights file."""

import math

import numpy as np


def stored_table(package, table):
    """(rows as stored, scales, the [V, C] float32 embeddings they make): int8 rows [V, C] with one scale per row,
    or uint8 rows [V, C / B, B] around 128 with one scale per block (TokenTable.block)."""
    data = (package / table.file).read_bytes()
    rows = np.frombuffer(data, table.rows.dtype, count=math.prod(table.rows.shape), offset=table.rows.offset)
    scale = np.frombuffer(data, np.float32, count=math.prod(table.scale.shape), offset=table.scale.offset)
    rows, scale = rows.reshape(table.rows.shape), scale.reshape(table.scale.shape)
    if table.block:
        return rows, scale, ((rows.astype(np.float32) - 128) * scale[..., None]).reshape(len(rows), -1)
    return rows, scale, rows * scale[:, None]
