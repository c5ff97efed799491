"""`tilecc collective OP --bytes N --topology T --link-bandwidth-gbs B --link-latency-ns L
[--algorithm A] [--mode ideal|contention] [--json]`: how long one collective takes on an
interconnect, and its algorithm and bus bandwidth (nccl-tests' definitions).

    tilecc collective all_reduce --bytes 1MiB --topology ring:8 --link-bandwidth-gbs 50 --link-latency-ns 500
    tilecc collective all_gather --bytes 64MiB --system "torus:8x8;link=tpu-v5e-ici" --mode contention --json

The link figures default to the `trn2-neuronlink` preset (or `--link-preset`, or those of
`--system`); the algorithm defaults to the fastest that applies (simulator/interconnect/
collective.py). JSON keys: time_us, algorithm_bandwidth_gbs, bus_bandwidth_gbs, algorithm,
alpha_beta_us, ... Every bad argument is one ``error:`` line and exit 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import re

from tilecc.errors import ConfigError

SIZE_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "kib": 1024, "m": 10**6, "mb": 10**6, "mib": 2**20,
              "g": 10**9, "gb": 10**9, "gib": 2**30, "t": 10**12, "tb": 10**12, "tib": 2**40}
MAX_BYTES = 2**44  # 16 TiB
MAX_CHIPS = 2048  # a collective's schedule holds every chip's transfers (ideal mode)


def byte_size(text: str) -> int:
    """An argparse type: a byte count, optionally with a unit (1048576, 1MiB, 64KB, 1G)."""
    m = re.fullmatch(r"\s*([0-9]+)\s*([a-zA-Z]*)\s*", text)
    if not m or m.group(2).lower() not in SIZE_UNITS:
        raise argparse.ArgumentTypeError(f"'{text}' is not a byte count (e.g. 1048576, 64KiB, 1MiB, 1GiB)")
    value = int(m.group(1)) * SIZE_UNITS[m.group(2).lower()]
    if not 1 <= value <= MAX_BYTES:
        raise argparse.ArgumentTypeError(f"'{text}' must be between 1 byte and {MAX_BYTES} bytes (16 TiB)")
    return value


def nonnegative(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"'{text}' must be a finite number >= 0")
    return value


def positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"'{text}' must be a finite number > 0")
    return value


def add_parser(sub: argparse._SubParsersAction) -> None:
    from tilecc.simulator.interconnect.algorithms import ALGORITHMS, ALIASES
    from tilecc.simulator.interconnect.schedule import COLLECTIVES
    from tilecc.simulator.interconnect.system import LINK_PRESETS

    c = sub.add_parser("collective", help="time one collective (all_reduce, ...) on an interconnect topology")
    c.add_argument("op", choices=COLLECTIVES, help="the collective")
    c.add_argument("--bytes", type=byte_size, required=True, dest="nbytes",
                   help="size per chip (all-gather: the gathered output; reduce-scatter: the input), e.g. 1MiB")
    c.add_argument("--topology", help="ring:N, torus:AxB[xC], switch:N, fattree:k=K,levels=L[,oversubscription=O]")
    c.add_argument("--system", help="a .toml file with a [system] table, or the short form "
                                    "'TOPOLOGY;link=PRESET;bandwidth_gbs=B;...' (docs/system.md)")
    c.add_argument("--link-preset", choices=sorted(LINK_PRESETS), help="link figures (default trn2-neuronlink)")
    c.add_argument("--link-bandwidth-gbs", type=positive, help="GB/s per link and direction")
    c.add_argument("--link-latency-ns", type=nonnegative, help="ns per link a transfer crosses")
    c.add_argument("--hop-latency-ns", type=nonnegative, help="ns per chip a route passes through")
    c.add_argument("--switch-latency-ns", type=nonnegative, help="ns per switch a route passes through")
    c.add_argument("--algorithm", choices=sorted(list(ALGORITHMS) + list(ALIASES)),
                   help="default: the fastest that applies")
    c.add_argument("--mode", choices=["ideal", "contention"], default="ideal",
                   help="ideal: alpha-beta, no link shared; contention: links shared by the transfers crossing them")
    c.add_argument("--peer", type=int, help="send_recv: the receiving chip (default: the last)")
    c.add_argument("--json", action="store_true", help="print one JSON object")
    c.set_defaults(fn=cmd_collective)


def _system(args: argparse.Namespace):
    from tilecc.simulator.interconnect.system import LINK_PRESETS, LinkConfig, load_system, parse_link
    from tilecc.simulator.interconnect.topology import parse_topology

    if args.system is not None and args.topology is not None:
        raise ConfigError("give --topology or --system, not both")
    if args.system is not None:
        system = load_system(args.system)
        topo, link = system.topology, system.link
    elif args.topology is not None:
        topo = parse_topology(args.topology, "--topology")
        link = parse_link({"preset": args.link_preset} if args.link_preset else {}, "link")
    else:
        raise ConfigError("give --topology (e.g. ring:8) or --system")
    if args.link_preset and args.system is not None:
        link = LinkConfig(**LINK_PRESETS[args.link_preset])
    overrides = {"bandwidth_gbs": args.link_bandwidth_gbs, "latency_ns": args.link_latency_ns,
                 "hop_latency_ns": args.hop_latency_ns, "switch_latency_ns": args.switch_latency_ns}
    link = dataclasses.replace(link, **{k: v for k, v in overrides.items() if v is not None})
    if topo.n_chips > MAX_CHIPS:
        raise ConfigError(f"--topology {topo.spec} has {topo.n_chips} chips; `tilecc collective` takes at most "
                          f"{MAX_CHIPS}")
    return topo, link


def cmd_collective(args: argparse.Namespace) -> int:
    from tilecc.simulator.interconnect.bound import alpha_beta_ns
    from tilecc.simulator.interconnect.collective import run_collective

    topo, link = _system(args)
    r = run_collective(args.op, args.nbytes, topo, link, algorithm=args.algorithm, mode=args.mode, peer=args.peer)
    bound = alpha_beta_ns(args.op, r.algorithm, topo, link, args.nbytes, r.chunks, args.peer) / 1e3
    if args.json:
        d = r.to_dict()
        d.update(alpha_beta_us=bound, link=dataclasses.asdict(link))
        print(json.dumps(d, sort_keys=True))
        return 0
    print(f"{r.collective} of {r.bytes:,} bytes per chip on {r.topology} ({r.chips} chips), {r.mode} mode")
    chunks = f", {r.chunks} chunks" if r.chunks > 1 else ""
    print(f"algorithm         {r.algorithm} ({r.steps:,} steps, {r.transfers:,} transfers{chunks})")
    print(f"link              {link.bandwidth_gbs:g} GB/s, {link.latency_ns:g} ns per link, "
          f"{link.hop_latency_ns:g} ns per hop, {link.switch_latency_ns:g} ns per switch")
    print(f"time              {r.time_us:,.3f} us  (alpha-beta formula {bound:,.3f} us)")
    print(f"algorithm bw      {r.algorithm_bandwidth_gbs:,.2f} GB/s")
    print(f"bus bandwidth     {r.bus_bandwidth_gbs:,.2f} GB/s")
    print(f"link energy       {r.link_energy_uj:,.3f} uJ")
    if r.mode == "contention":
        how = f"one chip standing for all ({r.symmetry} symmetry)" if r.symmetry else "every transfer"
        print(f"simulated         {r.simulated_transfers:,} transfers, {how}")
    return 0
