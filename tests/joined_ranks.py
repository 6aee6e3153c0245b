"""One rank of a joined job (codegen.runtime.joined), started by tests/test_joined.py as
`python tests/joined_ranks.py RANK WORLD PORT CASE`; prints what it saw as `RESULT <json>`.

Cases: `ok` (rank 0 runs two run_ranks; the ranks' values come back in rank order), `fail1` /
`fail0` (that rank's fn raises ValueError in the second run_ranks, the others are inside a
collective then), `timeout` (rendezvous_timeout_s=2: run alone, the other ranks never come)."""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch
import torch.distributed as dist

from codegen.runtime.joined import join
from codegen.runtime.launch import RankError, placement, run_ranks


def total(rank: int, world: int, scale: int) -> list:
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    return [rank, world, scale * float(t[0]), list(placement())]


def fails_on(rank: int, world: int, bad: int) -> int:
    if rank == bad:
        raise ValueError(f"boom on rank {rank}")
    dist.all_reduce(torch.ones(1))  # the others wait here for the failing rank
    return rank


def main() -> None:
    rank, world, port, case = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    seen = {}
    try:
        group = join(
            rank,
            world,
            1,
            "127.0.0.1",
            port,
            rendezvous_timeout_s=2.0 if case == "timeout" else 60.0,
            timeout_s=60.0,
        )

        def body():
            seen["first"] = run_ranks(total, world, args=(10,))
            if case.startswith("fail"):
                seen["second"] = run_ranks(fails_on, world, args=(int(case[-1]),))
            return "led"

        seen["value"] = group.lead(body) if rank == 0 else group.serve()
    except RankError as e:
        seen["error"] = str(e)
    print("RESULT " + json.dumps(seen), flush=True)


if __name__ == "__main__":
    main()
