"""Rewrites within the graph level: canonicalize-graph, fold-norm-affine, fuse-graph."""
