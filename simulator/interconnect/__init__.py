"""Many chips: the system description, interconnect topologies with routing, collective
algorithms as schedules of point-to-point transfers, and the link-level simulator
(`ideal` alpha-beta and `contention` event modes). docs/system.md describes the model.

    system.py       SystemConfig, LinkConfig: the `[system]` TOML table / short form
    topology.py     ring / torus / switch / fat-tree: chips, switches, directed links
    routing.py      the route of a chip-to-chip transfer on each topology
    schedule.py     Schedule: steps of (src, dst, offsets, elements, reduce?) transfers
    algorithms.py   ring, multi-dimensional ring, halving-doubling, double binary tree, ...
    functional.py   runs a schedule on numpy buffers (real data)
    ideal.py        alpha-beta time of a schedule (critical path, no link sharing)
    formulas.py     the closed forms of the alpha-beta model
    bound.py        an algorithm's closed form on a topology (each step's slowest route)
    contention.py   event simulation with link bandwidth shared among transfers
    collective.py   run_collective(): time, algorithm / bus bandwidth, chosen algorithm
"""
