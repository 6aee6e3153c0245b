"""Scaled dot-product attention on [S, B, E] activations: the reference value and its error bound.

    attention64(q, k, v, head_dim, causal)        # float64 [S, B, E]
    attention_error(v, e, r, U, head_dim, causal, gamma, subnormal)

Layout: sequence first, E = heads x head_dim (d); head h of batch b is the columns
[h d, (h + 1) d) of q[:, b, :]. Per (b, h), as `torch.nn.functional.scaled_dot_product_attention`
computes it on [B, heads, S, d] views: o = softmax(q k^T / sqrt d + mask) v, the mask -inf above
the diagonal where `causal` (query i sees keys j <= i), else 0.

Error bound (per element of o, for a run in the dtype, U = eps(dtype), in any blocking: the math
path, or a flash kernel's running max and rescaled accumulator). With |.| element-wise and `gamma`
the sum bound of `dsl.bounds`:
- scores s = q k^T / sqrt d: es = [|q| ek^T + eq |k|^T + eq ek^T + gamma(d) (|q|+eq)(|k|+ek)^T] / sqrt d,
  plus 2 U (|s| + es) (its rounding, 3 half-ulps with the scale's, applied to s or to q and k);
- softmax: exp(s_ij - m) is off by the factor exp(+-t_ij), t = es + (|s - m| + 4) U (the
  subtraction rounded, exp a 4 U library function); with lo_i = sum_j p_ij exp(-t_ij) and
  hi_i = sum_j p_ij exp(t_ij) (the normaliser's range, p the exact probabilities), p'_ij / p_ij
  lies in [exp(-t_ij) / hi_i, exp(t_ij) / lo_i]: rel_ij is the larger distance from 1, plus
  gamma(S) + 2 U for the normaliser's sum and the division;
- o = p v: sum_j p rel |v| + p (1 + rel) ev, plus (4 gamma(S) + U) sum_j p (1 + rel)(|v| + ev):
  the sum, a flash kernel's rescalings of its accumulator (one per key block, at most S, bounded
  like a sum's), p rounded to the dtype before the product; plus S subnormal spacings x |v|
  (probabilities flushed to zero). The caller adds the result's own rounding.
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np

from .errors import ShapeError


def heads(x: np.ndarray, d: int) -> np.ndarray:
    """[S, B, E] -> [B, E / d, S, d] (a view where numpy can)."""
    S, B, E = x.shape
    if E % d:
        raise ShapeError(f"attention's head_dim {d} does not divide the {E} columns")
    return x.reshape(S, B, E // d, d).transpose(1, 2, 0, 3)


def unheads(y: np.ndarray) -> np.ndarray:
    """[B, h, S, d] -> [S, B, h d]."""
    B, h, S, d = y.shape
    return y.transpose(2, 0, 1, 3).reshape(S, B, h * d)


def _mask(S: int, causal: bool) -> np.ndarray:
    return np.tril(np.ones((S, S), dtype=bool)) if causal else np.ones((S, S), dtype=bool)


def _scores(q, k, d: int, causal: bool) -> tuple[np.ndarray, np.ndarray]:
    """(q k^T / sqrt d in float64 [B, h, S, S], the mask of the keys each query sees)."""
    s = heads(q, d) @ heads(k, d).swapaxes(-1, -2) / math.sqrt(d)
    return s, _mask(s.shape[-1], causal)


def _softmax(s: np.ndarray, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(probabilities, s - rowmax) with the masked scores at probability 0."""
    m = np.where(mask, s, -np.inf).max(axis=-1, keepdims=True)
    e = np.where(mask, np.exp(np.where(mask, s - m, 0.0)), 0.0)
    return e / e.sum(axis=-1, keepdims=True), s - m


def attention64(q, k, v, head_dim: int, causal: bool = False) -> np.ndarray:
    """softmax(q k^T / sqrt d) v per batch and head, in float64, [S, B, E]."""
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    p, _ = _softmax(*_scores(q, k, head_dim, causal))
    return unheads(p @ heads(v, head_dim))


def attention_error(
    v: list,
    e: list,
    r: np.ndarray,
    U: float,
    head_dim: int,
    causal: bool,
    gamma: Callable[[int, float], float],
    subnormal: float,
) -> np.ndarray:
    """The propagated error of attention (see the module doc), [S, B, E]; `v`, `e`: the exact
    operands q, k, v and their error bounds, float64 [S, B, E]."""
    d = head_dim
    (q, k, vv), (eq, ek, ev) = v, e
    qa, ka, va = (np.abs(heads(x, d)) for x in (q, k, vv))
    eqh, ekh, evh = (heads(np.broadcast_to(x, q.shape), d) for x in (eq, ek, ev))
    s, mask = _scores(q, k, d, causal)
    T = lambda x: x.swapaxes(-1, -2)  # noqa: E731
    es = qa @ T(ekh) + eqh @ T(ka) + eqh @ T(ekh)
    es = (es + gamma(d, U) * ((qa + eqh) @ T(ka + ekh))) / math.sqrt(d)
    es = es + 2 * U * (np.abs(s) + es)
    p, centred = _softmax(s, mask)
    t = np.where(mask, es + (np.abs(centred) + 4) * U, 0.0)
    lo = (p * np.exp(-t)).sum(axis=-1, keepdims=True)
    hi = (p * np.exp(t)).sum(axis=-1, keepdims=True)
    with np.errstate(all="ignore"):
        rel = np.maximum(np.exp(t) / lo - 1, 1 - np.exp(-t) / hi)
    S = s.shape[-1]
    rel = np.where(mask, rel + gamma(S, U) + 2 * U, 0.0)
    wide = p * (1 + rel)
    out = (p * rel) @ va + wide @ evh + (4 * gamma(S, U) + U) * (wide @ (va + evh))
    out = out + subnormal * (va + evh).sum(axis=-2, keepdims=True)  # flushed probabilities
    return unheads(out)


__all__ = ["attention64", "attention_error", "heads", "unheads"]
