"""One job of a SLURM sweep, inside its tasks (suite.slurm submits it): the whole run, or its ranks.

- One task (hydra.launcher.nodes x tasks_per_node = 1): the Hydra job as `python -m suite` runs
  it; the suite starts `world_size` local ranks in it.
- Several tasks: each task is one rank (codegen.runtime.joined). They meet at the job's first
  node, at the address SLURM has for it (`scontrol show node`: NodeAddr, else its name), on
  `hydra.launcher.rendezvous_port` (null: a port in [20000, 60000) drawn from the job id, the same
  in every task), within `hydra.launcher.rendezvous_timeout_s`. Rank 0 runs the Hydra job (verify,
  generate, measure, predict, report: every file written once, by rank 0); every measurement's
  ranks are the job's tasks, which serve rank 0 in the meantime. The run's world_size is the
  job's task count (suite.slurm refuses other sweeps before submitting).

`run_task(launcher, overrides, job_dir_key, job_num, state) -> JobOutcome`: the suite's exit
status (3 when a rank failed), the run directory, the measured points (distinct experiment x
world size x size x shape) its results.csv held before the job when resume=true
(`points_resumed`: the points the run skipped) and those the job added (`points_measured`), and
the error: a rank's failure is that rank's line. The serving ranks return None, or their failure
as a JobOutcome (not raised: srun runs the tasks with --kill-on-bad-exit, and rank 0 must live to
write its report); rank 0 raises only when it cannot rendezvous (RankError, its task failed), and
srun then ends the others.
"""

from __future__ import annotations

import logging
import os
import random
import subprocess
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Optional

from hydra.core.hydra_config import HydraConfig
from hydra.core.singleton import Singleton
from hydra.core.utils import run_job, setup_globals
from omegaconf import OmegaConf, open_dict

from codegen.logs import configure
from codegen.runtime.joined import join
from codegen.runtime.launch import RankError
from reports.results import read_table

log = logging.getLogger(__name__)

PORTS = (20000, 60000)  # the rendezvous port's range when none is configured


@dataclass(frozen=True)
class JobOutcome:
    status: int  # the suite's exit status (0, 1, 2, 3, 130, 143)
    run_dir: str = ""
    points_resumed: int = 0  # measured points kept from an earlier run (resume=true), skipped
    points_measured: int = 0  # measured points the job added
    error: str = ""  # the failure's first line ("rank R failed: ..." for a rank's)


def run_task(
    launcher, overrides: list, job_dir_key: str, job_num: int, state: dict
) -> Optional[JobOutcome]:
    """This SLURM task's part of the job (see the module)."""
    configure()  # the level the submitting entry point exported
    import submitit  # as hydra-submitit-launcher: a lazy import keeps Hydra's plugin scan fast

    env = submitit.JobEnvironment()
    run = lambda: run_here(launcher, overrides, job_dir_key, job_num, state)  # noqa: E731
    if env.num_tasks == 1:
        return run()
    params = launcher.params
    port = params.get("rendezvous_port") or port_for(env.job_id)
    group = join(
        env.global_rank,
        env.num_tasks,
        env.num_tasks // env.num_nodes,
        node_address(env.hostnames[0]),
        int(port),
        rendezvous_timeout_s=float(params.get("rendezvous_timeout_s") or 300.0),
    )
    node = os.environ.get("SLURMD_NODENAME") or env.hostname
    where = f"{node} (node {env.node} of {env.num_nodes})"
    log.info(
        f"rank {env.global_rank} of {env.num_tasks} on {where}: joined rank 0 at {group_address()}"
    )
    if env.global_rank != 0:
        try:
            group.serve()
        except RankError as e:  # a value, not a failed task: srun would end rank 0 at once
            return JobOutcome(3, error=str(e))
        return None
    outcome = group.lead(run)
    return replace(outcome, error=outcome.error or group.failure or "")


def run_here(launcher, overrides: list, job_dir_key: str, job_num: int, state: dict) -> JobOutcome:
    """The Hydra job in this process (hydra-submitit-launcher's own steps), with its outcome."""
    import submitit

    Singleton.set_state(state)
    setup_globals()
    cfg = launcher.hydra_context.config_loader.load_sweep_config(launcher.config, list(overrides))
    with open_dict(cfg.hydra.job):
        cfg.hydra.job.id = submitit.JobEnvironment().job_id
        cfg.hydra.job.num = job_num
    HydraConfig.instance().set_config(cfg)
    run_dir = Path(str(OmegaConf.select(cfg, job_dir_key))) / str(cfg.hydra.sweep.subdir)
    before = measured_points(run_dir) if OmegaConf.select(cfg, "resume", default=False) else 0
    ret = run_job(
        hydra_context=launcher.hydra_context,
        task_function=launcher.task_function,
        config=cfg,
        job_dir_key=job_dir_key,
        job_subdir_key="hydra.sweep.subdir",
    )
    try:
        status, error = int(ret.return_value or 0), ""
    except Exception as e:  # noqa: BLE001 - the task raised: run_job kept it in the return
        status, error = 3, first_line(e)
    resumed = before if status != 2 else 0  # exit 2: refused before any work, nothing kept
    return JobOutcome(
        status, str(run_dir), resumed, max(0, measured_points(run_dir) - resumed), error
    )


def measured_points(run_dir: Path) -> int:
    """Distinct measured points (experiment, world size, size, shape) in run_dir/results.csv."""
    csv = run_dir / "results.csv"
    if not csv.exists():
        return 0
    df = read_table(csv)
    if df.empty or "source" not in df:
        return 0
    df = df[df.source == "measured"]
    return len(df.drop_duplicates(["experiment", "world_size", "size", "shape"]))


def port_for(job_id: str) -> int:
    """The rendezvous port of a job without one configured: the same in all its tasks."""
    return random.Random(str(job_id)).randrange(*PORTS)


def node_address(node: str) -> str:
    """The address SLURM reaches `node` at (NodeAddr), else the node's name."""
    try:
        out = subprocess.run(
            ["scontrol", "show", "node", "-o", node], capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired):
        return node
    fields = dict(f.split("=", 1) for f in out.stdout.split() if "=" in f)
    return fields.get("NodeAddr") or node


def group_address() -> str:
    return f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"


def first_line(e: BaseException) -> str:
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    return lines[0][:300] if lines else type(e).__name__
