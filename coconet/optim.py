"""`FusedOptimizer`: a torch optimizer for data-parallel training that runs an optimizer program's
generated `fuse(RS-C-AG)+as_slice` step instead of DDP's all-reduce plus an optimizer (the base of
`coconet.FusedAdam`, `FusedAdamW` and `FusedLAMB`, and the wrapper of a user's own program).

    model = Net()                                    # the same initial weights on every rank
    opt = coconet.FusedAdam(model.parameters(), lr=1e-3)       # no DDP wrapper
    for x, y in data:                                # this rank's micro-batch
        opt.zero_grad(); loss_fn(model(x), y).backward(); opt.step()

Contract
- Construction is collective over `group` (None: every rank). The parameters (float32, or
  bfloat16 / float16 as below, on the backend's device) are broadcast from the group's first rank, then moved into flat buckets
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
  A program with the i32 input `seg` (`programs.lamb_program(segments=K)`) gets each element's
  tensor index in its bucket (`BucketLayout.segment_ids`, -1 for padding); `per_bucket(spec)`
  gives the program of each bucket (its segment count), `program` its inputs and state.
- Mixed precision (`coconet.precision`): parameters all bfloat16 or all float16 (else float32)
  run a program with the low-precision gradient `g` and weights `h` and f32 `w` (e.g.
  `programs.adam_program(half=bf16)`): the gradient is reduce-scattered in its own dtype (the
  paper's and Apex's f16 communication: half the bytes of f32), this rank's slice is upcast and
  averaged in f32, the f32 master weights w, m and v are updated as slices (w is optimizer
  state: `master_weight` in `state_dict()`, per parameter, f32, the parameter's shape), and the
  new weights are cast to the parameters' dtype and all-gathered into them, all in the one
  generated kernel. A gathered state_dict without master weights (torch's AdamW's) starts them
  from the parameters.
- Dynamic loss scaling (float16 only; `loss_scale="dynamic"` or a `coconet.LossScaler`):
  backward on `opt.scale(loss)`; `step()` unscales the gradient inside the fused step, and where
  any rank's gradient overflowed (`precision.local_overflow`, max-reduced over the ranks inside
  the step as a 0-d all_reduce, or a non-finite value in a reduced slice) every rank keeps its
  weights and state, the step count does not advance, and `step()` returns False; the scale
  follows `torch.cuda.amp.GradScaler` (`loss_scale`, `skipped_steps`; its state under
  "loss_scaler" in the state dicts).
- Not supported (ValueError): parameters of mixed dtypes or of another dtype, loss scaling of
  parameters that are not float16, param groups added after construction, a weight decay asked of
  a step compiled without one.
"""

from __future__ import annotations

import numbers
from typing import Optional

import torch
import torch.distributed as dist

from codegen.runtime.backend import TORCH
from codegen.runtime.comm import Group

from . import precision, programs
from .buckets import BucketLayout, layout
from .checkpoint import Checkpoints
from .step import Step, compile_many

# torch.optim.Adam's (and AdamW's) names for the Adam programs' state
ADAM_STATE = {"m": "exp_avg", "v": "exp_avg_sq", "vmax": "max_exp_avg_sq"}
MASTER = {"w": "master_weight"}  # a mixed-precision program's f32 w, in state_dict()
OWN = ("step", "inv_scale", "found_inf")  # 0-d inputs the optimizer sets, not hyper-parameters


class _Bucket:
    """A layout with its flat buffers: w and g (N elements, in the parameters' dtype: w holds
    the parameters), and each sliced input of the program (`programs.sliced_inputs`: m and v for
    Adam; the f32 master weights too in mixed precision) as this rank's slice (N/P)."""

    def __init__(self, spec: BucketLayout, params: list, P: int, device, dtype, state: dict):
        self.spec, self.t = spec, 0
        self.w = torch.zeros(spec.numel, dtype=dtype, device=device)
        self.g = torch.zeros_like(self.w)
        self.state = {
            name: torch.zeros(spec.numel // P, dtype=dt, device=device)
            for name, dt in state.items()
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


class FusedOptimizer(Checkpoints, torch.optim.Optimizer):
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
        loss_scale=None,
        per_bucket=None,
    ):
        self._buckets: list[_Bucket] = []
        super().__init__(params, defaults)
        who = type(self).__name__
        inputs = {i.value.name: i.value.type for i in program.inputs}
        self._weights = "h" if "h" in inputs else "w"  # the input holding the parameters
        self._segmented = "seg" in inputs  # per-tensor segments of a bucket (LAMB's norms)
        if not {"g", "w"} <= set(inputs):
            raise ValueError(
                f"{who}: the program {program.name} needs the inputs g (the "
                f"gradient) and w (the weights); it has {sorted(inputs)}"
            )
        state = programs.state_of(program)
        unknown = sorted(set(state_names or {}) - set(state))
        if unknown:
            raise ValueError(
                f"{who}: state_names names {unknown}, not state of "
                f"{program.name} (its state: {list(state)})"
            )
        sliced = programs.sliced_inputs(program)
        names = {**MASTER, **(state_names or {})}
        self._state_names = {n: names.get(n, n) for n in sliced}
        zero_d = [n for n, t in inputs.items() if not t.shape]
        self._hyper = tuple(n for n in zero_d if n not in OWN)
        self._counts = "step" in zero_d  # the program takes the step count (Adam's bias correction)
        self._group = Group.world() if group is None else Group.of(group)
        P = self._group.size
        flat = [p for g in self.param_groups for p in g["params"]]
        dtype = precision.param_dtype(flat, who)
        self._check_program(program, inputs, dtype, loss_scale)
        self._scaler = None
        if loss_scale is not None:  # "dynamic" or the caller's own LossScaler
            own = isinstance(loss_scale, precision.LossScaler)
            self._scaler = loss_scale if own else precision.LossScaler()
        self._found = torch.zeros((), device=flat[0].device if flat else None)
        sizes = [[p.numel() for p in g["params"]] for g in self.param_groups]
        specs = layout(sizes, bucket_cap_numel, P * chunks)
        device = flat[0].device if flat else torch.device("cpu")
        kinds = {n: TORCH[inputs[n].dtype] for n in sliced}
        self._buckets = [_Bucket(s, flat, P, device, dtype, kinds) for s in specs]
        self._share(group)
        of = per_bucket or (lambda spec: program)
        items = [
            (of(b.spec), programs.sliced_schedule, {"N": b.spec.numel}, self._bound(b))
            for b in self._buckets
        ]
        steps = compile_many(items, group=group, backend=backend, chunks=chunks)
        for b, s in zip(self._buckets, steps):
            b.step = s

    def _check_program(self, program, inputs: dict, dtype: torch.dtype, loss_scale) -> None:
        """The program's gradient and weights in the parameters' dtype, and loss scaling in
        both or neither (a one-line ValueError naming what differs)."""
        who = type(self).__name__
        scaled = precision.check_loss_scale(loss_scale, dtype, who)
        for name in ("g", self._weights):
            if TORCH[inputs[name].dtype] != dtype:
                raise ValueError(
                    f"{who}: the program {program.name}'s input {name} is "
                    f"{inputs[name].dtype}, the parameters are {dtype}"
                )
        if scaled != ("found_inf" in inputs):
            raise ValueError(
                f"{who}: loss_scale={loss_scale!r} but the program {program.name} "
                + ("has" if "found_inf" in inputs else "has no")
                + " loss scaling (inputs inv_scale, found_inf)"
            )

    @torch.no_grad()
    def _share(self, group) -> None:
        """The parameters broadcast from the group's first rank into the buckets, each p.data
        and p.grad a view of its bucket, the f32 master slices (mixed precision) upcast."""
        P, me = self._group.size, self._group.me
        for b in self._buckets:
            for k, p in enumerate(b.params):
                b.view(b.w, k).copy_(p)
            dist.broadcast(b.w, src=self._group.ranks[0], group=group)
            for k, p in enumerate(b.params):
                p.data = b.view(b.w, k)
                p.grad = b.view(b.g, k)
            if self._weights == "h":
                n = b.spec.numel // P
                b.state["w"].copy_(b.w[me * n : (me + 1) * n])

    def _bound(self, b: _Bucket) -> dict:
        """The tensors a bucket's step works in (aliased)."""
        extra = {"found_inf": self._found} if self._scaler else {}
        if self._segmented:  # each element's tensor in the bucket (`BucketLayout.segment_ids`)
            extra["seg"] = torch.tensor(b.spec.segment_ids(), dtype=torch.int32, device=b.w.device)
        return {self._weights: b.w, "g": b.g, **b.state, **extra}

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
            total += part.double().mul_(self._unscale()).square().sum()
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
        """One fused step per bucket (collective). Returns the closure's loss where one is
        given (as torch's optimizers do), else whether the update was taken: False where the
        loss scaling found an overflow, and every rank skipped it."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for b in self._buckets:
            b.gather_grads()
        extra = {}
        if self._scaler:
            precision.local_overflow([b.g for b in self._buckets], self._group.size, self._found)
            extra = {"inv_scale": 1.0 / self._scaler.scale}
        skipped = False
        for b in self._buckets:
            b.t += 1
            count = {"step": float(b.t)} if self._counts else {}
            out = b.step(**count, **extra, **self.hyper(self.param_groups[b.spec.group]))
            if "overflow" in out and float(out["overflow"]) != 0.0:  # NaN too
                b.t -= 1  # a skipped step does not count (torch's step count)
                skipped = True
        if self._scaler:
            self._scaler.update(skipped)
        return loss if closure is not None else not skipped

    # -- loss scaling (fp16) ----------------------------------------------------------------------
    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        """The loss to call backward on: with loss_scale="dynamic", `loss` times S/P (S is
        `loss_scale`, P the ranks: see `coconet.precision`); else `loss` itself."""
        if self._scaler is None:
            return loss
        return loss * (self._scaler.scale / self._group.size)

    @property
    def loss_scale(self) -> float:
        """S, the dynamic loss scale (GradScaler's `get_scale()`); 1.0 without loss scaling."""
        return self._scaler.scale if self._scaler else 1.0

    def get_scale(self) -> float:
        return self.loss_scale

    @property
    def skipped_steps(self) -> int:
        """Steps skipped for an overflow so far (0 without loss scaling)."""
        return self._scaler.skipped_steps if self._scaler else 0

    def _unscale(self) -> float:
        """The factor from the summed gradient to the averaged one: 1/P, or 1/S when scaled."""
        return 1.0 / (self._scaler.scale if self._scaler else self._group.size)

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
