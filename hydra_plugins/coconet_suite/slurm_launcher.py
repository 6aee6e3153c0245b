"""The suite's SLURM launcher where Hydra looks for launchers (the `hydra_plugins` namespace);
`hydra/launcher=submitit_slurm` (or `slurm`) names it. The code is suite.slurm.SlurmSweep (the
submitting side) and suite.slurm_job (inside each job's tasks)."""

from suite.slurm import SlurmSweep


class SweepLauncher(SlurmSweep):
    pass
