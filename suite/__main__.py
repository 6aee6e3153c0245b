"""`python -m suite experiment=NAME scale=smoke|default|paper hydra.run.dir=DIR [key=value ...]`.

The command line is checked first (`suite.cli.prevalidate`: one line on stderr and exit 2 for bad
input), then Hydra composes the configuration, makes the run directory and calls `suite.run.run`.
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


@hydra.main(config_path=str(CONF_DIR), config_name="config", version_base="1.3")
def job(cfg: DictConfig) -> None:
    status = run(OmegaConf.to_object(cfg), HydraConfig.get().runtime.output_dir)
    if status:
        sys.exit(status)


def main() -> None:
    try:
        prevalidate(sys.argv[1:])
    except SuiteError as e:
        fail(e)
    register()
    job()


if __name__ == "__main__":
    main()
