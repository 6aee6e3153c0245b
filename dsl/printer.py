"""The printed form of statements and programs, used in errors, reports and golden tests.

    %3: f32[N/P]@sliced(0) = reduce_scatter[sum,dim=0](%2)  # g.rs

Fused groups print as `fuse#k { ... }` blocks (statements keep their order), overlaps as a line
`overlap(%producer -> %consumer, chunks=C)`.
"""

from __future__ import annotations

from .ir import Const, Program, Stmt, Value


def _attr(k: str, v: object) -> str:
    return str(v) if k == "op" else f"{k}={v}"


def format_stmt(s: Stmt) -> str:
    attrs = ",".join(_attr(k, v) for k, v in s.attrs)
    attrs = f"[{attrs}]" if attrs else ""
    args = ", ".join(str(a) if isinstance(a, (Value, Const)) else repr(a) for a in s.args)
    return f"%{s.out.id}: {s.out.type} = {s.op}{attrs}({args})  # {s.out.name}"


def format_program(p: Program) -> str:
    head = f"program {p.name}(P)"
    if p.stages > 1:
        head += f" stages={p.stages}"
    if p.schedule:
        head += f" schedule={p.schedule}"
    lines = [head + " {"]
    for i in p.inputs:
        default = "" if i.default is None else f" = {i.default}"
        lines.append(f"  in %{i.value.id}: {i.value.type}{default}  # {i.value.name}")
    open_group = None
    for s in p.body:
        g = p.group_of(s.out.id)
        if g is not open_group:
            if open_group is not None:
                lines.append("  }")
            if g is not None:
                lines.append(f"  fuse#{p.fused.index(g)} {{")
            open_group = g
        indent = "    " if g is not None else "  "
        lines.append(indent + format_stmt(s))
    if open_group is not None:
        lines.append("  }")
    for o in p.overlaps:
        lines.append(f"  overlap(%{o.producer} -> %{o.consumer}, chunks={o.chunks})")
    for f in p.prefetches:
        lines.append(f"  prefetch(%{f.gather} behind %{f.behind})")
    for name, v in p.outputs:
        lines.append(f"  out {name} = %{v.id}")
    lines.append("}")
    return "\n".join(lines)
