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

Shapes: N ids, K coords, S = d_seed, H heads, J = kappa knots, R rank, D = d_model.
The math is a pure function of a parameter dict (`lev_embed`) so it can be jitted,
chunked and rematerialised; the `LEV` module owns the parameters.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_collections
from flax import nnx

from lev_jax.config import ConfigError, lev_base
from lev_jax.sharding import constrain


def lev_param_count(vocab_size: int, d_model: int, lev: ml_collections.ConfigDict) -> int:
  """Closed-form LEV parameter count (LEV.md "Parameter count").

  k*b*d_seed + h*(d_seed**2 + 2*d_seed + d_seed*kappa*R + R*D), plus h learnable
  basis scales for the KHRONOS basis. `vocab_size` is the padded vocab.
  """
  b = lev.base or lev_base(vocab_size, lev.n_coords)
  s, h = lev.d_seed, lev.n_heads
  count = lev.n_coords * b * s + h * (s * s + 2 * s + s * lev.n_knots * lev.rank
                                      + lev.rank * d_model)
  return count + (h if lev.basis == "khronos" else 0)


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


def _lev_rows(params: dict, ids_N: jax.Array, cfg: ml_collections.ConfigDict,
              base: int) -> jax.Array:
  """LEV for a flat array of ids: int [N] -> float32 [N, D]."""
  f32 = jnp.float32
  digits_NxK = to_digits(ids_N, base, cfg.n_coords)
  codebooks_KxBxS = params["codebooks"].astype(f32)
  z_NxS = sum(codebooks_KxBxS[r][digits_NxK[:, r]] for r in range(cfg.n_coords))
  u_NxHxS = jnp.einsum("ns,hst->nht", z_NxS, params["seed_proj"].astype(f32))
  mean = u_NxHxS.mean(-1, keepdims=True)
  var = jnp.square(u_NxHxS - mean).mean(-1, keepdims=True)
  u_NxHxS = (u_NxHxS - mean) * jax.lax.rsqrt(var + cfg.ln_eps)
  u_NxHxS = u_NxHxS * params["ln_scale"] + params["ln_bias"]
  t_NxHxS = jax.nn.sigmoid(u_NxHxS * (0.5 if cfg.sigmoid == "half" else 1.0))
  if cfg.basis == "khronos":
    scale = params["basis_scale"].astype(f32)[:, None, None]  # [H, 1, 1]
  else:
    scale = float(cfg.n_knots - 1)
  basis_NxHxSxJ = bspline_basis(t_NxHxS, cfg.n_knots, scale, cfg.basis == "normalized")
  # S = 1 + delta, so sum_j B S = sum_j B + sum_j B delta.
  phi_NxHxSxR = jnp.einsum("nhsj,hsjr->nhsr", basis_NxHxSxJ,
                           params["spline_delta"].astype(f32))
  phi_NxHxSxR = phi_NxHxSxR + basis_NxHxSxJ.sum(-1)[..., None]
  modes_NxHxR = signed_log_product(phi_NxHxSxR, axis=2, eps=cfg.log_eps)
  return jnp.einsum("nhr,hrd->nd", modes_NxHxR, params["out_proj"].astype(f32))


def lev_embed(params: dict, ids: jax.Array, cfg: ml_collections.ConfigDict,
              base: int) -> jax.Array:
  """LEV embeddings of any-shaped ids, computed in rematerialised chunks.

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
  fn = jax.checkpoint(lambda ids_C: constrain(
      _lev_rows(params, constrain(ids_C, ("lev_rows",)), cfg, base), ("lev_rows", None)))
  if n <= chunk:
    out_NxD = fn(ids_N)
  else:
    n_chunks = -(-n // chunk)
    padded_N = jnp.pad(ids_N, (0, n_chunks * chunk - n))
    out_CxNxD = jax.lax.map(fn, padded_N.reshape(n_chunks, chunk))
    out_NxD = out_CxNxD.reshape(n_chunks * chunk, -1)[:n]
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

  Raises:
    ConfigError: if base**n_coords < vocab_size.
  """

  def __init__(self, vocab_size: int, d_model: int, cfg: ml_collections.ConfigDict, *,
               rngs: nnx.Rngs, param_dtype=jnp.float32, init_std: float = 0.02):
    cfg = ml_collections.FrozenConfigDict(cfg)
    self.cfg = cfg
    self.vocab_size = vocab_size
    self.base = cfg.base or lev_base(vocab_size, cfg.n_coords)
    if self.base ** cfg.n_coords < vocab_size:
      raise ConfigError(
          f"config.lev.base ** config.lev.n_coords = {self.base}**{cfg.n_coords} = "
          f"{self.base ** cfg.n_coords} < vocab_size = {vocab_size}")
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
    if cfg.out_proj_init == "match_table":
      sample_N = jnp.linspace(0, vocab_size - 1, min(vocab_size, 256)).astype(jnp.int32)
      rms = jnp.sqrt(jnp.mean(jnp.square(self(sample_N))))
      self.out_proj.set_value(self.out_proj[...] * (init_std / jnp.maximum(rms, 1e-30)
                                                    ).astype(param_dtype))

  def param_dict(self) -> dict:
    names = ["codebooks", "seed_proj", "ln_scale", "ln_bias", "spline_delta", "out_proj"]
    if self.cfg.basis == "khronos":
      names.append("basis_scale")
    return {n: getattr(self, n)[...] for n in names}

  def __call__(self, ids: jax.Array) -> jax.Array:
    """int [...] ids -> float32 [..., D] embeddings, computed per token."""
    return lev_embed(self.param_dict(), ids, self.cfg, self.base)

  def table(self) -> jax.Array:
    """float32 [vocab_size, D]: LEV evaluated at every id (the materialised table)."""
    return self(jnp.arange(self.vocab_size, dtype=jnp.int32))
