"""Design-space exploration: `tilecc sweep` (issue 23).

    spec.py        the sweep spec (TOML), validated: workloads, base config, objectives, space
    objectives.py  the objectives' table: unit, direction, formula over a point's figures
    pareto.py      Pareto fronts (minimised and maximised objectives, ties, NaN)
    systems.py     the multi-chip axes: system keys, tp / pp / dp, a point's deployment
    evaluate.py    full fidelity: compile, simulate and check one (workload, config)
    evaluate_system.py  full fidelity over several chips or dp replicas
    estimate.py    estimate fidelity: the roofline bound, calibrated on simulated points
    backends.py    where tasks run: this process, a local pool, Ray
    nsga2.py       strategy = "nsga2" (Optuna's NSGA-II sampler)
    results.py     results.csv, written point by point (resume)
    execute.py     the sweep: points -> tasks -> rows -> Pareto -> report
    report_html.py report.html: Pareto plots, the Pareto points' bottlenecks, the table
    cli.py         the `tilecc sweep` subcommand

The area model the `perf_per_mm2` objective reads is the simulator's (`simulator/area.py`).
"""
