"""Graph op -> vector-engine function: the one table lives in `ir/vector_fns.py` (the
roofline bound, `ir/graph_work.py`, reads it below the passes); re-exported here for the
passes."""

from tilecc.ir.vector_fns import BINARY, COMMUTATIVE, UNARY, elementwise_fn, gelu_fn

__all__ = ["BINARY", "COMMUTATIVE", "UNARY", "elementwise_fn", "gelu_fn"]
