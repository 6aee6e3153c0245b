"""The suite's SLURM launcher where Hydra looks for launchers (the `hydra_plugins` namespace);
the code is suite.slurm.SlurmSweep."""
from suite.slurm import SlurmSweep


class SweepLauncher(SlurmSweep):
    pass
