"""lower-graph-to-tile, the conversion from the graph level to the tile level, as a package:
the pass (`conversion.py`), its typed context (`context.py`), the op registry
(`registry.py`) and one module per op family (see docs/architecture.md)."""
