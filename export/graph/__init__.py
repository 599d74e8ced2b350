"""The graph kit: the ONNX pieces every family's decoder graph is built from (export/families/*/graph.py).

builder.py     GraphBuilder: nodes and initializers by name, large weights as external data
contract.py    the decoder's inputs and outputs (the graph contract, docs/package-format.md), Decoder, OPSET
attention.py   the attention bias, the cache lengths and GroupQueryAttention over the cache
norms.py       LayerNorm and RMSNorm, each also fused with the residual add
matmuls.py     x @ W for each weight recipe: float32, int8, int4
embeddings.py  the token embedding and the LM head for each recipe, tied or not
"""
