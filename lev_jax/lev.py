"""LEV: the continuous token-index -> embedding generator of Leviathan.

Source: arXiv 2601.22040 (Leviathan), Sec. 3.1, as reconstructed in ../shared/LEV.md,
and the KHRONOS separable B-spline layer by the same authors. Steps, for token id i:

  1. digits    i -> (i_1..i_k) in base b, most significant first, b**k >= V.
  2. seed      z = sum_r C_r[i_r]                                   C_r: b x d_seed
  3. per head  u = LayerNorm_l(W_seed_l z); t = sigmoid(u / 2)     (or sigmoid(u))
               B = quadratic B-spline basis of t on kappa uniform knots (normalised)
               phi[d, r] = sum_j B[d, j] (1 + delta_l[d, j, r])
               M_l[r] = prod_d phi[d, r]        (float32 log space, sign by parity)
  4. output    E(i) = sum_l M_l W_out_l                                W_out_l: R x D

Ablations (config.lev, issue 25; off by default, the paper's LEV): `id_permutation`
embeds perm[i] in place of i (`id_permutation`, in `LEV.__call__`, so before every core
and row strategy); `output_norm` rescales E(i) (`output_norm`, in `_lev_rows`).

Shapes: N ids, K coords, S = d_seed, H heads, J = kappa knots, R rank, D = d_model.
The math is a pure function of a parameter dict (`lev_embed`) so it can be jitted,
chunked and rematerialised; the `LEV` module owns the parameters.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import nnx

from lev_jax import target
from lev_jax.config import LEV_MODES, ConfigError, lev_digit_base
from lev_jax.dense import dense
from lev_jax.sharding import constrain, map_rows


def lev_param_count(vocab_size: int, d_model: int, lev: ml_collections.ConfigDict) -> int:
  """Closed-form LEV parameter count (LEV.md "Parameter count").

  k*b*d_seed + h*(d_seed**2 + 2*d_seed + d_seed*kappa*R + R*D), plus h learnable
  basis scales for the KHRONOS basis. `vocab_size` is the padded vocab.

  Raises:
    ConfigError: lev.base ** lev.n_coords < vocab_size (`config.lev_digit_base`).
  """
  b = lev_digit_base(lev.base, lev.n_coords, vocab_size)
  s, h = lev.d_seed, lev.n_heads
  count = lev.n_coords * b * s + h * (s * s + 2 * s + s * lev.n_knots * lev.rank
                                      + lev.rank * d_model)
  count += {"none": 0, "rmsnorm": d_model, "scale": 1}[lev.output_norm]
  return count + (h if lev.basis == "khronos" else 0)


@functools.lru_cache(maxsize=8)
def id_permutation(vocab_size: int, seed: int) -> np.ndarray:
  """The fixed random bijection of token ids of `lev.id_permutation`.

  Args:
    vocab_size: the padded vocab V (every id LEV addresses).
    seed: config.lev.permutation_seed, >= 0.
  Returns:
    int32 [V], read-only: a permutation of 0 .. V-1 (LEV embeds perm[i] for id i),
    computed once per (V, seed).
  Source: numpy.random.Generator.permutation of numpy.random.default_rng(seed) (PCG64);
    tests/test_lev.py pins its first values, so a numpy that drew another permutation
    (and would change a trained model's embedding on resume) fails there.
  """
  perm_V = np.random.default_rng(seed).permutation(vocab_size).astype(np.int32)
  perm_V.flags.writeable = False
  return perm_V


def to_digits(ids_N: jax.Array, base: int, n_coords: int) -> jax.Array:
  """Base-`base` digits of each id, most significant first.

  Args:
    ids_N: int [N] token ids in [0, base**n_coords).
  Returns:
    int32 [N, n_coords] digits in [0, base).
  """
  ids_N = ids_N.astype(jnp.int32)
  powers_K = base ** jnp.arange(n_coords - 1, -1, -1, dtype=jnp.int32)
  return (ids_N[:, None] // powers_K[None, :]) % base


def bspline_basis(t_NxS: jax.Array, n_knots: int, scale, normalize: bool) -> jax.Array:
  """Quadratic B-spline basis on the uniform grid linspace(0, 1, n_knots) (LEV.md 3c).

  Args:
    t_NxS: float32 [..., S] inputs in [0, 1].
    scale: knot-distance multiplier: n_knots - 1 (fixed), or the KHRONOS learnable
      scale broadcastable to t_NxS[..., None].
    normalize: divide by the sum over knots so each basis row sums to 1.
  Returns:
    float32 [..., S, J] non-negative weights.
  """
  grid_J = jnp.linspace(0.0, 1.0, n_knots, dtype=jnp.float32)
  s = jnp.abs(t_NxS[..., None] - grid_J) * scale
  basis = jnp.where(s < 0.5, 0.75 - s * s, jnp.where(s < 1.5, 0.5 * (1.5 - s) ** 2, 0.0))
  if normalize:
    basis = basis / jnp.maximum(basis.sum(-1, keepdims=True), 1e-12)
  return basis


def signed_log_product(phi: jax.Array, axis: int, eps: float) -> jax.Array:
  """prod(phi, axis) as sign * exp(sum log(|phi| + eps)), in float32 (LEV.md 3e).

  The sign is (-1) ** (number of negative factors). Equals the direct product up to
  the eps perturbation of each factor and float32 rounding.
  """
  phi = phi.astype(jnp.float32)
  log_abs = jnp.log(jnp.abs(phi) + eps).sum(axis)
  n_negative = (phi < 0).sum(axis)
  sign = 1.0 - 2.0 * (n_negative % 2).astype(jnp.float32)
  return sign * jnp.exp(log_abs)


_LN2 = float(np.log(2.0))
_FLOAT32_MIN_NORMAL = float(np.finfo(np.float32).tiny)
MAX_LOG_GROUP = 64  # a product of G float32 mantissas in [1, 2) stays below 2**G < 2**128


def bspline_window(t_NxS: jax.Array, n_knots: int, scale: float,
                   normalize: bool) -> tuple[jax.Array, jax.Array]:
  """The <= 3 nonzero quadratic B-spline weights of each input and their knots.

  For the fixed knot scale n_knots - 1 (LEV.md 3c), input t lies within 1.5 knot
  spacings of exactly the knots c - 1, c, c + 1 with c = round(t * (n_knots - 1)); every
  other basis function is 0 there. Equals `bspline_basis` restricted to those knots
  (same grid values, same formula, same normalisation).

  Args:
    t_NxS: float32 [..., S] inputs in [0, 1].
    scale: the fixed knot-distance multiplier n_knots - 1 (a Python float). The KHRONOS
      learnable scale can widen the support beyond 3 knots: use `bspline_basis` there.
  Returns:
    (weights [..., S, 3] float32, knots [..., S, 3] int32): knots clipped into
    [0, n_knots); a slot whose knot lies off the grid has weight 0.
  """
  grid_J = jnp.linspace(0.0, 1.0, n_knots, dtype=jnp.float32)
  nearest = jnp.floor(t_NxS * (n_knots - 1) + 0.5).astype(jnp.int32)
  knots = nearest[..., None] + jnp.arange(-1, 2, dtype=jnp.int32)
  on_grid = (knots >= 0) & (knots < n_knots)
  knots = jnp.clip(knots, 0, n_knots - 1)
  s = jnp.abs(t_NxS[..., None] - grid_J[knots]) * scale
  weights = jnp.where(s < 0.5, 0.75 - s * s, jnp.where(s < 1.5, 0.5 * (1.5 - s) ** 2, 0.0))
  weights = jnp.where(on_grid, weights, 0.0)
  if normalize:
    weights = weights / jnp.maximum(weights.sum(-1, keepdims=True), 1e-12)
  return weights, knots


def _factor(phi, log_eps):
  """sign(phi) * (|phi| + eps) with sign(0) = +1: the factor whose product is M (3e)."""
  return jnp.where(phi < 0, phi - log_eps, phi + log_eps)


def _mantissa_exponent(f):
  """f = m * 2**(e - 127), m in +-[1, 2) (sign kept), e the biased int32 exponent.

  Exact bit operations on float32 (IEEE 754): valid for normal numbers, which every
  factor is (|f| >= log_eps >= the smallest normal). A non-finite f is passed through as
  m so that inf and NaN propagate into the product as in the reference.
  """
  bits = jax.lax.bitcast_convert_type(f, jnp.int32)
  exponent = (bits >> 23) & 0xFF
  mantissa = jax.lax.bitcast_convert_type((bits & jnp.int32(-0x7F800001)) | 0x3F800000,
                                          jnp.float32)
  return jnp.where(jnp.abs(f) < jnp.inf, mantissa, f), exponent


def _coordinate_phi(w_NxHxW, k_NxHxW, delta_HxJxR):
  """phi[n, h, r] = sum_w w (1 + delta[h, k, r]) for one seed coordinate (LEV.md 3d).

  Returns (phi_NxHxR, rows): the W gathered delta rows [N, H, R] are reused by the
  backward pass. Only the window's knots are read (3 of J for the normalised basis).
  """
  h, j, r = delta_HxJxR.shape
  flat_HJxR = delta_HxJxR.reshape(h * j, r)
  idx_NxHxW = jnp.arange(h, dtype=jnp.int32)[None, :, None] * j + k_NxHxW
  rows = [flat_HJxR.at[idx_NxHxW[..., i]].get(mode="promise_in_bounds")
          for i in range(k_NxHxW.shape[-1])]
  phi_NxHxR = w_NxHxW.sum(-1)[..., None] + sum(
      w_NxHxW[..., i, None] * row for i, row in enumerate(rows))
  return phi_NxHxR, rows


# A window source: where each seed coordinate's window (weights and knots) comes from.
#   ("given",)                  the caller's weights and knots, stacked by coordinate
#   ("normalized", J)           bspline_window of the spline input t, normalised, scale J-1
#   ("khronos", J)              the dense KHRONOS basis of t with its learnable scale
# With the spline input, each coordinate's window is computed inside the loop (and
# again in the backward pass) from t: the only per-row residual is t itself, [S, H, N]
# with rows on the minor axis. Materialised windows ([N, H, S, W], W = 3 on the minor
# axis) are padded 42-fold by XLA:TPU's (8, 128) tiling: at the paper's shapes they were
# most of Leviathan's extra memory per chip (lev-compile, benchmarks/pod_compile.py).


def _window_basis(w_NxHxW, k_NxHxW, n_knots):
  """float32 [N, H, J]: the window's weights scattered onto the J knots (slots that share
  a knot add up)."""
  return (w_NxHxW[..., None] * jax.nn.one_hot(k_NxHxW, n_knots, dtype=jnp.float32)
          ).sum(-2)


def _window(source, x_c, scale):
  """(weights [N, H, W] float32, knots [N, H, W] int32) of one seed coordinate.

  x_c: the coordinate's slice of the source: (weights, knots) for "given", else t [H, N].
  """
  kind = source[0]
  if kind == "given":
    return x_c
  t_NxH = x_c.T
  n_knots = source[1]
  if kind == "normalized":
    return bspline_window(t_NxH, n_knots, float(n_knots - 1), True)
  weights_NxHxJ = bspline_basis(t_NxH, n_knots, scale[:, None], False)
  return weights_NxHxJ, jnp.broadcast_to(jnp.arange(n_knots, dtype=jnp.int32),
                                         weights_NxHxJ.shape)


def _fused_forward(xs_S, scale, delta_SxHxJxR, source, log_eps, log_group):
  s, h, _, r = delta_SxHxJxR.shape

  def group(g, carry):
    log_NxHxR, negative_NxHxR = carry
    mantissa = exponent = None
    for i in range(log_group):  # unrolled: the group's factors never leave the fusion
      c = g * log_group + i
      w_NxHxW, k_NxHxW = _window(source, jax.tree.map(lambda x: x[c], xs_S), scale)
      phi_NxHxR, _ = _coordinate_phi(w_NxHxW, k_NxHxW, delta_SxHxJxR[c])
      m, e = _mantissa_exponent(_factor(phi_NxHxR, log_eps))
      mantissa = m if mantissa is None else mantissa * m
      exponent = e if exponent is None else exponent + e
    # Materialise the group product once; the two updates below then read it.
    mantissa, exponent = jax.lax.optimization_barrier((mantissa, exponent))
    log_NxHxR = (log_NxHxR + jnp.log(jnp.abs(mantissa))
                 + (exponent - 127 * log_group).astype(jnp.float32) * _LN2)
    return log_NxHxR, negative_NxHxR ^ (mantissa < 0)

  n = _rows(xs_S, source)
  init = (jnp.zeros((n, h, r), jnp.float32), jnp.zeros((n, h, r), jnp.bool_))
  log_NxHxR, negative_NxHxR = jax.lax.fori_loop(0, s // log_group, group, init,
                                                unroll=target.loops_unrolled() or None)
  return jnp.where(negative_NxHxR, -1.0, 1.0) * jnp.exp(log_NxHxR)


def _rows(xs_S, source) -> int:
  return xs_S[0].shape[1] if source[0] == "given" else xs_S.shape[2]


def _check_core(s: int, log_eps: float, log_group: int) -> None:
  if not 1 <= log_group <= MAX_LOG_GROUP or s % log_group:
    raise ValueError(f"log_group = {log_group}: expected a divisor of d_seed = {s} in "
                     f"[1, {MAX_LOG_GROUP}]")
  if not log_eps >= _FLOAT32_MIN_NORMAL:
    raise ValueError(f"log_eps = {log_eps}: expected >= {_FLOAT32_MIN_NORMAL:.3g}")


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5))
def _fused_core(xs_S, scale, delta_SxHxJxR, source, log_eps, log_group):
  return _fused_forward(xs_S, scale, delta_SxHxJxR, source, log_eps, log_group)


def _fused_fwd(xs_S, scale, delta, source, log_eps, log_group):
  modes = _fused_core(xs_S, scale, delta, source, log_eps, log_group)
  return modes, (xs_S, scale, delta, modes)


def _fused_bwd(source, log_eps, log_group, residuals, g_modes_NxHxR):
  del log_group
  xs_S, scale, delta_SxHxJxR, modes = residuals
  j = delta_SxHxJxR.shape[2]
  g_log_NxHxR = g_modes_NxHxR * modes  # d modes = modes * sum_s d factor_s / factor_s

  def coordinate(g_scale, xs):
    x_c, d_HxJxR = xs
    if source[0] == "given":
      w_NxHxW, k_NxHxW = x_c
    else:
      w_NxHxW, window_vjp, k_NxHxW = jax.vjp(lambda t, sc: _window(source, t, sc), x_c,
                                             scale, has_aux=True)
    phi_NxHxR, rows = _coordinate_phi(w_NxHxW, k_NxHxW, d_HxJxR)
    g_phi_NxHxR = g_log_NxHxR / _factor(phi_NxHxR, log_eps)
    g_sum_NxH = g_phi_NxHxR.sum(-1)
    g_w_NxHxW = jnp.stack([g_sum_NxH + (g_phi_NxHxR * row).sum(-1) for row in rows], -1)
    # g_delta[h, j, r] = sum_n sum_w [k = j] w g_phi: a matmul over the rows with the
    # window scattered into a dense [N, H, J] basis (a scatter-add is serial on CPU).
    g_d_HxJxR = jnp.einsum("nhj,nhr->hjr", _window_basis(w_NxHxW, k_NxHxW, j),
                           g_phi_NxHxR)
    if source[0] == "given":
      return g_scale, (g_w_NxHxW, g_d_HxJxR)
    g_t_HxN, g_sc = window_vjp(g_w_NxHxW)
    if g_scale is not None:
      g_scale = g_scale + g_sc
    return g_scale, (g_t_HxN, g_d_HxJxR)

  g_scale0 = None if scale is None else jnp.zeros_like(scale)
  g_scale, (g_x_S, g_d_S) = jax.lax.scan(coordinate, g_scale0, (xs_S, delta_SxHxJxR),
                                         unroll=target.loops_unrolled() or 1)
  if source[0] == "given":
    g_x_S = (g_x_S, None)
  return g_x_S, g_scale, g_d_S


_fused_core.defvjp(_fused_fwd, _fused_bwd)


def lev_modes_fused(weights_NxHxSxW: jax.Array, knots_NxHxSxW: jax.Array,
                    delta_HxSxJxR: jax.Array, log_eps: float, log_group: int) -> jax.Array:
  """LEV's separable modes from the window basis, fused (LEV.md 3d-3e).

    phi[n,h,s,r] = sum_w weights[n,h,s,w] * (1 + delta[h, s, knots[n,h,s,w], r])
    modes[n,h,r] = prod_s sign(phi) * (|phi| + log_eps)

  Equal to `signed_log_product(phi, axis=2, eps=log_eps)` of the reference path up to
  float32 rounding, without its [N, H, S, R] tensor: a loop over the S seed coordinates
  keeps [N, H, R] intermediates; the factors of `log_group` coordinates are multiplied
  directly (mantissas in [1, 2) and integer exponents, so no group product can overflow
  or underflow) before one log, and the sign is the parity of the negative mantissa
  products, exact. The backward pass (custom VJP) stores only the modes and recomputes
  phi per coordinate: d modes / d phi = modes / factor (the reference's gradient, with
  d|phi|/dphi = +1 at phi = 0 as jnp.abs). `lev_modes_from_spline` is the same core fed
  with the spline input t instead of materialised windows (what `lev_embed` runs).

  Args:
    weights_NxHxSxW: float32 window weights (`bspline_window`; W = J for a dense basis).
    knots_NxHxSxW: int32 knot index of each window slot, in [0, J).
    delta_HxSxJxR: float32 `spline_delta`.
    log_eps: eps of the log-space product, >= the smallest normal float32.
    log_group: G, coordinates per log; divides S, at most MAX_LOG_GROUP.
  Returns:
    float32 [N, H, R] modes M_l[r].
  Raises:
    ValueError: S not divisible by log_group, log_group out of range, or log_eps below
      the smallest normal float32 (the exponent split would be wrong).
  """
  _check_core(weights_NxHxSxW.shape[2], log_eps, log_group)
  by_coordinate = lambda x: x.transpose(2, 0, 1, 3)
  return _fused_core((by_coordinate(weights_NxHxSxW), by_coordinate(knots_NxHxSxW)), None,
                     delta_HxSxJxR.transpose(1, 0, 2, 3), ("given",), log_eps, log_group)


def lev_modes_from_spline(t_NxHxS: jax.Array, scale, delta_HxSxJxR: jax.Array,
                          basis: str, log_eps: float, log_group: int) -> jax.Array:
  """`lev_modes_fused` of the B-spline window of `t_NxHxS`, computed coordinate by
  coordinate inside the core (LEV.md 3c-3e).

  Equals `lev_modes_fused(*bspline_window(t, J, J - 1, True), delta, ...)` for the
  normalised basis and the dense KHRONOS basis with knots 0..J-1 otherwise, values and
  gradients (to t, scale and delta), without materialising the [N, H, S, W] windows:
  the backward pass recomputes each coordinate's window from t.

  Args:
    t_NxHxS: float32 spline inputs in [0, 1].
    scale: None for "normalized" (fixed scale J - 1); the KHRONOS learnable scale,
      float32 [H], for "khronos".
    delta_HxSxJxR: float32 `spline_delta`.
    basis: "normalized" or "khronos" (config.BASIS_VARIANTS).
  Returns:
    float32 [N, H, R] modes.
  Raises:
    ValueError: as `lev_modes_fused`.
  """
  _check_core(t_NxHxS.shape[2], log_eps, log_group)
  source = (basis, delta_HxSxJxR.shape[2])
  return _fused_core(t_NxHxS.transpose(2, 1, 0), scale, delta_HxSxJxR.transpose(1, 0, 2, 3),
                     source, log_eps, log_group)


def _knot_grid(n_knots: int) -> np.ndarray:
  """`bspline_basis`'s grid, linspace(0, 1, n_knots) in float32, as host constants (the
  same values; inside a trace too)."""
  with jax.ensure_compile_time_eval():
    return np.asarray(jnp.linspace(0.0, 1.0, n_knots, dtype=jnp.float32))


def _knot_scale(scale, n_knots):
  """The knot-distance multiplier broadcastable to t: the KHRONOS scale [H] (learnable),
  or the fixed n_knots - 1 for the normalised basis (scale None)."""
  return float(n_knots - 1) if scale is None else scale[:, None]


def _unnormalized(s):
  return jnp.where(s < 0.5, 0.75 - s * s, jnp.where(s < 1.5, 0.5 * (1.5 - s) ** 2, 0.0))


def _inverse_total(t_NxHxS, scale, n_knots, basis):
  """1 / the sum over knots of the unnormalised basis (>= 1e-12), [N, H, S]; None for
  "khronos" (not normalised)."""
  if basis == "khronos":
    return None
  grid_J, sc = _knot_grid(n_knots), _knot_scale(scale, n_knots)
  total = sum(_unnormalized(jnp.abs(t_NxHxS - grid_J[k]) * sc) for k in range(n_knots))
  return 1.0 / jnp.maximum(total, 1e-12)


def _knot_basis(t_NxHxS, scale, n_knots, basis):
  """The B-spline basis (LEV.md 3c) as a list of J [N, H, S] arrays, one per knot.

  `bspline_basis` (with `scale[:, None, None]` for "khronos") without its J axis: XLA:TPU
  lays a minor J = 16 axis out in (8, 128) tiles and re-lays every knot's slice out
  again for each consumer (GBs of copies at 8,192 rows); a list has no such axis. The
  normalisation multiplies by 1 / total (`_inverse_total`), so each knot's weight is a
  cheap function of t that XLA can recompute where it is read."""
  grid_J, sc = _knot_grid(n_knots), _knot_scale(scale, n_knots)
  inverse = _inverse_total(t_NxHxS, scale, n_knots, basis)
  basis_J = [_unnormalized(jnp.abs(t_NxHxS - grid_J[k]) * sc) for k in range(n_knots)]
  return basis_J if inverse is None else [b * inverse for b in basis_J]


def _knot_basis_stacked(t_NxHxS, scale, n_knots, basis):
  """`_knot_basis` stacked on a leading knot axis, [J, N, H, S], computed from t in one
  expression (the same values): the dot in `_vectorized_bwd` then builds its operand
  from t instead of reading a stacked copy."""
  grid_J, sc = _knot_grid(n_knots), _knot_scale(scale, n_knots)
  inverse = _inverse_total(t_NxHxS, scale, n_knots, basis)
  basis_JxNxHxS = _unnormalized(jnp.abs(t_NxHxS[None] - grid_J[:, None, None, None]) * sc)
  return basis_JxNxHxS if inverse is None else basis_JxNxHxS * inverse[None]


def _knot_phi(basis_J, delta_HxSxJxR):
  """phi[n,h,s,r] = sum_j B_j (1 + delta[h,s,j,r]) as J multiply-adds per element, all in
  float32 on the vector units (a matmul with J = 16 contracted would run in bfloat16
  passes on a TPU and leave most of its MXU idle)."""
  phi = sum(basis_J[1:], basis_J[0])[..., None]
  for j, b in enumerate(basis_J):
    phi = phi + b[..., None] * delta_HxSxJxR[:, :, j]
  return phi


def _signed_log_product_once(phi, axis: int, eps: float):
  """`signed_log_product` with its two sums (log |phi| + eps and the negative count) as
  one variadic reduction: XLA:TPU then reads phi's inputs once, not once per sum (the
  vectorized core off the CPU; on the CPU the two sums keep their float32 bits)."""
  log_abs, n_negative = jax.lax.reduce(
      (jnp.log(jnp.abs(phi) + eps), (phi < 0).astype(jnp.int32)),
      (np.float32(0), np.int32(0)), lambda x, y: (x[0] + y[0], x[1] + y[1]), (axis,))
  return (1.0 - 2.0 * (n_negative % 2).astype(jnp.float32)) * jnp.exp(log_abs)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5, 6))
def _vectorized_core(t_NxHxS, scale, delta_HxSxJxR, basis, log_eps, grad_dtype,
                     one_reduction):
  del grad_dtype
  basis_J = _knot_basis(t_NxHxS, scale, delta_HxSxJxR.shape[2], basis)
  product = _signed_log_product_once if one_reduction else signed_log_product
  return product(_knot_phi(basis_J, delta_HxSxJxR), 2, log_eps)


def _vectorized_fwd(t_NxHxS, scale, delta_HxSxJxR, basis, log_eps, grad_dtype,
                    one_reduction):
  modes = _vectorized_core(t_NxHxS, scale, delta_HxSxJxR, basis, log_eps, grad_dtype,
                           one_reduction)
  return modes, (t_NxHxS, scale, delta_HxSxJxR, modes)


def _vectorized_bwd(basis, log_eps, grad_dtype, one_reduction, residuals, g_modes_NxHxR):
  """Two passes over [N, H, S, R], neither of which stores anything of that size:

    g_t[n,h,s] = sum_r g_phi dphi/dt         dphi/dt: phi's forward derivative in t
    g_delta[h,s,j,r] = sum_n B_j g_phi       one dot over the rows

  with g_phi = g_modes * modes / factor(phi) (d modes / d phi, as in `_fused_bwd`) and phi
  recomputed in each. phi[n,h,s,:] depends on t only through t[n,h,s] (and on the KHRONOS
  scale only through scale[h]), so dphi/dt is the jvp with tangent 1: the chain rule
  through the basis, sum_j dB_j/dt (1 + delta_j), folded into the same reduction as g_phi
  instead of a [N, H, S, J] basis gradient. XLA:TPU fuses g_phi's recomputation into the
  dot's operand, so g_phi never goes through HBM (the earlier backward stored it, 2.1 GB
  at 8,192 rows, and read it twice).
  """
  del one_reduction
  t_NxHxS, scale, delta_HxSxJxR, modes = residuals
  j = delta_HxSxJxR.shape[2]
  f32 = jnp.float32
  g_log_NxHxSxR = (g_modes_NxHxR * modes)[:, :, None, :]
  phi_of = lambda t, sc: _knot_phi(_knot_basis(t, sc, j, basis), delta_HxSxJxR)
  phi, dphi_dt = jax.jvp(lambda t: phi_of(t, scale), (t_NxHxS,), (jnp.ones_like(t_NxHxS),))
  factor = _factor(phi, log_eps)
  if grad_dtype == "float32":
    g_t_NxHxS = (g_log_NxHxSxR * dphi_dt / factor).sum(-1)
  else:  # g_phi rounded once to grad_dtype, as it enters each product
    g_t_NxHxS = ((g_log_NxHxSxR / factor).astype(grad_dtype).astype(f32) * dphi_dt).sum(-1)
  g_scale = None
  if scale is not None:
    dphi_dscale = jax.jvp(lambda sc: phi_of(t_NxHxS, sc), (scale,), (jnp.ones_like(scale),))[1]
    g_phi = (g_log_NxHxSxR / factor).astype(grad_dtype).astype(f32)
    g_scale = (g_phi * dphi_dscale).sum((0, 2, 3))
  g_delta_HxSxJxR = jnp.einsum(
      "jnhs,nhsr->hsjr", _knot_basis_stacked(t_NxHxS, scale, j, basis),
      (g_log_NxHxSxR / factor).astype(grad_dtype), precision=jax.lax.Precision.HIGHEST,
      preferred_element_type=f32)
  return g_t_NxHxS, g_scale, g_delta_HxSxJxR


_vectorized_core.defvjp(_vectorized_fwd, _vectorized_bwd)


def lev_modes_vectorized(t_NxHxS: jax.Array, scale, delta_HxSxJxR: jax.Array,
                         basis: str, log_eps: float, grad_dtype: str = "float32") -> jax.Array:
  """LEV's separable modes with every seed coordinate at once (LEV.md 3c-3e).

    phi[n,h,s,r] = sum_j B(t)[n,h,s,j] (1 + delta[h,s,j,r])   over all J knots
    modes[n,h,r] = prod_s sign(phi) (|phi| + log_eps)

  The accelerator path (`lev.impl = "vectorized"`): no loop over the S coordinates, so
  nothing [N, H, R]-sized goes through HBM once per coordinate as in the fused core's
  loop (leviathan_1.2b's shapes, 4,096 rows on one v5p chip: 4.2 ms with the first
  version of this core against 80.1 ms with the fused one; benchmarks/
  lev_tpu_estimate.py --impl, compiler ESTIMATES). It computes [N, H, S, R] float32
  values (phi, and its gradient in the backward) inside fusions, so rows are bounded by
  `lev.chunk_size`. A custom VJP keeps only t and the modes as residuals and recomputes
  phi (`_vectorized_bwd`): t's gradient is one reduction over R of phi's gradient g_phi
  times phi's derivative in t (the KHRONOS scale's likewise), and delta's one dot over the
  rows (float32, HIGHEST precision) whose operands XLA:TPU builds from t and g_modes
  inside the dot's fusion. The basis is a list of J [N, H, S] arrays (`_knot_basis`),
  never a [..., J] tensor. On a TPU the core's estimate is bound by HBM traffic: off the
  CPU the product's log-sum and sign count are one reduction (`_signed_log_product_once`).
  leviathan_200m, 8,192 rows on one v5p chip, LEV's embedding and gradient: 2.21 ms,
  5.19e9 bytes accessed, against 6.78 ms, 15.9e9 bytes with the backward before this one
  (which stored g_phi, 2.1 GB, and a [N, H, S, J] basis gradient; 5.41 ms with g_phi in
  bfloat16); leviathan_1.2b, 4,096 rows: 1.28 ms, 2.99e9 bytes, against 4.22 ms
  (compiler ESTIMATES, `python benchmarks/lev_tpu_estimate.py --rung leviathan_200m
  --rows 8192`, and `--rung leviathan_1.2b --rows 4096`). `grad_dtype="bfloat16"` rounds
  g_phi to bfloat16 as it enters each product (relative error <= 2**-9 per element);
  nothing of g_phi is stored any more, so it saves no HBM traffic: it costs more
  (leviathan_200m, 8,192 rows: 3.24 ms, 7.6e9 bytes, ESTIMATE, `--phi_grad_dtype
  bfloat16`). Computing phi on the MXU at lower precision (bfloat16x3 by hand,
  Precision.HIGH or DEFAULT) made the core slower there: phi then goes through HBM.

  Equals `lev_modes_from_spline` (and the reference path) up to float32 rounding, values
  and gradients to t, scale and delta (with grad_dtype="float32").

  Args:
    t_NxHxS: float32 spline inputs in [0, 1].
    scale: None for "normalized"; the KHRONOS learnable scale, float32 [H], for "khronos".
    delta_HxSxJxR: float32 `spline_delta`.
    basis: "normalized" or "khronos" (config.BASIS_VARIANTS).
    log_eps: eps of the log-space product.
    grad_dtype: "float32" or "bfloat16", g_phi's dtype in the backward pass
      (config.lev.phi_grad_dtype).
  Returns:
    float32 [N, H, R] modes.
  """
  # The platform is a static argument: jax caches the core's trace by its arguments.
  return _vectorized_core(t_NxHxS, scale, delta_HxSxJxR, basis, log_eps, grad_dtype,
                          target.platform() != "cpu")


def _modes(params: dict, t_NxHxS: jax.Array, cfg: ml_collections.ConfigDict) -> jax.Array:
  """float32 [N, H, R] modes from the spline inputs t, by `cfg.impl` (LEV.md 3c-3e)."""
  f32 = jnp.float32
  delta_HxSxJxR = params["spline_delta"].astype(f32)
  khronos = cfg.basis == "khronos"
  scale_H = params["basis_scale"].astype(f32) if khronos else None
  if cfg.impl == "vectorized":
    return lev_modes_vectorized(t_NxHxS, scale_H, delta_HxSxJxR, cfg.basis, cfg.log_eps,
                                cfg.phi_grad_dtype)
  if cfg.impl == "fused" and target.platform() != "cpu":
    # Off the CPU the windows are recomputed from t inside the core (memory: see
    # `_window`); on the CPU they are materialised first, which keeps the float32 bits
    # of every CPU run and figure made before (XLA:CPU rounds the in-loop window
    # differently in the last bit).
    return lev_modes_from_spline(t_NxHxS, scale_H, delta_HxSxJxR, cfg.basis, cfg.log_eps,
                                 cfg.log_group)
  if khronos:
    scale = params["basis_scale"].astype(f32)[:, None, None]  # [H, 1, 1]
  else:
    scale = float(cfg.n_knots - 1)
  if cfg.impl == "reference":
    basis_NxHxSxJ = bspline_basis(t_NxHxS, cfg.n_knots, scale, cfg.basis == "normalized")
    # S = 1 + delta, so sum_j B S = sum_j B + sum_j B delta.
    phi_NxHxSxR = jnp.einsum("nhsj,hsjr->nhsr", basis_NxHxSxJ, delta_HxSxJxR)
    phi_NxHxSxR = phi_NxHxSxR + basis_NxHxSxJ.sum(-1)[..., None]
    return signed_log_product(phi_NxHxSxR, axis=2, eps=cfg.log_eps)
  if khronos:
    # The learnable scale may widen each basis function past 3 knots: every knot is in
    # the window (W = J), which is exact for any scale.
    weights = bspline_basis(t_NxHxS, cfg.n_knots, scale, False)
    knots = jnp.broadcast_to(jnp.arange(cfg.n_knots, dtype=jnp.int32), weights.shape)
  else:
    weights, knots = bspline_window(t_NxHxS, cfg.n_knots, scale, True)
  if cfg.impl == "fused":
    return lev_modes_fused(weights, knots, delta_HxSxJxR, cfg.log_eps, cfg.log_group)
  from lev_jax.lev_pallas import lev_modes_pallas  # pylint: disable=g-import-not-at-top
  # A Pallas kernel is opaque to XLA's partitioner: each device runs it on its share of
  # the rows, with delta whole (its gradient summed over the devices).
  kernel = functools.partial(lev_modes_pallas, log_eps=cfg.log_eps, log_group=cfg.log_group)
  return map_rows(kernel, (weights, knots), (delta_HxSxJxR,))


def _lev_rows(params: dict, ids_N: jax.Array, cfg: ml_collections.ConfigDict,
              base: int) -> jax.Array:
  """LEV for a flat array of ids: int [N] -> float32 [N, D]."""
  f32 = jnp.float32
  digits_NxK = to_digits(ids_N, base, cfg.n_coords)
  codebooks_KxBxS = params["codebooks"].astype(f32)
  z_NxS = sum(codebooks_KxBxS[r][digits_NxK[:, r]] for r in range(cfg.n_coords))
  u_NxHxS = dense(z_NxS, params["seed_proj"].astype(f32).transpose(1, 0, 2))  # [S, H, S]
  mean = u_NxHxS.mean(-1, keepdims=True)
  var = jnp.square(u_NxHxS - mean).mean(-1, keepdims=True)
  u_NxHxS = (u_NxHxS - mean) * jax.lax.rsqrt(var + cfg.ln_eps)
  u_NxHxS = u_NxHxS * params["ln_scale"] + params["ln_bias"]
  t_NxHxS = jax.nn.sigmoid(u_NxHxS * (0.5 if cfg.sigmoid == "half" else 1.0))
  modes_NxHxR = _modes(params, t_NxHxS, cfg)
  return output_norm(params, dense(modes_NxHxR, params["out_proj"].astype(f32), 2), cfg)


def output_norm(params: dict, x_NxD: jax.Array, cfg: ml_collections.ConfigDict
                ) -> jax.Array:
  """LEV's output as the backbone gets it, by `cfg.output_norm` (per row, float32):

    none     x (the paper's).
    rmsnorm  x / sqrt(mean_D(x**2) + cfg.ln_eps) * g, g = params["out_norm_scale"] [D]
             (RMSNorm, Zhang & Sennrich 2019, as model.RMSNorm).
    scale    x * s, s = params["out_scale"] [] (one learned scalar).
  """
  if cfg.output_norm == "none":
    return x_NxD
  x_NxD = x_NxD.astype(jnp.float32)
  if cfg.output_norm == "rmsnorm":
    x_NxD = x_NxD * jax.lax.rsqrt(jnp.mean(x_NxD * x_NxD, -1, keepdims=True) + cfg.ln_eps)
    return x_NxD * params["out_norm_scale"].astype(jnp.float32)
  return x_NxD * params["out_scale"].astype(jnp.float32)


def dense_plan(padded_vocab: int, n_ids: int) -> tuple[str, int]:
  """The cheaper of `table` (padded_vocab rows) and `tokens` (n_ids rows); ties: tokens.

  What `auto` picks without a unique bound, and where `unique` falls back to.
  """
  return ("table", padded_vocab) if padded_vocab < n_ids else ("tokens", n_ids)


def evaluation_plan(mode: str, padded_vocab: int, n_ids: int,
                    unique_size: int = 0) -> tuple[str, int]:
  """Which rows LEV is evaluated on for a micro-batch of `n_ids` ids, and how many.

  The one decision used by `embeddings.LEVEmbedding.embed` and by `flops` (so the FLOP
  model counts what runs):
    table   every id of the padded vocab, then a gather: padded_vocab rows.
    tokens  one row per id: n_ids rows.
    unique  the distinct ids, padded to a static bound U (`lev.unique_size`; 0 = half of
            min(padded_vocab, n_ids)), then a gather: U rows. A micro-batch with more
            than U distinct ids falls back, exactly, to `dense_plan` (the cheaper of
            table / tokens).
    auto    the strategy with the fewest rows (`dense_plan` on a tie); `unique` is a
            candidate only when `unique_size` is set (> 0), since its row count is a
            bound the data must respect, not a fact of the shapes.

  Returns:
    (strategy, rows): one of "table", "tokens", "unique" and the rows evaluated.
  Raises:
    ConfigError: unknown mode.
  """
  dense = dense_plan(padded_vocab, n_ids)
  bound = min(unique_size or max(1, min(padded_vocab, n_ids) // 2), min(padded_vocab, n_ids))
  if mode == "table":
    return "table", padded_vocab
  if mode == "tokens":
    return "tokens", n_ids
  if mode == "unique":
    return "unique", bound
  if mode == "auto":
    return ("unique", bound) if unique_size and bound < dense[1] else dense
  raise ConfigError(f"config.lev.mode = {mode!r}: expected one of "
                    + ", ".join(repr(m) for m in LEV_MODES))


def lev_embed(params: dict, ids: jax.Array, cfg: ml_collections.ConfigDict,
              base: int) -> jax.Array:
  """LEV embeddings of any-shaped ids, computed in chunks of `cfg.chunk_size` ids.

  The `reference` implementation runs each chunk under `jax.checkpoint` (its backward
  would otherwise keep [chunk, H, S, R] tensors); the fused and Pallas cores keep only
  [chunk, H, S]-sized residuals and recompute inside their own backward pass, so a
  checkpoint would only repeat work.

  Args:
    params: the `LEV` module's parameters as a dict of arrays.
    ids: int [...] token ids in [0, base**n_coords).
    cfg: `config.lev`.
    base: b, the digit base.
  Returns:
    float32 [..., D].
  """
  ids_N = ids.reshape(-1)
  n = ids_N.shape[0]
  chunk = min(cfg.chunk_size, n)
  # Rows are split over every device of the mesh ("lev_rows" rule): LEV's parameters are
  # replicated, so each device evaluates its share of the ids (data-parallel LEV).
  fn = lambda ids_C: constrain(
      _lev_rows(params, constrain(ids_C, ("lev_rows",)), cfg, base), ("lev_rows", None))
  if cfg.impl == "reference":
    fn = jax.checkpoint(fn)
  if n <= chunk:
    out_NxD = fn(ids_N)
  else:
    # Chunk c holds ids c, c + n_chunks, c + 2 n_chunks, ...: a static [chunk, n_chunks]
    # layout whose rows keep the flat ids' split over devices (each device's contiguous
    # block of ids is its block of rows), so every chunk is spread evenly over the
    # devices with no data moved, and the loop slices an unsplit axis. (Slicing
    # contiguous chunks of the split flat axis is what XLA:TPU rejected: "Reshape should
    # have supported layout", jax 0.10.2 / libtpu 0.0.42.1.)
    n_chunks = -(-n // chunk)
    padded_N = jnp.pad(ids_N, (0, n_chunks * chunk - n))
    ids_CxK = constrain(padded_N.reshape(chunk, n_chunks), ("lev_rows", None))
    if target.loops_unrolled():  # lev-compile's cost estimate (target.unrolled_loops)
      out_KxCxD = jnp.stack([fn(ids_C) for ids_C in ids_CxK.T])
    else:
      out_KxCxD = jax.lax.map(fn, ids_CxK.T)
    out_NxD = out_KxCxD.swapaxes(0, 1).reshape(n_chunks * chunk, -1)[:n]
  return out_NxD.reshape(*ids.shape, -1)


class LEV(nnx.Module):
  """The LEV input embedding: token id -> D-vector (LEV.md "The map").

  Parameters carry `logical_axes` metadata (names starting with `lev_` for LEV's own
  dimensions, `embed` for D) for the sharding rules.

  `cfg.out_proj_init` = "paper": W_out_l ~ N(0, 0.02 / sqrt(h)) (LEV.md); "match_table":
  the same draw times one factor, init_std / rms(E) with rms(E) the RMS of LEV's output
  over a fixed, evenly spaced sample of min(vocab_size, 256) ids, so LEV's output rows
  start at the scale of a tied table's rows (entries N(0, init_std)). E is linear in
  W_out, so the rescaled sample RMS is init_std; no random draw is added.

  `vocab_size` is the padded vocab (the rows of `table()`).

  `cfg.id_permutation`: ids go through `id_permutation(vocab_size,
  cfg.permutation_seed)` before LEV (a constant of the program, not a parameter or
  state). `cfg.output_norm`: "rmsnorm" adds `out_norm_scale` [D] (init 1), "scale"
  `out_scale` [] (init 1), both in LEV's optimizer group (`output_norm`).

  Raises:
    ConfigError: if base**n_coords < vocab_size (`config.lev_digit_base`).
  """

  def __init__(self, vocab_size: int, d_model: int, cfg: ml_collections.ConfigDict, *,
               rngs: nnx.Rngs, param_dtype=jnp.float32, init_std: float = 0.02):
    cfg = ml_collections.FrozenConfigDict(cfg)
    self.cfg = cfg
    self.vocab_size = vocab_size
    self.base = lev_digit_base(cfg.base, cfg.n_coords, vocab_size)
    k, b, s, h = cfg.n_coords, self.base, cfg.d_seed, cfg.n_heads
    j, r = cfg.n_knots, cfg.rank
    normal = lambda std, shape: std * jax.random.normal(rngs.params(), shape, param_dtype)
    self.codebooks = nnx.Param(normal(0.02, (k, b, s)),
                               logical_axes=("lev_coords", "lev_codes", "lev_seed"))
    self.seed_proj = nnx.Param(normal(0.02, (h, s, s)),
                               logical_axes=("lev_heads", "lev_seed", "lev_seed_out"))
    self.ln_scale = nnx.Param(jnp.ones((h, s), param_dtype),
                              logical_axes=("lev_heads", "lev_seed"))
    self.ln_bias = nnx.Param(jnp.zeros((h, s), param_dtype),
                             logical_axes=("lev_heads", "lev_seed"))
    self.spline_delta = nnx.Param(normal(0.1, (h, s, j, r)),
                                  logical_axes=("lev_heads", "lev_seed", "lev_knots", "lev_rank"))
    self.out_proj = nnx.Param(normal(0.02 / h ** 0.5, (h, r, d_model)),
                              logical_axes=("lev_heads", "lev_rank", "embed"))
    if cfg.basis == "khronos":
      self.basis_scale = nnx.Param(jnp.full((h,), j - 1.0, param_dtype),
                                   logical_axes=("lev_heads",))
    if cfg.output_norm == "rmsnorm":
      self.out_norm_scale = nnx.Param(jnp.ones((d_model,), param_dtype),
                                      logical_axes=("embed",))
    elif cfg.output_norm == "scale":
      self.out_scale = nnx.Param(jnp.ones((), param_dtype), logical_axes=())
    if cfg.out_proj_init == "match_table":
      sample_N = jnp.linspace(0, vocab_size - 1, min(vocab_size, 256)).astype(jnp.int32)
      rms = jnp.sqrt(jnp.mean(jnp.square(self(sample_N))))
      self.out_proj.set_value(self.out_proj[...] * (init_std / jnp.maximum(rms, 1e-30)
                                                    ).astype(param_dtype))

  def param_dict(self) -> dict:
    names = ["codebooks", "seed_proj", "ln_scale", "ln_bias", "spline_delta", "out_proj"]
    if self.cfg.basis == "khronos":
      names.append("basis_scale")
    names += {"none": [], "rmsnorm": ["out_norm_scale"], "scale": ["out_scale"]}[
        self.cfg.output_norm]
    return {n: getattr(self, n)[...] for n in names}

  def __call__(self, ids: jax.Array) -> jax.Array:
    """int [...] ids in [0, vocab_size) -> float32 [..., D] embeddings, computed per
    token (of perm[ids] with `cfg.id_permutation`)."""
    if self.cfg.id_permutation:
      perm_V = jnp.asarray(id_permutation(self.vocab_size, self.cfg.permutation_seed))
      ids = perm_V[ids]
    return lev_embed(self.param_dict(), ids, self.cfg, self.base)

  def table(self) -> jax.Array:
    """float32 [vocab_size, D]: LEV evaluated at every id (the materialised table)."""
    return self(jnp.arange(self.vocab_size, dtype=jnp.int32))
