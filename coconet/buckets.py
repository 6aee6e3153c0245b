"""Buckets: where each parameter lives in the flat buffers a fused optimizer steps.

`layout(groups, cap_numel, multiple)` is pure: `groups` lists each param group's parameter sizes
(elements), in order; parameters are numbered across groups in that order (the ids of
`torch.optim.Optimizer.state_dict`). Each bucket holds parameters of one group only (they share
hyper-parameters), packed in order at consecutive offsets, until adding the next would pass
`cap_numel` (a parameter larger than the cap gets a bucket of its own; `cap_numel=None`: one bucket
per parameter). A bucket's element count N is padded up to a multiple of `multiple` (P times the
fused chunks, so that every rank's slice N/P divides into the chunks); the padding holds zeros,
which every optimizer here leaves at zero (zero gradient, zero weight: zero update, and nothing
added to LAMB's norms).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence


@dataclass(frozen=True)
class Slot:
    """One parameter's place in its bucket."""

    param: int  # the parameter's id (its index across all groups)
    offset: int  # first element in the bucket
    numel: int


@dataclass(frozen=True)
class BucketLayout:
    group: int  # the param group's index
    slots: tuple[Slot, ...]
    numel: int  # N: the padded element count

    @property
    def used(self) -> int:
        return sum(s.numel for s in self.slots)

    def segment_ids(self) -> list[int]:
        """Each of the N elements' slot index in the bucket (-1: padding, no tensor's)."""
        ids = [-1] * self.numel
        for k, s in enumerate(self.slots):
            ids[s.offset : s.offset + s.numel] = [k] * s.numel
        return ids


def _padded(n: int, multiple: int) -> int:
    return max(multiple, -(-n // multiple) * multiple)


def layout(
    groups: Sequence[Sequence[int]], cap_numel: Optional[int], multiple: int
) -> tuple[BucketLayout, ...]:
    """The buckets of `groups` (parameter sizes per group), in order (see the module doc)."""
    if cap_numel is not None and cap_numel < 1:
        raise ValueError(f"bucket cap must be a positive element count or None, got {cap_numel}")
    buckets: list[BucketLayout] = []
    pid = 0
    for gi, sizes in enumerate(groups):
        slots: list[Slot] = []
        fill = 0
        for n in sizes:
            if slots and (cap_numel is None or fill + n > cap_numel):
                buckets.append(BucketLayout(gi, tuple(slots), _padded(fill, multiple)))
                slots, fill = [], 0
            slots.append(Slot(pid, fill, n))
            fill += n
            pid += 1
        if slots:
            buckets.append(BucketLayout(gi, tuple(slots), _padded(fill, multiple)))
    return tuple(buckets)
