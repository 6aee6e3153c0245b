"""A real one-host SLURM cluster for the tests: munged, slurmctld and slurmd in a temporary folder.

    with LocalSlurm(tmp_path, cpus=2, nodes=2) as cluster:
        env = cluster.env            # SLURM_CONF (and PATH) for sbatch / squeue / sacct / scancel
        cluster.wait_idle()

nodes=1: one node, this host by its name, `cpus` CPUs. nodes=N > 1: N nodes node1..nodeN, each a
slurmd of its own on this host (`slurmd -N nodeK`, a port each; NodeAddr 127.0.0.1), each with
`cpus` CPUs whatever the machine has (SlurmdParameters=config_overrides): a job of tasks on two of
them runs as on two machines, except that they share this one's cores, memory and disk.

Everything the daemons write (state, spool, logs, the munge key and socket, pid files) stays in the
given folder; ports are free ones picked at start; the daemons run in the foreground as children
of this process and are stopped (SIGTERM, then SIGKILL) on exit, whatever happened. Needs root (the
daemons and munge run as root here) and Debian's packages slurmctld, slurmd, slurm-client, munge:
`available()` says whether they are there and why not.

Accounting: jobcomp/filetxt keeps a line per finished job (job id, state, exit code), read by
`job_states`; there is no slurmdbd.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Optional

DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "squeue", "scancel", "sinfo", "srun")


def available() -> Optional[str]:
    """None when a local cluster can start here, else the reason it cannot."""
    if os.geteuid() != 0:
        return "the SLURM daemons need root"
    missing = [b for b in (*DAEMONS, *CLIENTS) if not shutil.which(b, path=_path())]
    if missing:
        return (
            f"not installed: {', '.join(missing)} (apt-get install slurmctld slurmd "
            "slurm-client munge)"
        )
    return None


def _path() -> str:
    return os.environ.get("PATH", "") + ":/usr/sbin:/sbin"


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


class LocalSlurm:
    def __init__(self, root: Path, cpus: int = 2, partition: str = "debug", nodes: int = 1):
        self.root, self.cpus, self.partition = Path(root), cpus, partition
        self.host = socket.gethostname()
        self.nodes = [self.host] if nodes == 1 else [f"node{k + 1}" for k in range(nodes)]
        self.procs: list[subprocess.Popen] = []

    @property
    def conf(self) -> Path:
        return self.root / "slurm.conf"

    @property
    def env(self) -> dict:
        return {**os.environ, "SLURM_CONF": str(self.conf), "PATH": _path()}

    def _node_lines(self, mem: int) -> str:
        if self.nodes == [self.host]:
            return f"NodeName={self.host} CPUs={self.cpus} RealMemory={mem} State=UNKNOWN"
        ports = _free_ports(len(self.nodes))
        return "\n".join(
            f"NodeName={n} NodeHostname={self.host} NodeAddr=127.0.0.1 Port={p} "
            f"CPUs={self.cpus} RealMemory={mem // len(self.nodes)} State=UNKNOWN"
            for n, p in zip(self.nodes, ports)
        )

    def _write_conf(self) -> None:
        ctld, d = _free_ports(2)
        r = self.root
        mem = int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**20 * 0.8)
        self.conf.write_text(f"""\
ClusterName=coconet-test
SlurmctldHost={self.host}
SlurmctldPort={ctld}
SlurmdPort={d}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={r}/munge.socket
StateSaveLocation={r}/state
SlurmdSpoolDir={r}/spool/%n
SlurmctldPidFile={r}/slurmctld.pid
SlurmdPidFile={r}/slurmd.%n.pid
SlurmctldLogFile={r}/slurmctld.log
SlurmdLogFile={r}/slurmd.%n.log
SlurmdParameters=config_overrides
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
MpiDefault=none
JobCompType=jobcomp/filetxt
JobCompLoc={r}/jobcomp.txt
SchedulerType=sched/builtin
InactiveLimit=0
KillWait=5
MinJobAge=300
SlurmctldTimeout=30
SlurmdTimeout=30
{self._node_lines(mem)}
PartitionName={self.partition} Nodes={",".join(self.nodes)} Default=YES MaxTime=INFINITE State=UP
""")

    def start(self) -> "LocalSlurm":
        r = self.root
        for sub in ("state", *(f"spool/{n}" for n in self.nodes)):
            (r / sub).mkdir(parents=True, exist_ok=True)
        key = r / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        self._write_conf()
        log = open(r / "daemons.out", "ab")
        self._spawn(
            [
                "munged",
                "--foreground",
                "--force",
                f"--key-file={key}",
                f"--socket={r}/munge.socket",
                f"--pid-file={r}/munged.pid",
                f"--log-file={r}/munged.log",
                f"--seed-file={r}/munge.seed",
            ],
            log,
        )
        self._wait(lambda: (r / "munge.socket").exists(), "munged")
        self._spawn(["slurmctld", "-D", "-i", "-f", str(self.conf)], log)
        self._wait(lambda: self._ok(["sinfo", "-h"]), "slurmctld")
        for node in self.nodes:
            self._spawn(["slurmd", "-D", "-f", str(self.conf), "-N", node], log)
        self.wait_idle()
        return self

    def _spawn(self, cmd: list[str], log) -> None:
        self.procs.append(
            subprocess.Popen(cmd, stdout=log, stderr=log, env=self.env, start_new_session=True)
        )

    def _ok(self, cmd: list[str]) -> bool:
        return subprocess.run(cmd, env=self.env, capture_output=True, timeout=30).returncode == 0

    def _wait(self, ready, what: str, timeout_s: float = 60.0) -> None:
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            dead = [p for p in self.procs if p.poll() is not None]
            if dead:
                raise RuntimeError(
                    f"{' '.join(dead[0].args[:1])} exited with {dead[0].returncode}"
                    f" while waiting for {what}; logs in {self.root}"
                )
            if ready():
                return
            time.sleep(0.2)
        raise TimeoutError(f"{what} not ready after {timeout_s:.0f} s; logs in {self.root}")

    def node_states(self) -> list[str]:
        out = subprocess.run(
            ["sinfo", "-h", "-N", "-o", "%T"],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=30,
        )
        return out.stdout.split()

    def all_up(self) -> bool:
        states = self.node_states()
        return len(states) == len(self.nodes) and all(
            s in ("idle", "mixed", "allocated") for s in states
        )

    def wait_idle(self, timeout_s: float = 60.0) -> None:
        self._wait(self.all_up, "slurmd", timeout_s)

    def job_states(self) -> dict[str, str]:
        """Finished jobs: job id -> state (COMPLETED, FAILED, CANCELLED, TIMEOUT, ...)."""
        path = self.root / "jobcomp.txt"
        out = {}
        for line in path.read_text().splitlines() if path.exists() else []:
            fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
            if "JobId" in fields:
                out[fields["JobId"]] = fields.get("JobState", "?")
        return out

    def cancel_jobs(self, timeout_s: float = 30.0) -> None:
        """Cancel every job still queued or running, and wait for SLURM to end them (their
        steps' processes outlive slurmd otherwise)."""

        def queued() -> list[str]:
            out = subprocess.run(
                ["squeue", "-h", "-o", "%A"],
                env=self.env,
                capture_output=True,
                text=True,
                timeout=30,
            )
            return out.stdout.split() if out.returncode == 0 else []

        jobs = queued()
        if jobs:
            subprocess.run(["scancel", *jobs], env=self.env, capture_output=True, timeout=30)
        end = time.monotonic() + timeout_s
        while jobs and time.monotonic() < end:
            time.sleep(0.5)
            jobs = queued()

    def stop(self) -> None:
        if self.procs and all(p.poll() is None for p in self.procs):
            self.cancel_jobs()
        for p in reversed(self.procs):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in reversed(self.procs):
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(timeout=15)
        self.procs.clear()

    def __enter__(self) -> "LocalSlurm":
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc) -> None:
        self.stop()
