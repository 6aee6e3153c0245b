"""`FusedOptimizer`: a torch optimizer for data-parallel training that runs an optimizer program's
generated `fuse(RS-C-AG)+as_slice` step instead of DDP's all-reduce plus an optimizer (the base of
`coconet.FusedAdam`, `FusedAdamW` and `FusedLAMB`, and the wrapper of a user's own program).

    model = Net()                                    # the same initial weights on every rank
    opt = coconet.FusedAdam(model.parameters(), lr=1e-3)       # no DDP wrapper
    for x, y in data:                                # this rank's micro-batch
        opt.zero_grad(); loss_fn(model(x), y).backward(); opt.step()

Contract
- Construction is collective over `group` (None: every rank). The parameters (float32, on the
  backend's device) are broadcast from the group's first rank, then moved into flat buckets
  (`coconet.buckets`): each `p.data` becomes a view of its bucket, so the all-gather writes the
  updated weights into the model's parameters with no copy. Each bucket's step is compiled once
  (`coconet.step.compile_many`: one module for all buckets).
- Gradients live in flat buckets too: each `p.grad` is a view of its gradient bucket, so
  backward accumulates into it (as DDP's `gradient_as_bucket_view=True`); `zero_grad()` zeroes
  the buckets and keeps the views (`set_to_none` is ignored). A `.grad` replaced by another
  tensor is copied in at the next step; a parameter without `.grad` counts as a zero gradient.
- `step()` is collective: for each bucket the generated step runs: reduce-scatter of the gradient
  (summed, then averaged over the P ranks as DDP does), the update kernel on this rank's slice,
  all-gather of the weights. The reduce-scatter works in the gradient bucket, so after `step()`
  the gradients are consumed: call `zero_grad()` before the next backward (every training loop
  does). The hyper-parameters are read from the bucket's param group at every step, so
  learning-rate schedulers work. The state (Adam's m and v) exists only as this rank's slices:
  1/P of the state of `torch.optim.Adam` (`state_bytes()`).
- `clip_grad_norm(max_norm)` clips by the norm of the averaged gradient, as DDP's training does
  (`torch.nn.utils.clip_grad_norm_` would clip each rank's local gradient: see the method).
- `state_dict()` is collective and returns the gathered state in torch's format (per parameter
  id: `step` and each state tensor of the parameter's shape, under `state_names`: Adam's
  `exp_avg`, `exp_avg_sq`; `param_groups` with parameter ids), on every rank;
  `sharded_state_dict()` is local: this rank's slices per bucket and the layout they belong to.
  `load_state_dict` takes either (a sharded one only with the same layout, world size and rank)
  and resumes exactly where the saved optimizer was.
- Buckets: `bucket_cap_numel` elements at most (default 2^22; None: one bucket per parameter).
  `FusedLAMB` defaults to one bucket per parameter, so its trust ratio is per parameter tensor
  (You et al.; Apex's FusedLAMB); with larger buckets it is per bucket.
- Not supported (ValueError): params of another dtype than float32 (no mixed precision yet),
  param groups added after construction, a weight decay asked of a step compiled without one.
"""

from __future__ import annotations

import numbers
from typing import Optional

import torch
import torch.distributed as dist

from codegen.runtime.comm import Group

from . import programs
from .buckets import BucketLayout, layout
from .step import Step, compile_many

# torch.optim.Adam's (and AdamW's) names for the Adam programs' state
ADAM_STATE = {"m": "exp_avg", "v": "exp_avg_sq", "vmax": "max_exp_avg_sq"}


class _Bucket:
    """A layout with its flat buffers: w and g (N elements), and each state input of the
    program (`programs.state_of`: m and v for Adam) as this rank's slice (N/P)."""

    def __init__(self, spec: BucketLayout, params: list, P: int, device, state: tuple):
        self.spec, self.t = spec, 0
        self.w = torch.zeros(spec.numel, dtype=torch.float32, device=device)
        self.g = torch.zeros_like(self.w)
        self.state = {
            name: torch.zeros(spec.numel // P, dtype=torch.float32, device=device) for name in state
        }
        self.params = [params[s.param] for s in spec.slots]
        self.step: Optional[Step] = None

    def view(self, flat: torch.Tensor, k: int) -> torch.Tensor:
        s = self.spec.slots[k]
        return flat[s.offset : s.offset + s.numel].view_as(self.params[k])

    def gather_grads(self) -> None:
        """Each p.grad into the bucket (nothing to do where it already is a view of it), and
        p.grad a view of the bucket from then on."""
        for k, p in enumerate(self.params):
            dst = self.view(self.g, k)
            if p.grad is None:
                dst.zero_()
            elif p.grad.data_ptr() != dst.data_ptr():
                dst.copy_(p.grad)
            p.grad = dst


class FusedOptimizer(torch.optim.Optimizer):
    """The fused step of an optimizer program over the parameters (see the module doc); the base
    of FusedAdam, FusedAdamW and FusedLAMB, and the wrapper of a user's own program.

    `program`: a data-parallel optimizer program over `N` elements with the gradient `g`
    (`Local`), the weights `w` and its state (`Replicated` inputs it updates, `programs.state_of`;
    kept as slices) and 0-d hyper-parameters, which `step()` reads from each param group by name
    (`betas` as beta1, beta2; `step` is the optimizer's own count). `state_names`: the name of
    each state input in `state_dict()` (default: its own)."""

    def __init__(
        self,
        params,
        defaults: dict,
        program,
        *,
        state_names: Optional[dict] = None,
        group=None,
        bucket_cap_numel: Optional[int] = 1 << 22,
        chunks: int = 4,
        backend="cpu",
    ):
        self._buckets: list[_Bucket] = []
        super().__init__(params, defaults)
        names = {i.value.name for i in program.inputs}
        if not {"g", "w"} <= names:
            raise ValueError(
                f"{type(self).__name__}: the program {program.name} needs the inputs g (the "
                f"gradient) and w (the weights); it has {sorted(names)}"
            )
        state = programs.state_of(program)
        unknown = sorted(set(state_names or {}) - set(state))
        if unknown:
            raise ValueError(
                f"{type(self).__name__}: state_names names {unknown}, not state of "
                f"{program.name} (its state: {list(state)})"
            )
        self._state_names = {n: (state_names or {}).get(n, n) for n in state}
        zero_d = [i.value.name for i in program.inputs if not i.value.type.shape]
        self._hyper = tuple(n for n in zero_d if n != "step")
        self._counts = "step" in zero_d  # the program takes the step count (Adam's bias correction)
        self._group = Group.world() if group is None else Group.of(group)
        P = self._group.size
        flat = [p for g in self.param_groups for p in g["params"]]
        for p in flat:
            if p.dtype != torch.float32:
                raise ValueError(
                    f"{type(self).__name__}: parameters must be float32, got {p.dtype}"
                )
        sizes = [[p.numel() for p in g["params"]] for g in self.param_groups]
        specs = layout(sizes, bucket_cap_numel, P * chunks)
        device = flat[0].device if flat else torch.device("cpu")
        self._buckets = [_Bucket(s, flat, P, device, state) for s in specs]
        with torch.no_grad():
            for b in self._buckets:
                for k, p in enumerate(b.params):
                    b.view(b.w, k).copy_(p)
                dist.broadcast(b.w, src=self._group.ranks[0], group=group)
                for k, p in enumerate(b.params):
                    p.data = b.view(b.w, k)
                    p.grad = b.view(b.g, k)
        items = [
            (
                program,
                programs.sliced_schedule,
                {"N": b.spec.numel},
                {"w": b.w, "g": b.g, **b.state},
            )
            for b in self._buckets
        ]
        steps = compile_many(items, group=group, backend=backend, chunks=chunks)
        for b, s in zip(self._buckets, steps):
            b.step = s

    def add_param_group(self, param_group: dict) -> None:
        if self._buckets:
            raise ValueError(
                f"{type(self).__name__}: param groups cannot be added after "
                "construction (the buckets are compiled then)"
            )
        super().add_param_group(param_group)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Zero the gradient buckets; every p.grad stays a zeroed view of its bucket, so backward
        accumulates into the bucket (set_to_none is ignored, as with DDP's
        gradient_as_bucket_view)."""
        for b in self._buckets:
            b.g.zero_()
            for k, p in enumerate(b.params):
                p.grad = b.view(b.g, k)

    def hyper(self, group: dict) -> dict:
        """The step's 0-d inputs from a param group, by name (`betas`: beta1 and beta2)."""
        if group.get("weight_decay") and "weight_decay" not in self._hyper:
            raise ValueError(
                f"{type(self).__name__}: weight_decay={group['weight_decay']} in a param group, "
                "but the step was compiled without weight decay (set it at construction)"
            )
        given = dict(group)
        if "betas" in given:
            given["beta1"], given["beta2"] = given["betas"]
        return {name: given[name] for name in self._hyper if name in given}

    @torch.no_grad()
    def clip_grad_norm(self, max_norm: float) -> torch.Tensor:
        """Scale the gradients so that the 2-norm of the gradient the step uses (the average
        over the ranks) is at most `max_norm`, as `torch.nn.utils.clip_grad_norm_` does after
        DDP's all-reduce; returns that norm (before clipping). Collective; call it between
        backward and `step()`.

        Why not `torch.nn.utils.clip_grad_norm_(model.parameters(), ...)`: without DDP the
        `.grad`s are this rank's own gradients, not their average (the fused step averages them
        itself), so the usual call clips each rank by the norm of its local gradient and the
        ranks drift from DDP's training. Here each bucket is reduce-scattered into a scratch
        slice (half an all-reduce's traffic, on top of the step's), its squares summed, and one
        scalar all-reduced; every rank then scales its local gradients by the same coefficient
        min(1, max_norm / (norm + 1e-6)), which scales their average by it."""
        real = isinstance(max_norm, numbers.Real) and not isinstance(max_norm, bool)
        if not (real and 0 < max_norm < float("inf")):
            raise ValueError(
                f"{type(self).__name__}.clip_grad_norm: max_norm must be a positive finite "
                f"number, got {max_norm!r}"
            )
        P = self._group.size
        device = self._buckets[0].g.device if self._buckets else torch.device("cpu")
        total = torch.zeros((), dtype=torch.float64, device=device)  # NCCL reduces on the GPU
        for b in self._buckets:
            b.gather_grads()
            part = torch.empty(b.spec.numel // P, dtype=b.g.dtype, device=b.g.device)
            b.step.runner.comm.reduce_scatter(b.g, part, "sum")
            total += part.double().div_(P).square().sum()
        if P > 1:
            dist.all_reduce(total, group=self._group.pg)
        norm = total.sqrt().float().cpu()
        coef = float(max_norm) / (float(norm) + 1e-6)
        if coef < 1.0:
            for b in self._buckets:
                b.g.mul_(coef)
        return norm

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for b in self._buckets:
            b.gather_grads()
            b.t += 1
            count = {"step": float(b.t)} if self._counts else {}
            b.step(**count, **self.hyper(self.param_groups[b.spec.group]))
        return loss

    # -- state ----------------------------------------------------------------------------------
    def state_bytes(self) -> int:
        """Bytes of optimizer state this rank holds (its state slices; the step counters aside)."""
        return sum(t.numel() * t.element_size() for b in self._buckets for t in b.state.values())

    def buffer_bytes(self) -> int:
        """Bytes of the step's buffers on this rank besides the parameters, their gradients (the
        gradient buckets) and the state: the Plan's own (the reduced gradient slice, the
        updated slice, ...)."""
        own = {id(t) for b in self._buckets for t in (b.w, b.g, *b.state.values())}
        return sum(
            t.numel() * t.element_size()
            for b in self._buckets
            for t in b.step.runner.bufs.values()
            if id(t) not in own
        )

    def _groups_dict(self) -> list[dict]:
        out, pid = [], 0
        for g in self.param_groups:
            n = len(g["params"])
            out.append(
                {
                    **{k: v for k, v in g.items() if k != "params"},
                    "params": list(range(pid, pid + n)),
                }
            )
            pid += n
        return out

    def state_dict(self) -> dict:
        """The gathered state, in torch's format (Adam's names for FusedAdam), on every rank
        (collective)."""
        state = {}
        for b in self._buckets:
            full = {}
            for name, part in b.state.items():
                full[name] = torch.empty_like(b.w)
                b.step.runner.comm.all_gather(part, full[name])
            for k, s in enumerate(b.spec.slots):
                state[s.param] = {
                    "step": torch.tensor(float(b.t)),
                    **{self._state_names[n]: b.view(full[n], k).clone() for n in b.state},
                }
        return {"state": state, "param_groups": self._groups_dict()}

    def sharded_state_dict(self) -> dict:
        """This rank's slices of the state, per bucket, and the layout they belong to (local)."""
        state = {
            i: {
                "step": torch.tensor(float(b.t)),
                **{self._state_names[n]: t.clone() for n, t in b.state.items()},
            }
            for i, b in enumerate(self._buckets)
        }
        return {
            "state": state,
            "param_groups": self._groups_dict(),
            "sharded": {
                "world_size": self._group.size,
                "rank": self._group.me,
                "layout": [b.spec for b in self._buckets],
            },
        }

    def load_state_dict(self, state_dict: dict) -> None:
        groups = state_dict["param_groups"]
        if [len(g["params"]) for g in groups] != [len(g["params"]) for g in self.param_groups]:
            raise ValueError(
                f"{type(self).__name__}.load_state_dict: the saved param groups do "
                "not match this optimizer's"
            )
        for mine, saved in zip(self.param_groups, groups):
            mine.update({k: v for k, v in saved.items() if k != "params"})
        with torch.no_grad():
            if "sharded" in state_dict:
                self._load_sharded(state_dict)
            else:
                self._load_gathered(state_dict["state"])

    def _load_sharded(self, sd: dict) -> None:
        meta = sd["sharded"]
        here = {
            "world_size": self._group.size,
            "rank": self._group.me,
            "layout": [b.spec for b in self._buckets],
        }
        if meta != here:
            raise ValueError(
                f"{type(self).__name__}.load_state_dict: a sharded state of another "
                "layout, world size or rank (load the gathered state_dict instead)"
            )
        for i, b in enumerate(self._buckets):
            st = sd["state"][i]
            b.t = int(st["step"])
            for name, part in b.state.items():
                part.copy_(st[self._state_names[name]])

    def _load_gathered(self, state: dict) -> None:
        n, me = self._group.size, self._group.me
        for b in self._buckets:
            steps = {int(state[s.param]["step"]) for s in b.spec.slots if s.param in state}
            if len(steps) > 1:
                raise ValueError(
                    f"{type(self).__name__}.load_state_dict: parameters of one bucket "
                    f"saved at different steps {sorted(steps)}"
                )
            b.t = steps.pop() if steps else 0
            k = b.spec.numel // n
            for name, part in b.state.items():
                full = torch.zeros_like(b.w)
                for j, s in enumerate(b.spec.slots):
                    if s.param in state:
                        b.view(full, j).copy_(state[s.param][self._state_names[name]])
                part.copy_(full[me * k : (me + 1) * k])
