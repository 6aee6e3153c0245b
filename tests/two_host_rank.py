"""One rank of a two-host job, started by tests/test_two_hosts.py inside its own network namespace
as `python tests/two_host_rank.py RANK HOST PORT OUT`: it joins the job the way a SLURM task does
(codegen.runtime.joined: rank 0 serves the store on HOST, the address named for it), rank 0
measures experiment adam_fusion at smoke scale on both ranks into OUT/results.csv, and each rank
prints `RESULT <json>` with the TCP addresses listening in its namespace during the run."""

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from codegen.runtime.joined import join  # noqa: E402
from codegen.runtime.launch import RankError, run_ranks  # noqa: E402

WORLD = 2


def listening(rank: int, world: int) -> list:
    """'address:port' of every listening TCP socket in this rank's network namespace (what
    `ss -ltn` shows there): the store, gloo's own."""
    out = []
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/self/net/{table}").read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            if state == "0A":
                address, port = local.split(":")
                raw = bytes.fromhex(address)
                words = [raw[i : i + 4][::-1] for i in range(0, len(raw), 4)]
                ip = (
                    ".".join(str(b) for b in words[0])
                    if len(raw) == 4
                    else ":".join(w.hex() for w in words)
                )
                out.append(f"{ip}:{int(port, 16)}")
    return out


def main() -> None:
    rank, host, port, out = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), Path(sys.argv[4])
    seen = {}
    try:
        group = join(rank, WORLD, 1, host, port, rendezvous_timeout_s=60.0, timeout_s=120.0)

        def body():
            import experiments
            from experiments.api import MeasureSettings
            from experiments.harness import measure

            seen["listening"] = run_ranks(listening, WORLD)
            settings = MeasureSettings(
                scale="smoke",
                max_elements=1 << 12,
                world_size=WORLD,
                warmup=1,
                repeats=3,
                csv_path=out / "results.csv",
                kernels_dir=out / "kernels",
                max_rounds=3,
            )
            rows = measure(experiments.get("adam_fusion"), settings)
            seen["rows"] = [
                {k: r[k] for k in ("schedule", "size", "verified", "nodes")} for r in rows
            ]
            return "led"

        seen["value"] = group.lead(body) if rank == 0 else group.serve()
    except RankError as e:
        seen["error"] = str(e)
    print("RESULT " + json.dumps(seen), flush=True)


if __name__ == "__main__":
    main()
