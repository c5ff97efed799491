"""graph ops for convolutional networks: convolution, pooling, batch norm, resizing, padding.

They build on the base classes of `tilecc.ir.graph` and join the `graph` dialect there.
"""

from __future__ import annotations

NN_OPS: tuple = ()
