"""Collectives on interconnect topologies: time and bus bandwidth against the alpha-beta bound.

    .venv/bin/python benchmarks/collectives.py [--link-preset trn2-neuronlink] [--sizes 1KiB,1MiB,1GiB]
                                               [--chips 8,64,1024] [--quick]

For all-reduce, all-gather and reduce-scatter, 1 KiB - 1 GiB per chip, on rings, tori,
switches and fat-trees of 8 to 1,024 chips: the algorithm `tilecc collective` picks (the
fastest whose steps share no link), its alpha-beta closed form (simulator/interconnect/
bound.py), the ideal-mode time (the critical path of its schedule, no link shared) and the
contention-mode time (the event simulation with link bandwidth shared), each with its bus
bandwidth (nccl-tests' definition), and the wall time of both simulations. `ideal/ab` is
1.000 where the schedule's steps are uniform; contention equals ideal for the schedules
that share no link. A second table runs every algorithm that applies (1 MiB all-reduce on
the 64-chip topologies), where contention mode shows what sharing links costs.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tilecc.collective_cli import byte_size  # noqa: E402
from tilecc.simulator.interconnect.algorithms import applicable  # noqa: E402
from tilecc.simulator.interconnect.bound import alpha_beta_ns  # noqa: E402
from tilecc.simulator.interconnect.collective import run_collective  # noqa: E402
from tilecc.simulator.interconnect.formulas import bus_factor  # noqa: E402
from tilecc.simulator.interconnect.system import LINK_PRESETS, LinkConfig  # noqa: E402
from tilecc.simulator.interconnect.topology import parse_topology  # noqa: E402

TOPOLOGIES = {  # chips -> one topology of each kind
    8: ["ring:8", "torus:2x4", "switch:8", "fattree:k=2,levels=3,oversubscription=2"],
    64: ["ring:64", "torus:8x8", "switch:64", "fattree:k=8,levels=2,oversubscription=2"],
    1024: ["ring:1024", "torus:32x32", "switch:1024", "fattree:k=32,levels=2,oversubscription=2"],
}
COLLECTIVES = ["all_reduce", "all_gather", "reduce_scatter"]


def _size(n: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n} B"


def row(coll: str, spec: str, nbytes: int, link: LinkConfig, algorithm: str | None = None) -> str:
    topo = parse_topology(spec)
    t0 = time.perf_counter()
    ideal = run_collective(coll, nbytes, topo, link, algorithm=algorithm, mode="ideal")
    t1 = time.perf_counter()
    cont = run_collective(coll, nbytes, topo, link, algorithm=ideal.algorithm, mode="contention")
    t2 = time.perf_counter()
    ab = alpha_beta_ns(coll, ideal.algorithm, topo, link, nbytes, ideal.chunks) / 1e3
    ab_bus = nbytes / (ab * 1e3) * bus_factor(coll, topo.n_chips)
    return (f"| {coll} | {spec} | {topo.n_chips} | {_size(nbytes)} | {ideal.algorithm} | {ab:,.2f} | "
            f"{ideal.time_us:,.2f} | {cont.time_us:,.2f} | {ideal.time_us / ab:.3f} | {cont.time_us / ab:.3f} | "
            f"{ab_bus:,.1f} | {ideal.bus_bandwidth_gbs:,.1f} | {cont.bus_bandwidth_gbs:,.1f} | "
            f"{(t1 - t0) * 1e3:,.0f} / {(t2 - t1) * 1e3:,.0f} |")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--link-preset", default="trn2-neuronlink", choices=sorted(LINK_PRESETS))
    ap.add_argument("--sizes", default="1KiB,1MiB,1GiB", help="comma-separated sizes per chip")
    ap.add_argument("--chips", default="8,64,1024", help="comma-separated, from 8, 64, 1024")
    ap.add_argument("--quick", action="store_true", help="1 MiB on 8 and 64 chips only")
    args = ap.parse_args(argv)
    link = LinkConfig(**LINK_PRESETS[args.link_preset])
    sizes = [byte_size(s) for s in args.sizes.split(",")] if not args.quick else [2**20]
    chips = [int(c) for c in args.chips.split(",")] if not args.quick else [8, 64]
    print(f"link: {args.link_preset}: {link.bandwidth_gbs:g} GB/s per link and direction, "
          f"{link.latency_ns:g} ns per link, {link.hop_latency_ns:g} ns per hop, {link.switch_latency_ns:g} ns "
          f"per switch\n")
    t0 = time.perf_counter()
    print("The algorithm tilecc picks:\n")
    print(HEADER)
    for coll in COLLECTIVES:
        for n in chips:
            for spec in TOPOLOGIES[n]:
                for nbytes in sizes:
                    print(row(coll, spec, nbytes, link), flush=True)
    print("\nEvery algorithm that applies, 1 MiB all-reduce, 64 chips:\n")
    print(HEADER)
    for spec in TOPOLOGIES[64]:
        for alg in applicable("all_reduce", parse_topology(spec), 2**20):
            print(row("all_reduce", spec, 2**20, link, alg), flush=True)
    print(f"\n{time.perf_counter() - t0:.1f} s in all")


HEADER = ("| collective | topology | chips | size | algorithm | alpha-beta us | ideal us | contention us | "
          "ideal/ab | contention/ab | ab busbw GB/s | ideal busbw | contention busbw | sim ms (ideal / cont.) |\n"
          "| --- | --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")


if __name__ == "__main__":
    main()
