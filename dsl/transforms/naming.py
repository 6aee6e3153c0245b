"""`schedule_name(program)`: the paper's name of a schedule, read off the program's structure.

Each statement becomes a token: matmul `MM`, attention `ATT`, all_reduce `AR`, reduce_scatter `RS`, all_gather
`AG`, p2p `P2P`, broadcast `BC`, reduce `RD`, all_to_all `A2A`, any computation `C` (a 0-d
all_reduce, the combine step of a sliced reduction, counts as computation; an update is a write-back
and gives no token). Runs of the same token collapse (`C-C` -> `C`, the all-gathers of several
updated tensors -> one `AG`). A fused group prints as `fuse(..)`, an overlap as `ol(producer,
consumer)`, a prefetched all-gather as `pf(AG,behind)` where the statement it runs behind was. A
program that keeps updated state as slices (`as_slice`) gets a suffix: `+as_slice`
for the paper's (ZeRO-style) default, every updated tensor kept as slices but the last one updated
(the weights: Adam's m and v, SGD's momentum), else `+as_slice(x,y)` naming the sliced tensors in
update order, so that distinct slicings never share a name.

    AR, C                     -> AR-C
    RS, C, AG                 -> RS-C-AG
    MM, [RS, C, AG] fused, MM overlapped with RS -> ol(MM,fuse(RS-C-AG))
    AG, MM, AG, MM, the second AG prefetched behind the first MM -> AG-pf(AG,MM)-MM
"""

from __future__ import annotations

from ..ir import Program, Stmt
from ..ops import is_combine
from ..types import Sliced

TOKENS = {
    "matmul": "MM",
    "attention": "ATT",
    "all_reduce": "AR",
    "reduce_scatter": "RS",
    "all_gather": "AG",
    "p2p": "P2P",
    "broadcast": "BC",
    "reduce": "RD",
    "all_to_all": "A2A",
}


def token(s: Stmt) -> str | None:
    if s.op == "update":
        return None
    if is_combine(s):
        return "C"
    return TOKENS.get(s.op, "C")


def _collapse(tokens: list[str]) -> list[str]:
    out: list[str] = []
    for t in tokens:
        if not out or out[-1] != t:
            out.append(t)
    return out


def schedule_name(p: Program) -> str:
    # segments: (token text, first stmt id, set of stmt ids it covers)
    segs: list[tuple[str, set[int]]] = []
    i = 0
    body = list(p.body)
    while i < len(body):
        g = p.group_of(body[i].out.id)
        if g is None:
            t = token(body[i])
            if t is not None:
                if segs and segs[-1][0] == t and not segs[-1][0].startswith("fuse("):
                    segs[-1][1].add(body[i].out.id)
                else:
                    segs.append((t, {body[i].out.id}))
            i += 1
            continue
        members = [s for s in body[i:] if s.out.id in g.ids]
        inner = _collapse([t for t in map(token, members) if t is not None])
        segs.append((f"fuse({'-'.join(inner)})", set(g.ids)))
        i += len(members)
    for o in p.overlaps:
        a = next(k for k, (_, ids) in enumerate(segs) if o.producer in ids)
        b = next(k for k, (_, ids) in enumerate(segs) if o.consumer in ids)
        merged = (f"ol({segs[a][0]},{segs[b][0]})", segs[a][1] | segs[b][1])
        segs = segs[:a] + [merged] + segs[a + 1 : b] + segs[b + 1 :]
    for f in p.prefetches:  # the gather moves to the statement it runs behind
        b = next(k for k, (_, ids) in enumerate(segs) if f.behind in ids)
        g = next(k for k, (_, ids) in enumerate(segs) if f.gather in ids)
        merged = (f"pf({segs[g][0]},{segs[b][0]})", segs[g][1] | segs[b][1])
        segs = segs[:b] + [merged] + segs[b + 1 : g] + segs[g + 1 :]
    name = "-".join(_collapse([t for t, _ in segs]))
    return name + _sliced_suffix(p)


def _sliced_suffix(p: Program) -> str:
    """'' (no sliced state), '+as_slice' (all updated tensors sliced but the last updated), or
    '+as_slice(m)' naming the sliced ones."""
    updated = [s.args[0] for s in p.body if s.op == "update"]
    sliced = [x.name for x in updated if isinstance(x.type.layout, Sliced)]
    if not sliced:
        return ""
    if sliced == [x.name for x in updated[:-1]]:
        return "+as_slice"
    return f"+as_slice({','.join(sliced)})"
