"""The transformer ops' code, shared by the renderers (`codegen.render.Renderer`'s tables): GeLU's
expression, and one row's lines of the row ops (softmax, layer_norm over the last dimension) from
`x(j)` (the operand at j, as double), `y(j, value)` (the store), the row length L, the renderer
`r` (its `row_loop`, `row_combine`, `code_for_op`, `const`, `inf`) and the statement `s`. They
compute in double, as `dsl.interpret` does.
"""

from __future__ import annotations

from typing import Callable

from dsl.types import DType


def gelu_rule(exp: str, erfc: str) -> Callable[..., str]:
    """x * Phi(x) as 0.5 x erfc(-x / sqrt 2), or x / (1 + exp(-2u)) for approximate="tanh"
    (`dsl.interpret.gelu64`), with the target's erfc and exp."""

    def rule(a: str, approximate: str, dt: DType) -> str:
        f = "" if dt is DType.f64 else "f"
        if approximate == "tanh":
            two_u = f"1.5957691216057308{f} * ({a} + 0.044715{f} * {a} * {a} * {a})"
            return f"({a} / (1.0{f} + {exp}(-({two_u}))))"
        return f"(0.5{f} * {a} * {erfc}(-{a} * 0.7071067811865476{f}))"

    return rule


def softmax_row(x: Callable[[str], str], y: Callable[[str, str], str], L: int, r, s) -> list[str]:
    """exp(x - max) / sum exp(x - max), in double."""
    loop, xj = r.row_loop(), x("j")
    e = r.code_for_op["exp"](f"{xj} - cc_m", DType.f64)
    return [
        f"double cc_m = -{r.inf};",
        f"{loop} cc_m = cc_max(cc_m, {xj});",
        *r.row_combine("max", "cc_m"),
        "double cc_s = 0;",
        f"{loop} cc_s += {e};",
        *r.row_combine("sum", "cc_s"),
        f"{loop} {y('j', f'{e} / cc_s')}",
    ]


def layer_norm_row(
    x: Callable[[str], str], y: Callable[[str, str], str], L: int, r, s
) -> list[str]:
    """(x - mean) * (1 / sqrt(var + eps)), the biased variance of the centred values, in double."""
    loop, xj, n = r.row_loop(), x("j"), f"{L}.0"
    eps = r.const(float(s.attr("eps", 1e-5)), DType.f64)
    root = r.code_for_op["sqrt"](f"cc_v / {n} + {eps}", DType.f64)
    return [
        "double cc_s = 0;",
        f"{loop} cc_s += {xj};",
        *r.row_combine("sum", "cc_s"),
        f"const double cc_mean = cc_s / {n};",
        "double cc_v = 0;",
        f"{loop} {{ const double cc_d = {xj} - cc_mean; cc_v += cc_d * cc_d; }}",
        *r.row_combine("sum", "cc_v"),
        f"const double cc_rstd = 1 / {root};",
        f"{loop} {y('j', f'({xj} - cc_mean) * cc_rstd')}",
    ]
