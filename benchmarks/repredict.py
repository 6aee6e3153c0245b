"""A finished run's measured points predicted again on another topology, speedups side by side.

    python -m benchmarks.repredict RUN_DIR [--topology-path FILE] [--baseline-run DIR]

Reads RUN_DIR/results.csv (a measured run of a program experiment), predicts its measured points
with the cost model on the topology in FILE (default: the shipped local one), each baseline
computing in the time its own library call took in that run, as the suite's predict step does
(`experiments.predict.predictions`), and prints per point and schedule the measured and the
predicted speedup over the run's baseline and their ratio. With `--baseline-run DIR` (a run of
the same points on another transport, e.g. gloo), also each schedule's speedup over that run's
baseline, measured and predicted (its points predicted on the shipped local topology). E.g. the
comm=shm figures of issue 19:

    python -m benchmarks.repredict runs/shm --topology-path cost_model/data/local_shm.yaml \\
        --baseline-run runs/gloo
"""
from __future__ import annotations

import argparse
from pathlib import Path

from cost_model.topology import load_topology
from experiments import registry
from experiments.api import PredictSettings
from experiments.predict import predictions
from reports.table import read_table


def rows_of(run: Path) -> list[dict]:
    df = read_table(run / "results.csv")
    return df[df.source == "measured"].to_dict("records")


def predicted(run: Path, topology_path) -> dict:
    """{(shape, schedule): predicted time_ms} of the run's measured points on the topology."""
    measured = rows_of(run)
    exp = registry.get(measured[0]["experiment"])
    topo = load_topology("local", path=topology_path)
    settings = PredictSettings(scale="default", backend="cpu", topology=topo,
                               world_size=int(measured[0]["world_size"]), max_elements=1 << 40,
                               measured=measured, out_dir=run)
    return {(r["shape"], r["schedule"]): r["time_ms"] for r in predictions(exp, settings)
            if r["source"] == "predicted" and r["topology"] == "local"}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", type=Path)
    ap.add_argument("--topology-path", default=None)
    ap.add_argument("--baseline-run", type=Path, default=None)
    a = ap.parse_args(argv)
    meas = {(r["shape"], r["schedule"]): r["time_ms"] for r in rows_of(a.run)}
    pred = predicted(a.run, a.topology_path)
    other = ({(r["shape"], r["schedule"]): r["time_ms"] for r in rows_of(a.baseline_run)}
             if a.baseline_run else {})
    other_pred = predicted(a.baseline_run, None) if a.baseline_run else {}
    print(f"{'shape':>12} {'schedule':<24} {'measured':>9} {'predicted':>9} {'pred/meas':>9}"
          + ("  vs other baseline: measured predicted" if other else ""))
    for (shape, name), ms in meas.items():
        base, pbase = meas[(shape, "baseline")], pred.get((shape, "baseline"))
        p = pred.get((shape, name))
        s_m = base / ms
        s_p = pbase / p if p and pbase else float("nan")
        line = f"{shape:>12} {name:<24} x{s_m:8.2f} x{s_p:8.2f} {s_p / s_m:9.2f}"
        if (shape, "baseline") in other:
            o_p = other_pred.get((shape, "baseline"))
            line += (f"  x{other[(shape, 'baseline')] / ms:8.2f}"
                     f" x{(o_p / p) if o_p and p else float('nan'):8.2f}")
        print(line)


if __name__ == "__main__":
    main()
