"""The LLaMA-style decoder shared by every model variant.

Pre-norm RMSNorm, rotary position embeddings (RoPE), causal multi-head attention with
grouped-query support, SwiGLU MLP, no biases, final RMSNorm (Touvron et al. 2023,
"LLaMA", Sec. 2.2). The input embedding and output head come from
`lev_jax.embeddings`; this module never touches a table.

Parameters are `param_dtype` (float32); activations are `dtype` (bfloat16 or float32),
with norms, softmax and logits in float32. Every parameter carries `logical_axes`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_collections
from flax import nnx

from lev_jax.embeddings import make_embedding
from lev_jax.sharding import constrain

# config.model.remat -> what the backward pass may keep instead of recomputing
# (jax.checkpoint_policies; "none" = no rematerialisation).
REMAT_POLICIES = {
    "full": jax.checkpoint_policies.nothing_saveable,
    "dots": jax.checkpoint_policies.dots_saveable,
    "dots_no_batch": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}


def _param(rngs, shape, std, axes, dtype):
  return nnx.Param(std * jax.random.normal(rngs.params(), shape, dtype), logical_axes=axes)


class RMSNorm(nnx.Module):
  """x / rms(x) * scale, computed in float32 (Zhang & Sennrich 2019)."""

  def __init__(self, d: int, eps: float, param_dtype):
    self.eps = eps
    self.scale = nnx.Param(jnp.ones((d,), param_dtype), logical_axes=("embed",))

  def __call__(self, x_BxLxD: jax.Array) -> jax.Array:
    x = x_BxLxD.astype(jnp.float32)
    x = x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + self.eps)
    return (x * self.scale[...]).astype(x_BxLxD.dtype)


def rope(x_BxLxHxK: jax.Array, positions_BxL: jax.Array, theta: float) -> jax.Array:
  """Rotary position embedding (Su et al. 2021, eq. 34), half-split layout."""
  half = x_BxLxHxK.shape[-1] // 2
  freq_K = theta ** (-jnp.arange(half, dtype=jnp.float32) / half)
  angle_BxLxK = positions_BxL[..., None].astype(jnp.float32) * freq_K
  sin, cos = jnp.sin(angle_BxLxK)[:, :, None], jnp.cos(angle_BxLxK)[:, :, None]
  x1, x2 = jnp.split(x_BxLxHxK.astype(jnp.float32), 2, axis=-1)
  out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
  return out.astype(x_BxLxHxK.dtype)


class Attention(nnx.Module):
  """Causal multi-head attention with grouped-query heads (n_kv_heads <= n_heads)."""

  def __init__(self, cfg: ml_collections.ConfigDict, *, rngs, dtype, param_dtype):
    d, h, kv, k = cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    std = cfg.init_std
    self.theta, self.dtype = cfg.rope_theta, dtype
    self.wq = _param(rngs, (d, h, k), std, ("embed", "heads", "head_dim"), param_dtype)
    self.wk = _param(rngs, (d, kv, k), std, ("embed", "kv_heads", "head_dim"), param_dtype)
    self.wv = _param(rngs, (d, kv, k), std, ("embed", "kv_heads", "head_dim"), param_dtype)
    out_std = std / (2 * cfg.n_layers) ** 0.5
    self.wo = _param(rngs, (h, k, d), out_std, ("heads", "head_dim", "embed"), param_dtype)

  def __call__(self, x_BxLxD: jax.Array, positions_BxL: jax.Array,
               segment_ids_BxL: jax.Array | None = None) -> jax.Array:
    """x [B, L, D] -> [B, L, D]. positions [B, L] int (RoPE); segment_ids [B, L] int or
    None: a query attends only to earlier keys of its own segment (packed documents)."""
    c = lambda w: w[...].astype(self.dtype)
    heads = ("batch", "length", "act_heads", "head_dim")
    q_BxLxHxK = rope(jnp.einsum("bld,dhk->blhk", x_BxLxD, c(self.wq)), positions_BxL, self.theta)
    k_BxLxGxK = rope(jnp.einsum("bld,dhk->blhk", x_BxLxD, c(self.wk)), positions_BxL, self.theta)
    v_BxLxGxK = jnp.einsum("bld,dhk->blhk", x_BxLxD, c(self.wv))
    q_BxLxHxK, k_BxLxGxK, v_BxLxGxK = (constrain(t, heads)
                                       for t in (q_BxLxHxK, k_BxLxGxK, v_BxLxGxK))
    mask_Bx1xLxL = None
    if segment_ids_BxL is not None:
      mask_Bx1xLxL = (segment_ids_BxL[:, None, :, None] == segment_ids_BxL[:, None, None, :])
    out_BxLxHxK = jax.nn.dot_product_attention(q_BxLxHxK, k_BxLxGxK, v_BxLxGxK,
                                               mask=mask_Bx1xLxL, is_causal=True,
                                               implementation="xla")
    return jnp.einsum("blhk,hkd->bld", out_BxLxHxK, c(self.wo))


class MLP(nnx.Module):
  """SwiGLU feed-forward: W_down (silu(x W_gate) * x W_up) (Shazeer 2020)."""

  def __init__(self, cfg: ml_collections.ConfigDict, *, rngs, dtype, param_dtype):
    d, f, std = cfg.d_model, cfg.d_ff, cfg.init_std
    self.dtype = dtype
    self.w_gate = _param(rngs, (d, f), std, ("embed", "mlp"), param_dtype)
    self.w_up = _param(rngs, (d, f), std, ("embed", "mlp"), param_dtype)
    out_std = std / (2 * cfg.n_layers) ** 0.5
    self.w_down = _param(rngs, (f, d), out_std, ("mlp", "embed"), param_dtype)

  def __call__(self, x_BxLxD: jax.Array) -> jax.Array:
    c = lambda w: w[...].astype(self.dtype)
    h_BxLxF = jax.nn.silu(x_BxLxD @ c(self.w_gate)) * (x_BxLxD @ c(self.w_up))
    h_BxLxF = constrain(h_BxLxF, ("batch", "length", "act_mlp"))
    return h_BxLxF @ c(self.w_down)


class Block(nnx.Module):
  """x + Attn(RMSNorm(x)), then x + MLP(RMSNorm(x))."""

  def __init__(self, cfg, *, rngs, dtype, param_dtype):
    self.attn_norm = RMSNorm(cfg.d_model, cfg.norm_eps, param_dtype)
    self.attn = Attention(cfg, rngs=rngs, dtype=dtype, param_dtype=param_dtype)
    self.mlp_norm = RMSNorm(cfg.d_model, cfg.norm_eps, param_dtype)
    self.mlp = MLP(cfg, rngs=rngs, dtype=dtype, param_dtype=param_dtype)

  def __call__(self, x_BxLxD, positions_BxL, segment_ids_BxL=None):
    x_BxLxD = x_BxLxD + self.attn(self.attn_norm(x_BxLxD), positions_BxL, segment_ids_BxL)
    x_BxLxD = x_BxLxD + self.mlp(self.mlp_norm(x_BxLxD))
    return constrain(x_BxLxD, ("batch", "length", "act_embed"))


class Decoder(nnx.Module):
  """ids_BxL (int32) -> logits_BxLxV (float32, V = padded vocab).

  Args (constructor):
    config: the full experiment config (`model` and `lev` sections are read).
    rngs: parameter RNG streams.
  Raises:
    ConfigError: from the embedding factory (unknown embedding, b**k < vocab).
  """

  def __init__(self, config: ml_collections.ConfigDict, *, rngs: nnx.Rngs):
    cfg = ml_collections.FrozenConfigDict(config.model)
    dtype, param_dtype = jnp.dtype(cfg.dtype), jnp.dtype(cfg.param_dtype)
    self.remat, self.scan_layers = cfg.remat, cfg.scan_layers
    self.embedding = make_embedding(cfg, ml_collections.FrozenConfigDict(config.lev),
                                    rngs=rngs, dtype=dtype, param_dtype=param_dtype)
    if cfg.scan_layers:
      # One Block whose parameters are stacked [n_layers, ...] (logical axis "layers"):
      # the layer loop is one lax.scan, so compile time does not grow with depth.
      @nnx.split_rngs(splits=cfg.n_layers)
      @nnx.vmap(in_axes=(0,), out_axes=0)
      def stacked(rngs):
        return Block(cfg, rngs=rngs, dtype=dtype, param_dtype=param_dtype)
      self.blocks = stacked(rngs)
    else:
      self.blocks = nnx.List([Block(cfg, rngs=rngs, dtype=dtype, param_dtype=param_dtype)
                              for _ in range(cfg.n_layers)])
    self.final_norm = RMSNorm(cfg.d_model, cfg.norm_eps, param_dtype)

  def __call__(self, ids_BxL: jax.Array, positions_BxL: jax.Array | None = None,
               segment_ids_BxL: jax.Array | None = None) -> jax.Array:
    """ids int32 [B, L] -> logits float32 [B, L, V_padded].

    positions int [B, L] (default 0..L-1 in every row) drive RoPE; segment_ids int
    [B, L] (default None: one sequence per row) restrict attention to earlier tokens of
    the same segment, for rows packed from several documents (data.segment_masking).
    """
    if positions_BxL is None:
      positions_BxL = jnp.broadcast_to(jnp.arange(ids_BxL.shape[1]), ids_BxL.shape)
    x_BxLxD = constrain(self.embedding.embed(ids_BxL), ("batch", "length", "act_embed"))
    apply = lambda b, x, p, s: b(x, p, s)
    if self.remat != "none":
      apply = nnx.remat(apply, policy=REMAT_POLICIES[self.remat])
    if self.scan_layers:
      scanned = nnx.scan(apply, in_axes=(0, nnx.Carry, None, None), out_axes=nnx.Carry)
      x_BxLxD = scanned(self.blocks, x_BxLxD, positions_BxL, segment_ids_BxL)
    else:
      for block in self.blocks:
        x_BxLxD = apply(block, x_BxLxD, positions_BxL, segment_ids_BxL)
    logits_BxLxV = self.embedding.unembed(self.final_norm(x_BxLxD))
    return constrain(logits_BxLxV, ("batch", "length", "act_vocab"))
