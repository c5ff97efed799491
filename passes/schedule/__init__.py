"""Models that choose and never rewrite IR: the matmul schedule space, its cost model,
the autotuning policy and the autotuner's cache of winners."""
