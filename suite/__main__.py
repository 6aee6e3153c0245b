"""`python -m suite experiment=NAME scale=smoke|default|paper hydra.run.dir=DIR [key=value ...]`.

The command line is checked first (`suite.cli.prevalidate`: one line on stderr and exit 2 for bad
input), then Hydra composes the configuration, makes the run directory and calls `suite.run.run`
once per job (several with `-m`); the exit status is the worst job's (1: a schedule failed).
"""
import sys

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from . import CONF_DIR
from .cli import prevalidate
from .config import register
from .errors import SuiteError
from .run import fail, run

statuses: list[int] = []


@hydra.main(config_path=str(CONF_DIR), config_name="config", version_base="1.3")
def job(cfg: DictConfig) -> None:
    statuses.append(run(OmegaConf.to_object(cfg), HydraConfig.get().runtime.output_dir))


def main() -> None:
    try:
        prevalidate(sys.argv[1:])
    except SuiteError as e:
        fail(e)
    register()
    job()
    sys.exit(max(statuses, default=0))


if __name__ == "__main__":
    main()
