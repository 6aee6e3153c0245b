"""`python -m experiments NAME [--scale smoke] [--out DIR] [--world-size N]`: measure one experiment
on ranks without Hydra, e.g. on ranks started by torchrun:

    torchrun --nproc_per_node=2 -m experiments adam_fusion --scale smoke --out /tmp/run

Every rank runs the same command; rank 0 writes DIR/results.csv and DIR/kernels/. This is the
same runtime `python -m suite` uses (which starts its own local ranks).
"""
from __future__ import annotations

import argparse
import os
from pathlib import Path

from . import EXPERIMENTS, MeasureSettings, load

MAX_ELEMENTS = {"smoke": 1 << 16, "default": 1 << 25, "paper": 1 << 27}


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m experiments")
    ap.add_argument("name", choices=EXPERIMENTS)
    ap.add_argument("--scale", default="smoke", choices=sorted(MAX_ELEMENTS))
    ap.add_argument("--out", default="runs/experiments")
    ap.add_argument("--world-size", type=int, default=int(os.environ.get("WORLD_SIZE", "2")))
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    mod = load(args.name)
    if not hasattr(mod, "measure"):
        raise SystemExit(f"error: {args.name} has no local measurement yet")
    settings = MeasureSettings(scale=args.scale, max_elements=MAX_ELEMENTS[args.scale],
                               world_size=args.world_size, warmup=1, repeats=args.repeats,
                               csv_path=out / "results.csv", kernels_dir=out / "kernels")
    rows = mod.measure(settings)
    shutdown()
    if int(os.environ.get("RANK", "0")) == 0:
        bad = [r for r in rows if not r["verified"]]
        print(f"{len(rows)} points measured, {len(bad)} not verified; {settings.csv_path}")
        raise SystemExit(1 if bad else 0)


def shutdown() -> None:
    """Leave the process group together (torchrun's ranks): a rank that exits while its peer's
    gloo threads still talk to it can abort that peer at exit (seen once in CI: SIGABRT)."""
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
