"""LLM inference on the NPU: a static KV cache as module state (`static_cache`), the
prefill and decode programs over it (`programs`), greedy generation with the serving
figures (`generate`), and the `tilecc generate` command (`tilecc/generate_cli.py`)."""
