"""SLURM sweeps through Hydra's submitit launcher, with every job's id and state reported.

    python -m suite -m hydra/launcher=slurm hydra.launcher.partition=P experiment=a,b scale=smoke

`conf/hydra/launcher/slurm.yaml` selects `hydra_plugins.coconet_suite.slurm_launcher.SweepLauncher`
(Hydra instantiates launchers only from that namespace package), which is `SlurmSweep` here: submitit's own SLURM launcher (one SLURM
job per point of the sweep, as a job array; `hydra.launcher.*` are its sbatch options: partition,
timeout_min, nodes, tasks_per_node, gpus_per_node, cpus_per_task, mem_gb, account, ...), except that
a job that fails, is cancelled or times out does not end the sweep with a traceback: every job is
waited for, and the sweep directory gets `sweep.csv` (one row per job: job number, SLURM job id,
state, exit status, overrides, run directory) and the same as a table on stdout. A job's exit status
is the suite's own (0, 1 verification failed, 2 bad input, 3 failed); a job that produced no
result (cancelled, timed out, node failure) counts 3. `SWEPT` holds the last sweep's jobs for
`python -m suite`'s exit status (suite/__main__.py). The states come from `sacct` where the cluster keeps accounting,
else from `scontrol show job` (jobs stay there for MinJobAge after they end).
"""
from __future__ import annotations

import copy
import csv
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Sequence

from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus
from hydra_plugins.hydra_submitit_launcher.config import BaseQueueConf
from hydra_plugins.hydra_submitit_launcher.submitit_launcher import SlurmLauncher
from omegaconf import OmegaConf
from submitit.core.utils import pickle_load


@dataclass(frozen=True)
class SweptJob:
    num: int  # hydra.job.num
    job_id: str  # SLURM's (array jobs: <array id>_<index>)
    state: str  # COMPLETED, FAILED, CANCELLED, TIMEOUT, ...
    status: int  # the suite's exit status (3 when the job produced no result)
    overrides: str
    error: str = ""  # the first line of a failed job's error


SWEPT: list[SweptJob] = []


def slurm_state(job_id: str) -> str:
    """The job's state from sacct, else scontrol; UNKNOWN when neither knows it."""
    for cmd in (["sacct", "-n", "-X", "-P", "-o", "State", "-j", job_id],
                ["scontrol", "show", "job", "-o", job_id]):
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

    def launch(self, job_overrides: Sequence[Sequence[str]],
               initial_job_idx: int) -> Sequence[JobReturn]:
        import submitit  # as the base class: a lazy import keeps Hydra's plugin scan fast

        params = dict(self.params)
        folder = params.pop("submitit_folder")
        executor = submitit.AutoExecutor(cluster=self._EXECUTOR, folder=folder,
                                         slurm_max_num_timeout=params.pop("max_num_timeout", 0))
        base = set(OmegaConf.structured(BaseQueueConf).keys())
        executor.update_parameters(**{k if k in base else f"slurm_{k}": v
                                      for k, v in params.items()})
        sweep = Path(str(self.config.hydra.sweep.dir))
        sweep.mkdir(parents=True, exist_ok=True)
        state = Singleton.get_state()
        nums = [initial_job_idx + i for i in range(len(job_overrides))]
        args = [(list(o), "hydra.sweep.dir", n, f"job_id_for_{n}", state)
                for o, n in zip(job_overrides, nums)]
        # the jobs unpickle this launcher: as SlurmSweep, which an editable install can import
        # anywhere, not as the hydra_plugins subclass, found only with the checkout on the path
        task = copy.copy(self)
        task.__class__ = SlurmSweep
        jobs = executor.map_array(task, *zip(*args))
        print(f"submitted {len(jobs)} SLURM jobs ({', '.join(str(j.job_id) for j in jobs)}); "
              f"sweep directory {sweep}", flush=True)
        swept: list[SweptJob] = []
        returns = [_job_return(j, n, list(o), swept) for j, n, o in zip(jobs, nums, job_overrides)]
        write_summary(sweep, swept)
        SWEPT.extend(swept)
        return returns


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


def _job_return(job, num: int, overrides: list[str], collect: list) -> JobReturn:
    """Wait for one submitit job; record it; a JobReturn Hydra accepts whatever happened."""
    _wait(job)
    status, error = 3, "no result (the job ended before its task returned)"
    if job.paths.result_pickle.exists():
        outcome, value = pickle_load(job.paths.result_pickle)
        if outcome == "success":
            status, error = int(value.return_value or 0), ""
        else:
            error = _first_line(Exception(str(value).strip().splitlines()[-1]))
    state = final_state(str(job.job_id))
    if state == "UNKNOWN":
        state = "COMPLETED" if not error else "FAILED"
    collect.append(SweptJob(num, str(job.job_id), state, status, " ".join(overrides), error))
    ret = JobReturn(overrides=overrides, status=JobStatus.COMPLETED)
    ret.return_value = status
    return ret


def _first_line(e: Exception) -> str:
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    return lines[0][:200] if lines else type(e).__name__


def write_summary(sweep: Path, jobs: list[SweptJob]) -> Path:
    sweep.mkdir(parents=True, exist_ok=True)
    path = sweep / "sweep.csv"
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(SweptJob.__dataclass_fields__))
        w.writeheader()
        for j in sorted(jobs, key=lambda j: j.num):
            w.writerow(asdict(j))
    print(summary_table(jobs), flush=True)
    return path


def summary_table(jobs: list[SweptJob]) -> str:
    rows = [f"  #{j.num:<3d} job {j.job_id:<10s} {j.state:<11s} exit {j.status}  {j.overrides}"
            + (f"  ({j.error})" if j.error else "") for j in sorted(jobs, key=lambda j: j.num)]
    return "\n".join([f"== sweep: {len(jobs)} SLURM jobs ==", *rows])
