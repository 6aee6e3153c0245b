"""A finished run's measured points predicted again on other topologies, speedups side by side.

    python -m benchmarks.repredict RUN_DIR [--topology-path FILE] [--gloo-topology-path FILE]

Reads RUN_DIR/results.csv (a measured run of a program experiment), predicts its measured points
with the cost model on the topology in FILE (default: the shipped local one), each baseline
computing in the time its own library call took in that run, as the suite's predict step does
(`experiments.predict.predictions`), and prints per point and schedule the measured speedup over
the run's baseline (the paired median of the interleaved rounds) beside the predicted one and
their ratio. A comm=shm run also timed the library baseline on gloo in the same rounds (schedule
`baseline(gloo)`, `speedup_gloo` on every row): that baseline is predicted on the gloo topology
(`--gloo-topology-path`, default the shipped local one; a calibration's topology.yaml beside its
topology_shm.yaml), as the suite's predict step does (`PredictSettings.gloo_topology`), and
each schedule's speedup over it printed too, measured and predicted. E.g.

    python -m benchmarks.repredict outputs/adam_shm \\
        --topology-path .cache/calibration/KEY/topology_shm.yaml \\
        --gloo-topology-path .cache/calibration/KEY/topology.yaml
"""

from __future__ import annotations

import argparse
from pathlib import Path

from cost_model.topology import load_topology
from experiments import registry
from experiments.api import PredictSettings
from experiments.harness import GLOO_BASELINE
from experiments.predict import predictions
from reports.results import read_table


def rows_of(run: Path) -> list[dict]:
    df = read_table(run / "results.csv")
    return df[df.source == "measured"].to_dict("records")


def predicted(run: Path, measured: list[dict], topology_path, gloo_topology_path) -> dict:
    """{(shape, schedule): predicted row} of the measured points on the topology (a comm=shm
    run's gloo baseline, and each row's speedup_gloo, on the gloo topology)."""
    exp = registry.get(measured[0]["experiment"])
    topo = load_topology("local", path=topology_path)
    settings = PredictSettings(
        scale="default",
        backend="cpu",
        topology=topo,
        world_size=int(measured[0]["world_size"]),
        max_elements=1 << 40,
        measured=measured,
        out_dir=run,
        gloo_topology=load_topology("local", path=gloo_topology_path),
    )
    return {
        (r["shape"], r["schedule"]): r
        for r in predictions(exp, settings)
        if r["source"] == "predicted" and r["topology"] == "local"
    }


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", type=Path)
    ap.add_argument("--topology-path", default=None)
    ap.add_argument("--gloo-topology-path", default=None)
    a = ap.parse_args(argv)
    rows = rows_of(a.run)
    pred = predicted(a.run, rows, a.topology_path, a.gloo_topology_path)
    gloo = any(r["schedule"] == GLOO_BASELINE for r in rows)
    print(
        f"{'shape':>12} {'schedule':<24} {'measured':>9} {'predicted':>9} {'pred/meas':>9}"
        + ("   over gloo's baseline: measured predicted pred/meas" if gloo else "")
    )
    for r in rows:
        shape, name = r["shape"], r["schedule"]
        if name == GLOO_BASELINE:
            continue
        p = pred.get((shape, name), {})
        s_p = p.get("speedup", float("nan"))
        line = f"{shape:>12} {name:<24} x{r['speedup']:8.3f} x{s_p:8.3f} {s_p / r['speedup']:9.3f}"
        if gloo:
            g_p = p.get("speedup_gloo", float("nan"))
            line += f"   x{r['speedup_gloo']:8.3f} x{g_p:8.3f} {g_p / r['speedup_gloo']:9.3f}"
        print(line)


if __name__ == "__main__":
    main()
