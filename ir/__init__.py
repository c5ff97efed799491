"""tilecc's IR: the xDSL dialects of the three levels and what belongs to them.

graph (graph*.py: ATen-granularity tensor ops with shape inference and numpy reference
semantics; graph_interp.py evaluates a graph), tile (tile.py: kernels as loops over on-chip
tiles), npu (npu.py: instructions on engine queues, loops kept structured), with the
affine index expressions npu fields use (affine.py) and element types (dtypes.py).
"""
