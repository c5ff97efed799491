"""LLM generation on the simulator (tilecc/llm/): a static KV cache as module state, the
prefill and decode programs over it, greedy tokens against eager `model.generate`, and
the `tilecc generate` command (figures, JSON keys, errors)."""

from __future__ import annotations

import copy
import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch

import tilecc
from tilecc.cli import main
from tilecc.errors import InputMismatchError, TileccError
from tilecc.llm.programs import compile_programs
from tilecc.llm.static_cache import StaticCacheLM

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
from gqa_decode import GqaDecode  # noqa: E402  (repeat_kv, then sdpa with the mask)

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "llm.py"
KEYS = ("tokens", "matches_eager", "ttft_us", "tpot_us", "tokens_per_second", "joules_per_token",
        "prefill_roofline_ratio", "decode_roofline_ratio")


def _examples():
    spec = importlib.util.spec_from_file_location("tilecc_test_llm_examples", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _prompt(model, batch, length, seed=1):
    vocab = model.config.vocab_size
    return torch.randint(0, vocab, (batch, length), generator=torch.Generator().manual_seed(seed))


def test_static_cache_decode_steps_match_eager():
    """Prefill then four decode steps at increasing positions: each step's logits and the
    cache buffers equal the eager wrapper's, and the eager wrapper equals the model's own
    forward over the whole sequence (so the cache, the masks and the positions are right)."""
    model = _examples().tiny_llama()
    ids = _prompt(model, 1, 6)
    progs = compile_programs(copy.deepcopy(model), batch=1, prompt_len=6, max_len=12)
    eager = StaticCacheLM(copy.deepcopy(model), batch=1, max_len=12).eval()
    seq = ids
    with torch.no_grad():
        want = eager(ids, torch.arange(6), last_only=True)
    got = progs.prefill(ids, torch.arange(6))
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    for step in range(4):
        token = want[:, -1].argmax(-1, keepdim=True)
        seq = torch.cat([seq, token], 1)
        pos = torch.tensor([6 + step])
        with torch.no_grad():
            want = eager(token, pos, last_only=True)
            full = model(seq).logits[:, -1:]
        got = progs.decode(token, pos)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(want, full, rtol=1e-4, atol=1e-4)
    for name in ("key_cache_0", "value_cache_1"):
        torch.testing.assert_close(progs.decode.state.buffers[f"lm.{name}"], getattr(eager, name), rtol=1e-4, atol=1e-4)
    # one decode program served every step: the position is an input
    names = [s.name for s in progs.decode.program.inputs]
    assert "input_ids" in names and "cache_position" in names


def test_prefill_positions_are_constants_so_its_attention_is_causal():
    """The prefill fills an empty cache from position 0, so its positions are constants
    of the program: the mask built from them is the causal pattern at compile time (the
    flash kernel skips the masked tiles and the cache slots past the prompt), and the
    logits and the cache still equal the eager wrapper's. Positions other than 0..P-1 are
    refused (the program could not honour them)."""
    model = _examples().tiny_llama()
    ids = _prompt(model, 1, 40)
    progs = compile_programs(copy.deepcopy(model), batch=1, prompt_len=40, max_len=48)
    assert progs.prefill.program is not None
    assert [s.name for s in progs.prefill.program.inputs if not s.name.startswith("buffer:")] == ["input_ids"]
    notes = [r["message"] for r in progs.prefill.program.meta["remarks"]]
    assert sum("mask is the causal pattern" in n for n in notes) == 2, notes  # one per layer
    eager = StaticCacheLM(copy.deepcopy(model), batch=1, max_len=48).eval()
    with torch.no_grad():
        want = eager(ids, torch.arange(40), last_only=True)
    torch.testing.assert_close(progs.prefill(ids), want, rtol=1e-4, atol=1e-4)
    for name in ("key_cache_0", "value_cache_1"):
        torch.testing.assert_close(progs.prefill.state.buffers[f"lm.{name}"], getattr(eager, name),
                                   rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(progs.prefill(ids, torch.arange(40)), want, rtol=1e-4, atol=1e-4)
    with pytest.raises(InputMismatchError, match=r"positions must be 0\.\.39"):
        progs.prefill(ids, torch.arange(40) + 1)
    with pytest.raises(InputMismatchError, match="positions must be"):
        progs.prefill(ids, torch.arange(39))
    # the next token through the decode program at position 40 still matches the model
    token = want[:, -1].argmax(-1, keepdim=True)
    with torch.no_grad():
        full = model(torch.cat([ids, token], 1)).logits[:, -1:]
    torch.testing.assert_close(progs.decode(token, torch.tensor([40])), full, rtol=1e-4, atol=1e-4)


def test_generate_llama_batch2_matches_eager_and_reports_figures():
    model = _examples().tiny_llama()
    ids = _prompt(model, 2, 8)
    result = tilecc.generate(model, ids, 5)
    assert result.matches_eager is True
    assert result.tokens == result.eager_tokens and len(result.tokens) == 2 and len(result.tokens[0]) == 5
    assert result.tokens[0] != result.tokens[1]
    assert 0 < result.tpot_us and 0 < result.ttft_us
    assert result.tokens_per_second == pytest.approx(2 * 1e6 / result.tpot_us)
    assert result.joules_per_token > 0
    assert result.prefill_roofline_ratio >= 1.0 and result.decode_roofline_ratio >= 1.0


def test_cli_generate_json(capsys):
    code = main(["generate", f"{EXAMPLE}:tiny_gpt2", "--prompt-len", "5", "--new-tokens", "3", "--json", "-q"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0
    for key in KEYS:
        assert key in out, key
    assert out["matches_eager"] is True and len(out["tokens"][0]) == 3 and out["tokens"] == out["eager_tokens"]


def _error(capsys, argv) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ")
    return err[0]


def test_cli_generate_errors(capsys, tmp_path):
    assert "has no callable 'nope'" in _error(capsys, ["generate", f"{EXAMPLE}:nope", "--prompt-len", "4",
                                                         "--new-tokens", "2", "-q"])
    assert "no such Python file" in _error(capsys, ["generate", f"{tmp_path}/x.py:f", "--prompt-len", "4",
                                                      "--new-tokens", "2", "-q"])
    assert ">= 1" in _error(capsys, ["generate", f"{EXAMPLE}:tiny_llama", "--prompt-len", "0",
                                     "--new-tokens", "2", "-q"])
    # the tiny models hold 256 positions
    assert "longer than the model's 256 positions" in _error(
        capsys, ["generate", f"{EXAMPLE}:tiny_llama", "--prompt-len", "250", "--new-tokens", "10", "-q"])
    bad = tmp_path / "notlm.py"
    bad.write_text("import torch\ndef f():\n    return torch.nn.Linear(2, 2)\n")
    assert "must return a transformers causal LM" in _error(
        capsys, ["generate", f"{bad}:f", "--prompt-len", "4", "--new-tokens", "2", "-q"])


def test_prompt_longer_than_cache_is_an_error():
    model = _examples().tiny_llama()
    with pytest.raises(TileccError, match="do not fit the cache of 8 positions"):
        tilecc.generate(model, _prompt(model, 1, 6), 4, max_len=8)
    with pytest.raises(TileccError, match="longer than the cache"):
        compile_programs(model, batch=1, prompt_len=9, max_len=8)


@pytest.mark.slow
@pytest.mark.parametrize("factory", ["tiny_qwen2", "tiny_mistral", "tiny_gemma", "tiny_gpt2"])
def test_generate_families_match_eager(factory):
    model = getattr(_examples(), factory)()
    result = tilecc.generate(model, _prompt(model, 1, 7), 6)
    assert result.matches_eager is True, (result.tokens, result.eager_tokens)


@pytest.mark.slow
def test_timing_only_gives_the_functional_figures():
    model = _examples().tiny_llama()
    ids = _prompt(model, 2, 6)
    full = tilecc.generate(copy.deepcopy(model), ids, 3)
    timing = tilecc.generate(model, ids, 3, timing_only=True)
    assert timing.tokens is None and timing.matches_eager is None
    assert timing.tpot_us == pytest.approx(full.tpot_us, rel=1e-6)
    assert timing.ttft_us == pytest.approx(full.ttft_us, rel=1e-6)


@pytest.mark.parametrize("weights", [pytest.param("bf16", marks=pytest.mark.slow), "int8"])
def test_meta_device_model_times_like_the_same_model_with_weights(weights):
    """A model built on the meta device (no weight values, as benchmarks/llm.py builds
    Llama-1B/8B shapes) generates timing-only with exactly the figures of the same
    architecture holding real weights: timing never depends on values."""
    tiny = _examples().TINY  # first: it stubs torchvision's registrations for transformers
    from transformers import LlamaConfig, LlamaForCausalLM

    from tilecc.quantize import quantize_weights

    cfg = LlamaConfig(**tiny)
    torch.manual_seed(0)
    real = LlamaForCausalLM(cfg).to(torch.bfloat16).eval()
    with torch.device("meta"):
        meta = LlamaForCausalLM(cfg).to(torch.bfloat16).eval()
    if weights == "int8":
        real, meta = (quantize_weights(m, "int8", skip=("lm_head",)) for m in (real, meta))
    ids = _prompt(real, 1, 5)
    got = [tilecc.generate(m, ids, 2, timing_only=True, check_eager=False, critical_path=True)
           for m in (real, meta)]
    assert got[1].tpot_us == got[0].tpot_us > 0 and got[1].ttft_us == got[0].ttft_us > 0
    assert got[1].decode_roofline_ratio == got[0].decode_roofline_ratio
    # the chains too (timing-only runs of both programs): equal, and as long as the steps
    assert got[1].decode_critical_path == got[0].decode_critical_path
    assert got[1].prefill_critical_path == got[0].prefill_critical_path
    clock_mhz = tilecc.simulator.config.load_config("tiny").clock_ghz * 1e3
    assert got[1].decode_critical_path["cycles"] == pytest.approx(got[1].tpot_us * clock_mhz)
    with pytest.raises(TileccError, match="meta device"):
        tilecc.generate(meta, ids, 2, timing_only=True, check_eager=False, trace="t.json")


class _RotateHalf(torch.nn.Module):
    def forward(self, x):
        half = x.shape[-1] // 2
        return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


@pytest.mark.parametrize("shape", [(2, 16, 1, 64), (3, 1, 5, 8)])
def test_decode_shape_concat_fills_partitions(shape):
    """A decode step's rotate-half (``[B, H, 1, D]``) concatenates rows of the output
    viewed as ``[B * H, D]``: one DMA pair per input, not one per (batch, head)."""
    x = torch.randn(*shape)
    cm = tilecc.compile(_RotateHalf().eval(), (x,))
    torch.testing.assert_close(cm(x), _RotateHalf()(x))
    (count,) = [n for name, _, n in cm.program.kernels if "concat" in name]
    assert count <= 8, count


@pytest.mark.slow
def test_torch_compile_inside_model_generate_runs_decode_on_the_npu():
    """`torch.compile(model.forward, backend="tilecc")` in `model.generate(...,
    cache_implementation="static")`: two graphs (prefill, decode step), each compiled
    once; the decode graph runs for every further token; the tokens equal eager's."""
    from tilecc.llm.compiled_generate import generate_compiled

    model = _examples().tiny_llama()
    result = generate_compiled(model, _prompt(model, 1, 6), 4)
    assert result.matches_eager is True, (result.tokens, result.eager_tokens)
    e = result.explanation
    assert e.graphs == 2
    decode = e.plans[1].npu_partitions
    assert len(decode) == 1 and decode[0].runs == 3 and decode[0].compiled
    assert e.npu_share > 0.9  # the rotary embedding's sin / cos fall back
    assert any("aten.sin" in f.op for f in e.fallbacks)
    assert "op(s) on the NPU" in str(e)
    assert type(model).forward is model.forward.__func__  # restored


class _CacheWrite(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("cache", torch.zeros(4, 3, 8, 5))

    def forward(self, k, pos):
        self.cache.index_copy_(2, pos, k)
        return self.cache * 1.0


def test_decode_cache_write_is_one_scatter_per_tile_of_rows():
    """Writing one position of every (batch, head) row: one broadcast index, one offsets
    column, one rows load and one scatter, not three DMAs per (batch, head)."""
    model, eager = _CacheWrite().eval(), _CacheWrite().eval()
    cm = tilecc.compile(model, (torch.randn(4, 3, 1, 5), torch.tensor([0])))
    for p in (6, 2):
        k = torch.randn(4, 3, 1, 5)
        torch.testing.assert_close(cm(k, torch.tensor([p])), eager(k, torch.tensor([p])))
    (count,) = [n for name, _, n in cm.program.kernels if "scatter" in name]
    assert count <= 6, count


def test_grouped_decode_attention_reads_the_cache_once_per_kv_head():
    """One query row per head: the G query heads of a KV head become G rows of one
    attention over that head's cache, with no expanded (repeat_kv) copy of the cache."""
    q, k, v = torch.randn(3, 8, 1, 16), torch.randn(3, 2, 24, 16), torch.randn(3, 2, 24, 16)
    mask = torch.zeros(3, 1, 1, 24)
    mask[:, :, :, 13:] = float("-inf")  # positions not yet written
    cm = tilecc.compile(GqaDecode().eval(), (q, k, v, mask))
    torch.testing.assert_close(cm(q, k, v, mask), GqaDecode()(q, k, v, mask), rtol=1e-4, atol=1e-4)
    names = [name for name, _, _ in cm.program.kernels]
    assert any("attention" in n for n in names) and not any("copy" in n or "expand" in n for n in names), names


def test_cli_generate_critical_path(capsys):
    """`--critical-path` adds the prefill's and one decode step's chains: their cycles are
    the programs' (TTFT and TPOT in cycles), their kinds add up to them, and each layer
    kernel's launches are summed (two layers: two launches)."""
    code = main(["generate", f"{EXAMPLE}:tiny_llama", "--prompt-len", "6", "--new-tokens", "3", "--critical-path",
                 "--json", "-q"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["matches_eager"] is True
    clock_mhz = tilecc.simulator.config.load_config("tiny").clock_ghz * 1e3
    for what, us in (("prefill", out["ttft_us"]), ("decode", out["tpot_us"])):
        cp = out[f"{what}_critical_path"]
        assert cp["cycles"] == pytest.approx(us * clock_mhz)
        assert sum(cp["by_kind"].values()) == pytest.approx(cp["cycles"])
        assert any(row["launches"] == 2 for row in cp["by_family"]), cp["by_family"]
    assert main(["generate", f"{EXAMPLE}:tiny_llama", "--prompt-len", "6", "--new-tokens", "2", "--critical-path",
                 "-q"]) == 0
    text = capsys.readouterr().out
    assert "decode step:" in text and "instructions set the cycles" in text and " x2 " in text
