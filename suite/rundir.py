"""A run directory is never overwritten: an earlier run moved aside whole, or restored as it was
when a command is refused.

- `move_aside(path) -> Path`: the earlier run in `path` renamed whole to the next free
  `<path>.<k>` (k = 1, 2, ...) before the new run starts (`existing=aside`).
- `Snapshot.of(path)`: what Hydra rewrites in a run directory before the run's own checks
  (its `.hydra/` files and the job's log, byte for byte); `restore()` puts them back and removes
  what was not there, so a command refused after Hydra started (exit 2: a `resume=true` whose
  settings differ, a setting only the run can check) leaves the directory as it found it.
Units: none.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

log = logging.getLogger(__name__)

HYDRA_FILES = (".hydra/config.yaml", ".hydra/hydra.yaml", ".hydra/overrides.yaml")


def move_aside(path: Path) -> Path:
    k = 1
    while path.with_name(f"{path.name}.{k}").exists():
        k += 1
    aside = path.with_name(f"{path.name}.{k}")
    path.rename(aside)
    log.info(f"moved the earlier run in {path} aside to {aside}")
    return aside


@dataclass(frozen=True)
class Snapshot:
    path: Path
    files: dict  # relative name -> bytes, or None where the file was absent
    existed: bool  # whether the directory was there (else Hydra made it: removed when empty)

    @classmethod
    def of(cls, path: Optional[Path]) -> Optional["Snapshot"]:
        if path is None or (path.exists() and not path.is_dir()):
            return None
        logs = [p.name for p in path.glob("*.log")] if path.is_dir() else []
        return cls(
            path,
            {
                n: (path / n).read_bytes() if (path / n).is_file() else None
                for n in (*HYDRA_FILES, *logs)
            },
            path.is_dir(),
        )

    def restore(self) -> None:
        made = [p.name for p in self.path.glob("*.log") if p.name not in self.files]
        for name, data in {**self.files, **dict.fromkeys(made)}.items():
            target = self.path / name
            if data is None:
                target.unlink(missing_ok=True)
            else:
                target.write_bytes(data)
        for folder in (self.path / ".hydra", *(() if self.existed else (self.path,))):
            if folder.is_dir() and not any(folder.iterdir()):
                folder.rmdir()
