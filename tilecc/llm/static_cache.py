"""`StaticCacheLM`: a `transformers` causal LM with its KV cache as registered buffers.

`transformers`' own `StaticCache` allocates its tensors lazily and counts positions in
a tensor it mutates (`cumulative_length`), so torch.export cannot take it as module
state. This wrapper owns one key and one value buffer per layer,
``[batch, kv_heads, max_len, head_dim]``, and hands the model a `Cache` whose layers
write them in place at the positions the caller gives:

    lm = StaticCacheLM(model, batch=1, max_len=64)
    logits = lm(ids, torch.arange(P))             # prefill: positions 0..P-1
    logits = lm(next_id, torch.tensor([P]))       # decode: one position, any step

forward(input_ids [B, S], cache_position [S]) writes keys and values at
`cache_position` (`index_copy_` along the sequence: an in-place DMA scatter on the NPU,
`frontend/aten_scatter.py`), attends over the whole `max_len` cache with the mask
"key position <= query position" built from `cache_position` (so positions not yet
written never count), and returns the logits ``[B, S, vocab]``. One exported program
serves every decode step: the position is an input, never a constant.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.cache_utils import Cache, StaticLayer

from tilecc.errors import TileccError


class _BufferLayer(StaticLayer):
    """One layer's cache: the wrapper's buffers, written at the positions of the call."""

    def __init__(self, owner: StaticCacheLM, index: int):
        super().__init__(max_cache_len=owner.max_len)
        self._owner = owner
        self._index = index
        self.is_initialized = True
        self.batch_size = owner.batch
        self.num_heads = owner.kv_heads

    @property
    def keys(self) -> torch.Tensor:  # type: ignore[override]
        return getattr(self._owner, f"key_cache_{self._index}")

    @keys.setter
    def keys(self, value: torch.Tensor) -> None:  # StaticLayer's reset assigns; the buffers stay
        pass

    @property
    def values(self) -> torch.Tensor:  # type: ignore[override]
        return getattr(self._owner, f"value_cache_{self._index}")

    @values.setter
    def values(self, value: torch.Tensor) -> None:
        pass

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        pass

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        position = self._owner._cache.position
        self.keys.index_copy_(2, position, key_states.to(self.keys.dtype))
        self.values.index_copy_(2, position, value_states.to(self.values.dtype))
        return self.keys, self.values

    def get_seq_length(self) -> torch.Tensor:  # type: ignore[override]
        # the first query's position: the masks count keys at positions <= each query's
        return self._owner._cache.position[0]

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.max_cache_len, 0


class _RotaryTable(torch.nn.Module):
    """A rotary embedding as a table: the model's own (cos, sin) computed once for
    positions 0..max_len-1, looked up by position (a gather) in forward(). The position
    is a program input, and the NPU has no sin/cos: serving engines keep this table too."""

    def __init__(self, rotary: torch.nn.Module, max_len: int, like: torch.Tensor):
        super().__init__()
        object.__setattr__(self, "original", rotary)  # not a submodule: to tabulate again
        positions = torch.arange(max_len, device=like.device).unsqueeze(0)
        with torch.no_grad():
            cos, sin = rotary(like, positions)
        self.cos_table: torch.Tensor
        self.sin_table: torch.Tensor
        self.register_buffer("cos_table", cos[0].clone(), persistent=False)
        self.register_buffer("sin_table", sin[0].clone(), persistent=False)

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.cos_table[position_ids].to(x.dtype), self.sin_table[position_ids].to(x.dtype)


def _tabulate_rotary(model: torch.nn.Module, max_len: int, dtype: torch.dtype) -> None:
    """Replace each rotary embedding module of `model` by its table (in place)."""
    for name, module in list(model.named_modules()):
        if isinstance(module, _RotaryTable):
            module = module.original
        elif not type(module).__name__.endswith("RotaryEmbedding"):
            continue
        parent_name, _, attr = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        like = torch.zeros(1, dtype=dtype, device=next(model.parameters()).device)
        setattr(parent, attr, _RotaryTable(module, max_len, like))  # pyright: ignore[reportArgumentType]


class _BufferCache(Cache):
    def __init__(self, owner: StaticCacheLM):
        super().__init__(layers=[_BufferLayer(owner, i) for i in range(owner.num_layers)])
        self.position = torch.zeros(1, dtype=torch.long)  # set by each forward()


def _text_config(model: Any) -> Any:
    cfg = model.config
    return cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg


class StaticCacheLM(torch.nn.Module):
    """`model` (a `transformers` causal LM) with a static KV cache of `max_len` positions
    for `batch` sequences, kept in registered buffers that forward() updates in place."""

    def __init__(self, model: torch.nn.Module, batch: int, max_len: int, dtype: torch.dtype | None = None):
        super().__init__()
        cfg = _text_config(model)
        if batch < 1 or max_len < 1:
            raise TileccError(f"StaticCacheLM: batch ({batch}) and max_len ({max_len}) must be >= 1")
        limit = getattr(cfg, "max_position_embeddings", None) or getattr(cfg, "n_positions", None)
        if limit is not None and max_len > limit:
            raise TileccError(
                f"StaticCacheLM: a cache of {max_len} positions is longer than the model's "
                f"{limit} positions (max_position_embeddings)"
            )
        self.model = model
        self.batch = batch
        self.max_len = max_len
        self.num_layers = int(getattr(cfg, "num_hidden_layers", None) or cfg.n_layer)
        heads = int(getattr(cfg, "num_attention_heads", None) or cfg.n_head)
        self.kv_heads = int(getattr(cfg, "num_key_value_heads", None) or heads)
        hidden = int(getattr(cfg, "hidden_size", None) or cfg.n_embd)
        self.head_dim = int(getattr(cfg, "head_dim", None) or hidden // heads)
        if dtype is None:
            dtype = next(model.parameters()).dtype
        device = next(model.parameters()).device
        shape = (batch, self.kv_heads, max_len, self.head_dim)
        for i in range(self.num_layers):
            self.register_buffer(f"key_cache_{i}", torch.zeros(shape, dtype=dtype, device=device))
            self.register_buffer(f"value_cache_{i}", torch.zeros(shape, dtype=dtype, device=device))
        self._cache = _BufferCache(self)
        _tabulate_rotary(model, max_len, dtype)

    def reset(self) -> None:
        """Zero the cache (a new prompt)."""
        for i in range(self.num_layers):
            getattr(self, f"key_cache_{i}").zero_()
            getattr(self, f"value_cache_{i}").zero_()

    def forward(self, input_ids: torch.Tensor, cache_position: torch.Tensor, last_only: bool = False) -> torch.Tensor:
        """Logits [B, S, vocab] (`last_only`: [B, 1, vocab], the head applied to the last
        position only, as generation needs)."""
        self._cache.position = cache_position
        position_ids = cache_position.unsqueeze(0).expand(input_ids.shape[0], -1)
        extra = {"logits_to_keep": 1} if last_only else {}
        out = self.model(input_ids=input_ids, position_ids=position_ids, cache=self._cache,
                         use_cache=True, **extra)
        return out.logits
