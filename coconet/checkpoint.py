"""`Checkpoints`: `FusedOptimizer`'s state dicts (see `coconet.optim`'s contract).

- `state_dict()` (collective): the gathered state in torch's format, per parameter id: `step` and
  each state tensor of the parameter's shape under the optimizer's `_state_names` (Adam's
  `exp_avg`, `exp_avg_sq`; a mixed-precision step's `master_weight`), `param_groups` with
  parameter ids, and the loss scaler's state under "loss_scaler" where there is one; on every rank.
- `sharded_state_dict()` (local): this rank's slices per bucket and the layout they belong to.
- `load_state_dict(sd)` takes either (a sharded one only with the same layout, world size and
  rank; a gathered one without master weights starts them from the parameters).

The mixin reads the optimizer's `_buckets` (each with `spec`, `state`, `t`, `view`, `w` and its
step's runner), `_state_names`, `_group`, `_scaler` and `param_groups`.
"""

from __future__ import annotations

import torch


class Checkpoints:
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
                full[name] = torch.empty(b.spec.numel, dtype=part.dtype, device=part.device)
                b.step.runner.comm.all_gather(part, full[name])
            for k, s in enumerate(b.spec.slots):
                state[s.param] = {
                    "step": torch.tensor(float(b.t)),
                    **{self._state_names[n]: b.view(full[n], k).clone() for n in b.state},
                }
        return {"state": state, "param_groups": self._groups_dict(), **self._scaler_dict()}

    def _scaler_dict(self) -> dict:
        return {"loss_scaler": self._scaler.state_dict()} if self._scaler else {}

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
            **self._scaler_dict(),
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
        if self._scaler and "loss_scaler" in state_dict:
            self._scaler.load_state_dict(state_dict["loss_scaler"])
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
                full = torch.zeros(b.spec.numel, dtype=part.dtype, device=part.device)
                for j, s in enumerate(b.spec.slots):
                    saved = state.get(s.param, {}).get(self._state_names[name])
                    if saved is not None:
                        b.view(full, j).copy_(saved)
                    elif name == "w":  # no master weights saved: the parameters, upcast
                        b.view(full, j).copy_(b.view(b.w, j))
                part.copy_(full[me * k : (me + 1) * k])
