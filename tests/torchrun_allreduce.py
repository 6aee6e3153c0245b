"""Started by tests/test_runtime_comm.py under torchrun (`python -m torch.distributed.run
--standalone --nproc_per_node=2 tests/torchrun_allreduce.py`): joins the ranks with `run_ranks`,
runs an all-reduce and a ring reduce-scatter, checks every rank's values, prints OK on rank 0."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch
import torch.distributed as dist

from codegen.runtime import comm
from codegen.runtime.launch import run_ranks


def body(rank: int, world_size: int) -> list:
    x = torch.full((6,), float(rank + 1))
    comm.all_reduce(x)
    out = torch.empty(3)
    comm.reduce_scatter(torch.arange(3 * world_size, dtype=torch.float32), out)
    return x.tolist() + out.tolist()


def main() -> None:
    values = run_ranks(body, None, timeout_s=60.0)
    size = dist.get_world_size()
    total = float(sum(range(1, size + 1)))
    expected = [[total] * 6 + [size * float(3 * r + i) for i in range(3)] for r in range(size)]
    if values != expected:
        raise SystemExit(f"rank {dist.get_rank()}: got {values}, expected {expected}")
    if dist.get_rank() == 0:
        print(f"OK {size} ranks")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
