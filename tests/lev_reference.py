"""An independent float64 NumPy LEV, written from ../shared/LEV.md ("The map") alone.

Not a translation of lev_jax/lev.py: each step below is LEV.md's, one token at a time,
with plain loops where the document has sums and products, so that a shared mistake is
unlikely. Parameters use the `LEV` module's names and layouts (documented per step);
LEV.md writes matrix shapes input-first and applies them to row vectors
(E(i) = sum_l M_l W_out_l with W_out_l: R x D), so W_seed_l (d_seed x d_seed) is applied
the same way: u = z W_seed_l, i.e. u[t] = sum_s z[s] W_seed_l[s, t].
"""

from __future__ import annotations

import numpy as np


def digit_base(vocab_size: int, n_coords: int) -> int:
  """b = ceil(V ** (1 / k)) in exact integer arithmetic: the least b with b**k >= V."""
  b = 1
  while b ** n_coords < vocab_size:
    b += 1
  return max(b, 2)


def digits_of(i: int, base: int, n_coords: int) -> list[int]:
  """i in base b with k digits, most significant first (LEV.md step 1)."""
  out = []
  for _ in range(n_coords):
    out.append(i % base)
    i //= base
  if i:
    raise ValueError("id needs more than n_coords digits: b**k < V")
  return out[::-1]


def _layer_norm(u, scale, bias, eps):
  """LayerNorm over the features of one vector: biased variance, eps inside the root."""
  mean = u.sum() / u.size
  var = ((u - mean) ** 2).sum() / u.size
  return (u - mean) / np.sqrt(var + eps) * scale + bias


def _sigmoid(x):
  return 1.0 / (1.0 + np.exp(-x))


def _quadratic_bspline(s):
  """LEV.md 3c, for a knot distance s >= 0 already multiplied by the knot scale."""
  if s < 0.5:
    return 0.75 - s * s
  if s < 1.5:
    return 0.5 * (1.5 - s) ** 2
  return 0.0


def lev_reference(params: dict, ids, *, vocab_size: int, n_coords: int, n_knots: int,
                  sigmoid: str, basis: str, ln_eps: float = 1e-5,
                  log_eps: float = 1e-6) -> np.ndarray:
  """E(i) for each id, float64 [N, D].

  Args:
    params: float arrays, in the `LEV` module's layout:
      codebooks [k, b, d_seed]           C_r = codebooks[r]
      seed_proj [h, d_seed, d_seed]      W_seed_l = seed_proj[l] (input dim first)
      ln_scale, ln_bias [h, d_seed]      LayerNorm_l's scale and bias
      spline_delta [h, d_seed, kappa, R] delta_l
      out_proj [h, R, D]                 W_out_l
      basis_scale [h]                    KHRONOS's learnable knot scale (basis="khronos")
    ids: ints in [0, vocab_size).
    sigmoid: "half" (sigmoid(u / 2)) or "full" (sigmoid(u)).
    basis: "normalized" (fixed scale kappa - 1, basis normalised over knots) or
      "khronos" (learnable scale per head, not normalised).
  """
  p = {k: np.asarray(v, np.float64) for k, v in params.items()}
  base = digit_base(vocab_size, n_coords)
  n_heads, d_seed = p["ln_scale"].shape
  rank, d_model = p["out_proj"].shape[1:]
  grid = np.linspace(0.0, 1.0, n_knots)
  out = np.zeros((len(ids), d_model))
  for n, i in enumerate(np.asarray(ids).tolist()):
    z = np.zeros(d_seed)
    for r, digit in enumerate(digits_of(i, base, n_coords)):   # step 2: the seed
      z = z + p["codebooks"][r, digit]
    for l in range(n_heads):                                     # step 3: per head
      u = z @ p["seed_proj"][l]
      u = _layer_norm(u, p["ln_scale"][l], p["ln_bias"][l], ln_eps)
      t = _sigmoid(u / 2.0 if sigmoid == "half" else u)
      scale = p["basis_scale"][l] if basis == "khronos" else n_knots - 1.0
      log_abs, negatives = np.zeros(rank), np.zeros(rank, int)
      for d in range(d_seed):
        b_j = np.array([_quadratic_bspline(abs(t[d] - g) * scale) for g in grid])
        if basis == "normalized":
          b_j = b_j / b_j.sum()
        spline = 1.0 + p["spline_delta"][l, d]                   # S_l[d]: [kappa, R]
        phi = b_j @ spline                                       # phi[d, :]: [R]
        log_abs += np.log(np.abs(phi) + log_eps)                 # 3e: M_l in log space
        negatives += phi < 0
      mode = np.where(negatives % 2, -1.0, 1.0) * np.exp(log_abs)
      out[n] += mode @ p["out_proj"][l]                          # step 4
  return out
