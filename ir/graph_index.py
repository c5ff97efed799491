"""graph ops for indexing, slicing, joining and reductions: slice, cat, gather, embedding,
reductions, comparisons and selection.

They build on the base classes of `tilecc.ir.graph` and join the `graph` dialect there.
"""

from __future__ import annotations

INDEX_OPS: tuple = ()
