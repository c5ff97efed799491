"""`tilecc generate FILE.py:FACTORY --prompt-len P --new-tokens N [--batch B] [--target T]
[--timing-only] [--trace F] [--critical-path] [--json] [--weights bf16|int8|fp8|w8a8]`: greedy decoding of a
`transformers` causal LM on the simulated NPU, with the serving figures.

    tilecc generate examples/llm.py:tiny_llama --prompt-len 16 --new-tokens 8
    tilecc generate examples/llm.py:llama_mid --prompt-len 128 --new-tokens 4 --batch 8 \\
        --target cloud --weights bf16 --timing-only --json

`FACTORY()` returns the model (or `(model, anything)`, as `tilecc run`'s factories do).
The prompt is random token ids (seed `--seed`); tilecc compiles a prefill and a decode
program over a static KV cache (tilecc/llm/), decodes greedily, prints the tokens, whether
they equal eager `model.generate(..., do_sample=False)` exactly, and TTFT, TPOT, tokens/s,
J/token and the prefill / decode roofline ratios. `--timing-only` simulates without
values (no tokens, no comparison). Exit status: 0, or 1 when the tokens differ from
eager's; every bad argument is one ``error:`` line and exit 2.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

from tilecc.cli_args import add_quiet, one_line, output_file
from tilecc.errors import ModelLoadError, TileccError

WEIGHTS = ("native", "bf16", "int8", "fp8", "w8a8")


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"'{text}' must be an integer >= 1")
    return value


def load_lm(spec: str) -> Any:
    """Run `FILE.py:FACTORY` and return the causal LM it builds."""
    if ":" not in spec:
        raise ModelLoadError(f"'{spec}': expected FILE.py:FACTORY")
    path_s, _, name = spec.rpartition(":")
    path = Path(path_s)
    if not path.is_file() or path.suffix != ".py":
        raise ModelLoadError(f"'{path_s}': no such Python file (expected FILE.py:FACTORY)")
    mod_name = f"tilecc_user_{path.stem}"
    loader_spec = importlib.util.spec_from_file_location(mod_name, path)
    if loader_spec is None or loader_spec.loader is None:
        raise ModelLoadError(f"'{path_s}': cannot be imported as a Python file")
    module = importlib.util.module_from_spec(loader_spec)
    sys.modules[mod_name] = module
    try:
        loader_spec.loader.exec_module(module)
        factory = getattr(module, name, None)
        if not callable(factory):
            raise ModelLoadError(f"'{path_s}' has no callable '{name}'")
        result = factory()
    except TileccError:
        raise
    except Exception as e:  # the user's file or factory failed: one line
        raise ModelLoadError(f"{spec} raised {type(e).__name__}: {one_line(str(e))}") from None
    model = result[0] if isinstance(result, tuple) else result
    if not (hasattr(model, "generate") and hasattr(model, "config")):
        raise ModelLoadError(f"{spec}() must return a transformers causal LM (a model with .generate), "
                             f"got {type(model).__name__}")
    return model


def apply_weights(model: Any, weights: str) -> Any:
    """The model in the weight format `weights` (native, bf16, int8, fp8, w8a8:
    `tilecc.quantize.SCHEMES`)."""
    import torch

    if weights == "bf16":
        return model.to(torch.bfloat16)
    if weights in ("int8", "fp8", "w8a8"):
        try:
            from tilecc.quantize import quantize_scheme
        except ImportError:
            raise TileccError(f"--weights {weights}: weight quantisation (tilecc.quantize) is not in this "
                              "build of tilecc") from None
        return quantize_scheme(model, weights, skip=("lm_head",))
    return model


def cmd_generate(args: argparse.Namespace) -> int:
    import torch

    from tilecc.llm.generate import generate

    model = apply_weights(load_lm(args.source), args.weights)
    vocab = int(model.config.get_text_config().vocab_size)
    gen = torch.Generator().manual_seed(args.seed)
    ids = torch.randint(0, vocab, (args.batch, args.prompt_len), generator=gen)
    result = generate(model, ids, args.new_tokens, target=args.target, timing_only=args.timing_only,
                      trace=args.trace, critical_path=args.critical_path)
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
    else:
        print(result)
    return 1 if result.matches_eager is False else 0


def add_parser(sub: Any) -> None:
    g = sub.add_parser("generate", help="greedy decoding of a transformers causal LM on the simulator: "
                                        "tokens against eager, TTFT, TPOT, tokens/s, J/token")
    g.add_argument("source", help="FILE.py:FACTORY (FACTORY() returns a transformers causal LM)")
    g.add_argument("--prompt-len", type=positive_int, required=True, help="prompt tokens (random ids)")
    g.add_argument("--new-tokens", type=positive_int, required=True, help="tokens to generate")
    g.add_argument("--batch", type=positive_int, default=1, help="sequences decoded together (default 1)")
    g.add_argument("--target", default="tiny", help="preset name (tiny, edge, cloud) or a TOML file")
    g.add_argument("--weights", choices=WEIGHTS, default="native",
                   help="weight format: native (as built), bf16, int8 or fp8 (weight-only), or w8a8 (int8 "
                        "weights and per-token int8 activations); lm_head kept")
    g.add_argument("--timing-only", action="store_true",
                   help="simulate without values: figures only, no tokens, no comparison with eager")
    g.add_argument("--trace", type=output_file, help="write the first decode step's Perfetto timeline there")
    g.add_argument("--critical-path", action="store_true",
                   help="print the chains of instructions that set the prefill's and one decode step's cycles, "
                        "by kind and by kernel (a shared layer kernel's launches summed)")
    g.add_argument("--seed", type=int, default=0, help="seed of the random prompt (default 0)")
    g.add_argument("--json", action="store_true")
    add_quiet(g)
    g.set_defaults(fn=cmd_generate)
