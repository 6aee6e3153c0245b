"""SLURM sweeps through Hydra's submitit launcher, with every job's id and state reported.

    python -m suite -m hydra/launcher=submitit_slurm hydra.launcher.partition=P experiment=a,b
    python -m suite -m hydra/launcher=submitit_slurm hydra.launcher.nodes=2 experiment=adam_fusion

`hydra/launcher=submitit_slurm` is the schema `SuiteSlurmConf` registered here in place of the
plugin's own (`suite/conf/hydra/launcher/slurm.yaml`, the same, spells its options out):
hydra-submitit-launcher's SLURM
options (partition, account, timeout_min, nodes, tasks_per_node, gpus_per_node, cpus_per_task,
mem_gb, additional_parameters, setup, ...) plus `rendezvous_timeout_s` and `rendezvous_port` for
jobs of several tasks, and `_target_` our launcher
(`hydra_plugins.coconet_suite.slurm_launcher.SweepLauncher`: Hydra instantiates launchers only from
that namespace package), which is `SlurmSweep` here: submitit's own SLURM launcher (one SLURM job
per point of the sweep, as a job array), except that

- a job of nodes x tasks_per_node > 1 tasks runs one measurement whose ranks are its tasks
  (suite.slurm_job; rank 0 writes every file); each job's world_size must be that task count,
  else the sweep is refused before anything is submitted (exit 2, one line);
- a job that fails, is cancelled or times out does not end the sweep with a traceback: every job
  is waited for, and the sweep directory gets `sweep.csv` (one row per job: job number, SLURM job
  id, state, exit status, nodes and tasks per node, measured points kept by resume=true and
  added, overrides, run directory, error) and the same as a table on stdout.

A job's exit status is the suite's own (0, 1 verification failed, 2 bad input, 3 failed); a job
that produced no result (cancelled, timed out, node failure) counts 3. `SWEPT` holds the last
sweep's jobs for `python -m suite`'s exit status (suite/__main__.py). The states come from
`sacct` where the cluster keeps accounting, else from `scontrol show job` (jobs stay there for
MinJobAge after they end).
"""

from __future__ import annotations

import copy
import csv
import logging
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional, Sequence

from hydra.core.config_store import ConfigStore
from hydra.core.plugins import Plugins
from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus
from omegaconf import OmegaConf
from submitit.core.utils import pickle_load

from codegen.runtime.failures import looks_like_echo
from hydra_plugins.hydra_submitit_launcher.config import BaseQueueConf, SlurmQueueConf
from hydra_plugins.hydra_submitit_launcher.submitit_launcher import SlurmLauncher

from .errors import SuiteError, fail
from .slurm_job import JobOutcome, first_line, run_task

log = logging.getLogger(__name__)


@dataclass
class SuiteSlurmConf(SlurmQueueConf):
    """hydra-submitit-launcher's SLURM options, our launcher, and the rendezvous of a job whose
    tasks are the ranks (nodes x tasks_per_node > 1)."""

    _target_: str = "hydra_plugins.coconet_suite.slurm_launcher.SweepLauncher"
    rendezvous_timeout_s: float = 300.0  # how long the tasks wait for one another
    rendezvous_port: Optional[int] = None  # rank 0's port; null: drawn from the job id


OWN = ("rendezvous_timeout_s", "rendezvous_port")  # ours, not sbatch's


def register_launcher() -> None:
    """Make hydra/launcher=submitit_slurm ours (suite/conf/hydra/launcher/slurm.yaml spells it out).
    Hydra's plugin scan executes every plugin module again, the submitit plugin's config too,
    which registers its own submitit_slurm: so the scan first (once per process), then ours."""
    Plugins.instance()
    ConfigStore.instance().store(
        group="hydra/launcher", name="submitit_slurm", node=SuiteSlurmConf, provider="coconet_suite"
    )


@dataclass(frozen=True)
class SweptJob:
    num: int  # hydra.job.num
    job_id: str  # SLURM's (array jobs: <array id>_<index>)
    state: str  # COMPLETED, FAILED, CANCELLED, TIMEOUT, ...
    status: int  # the suite's exit status (3 when the job produced no result)
    overrides: str
    error: str = ""  # the first line of a failed job's error
    nodes: int = 1
    tasks_per_node: int = 1  # tasks > 1 in all: the tasks are the measurement's ranks
    points_measured: int = 0  # measured points the job added to its results.csv
    points_resumed: int = 0  # measured points kept from an earlier run (resume=true), skipped
    run_dir: str = ""


SWEPT: list[SweptJob] = []


def slurm_state(job_id: str) -> str:
    """The job's state from sacct, else scontrol; UNKNOWN when neither knows it."""
    for cmd in (
        ["sacct", "-n", "-X", "-P", "-o", "State", "-j", job_id],
        ["scontrol", "show", "job", "-o", job_id],
    ):
        try:
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if out.returncode != 0 or not out.stdout.strip():
            continue
        text = out.stdout.strip()
        if cmd[0] == "sacct":
            return text.splitlines()[0].split()[0]
        fields = dict(f.split("=", 1) for f in text.split() if "=" in f)
        if "JobState" in fields:
            return fields["JobState"]
    return "UNKNOWN"


ACTIVE = ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED")


def final_state(job_id: str, timeout_s: float = 60.0) -> str:
    """The job's state once SLURM has finished with it (its result can come back before SLURM
    marks it COMPLETED); the last state seen after `timeout_s`."""
    end = time.monotonic() + timeout_s
    state = slurm_state(job_id)
    while state.split()[0] in ACTIVE and time.monotonic() < end:
        time.sleep(0.5)
        state = slurm_state(job_id)
    return state


class SlurmSweep(SlurmLauncher):
    """submitit's SLURM launcher that reports every job instead of raising on the first failure."""

    def launch(
        self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int
    ) -> Sequence[JobReturn]:
        import submitit  # as the base class: a lazy import keeps Hydra's plugin scan fast

        params = {k: v for k, v in self.params.items() if k not in OWN}
        check_world_sizes(self, job_overrides, params["nodes"] * params["tasks_per_node"])
        folder = params.pop("submitit_folder")
        executor = submitit.AutoExecutor(
            cluster=self._EXECUTOR,
            folder=folder,
            slurm_max_num_timeout=params.pop("max_num_timeout", 0),
        )
        base = set(OmegaConf.structured(BaseQueueConf).keys())
        executor.update_parameters(
            **{k if k in base else f"slurm_{k}": v for k, v in params.items()}
        )
        if params["nodes"] * params["tasks_per_node"] > 1:  # a rank 0 that fails ends the tasks
            executor.update_parameters(slurm_srun_args=["--kill-on-bad-exit=1"])
        sweep = Path(str(self.config.hydra.sweep.dir))
        sweep.mkdir(parents=True, exist_ok=True)
        state = Singleton.get_state()
        nums = [initial_job_idx + i for i in range(len(job_overrides))]
        args = [
            (list(o), "hydra.sweep.dir", n, f"job_id_for_{n}", state)
            for o, n in zip(job_overrides, nums)
        ]
        # the jobs unpickle this launcher: as SlurmSweep, which an editable install can import
        # anywhere, not as the hydra_plugins subclass, found only with the checkout on the path
        task = copy.copy(self)
        task.__class__ = SlurmSweep
        jobs = executor.map_array(task, *zip(*args))
        log.info(
            f"submitted {len(jobs)} SLURM jobs ({', '.join(str(j.job_id) for j in jobs)}); "
            f"sweep directory {sweep}"
        )
        swept: list[SweptJob] = []
        shape = (int(params["nodes"]), int(params["tasks_per_node"]))
        returns = [
            _job_return(j, n, list(o), shape, swept) for j, n, o in zip(jobs, nums, job_overrides)
        ]
        write_summary(sweep, swept)
        SWEPT.extend(swept)
        return returns

    def __call__(
        self,
        sweep_overrides: list,
        job_dir_key: str,
        job_num: int,
        job_id: str,
        singleton_state: dict,
    ) -> Optional[JobOutcome]:
        """In every SLURM task of a job: its part of the job (suite.slurm_job)."""
        return run_task(self, sweep_overrides, job_dir_key, job_num, singleton_state)


def check_world_sizes(launcher, job_overrides, tasks: int) -> None:
    """A job of several tasks measures on them: each job's world_size must be the task count."""
    if tasks == 1:
        return
    for overrides in job_overrides:
        cfg = launcher.hydra_context.config_loader.load_sweep_config(
            launcher.config, list(overrides)
        )
        if int(cfg.world_size) != tasks:
            fail(
                SuiteError(
                    f"hydra.launcher: a job of {tasks} tasks (nodes x tasks_per_node) "
                    f"runs {tasks} ranks, but world_size={cfg.world_size} (job: "
                    f"{' '.join(overrides)}); set world_size={tasks}"
                )
            )


TERMINAL_GRACE_S = 10.0  # how long a finished job's result may take to appear on a shared disk


def _wait(job, poll_s: float = 1.0) -> None:
    """Until the job's result is written, or SLURM says it ended (then a grace period for the
    result file). Polls SLURM directly: submitit's own wait relies on sacct, and a job cancelled on
    a cluster without accounting would look UNKNOWN to it forever."""
    ended_at = None
    while not job.paths.result_pickle.exists():
        state = slurm_state(str(job.job_id)).split()[0]
        if state not in ACTIVE and state != "UNKNOWN":
            ended_at = ended_at or time.monotonic()
            if time.monotonic() - ended_at > TERMINAL_GRACE_S:
                return
        time.sleep(poll_s)


def _job_return(
    job, num: int, overrides: list[str], shape: tuple[int, int], collect: list
) -> JobReturn:
    """Wait for one submitit job; record it; a JobReturn Hydra accepts whatever happened."""
    _wait(job)
    outcome = JobOutcome(3, error="no result (the job ended before its task returned)")
    kind, value = _task_result(job)
    if kind == "success":
        outcome = value if isinstance(value, JobOutcome) else JobOutcome(int(value or 0))
    elif kind == "error":
        outcome = JobOutcome(3, error=value)
    if outcome.status and not outcome.error:
        outcome = JobOutcome(
            outcome.status,
            outcome.run_dir,
            outcome.points_resumed,
            outcome.points_measured,
            _ranks_error(job),
        )
    state = final_state(str(job.job_id))
    if state == "UNKNOWN":
        state = "COMPLETED" if not outcome.error else "FAILED"
    collect.append(
        SweptJob(
            num,
            str(job.job_id),
            state,
            outcome.status,
            " ".join(overrides),
            outcome.error,
            *shape,
            outcome.points_measured,
            outcome.points_resumed,
            outcome.run_dir,
        )
    )
    ret = JobReturn(overrides=overrides, status=JobStatus.COMPLETED)
    ret.return_value = outcome.status
    return ret


def _task_result(job) -> tuple[str, object]:
    """('success', value), ('error', its last line) or ('none', None) for the job's task."""
    if not job.paths.result_pickle.exists():
        return "none", None
    kind, value = pickle_load(job.paths.result_pickle)
    if kind == "success":
        return kind, value
    return "error", first_line(Exception(str(value).strip().splitlines()[-1]))


def _ranks_error(job) -> str:
    """The first failure among a job's other tasks (its ranks), root causes before echoes."""
    lines = []
    for k in range(1, getattr(job, "num_tasks", 1)):
        kind, value = _task_result(job.task(k))
        line = value.error if isinstance(value, JobOutcome) else value if kind == "error" else ""
        if line:
            lines.append(str(line))
    lines.sort(key=lambda ln: looks_like_echo("", ln))
    return lines[0] if lines else ""


def write_summary(sweep: Path, jobs: list[SweptJob]) -> Path:
    sweep.mkdir(parents=True, exist_ok=True)
    path = sweep / "sweep.csv"
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(SweptJob.__dataclass_fields__))
        w.writeheader()
        for j in sorted(jobs, key=lambda j: j.num):
            w.writerow(asdict(j))
    log.info(summary_table(jobs))
    return path


def summary_table(jobs: list[SweptJob]) -> str:
    rows = [
        f"  #{j.num:<3d} job {j.job_id:<10s} {j.state:<11s} exit {j.status}  {_ranks(j)}"
        f"points measured {j.points_measured}, resumed {j.points_resumed}  {j.overrides}"
        + (f"  ({j.error})" if j.error else "")
        for j in sorted(jobs, key=lambda j: j.num)
    ]
    return "\n".join([f"== sweep: {len(jobs)} SLURM jobs ==", *rows])


def _ranks(j: SweptJob) -> str:
    tasks = j.nodes * j.tasks_per_node
    return (
        ""
        if tasks == 1
        else (
            f"{tasks} ranks = {j.nodes} node{'s' * (j.nodes > 1)} x "
            f"{j.tasks_per_node} task{'s' * (j.tasks_per_node > 1)}  "
        )
    )
