"""LEV's separable-product core as Pallas kernels (forward and backward).

What it computes (LEV.md steps 3d-3e), per row n, LEV head h, rank r:

  phi[n, h, s, r]  = sum_w weights[n, h, s, w] * (1 + delta[h, s, knots[n, h, s, w], r])
  modes[n, h, r]   = prod_s phi[n, h, s, r], as sign * exp(sum_s log(|phi| + log_eps)),
                     the sign from the parity of negative factors, in float32.

It equals `lev.signed_log_product(phi, axis=2, eps=log_eps)` with phi the einsum of the
dense basis, without ever writing phi (N x H x S x R) to memory, in the forward or the
backward.

Shapes: N rows (ids), H LEV heads, S = d_seed coordinates, W window slots per coordinate
(3 for the normalised quadratic basis; J for the dense KHRONOS window), J knots, R rank.

Tiling. One program per (row block, head, rank block): grid (N/bn, H, R/br), rank
innermost so a row block's weights and knots stay resident while its rank blocks run.
Inside, a loop over the S coordinates in groups of `log_group` = G:
  1. the window weights of coordinate s are scattered into a dense basis [J, bn]
     (one compare-and-select per slot: no gather, which neither Triton nor Mosaic
     lowers well), and phi^T [br, bn] = (1 + delta_s)^T [br, J] @ basis [J, bn] is one
     matmul on the tensor cores (GPU) or the MXU (TPU);
  2. the G factors |phi| + eps are multiplied directly, one log per group: this divides
     the transcendental count, the LEV bottleneck, by G. The product cannot overflow or
     underflow whatever G and the data: each factor is split by bit operations into its
     mantissa in [1, 2) and its integer exponent; the mantissas' product lies in
     [1, 2**G) (G <= 64 is enforced) and the exponents are summed exactly in int32.
     This needs every factor to be a normal float32, hence log_eps >= 1.2e-38 (checked);
  3. the sign is flipped for each negative factor (exact parity).
The end: modes = sign * exp(sum of group logs + exponent sum * ln 2).

Backward (custom VJP). The only residual is modes [N, H, R]. Each coordinate is
recomputed (basis, phi; no group needed) and
  g_phi     = g_modes * modes * sign(phi) / (|phi| + eps)     (sign(0) = +1: jnp.abs's
                                                               gradient, select(x >= 0))
  g_basis   = (1 + delta_s) [J, br] @ g_phi [br, bn]          -> g_weights by the knots
  g_delta_s = basis [J, bn] @ g_phi^T [bn, br]
Every output block is written by exactly one program (no accumulation across grid
steps, which Triton's parallel grid does not allow): g_weights is written per rank block
and g_delta per row block, and the partials are summed by XLA outside. The g_delta
partials hold (N / block_rows) x H x S x J x R floats: raise block_rows for long
inputs (LEV's chunks of 4096 ids at the default shapes: 32 x 4 MiB).

Layout. Inside, rows are the minor (lane) axis: weights and knots are transposed to
[H, S, W, N] so a block [S, W, bn] is dense in VMEM (W on sublanes, not lane-padded to
128), and modes come out as [H, R, N]. The wrapper pads N to block_rows, R to
block_rank, J to a power of two >= 16 (matmul minimum on Triton) with zero delta, and W
to a power of two with zero-weight slots, then slices back.

Precision. The in-kernel matmuls default to HIGHEST (float32-exact phi, as the XLA
path on CPU): IEEE float32 FMA on Triton (no tensor cores) and 6-pass bf16 on the TPU
MXU. precision=HIGH (TF32 on GPU tensor cores, 3-pass bf16 on TPU) is faster, at ~1e-3
relative error in
phi. The matmuls are thin (K = J = 16): the kernel's win is keeping phi on chip and
one log per G factors, not matmul throughput.

Backends. `interpret=None` runs the kernels in the Pallas interpreter on CPU (how the
tests check them) and compiles them elsewhere. On GPU the Triton backend is selected
explicitly (jax 0.10 defaults to Mosaic GPU, whose `pallas_call` path is deprecated and
needs explicit layouts; the Pallas docs call Triton best-effort, Ampere and newer). Both
kernels, forward and VJP, lower from a CPU host to Triton IR (`lowering_platforms=
("cuda",)`) and to Mosaic (`("tpu",)`), which tests/test_lev_pallas.py checks; the
device compilers' own passes (Triton to PTX, Mosaic's layout passes) did not run and
accelerator speed is UNMEASURED: no accelerator was available when this was written.
On TPU, block_rows and block_rank must be multiples of 128 or cover the padded axis
(R <= 128 does).

Sources: the Pallas docs, https://docs.jax.dev/en/latest/pallas/ (quickstart.html,
grid_blockspec.html, tpu/details.html, the pallas_call API page), and the installed jax
0.10 lowering rules (jax/_src/pallas/triton/lowering.py: power-of-two load/store
shapes, dot_general transposes; jax/_src/pallas/mosaic/lowering.py).
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl

from lev_jax import target

_LN2 = math.log(2.0)
_MANTISSA_BITS = 23
_MANTISSA_MASK = 0x007FFFFF
_ONE_BITS = 0x3F800000  # float32 1.0: exponent field 127, mantissa 0.
_EXPONENT_BIAS = 127
_MAX_LOG_GROUP = 64  # mantissa product < 2**64, far from float32's 2**128.
_MIN_BLOCK = 16  # Triton's smallest matmul dimension.


@dataclasses.dataclass(frozen=True)
class _Static:
  """The non-differentiable arguments (hashable: a custom_vjp nondiff argument)."""
  log_eps: float
  log_group: int
  interpret: bool
  platform: str  # "gpu", "tpu" or "cpu" (interpret only): picks the compiler params.
  block_rows: int
  block_rank: int
  precision: jax.lax.Precision


def _next_pow2(n: int, floor: int = 1) -> int:
  return max(floor, 1 << max(0, n - 1).bit_length())


def _is_pow2(n: int) -> bool:
  return n > 0 and n & (n - 1) == 0


def _basis_JxB(weights_ref, knots_ref, s, n_knots: int) -> jax.Array:
  """Dense basis [J, bn] of coordinate s: each window slot's weight at its knot."""
  n_slots, block_rows = weights_ref.shape[1:]
  knot_JxB = jax.lax.broadcasted_iota(jnp.int32, (n_knots, block_rows), 0)
  basis_JxB = jnp.zeros((n_knots, block_rows), jnp.float32)
  for w in range(n_slots):
    hit_JxB = knot_JxB == knots_ref[s, pl.ds(w, 1), :]
    basis_JxB = basis_JxB + jnp.where(hit_JxB, weights_ref[s, pl.ds(w, 1), :], 0.0)
  return basis_JxB


def _dot(a, b, contract, precision):
  return jax.lax.dot_general(a, b, (contract, ((), ())), precision=precision,
                             preferred_element_type=jnp.float32)


def _phi_RxB(basis_JxB, spline_JxR, precision):
  """phi^T [br, bn] = spline^T @ basis (contracting the knot axis of both)."""
  return _dot(spline_JxR, basis_JxB, ((0,), (0,)), precision)


def _forward_kernel(weights_ref, knots_ref, delta_ref, modes_ref, *, st: _Static):
  n_coords = weights_ref.shape[0]
  n_knots = delta_ref.shape[1]
  shape_RxB = modes_ref.shape

  def factor(s, carry):
    """Multiply coordinate s's factors into the group's mantissa product."""
    mantissa_RxB, exponent_RxB, sign_RxB = carry
    spline_JxR = 1.0 + delta_ref[s]
    phi_RxB = _phi_RxB(_basis_JxB(weights_ref, knots_ref, s, n_knots), spline_JxR,
                       st.precision)
    factor_RxB = jnp.abs(phi_RxB) + st.log_eps  # a normal float32 >= log_eps > 0
    bits_RxB = jax.lax.bitcast_convert_type(factor_RxB, jnp.int32)
    exponent_RxB = exponent_RxB + ((bits_RxB >> _MANTISSA_BITS) - _EXPONENT_BIAS)
    unit_RxB = jax.lax.bitcast_convert_type((bits_RxB & _MANTISSA_MASK) | _ONE_BITS,
                                            jnp.float32)
    # inf and nan factors pass through unchanged, as in the plain log.
    mantissa_RxB = mantissa_RxB * jnp.where(factor_RxB < jnp.inf, unit_RxB, factor_RxB)
    sign_RxB = jnp.where(phi_RxB < 0.0, -sign_RxB, sign_RxB)
    return mantissa_RxB, exponent_RxB, sign_RxB

  def group(g, carry):
    log_RxB, exponent_RxB, sign_RxB = carry
    start = g * st.log_group
    mantissa_RxB, exponent_RxB, sign_RxB = jax.lax.fori_loop(
        start, start + st.log_group, factor,
        (jnp.ones(shape_RxB, jnp.float32), exponent_RxB, sign_RxB))
    return log_RxB + jnp.log(mantissa_RxB), exponent_RxB, sign_RxB

  init = (jnp.zeros(shape_RxB, jnp.float32), jnp.zeros(shape_RxB, jnp.int32),
          jnp.ones(shape_RxB, jnp.float32))
  log_RxB, exponent_RxB, sign_RxB = jax.lax.fori_loop(
      0, n_coords // st.log_group, group, init)
  log_RxB = log_RxB + exponent_RxB.astype(jnp.float32) * _LN2
  modes_ref[...] = sign_RxB * jnp.exp(log_RxB)


def _backward_kernel(weights_ref, knots_ref, delta_ref, gm_ref, g_weights_ref,
                     g_delta_ref, *, st: _Static):
  n_coords, n_slots, block_rows = weights_ref.shape
  n_knots = delta_ref.shape[1]
  gm_RxB = gm_ref[...]  # g_modes * modes
  knot_JxB = jax.lax.broadcasted_iota(jnp.int32, (n_knots, block_rows), 0)

  def coord(s, carry):
    basis_JxB = _basis_JxB(weights_ref, knots_ref, s, n_knots)
    spline_JxR = 1.0 + delta_ref[s]
    phi_RxB = _phi_RxB(basis_JxB, spline_JxR, st.precision)
    # d|phi|/dphi as jnp.abs differentiates it: +1 at phi >= 0 (zero included), else -1.
    sign_RxB = jnp.where(phi_RxB >= 0.0, 1.0, -1.0)
    g_phi_RxB = gm_RxB * sign_RxB / (jnp.abs(phi_RxB) + st.log_eps)
    g_basis_JxB = _dot(spline_JxR, g_phi_RxB, ((1,), (0,)), st.precision)
    for w in range(n_slots):
      hit_JxB = knot_JxB == knots_ref[s, pl.ds(w, 1), :]
      g_weights_ref[s, pl.ds(w, 1), :] = jnp.sum(
          jnp.where(hit_JxB, g_basis_JxB, 0.0), axis=0, keepdims=True)
    g_delta_ref[s] = _dot(basis_JxB, g_phi_RxB, ((1,), (1,)), st.precision)
    return carry

  jax.lax.fori_loop(0, n_coords, coord, 0)


def _compiler_params(st: _Static):
  """Triton on GPU (jax's default there is Mosaic GPU); TPU: every grid axis parallel."""
  if st.interpret:
    return None
  if st.platform == "gpu":
    from jax.experimental.pallas import triton as pltriton
    return pltriton.CompilerParams()
  if st.platform == "tpu":
    from jax.experimental.pallas import tpu as pltpu
    return pltpu.CompilerParams(dimension_semantics=("parallel",) * 3)
  return None


def _padded_inputs(weights_NxHxSxW, knots_NxHxSxW, delta_HxSxJxR, st: _Static):
  """Kernel layout: weights, knots [H, S, Wp, Np]; delta [H, S, Jp, Rp]."""
  n, _, _, w = weights_NxHxSxW.shape
  j, r = delta_HxSxJxR.shape[2:]
  n_p = -(-n // st.block_rows) * st.block_rows
  pad = ((0, n_p - n), (0, 0), (0, 0), (0, _next_pow2(w) - w))
  weights_HxSxWxN = jnp.pad(weights_NxHxSxW.astype(jnp.float32), pad).transpose(1, 2, 3, 0)
  knots_HxSxWxN = jnp.pad(knots_NxHxSxW.astype(jnp.int32), pad).transpose(1, 2, 3, 0)
  r_p = -(-r // st.block_rank) * st.block_rank
  delta_HxSxJxR = jnp.pad(delta_HxSxJxR.astype(jnp.float32),
                          ((0, 0), (0, 0), (0, _next_pow2(j, _MIN_BLOCK) - j), (0, r_p - r)))
  return weights_HxSxWxN, knots_HxSxWxN, delta_HxSxJxR


def _specs(shapes, st: _Static):
  """BlockSpecs over the grid (row block i, head h, rank block r)."""
  (h, s, w_p, n_p), (_, _, j_p, r_p) = shapes
  bn, br = st.block_rows, st.block_rank
  sq = pl.squeezed
  window = pl.BlockSpec((sq, s, w_p, bn), lambda i, h, r: (h, 0, 0, i))
  delta = pl.BlockSpec((sq, s, j_p, br), lambda i, h, r: (h, 0, 0, r))
  modes = pl.BlockSpec((sq, br, bn), lambda i, h, r: (h, r, i))
  grid = (n_p // bn, h, r_p // br)
  return grid, window, delta, modes


def _forward_call(weights_HxSxWxN, knots_HxSxWxN, delta_HxSxJxR, st: _Static):
  """Padded modes [H, Rp, Np]."""
  h, s, w_p, n_p = weights_HxSxWxN.shape
  j_p, r_p = delta_HxSxJxR.shape[2:]
  grid, window, delta, modes = _specs((weights_HxSxWxN.shape, delta_HxSxJxR.shape), st)
  cost = pl.CostEstimate(
      flops=2 * n_p * h * s * j_p * r_p + 12 * n_p * h * s * r_p,
      transcendentals=n_p * h * r_p * (s // st.log_group + 1),
      bytes_accessed=4 * (2 * h * s * w_p * n_p + h * s * j_p * r_p + h * r_p * n_p))
  return pl.pallas_call(
      functools.partial(_forward_kernel, st=st),
      out_shape=jax.ShapeDtypeStruct((h, r_p, n_p), jnp.float32),
      grid=grid, in_specs=[window, window, delta], out_specs=modes,
      interpret=st.interpret, compiler_params=_compiler_params(st), cost_estimate=cost,
      name="lev_modes_fwd")(weights_HxSxWxN, knots_HxSxWxN, delta_HxSxJxR)


def _backward_call(weights_HxSxWxN, knots_HxSxWxN, delta_HxSxJxR, gm_HxRxN, st: _Static):
  """(g_weights [H, S, Wp, Np], g_delta [H, S, Jp, Rp]), partials summed here."""
  h, s, w_p, n_p = weights_HxSxWxN.shape
  j_p, r_p = delta_HxSxJxR.shape[2:]
  grid, window, delta, modes = _specs((weights_HxSxWxN.shape, delta_HxSxJxR.shape), st)
  n_row_blocks, _, n_rank_blocks = grid
  sq = pl.squeezed
  g_window = pl.BlockSpec((sq, sq, s, w_p, st.block_rows), lambda i, h, r: (r, h, 0, 0, i))
  g_delta = pl.BlockSpec((sq, sq, s, j_p, st.block_rank), lambda i, h, r: (i, h, 0, 0, r))
  cost = pl.CostEstimate(
      flops=6 * n_p * h * s * j_p * r_p + 12 * n_p * h * s * r_p,
      transcendentals=0,
      bytes_accessed=4 * (2 * h * s * w_p * n_p * (1 + n_rank_blocks) + h * r_p * n_p +
                          h * s * j_p * r_p * (1 + n_row_blocks)))
  g_weights_PxHxSxWxN, g_delta_PxHxSxJxR = pl.pallas_call(
      functools.partial(_backward_kernel, st=st),
      out_shape=(jax.ShapeDtypeStruct((n_rank_blocks, h, s, w_p, n_p), jnp.float32),
                 jax.ShapeDtypeStruct((n_row_blocks, h, s, j_p, r_p), jnp.float32)),
      grid=grid, in_specs=[window, window, delta, modes], out_specs=(g_window, g_delta),
      interpret=st.interpret, compiler_params=_compiler_params(st), cost_estimate=cost,
      name="lev_modes_bwd")(weights_HxSxWxN, knots_HxSxWxN, delta_HxSxJxR, gm_HxRxN)
  return g_weights_PxHxSxWxN.sum(0), g_delta_PxHxSxJxR.sum(0)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _lev_modes(weights_NxHxSxW, knots_NxHxSxW, delta_HxSxJxR, st: _Static):
  return _lev_modes_fwd(weights_NxHxSxW, knots_NxHxSxW, delta_HxSxJxR, st)[0]


def _lev_modes_fwd(weights_NxHxSxW, knots_NxHxSxW, delta_HxSxJxR, st: _Static):
  n = weights_NxHxSxW.shape[0]
  r = delta_HxSxJxR.shape[3]
  inputs = _padded_inputs(weights_NxHxSxW, knots_NxHxSxW, delta_HxSxJxR, st)
  modes_HxRxN = _forward_call(*inputs, st)
  modes_NxHxR = modes_HxRxN[:, :r, :n].transpose(2, 0, 1)
  return modes_NxHxR, (weights_NxHxSxW, knots_NxHxSxW, delta_HxSxJxR, modes_HxRxN)


def _lev_modes_bwd(st: _Static, residuals, g_modes_NxHxR):
  weights_NxHxSxW, knots_NxHxSxW, delta_HxSxJxR, modes_HxRxN = residuals
  n, _, _, w = weights_NxHxSxW.shape
  j, r = delta_HxSxJxR.shape[2:]
  r_p, n_p = modes_HxRxN.shape[1:]
  g_HxRxN = jnp.pad(g_modes_NxHxR.astype(jnp.float32).transpose(1, 2, 0),
                    ((0, 0), (0, r_p - r), (0, n_p - n)))
  inputs = _padded_inputs(weights_NxHxSxW, knots_NxHxSxW, delta_HxSxJxR, st)
  g_weights_HxSxWxN, g_delta_HxSxJxR = _backward_call(*inputs, g_HxRxN * modes_HxRxN, st)
  g_weights_NxHxSxW = g_weights_HxSxWxN[:, :, :w, :n].transpose(3, 0, 1, 2)
  return (g_weights_NxHxSxW.astype(weights_NxHxSxW.dtype), None,
          g_delta_HxSxJxR[:, :, :j, :r].astype(delta_HxSxJxR.dtype))


_lev_modes.defvjp(_lev_modes_fwd, _lev_modes_bwd)


def lev_modes_pallas(weights_NxHxSxW: jax.Array, knots_NxHxSxW: jax.Array,
                     delta_HxSxJxR: jax.Array, *, log_eps: float, log_group: int,
                     interpret: bool | None = None, platform: str | None = None,
                     block_rows: int = 128,
                     block_rank: int = 128,
                     precision: jax.lax.Precision = jax.lax.Precision.HIGHEST) -> jax.Array:
  """LEV modes prod_s phi[n, h, s, r] from the window basis, as Pallas kernels.

  Differentiable in weights and delta (custom VJP, Pallas backward); knots get no
  gradient. Equals `lev.signed_log_product(phi, axis=2, eps=log_eps)` with
  phi[n, h, s, r] = sum_w weights[n, h, s, w] (1 + delta[h, s, knots[n, h, s, w], r]).

  Args:
    weights_NxHxSxW: float [N, H, S, W] window weights (0 for a slot outside the grid).
    knots_NxHxSxW: int [N, H, S, W] knot index of each slot, in [0, J). A knot outside
      [0, J) contributes nothing (it matches no knot of the dense basis).
    delta_HxSxJxR: float [H, S, J, R] the `spline_delta` parameter.
    log_eps: eps in log(|phi| + eps); at least 1.2e-38 (float32's smallest normal).
    log_group: G, coordinates multiplied directly before one log; divides S, <= 64.
    interpret: run in the Pallas interpreter; None: when the platform is the CPU
      (`lev_jax.target.platform()`: the default backend, or lev-compile's target).
    platform: the compile target, "gpu" (Triton) or "tpu" (Mosaic); None: the default
      backend's. Only matters when not interpreting (e.g. `jax.export` to another one).
    block_rows: rows per program (bn), a power of two >= 16; a multiple of 128 on TPU.
    block_rank: rank columns per program (br), a power of two >= 16; capped at R
      rounded up to a power of two.
    precision: of the in-kernel float32 matmuls (HIGHEST: float32-exact phi).
  Returns:
    float32 [N, H, R] modes.
  Raises:
    ValueError: on mismatched shapes, a non-integer knots dtype, S not divisible by
      log_group, log_group outside [1, 64], log_eps below 1.2e-38, a block size that
      is not a power of two >= 16, or an unknown platform (or "cpu" not interpreting).
  """
  if weights_NxHxSxW.ndim != 4 or knots_NxHxSxW.shape != weights_NxHxSxW.shape:
    raise ValueError(f"weights and knots must have the same shape [N, H, S, W]; got "
                     f"{weights_NxHxSxW.shape} and {knots_NxHxSxW.shape}")
  if not jnp.issubdtype(knots_NxHxSxW.dtype, jnp.integer):
    raise ValueError(f"knots must be an integer array; got {knots_NxHxSxW.dtype}")
  _, h, s, _ = weights_NxHxSxW.shape
  if delta_HxSxJxR.ndim != 4 or delta_HxSxJxR.shape[:2] != (h, s):
    raise ValueError(f"delta must have shape [H={h}, S={s}, J, R]; got "
                     f"{delta_HxSxJxR.shape}")
  if not 1 <= log_group <= _MAX_LOG_GROUP or s % log_group:
    raise ValueError(f"log_group must divide S = {s} and lie in [1, {_MAX_LOG_GROUP}]; "
                     f"got {log_group}")
  if not log_eps >= np.finfo(np.float32).tiny:
    raise ValueError(f"log_eps must be >= {np.finfo(np.float32).tiny} (every factor "
                     f"|phi| + eps a normal float32); got {log_eps}")
  for name, size in (("block_rows", block_rows), ("block_rank", block_rank)):
    if not _is_pow2(size) or size < _MIN_BLOCK:
      raise ValueError(f"{name} must be a power of two >= {_MIN_BLOCK}; got {size}")
  platform = platform or target.platform()
  platform = "gpu" if platform in ("cuda", "rocm") else platform
  if interpret is None:
    interpret = platform == "cpu"
  if platform not in ("gpu", "tpu", "cpu") or (platform == "cpu" and not interpret):
    raise ValueError(f"platform must be 'gpu' or 'tpu' (or 'cpu' when interpreting); "
                     f"got {platform!r}")
  block_rank = min(block_rank, _next_pow2(delta_HxSxJxR.shape[3], _MIN_BLOCK))
  st = _Static(float(log_eps), int(log_group), bool(interpret), platform, block_rows,
               block_rank, precision)
  return _lev_modes(weights_NxHxSxW, knots_NxHxSxW, delta_HxSxJxR, st)
