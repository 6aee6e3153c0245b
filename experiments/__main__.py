"""`python -m experiments NAME [--module SPEC] [--scale smoke] [--out DIR] [--world-size N]`:
measure one experiment on ranks without Hydra, e.g. on ranks started by torchrun:

    torchrun --nproc_per_node=2 -m experiments adam_fusion --scale smoke --out /tmp/run

Every rank runs the same command; rank 0 writes DIR/results.csv and DIR/kernels/. This is the
same harness `python -m suite` uses (which starts its own local ranks). `--module` loads a user's
experiment first (a dotted module name or a .py file, as `experiment.module=` does).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch.distributed as dist

from codegen.logs import configure

from . import MeasureSettings, RegistryError, get, harness, load_module

MAX_ELEMENTS = {"smoke": 1 << 16, "default": 1 << 25, "paper": 1 << 27}


def main() -> None:
    configure()
    ap = argparse.ArgumentParser(prog="python -m experiments")
    ap.add_argument("name")
    ap.add_argument("--module", default=None)
    ap.add_argument("--scale", default="smoke", choices=sorted(MAX_ELEMENTS))
    ap.add_argument("--out", default="runs/experiments")
    ap.add_argument("--world-size", type=int, default=int(os.environ.get("WORLD_SIZE", "2")))
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    try:
        if args.module:
            load_module(args.module)
        exp = get(args.name)
    except (KeyError, RegistryError) as e:
        print(f"error: {e.args[0]}", file=sys.stderr)
        raise SystemExit(2) from None
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    settings = MeasureSettings(
        scale=args.scale,
        max_elements=MAX_ELEMENTS[args.scale],
        world_size=args.world_size,
        warmup=1,
        repeats=args.repeats,
        csv_path=out / "results.csv",
        kernels_dir=out / "kernels",
    )
    rows = exp.measure(settings) if exp.measure else harness.measure(exp, settings)
    shutdown()
    if int(os.environ.get("RANK", "0")) == 0:
        bad = [r for r in rows if not r["verified"]]
        print(f"{len(rows)} points measured, {len(bad)} not verified; {settings.csv_path}")
        raise SystemExit(1 if bad else 0)


def shutdown() -> None:
    """Leave the process group together (torchrun's ranks): a rank that exits while its peer's
    gloo threads still talk to it can abort that peer at exit (seen once in CI: SIGABRT)."""
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
