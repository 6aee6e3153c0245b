"""Figures from the results table alone (pure functions of a DataFrame; nothing is re-run).

`speedup_figure(df, experiment, path)`: the paper's Fig. 10 style: speedup over `baseline`
against the principal tensor's size (log2 axis), one line per schedule, one panel per source
(measured, predicted, ...) present. Colours are fixed per schedule across all figures.
"""
from __future__ import annotations

import os
from pathlib import Path

_CACHE = Path(__file__).resolve().parent.parent / ".cache"
os.environ.setdefault("MPLCONFIGDIR", str(_CACHE / "matplotlib"))

import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ORDER = ["baseline", "AR-C", "RS-C-AG", "RS-C-AG+as_slice", "fuse(RS-C-AG)",
         "fuse(RS-C-AG)+as_slice", "MM-AR-C", "MM-RS-C-AG", "ol(MM,fuse(RS-C-AG))", "AR-C-P2P",
         "AR-P2P-C", "RS-P2P-C-AG", "ol(RS,fuse(P2P-C-AG))"]


def colour(schedule: str) -> str:
    palette = plt.get_cmap("tab20").colors
    k = ORDER.index(schedule) if schedule in ORDER else len(ORDER) + hash(schedule) % 8
    return matplotlib.colors.to_hex(palette[k % len(palette)])


def _rank(schedule: str) -> int:
    return ORDER.index(schedule) if schedule in ORDER else len(ORDER)


def speedup_figure(df, experiment: str, path) -> Path:
    rows = df[df.experiment == experiment]
    sources = [s for s in ("measured", "predicted", "paper") if s in set(rows.source)]
    fig, axes = plt.subplots(1, max(1, len(sources)), figsize=(5.5 * max(1, len(sources)), 4),
                             squeeze=False)
    for ax, source in zip(axes[0], sources):
        part = rows[rows.source == source]
        for schedule in sorted(set(part.schedule), key=_rank):
            line = part[part.schedule == schedule].sort_values("size")
            ax.plot(line["size"], line["speedup"], marker="o", label=schedule, color=colour(schedule))
        ax.set_xscale("log", base=2)
        ax.axhline(1.0, color="grey", lw=0.8, ls="--")
        ax.set_xlabel("elements of the principal tensor (log2)")
        ax.set_ylabel("speedup over baseline (x)")
        ax.set_title(f"{experiment}: {source}")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
