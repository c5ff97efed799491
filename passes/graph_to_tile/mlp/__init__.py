"""The fused MLP kernel: up projection, bias, activation, down projection, bias (and a
residual), with the hidden activation kept in SRAM, transposed (entry.py)."""
