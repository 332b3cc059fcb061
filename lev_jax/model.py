"""The LLaMA-style decoder shared by every model variant.

Pre-norm RMSNorm, rotary position embeddings (RoPE), causal multi-head attention with
grouped-query support, SwiGLU MLP, no biases, final RMSNorm (Touvron et al. 2023,
"LLaMA", Sec. 2.2). The input embedding and output head come from
`lev_jax.embeddings`; this module never touches a table.

Parameters are `param_dtype` (float32); activations are `dtype` (bfloat16 or float32),
with norms, softmax and logits in float32. Every parameter carries `logical_axes`.

Inference: `Decoder.init_cache` and `Decoder.decode` run the same layers with a
key/value cache (standard KV caching for autoregressive decoding; Pope et al. 2022,
"Efficiently Scaling Transformer Inference", Sec. 2): each step computes keys and values
only for the new tokens and attends to the cached ones. `lev_jax.decode` drives it.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_collections
from flax import nnx

from lev_jax import attention, sharding, target, topology
from lev_jax import remat as remat_lib
from lev_jax.config import REMAT_POLICIES
from lev_jax.dense import dense
from lev_jax.embeddings import make_embedding
from lev_jax.sharding import constrain


def remat_policy(name: str):
  """The jax.checkpoint_policies function of config.model.remat = `name` (a key of
  `config.REMAT_POLICIES`), or None for "none" (no rematerialisation).

  Raises:
    KeyError: an unknown name (`config.validate` refuses it first).
  """
  policy = REMAT_POLICIES[name]
  return None if policy is None else getattr(jax.checkpoint_policies, policy)


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
  """Causal multi-head attention with grouped-query heads (n_kv_heads <= n_heads).

  The kernel of the full forward pass is config.model.attention (lev_jax/attention.py),
  chosen when the step is traced, for `lev_jax.target.platform()`; `decode` is xla.

  Raises (constructor):
    ConfigError: an unknown model.attention (the platform is checked when traced).
  """

  def __init__(self, cfg: ml_collections.ConfigDict, *, rngs, dtype, param_dtype):
    d, h, kv, k = cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    std = cfg.init_std
    self.theta, self.dtype = cfg.rope_theta, dtype
    attention.check_name(cfg.attention)  # "auto": chosen when traced
    self.kernel_fields = attention.kernel_fields(cfg)  # the kernel, its blocks, interpret
    self.logits_dtype = cfg.get("attention_logits_dtype", "float32")
    self.wq = _param(rngs, (d, h, k), std, ("embed", "heads", "head_dim"), param_dtype)
    self.wk = _param(rngs, (d, kv, k), std, ("embed", "kv_heads", "head_dim"), param_dtype)
    self.wv = _param(rngs, (d, kv, k), std, ("embed", "kv_heads", "head_dim"), param_dtype)
    out_std = std / (2 * cfg.n_layers) ** 0.5
    self.wo = _param(rngs, (h, k, d), out_std, ("heads", "head_dim", "embed"), param_dtype)

  def _qkv(self, x_BxLxD: jax.Array, positions_BxL: jax.Array
           ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """The projections of L tokens: (q_BxLxHxK with RoPE, k_BxLxGxK with RoPE,
    v_BxLxGxK), in the compute dtype; positions int [B, L]. Shared by the full forward
    pass and the cached `decode`, so both compute the same queries, keys and values."""
    c = lambda w: w[...].astype(self.dtype)
    q_BxLxHxK = rope(dense(x_BxLxD, c(self.wq)), positions_BxL, self.theta)
    k_BxLxGxK = rope(dense(x_BxLxD, c(self.wk)), positions_BxL, self.theta)
    v_BxLxGxK = dense(x_BxLxD, c(self.wv))
    return q_BxLxHxK, k_BxLxGxK, v_BxLxGxK

  def __call__(self, x_BxLxD: jax.Array, positions_BxL: jax.Array,
               segment_ids_BxL: jax.Array | None = None) -> jax.Array:
    """x [B, L, D] -> [B, L, D]. positions [B, L] int (RoPE); segment_ids [B, L] int or
    None: a query attends only to earlier keys of its own segment (packed documents).

    Raises:
      ConfigError: model.attention cannot run here (`attention.choose`: e.g. splash in
        a program that is not for a TPU, without model.attention_interpret).
    """
    c = lambda w: w[...].astype(self.dtype)
    q_BxLxHxK, k_BxLxGxK, v_BxLxGxK = self._qkv(x_BxLxD, positions_BxL)
    kernel = self.kernel_fields
    impl, _ = attention.choose_for(kernel, target.platform(), seq_len=x_BxLxD.shape[1],
                                   segments=segment_ids_BxL is not None)
    out_BxLxHxK = attention.attend(q_BxLxHxK, k_BxLxGxK, v_BxLxGxK, segment_ids_BxL, impl,
                                   block_q=kernel.splash_block_q,
                                   block_kv=kernel.splash_block_kv,
                                   interpret=kernel.attention_interpret,
                                   logits_dtype=self.logits_dtype)
    return dense(out_BxLxHxK, c(self.wo), 2)

  def decode(self, x_BxTxD: jax.Array, positions_BxT: jax.Array, cache: dict,
             cache_index: jax.Array, key_valid_BxS: jax.Array) -> tuple[jax.Array, dict]:
    """Attention of T new tokens over a key/value cache of S slots (Pope et al. 2022).

    Args:
      x_BxTxD: the new tokens' normed activations.
      positions_BxT: int RoPE positions of the new tokens.
      cache: {"k": k_BxSxGxK, "v": v_BxSxGxK} of this layer (G = n_kv_heads).
      cache_index: int scalar slot of the first new token; the new keys and values are
        written to slots [cache_index, cache_index + T), which must lie inside S.
      key_valid_BxS: bool, False for slots that hold no token (left padding).
    Returns:
      (out_BxTxD, updated cache). A query at slot cache_index + t attends to the valid
      slots <= its own; a query with no valid slot (a padding slot) gets finite garbage.
    """
    c = lambda w: w[...].astype(self.dtype)
    q_BxTxHxK, k_BxTxGxK, v_BxTxGxK = self._qkv(x_BxTxD, positions_BxT)
    start = (0, cache_index, 0, 0)
    k_BxSxGxK = jax.lax.dynamic_update_slice(
        cache["k"], k_BxTxGxK.astype(cache["k"].dtype), start)
    v_BxSxGxK = jax.lax.dynamic_update_slice(
        cache["v"], v_BxTxGxK.astype(cache["v"].dtype), start)
    q_BxTxHxK, k_BxSxGxK, v_BxSxGxK = (constrain(t, attention.HEADS)
                                       for t in (q_BxTxHxK, k_BxSxGxK, v_BxSxGxK))
    t, s = x_BxTxD.shape[1], k_BxSxGxK.shape[1]
    causal_TxS = jnp.arange(s)[None, :] <= (cache_index + jnp.arange(t))[:, None]
    mask_Bx1xTxS = key_valid_BxS[:, None, None, :] & causal_TxS[None, None]
    out_BxTxHxK = jax.nn.dot_product_attention(
        q_BxTxHxK, k_BxSxGxK.astype(self.dtype), v_BxSxGxK.astype(self.dtype),
        mask=mask_Bx1xTxS, implementation="xla")
    out_BxTxD = dense(out_BxTxHxK, c(self.wo), 2)
    return out_BxTxD, {"k": k_BxSxGxK, "v": v_BxSxGxK}


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
    h_BxLxF = jax.nn.silu(dense(x_BxLxD, c(self.w_gate))) * dense(x_BxLxD, c(self.w_up))
    h_BxLxF = constrain(h_BxLxF, ("batch", "length", "act_mlp"))
    return dense(h_BxLxF, c(self.w_down))


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

  def decode(self, x_BxTxD, positions_BxT, cache, cache_index, key_valid_BxS):
    """The block over T new tokens with this layer's cache: (x_BxTxD, updated cache)."""
    a_BxTxD, cache = self.attn.decode(self.attn_norm(x_BxTxD), positions_BxT, cache,
                                      cache_index, key_valid_BxS)
    x_BxTxD = x_BxTxD + a_BxTxD
    x_BxTxD = x_BxTxD + self.mlp(self.mlp_norm(x_BxTxD))
    return constrain(x_BxTxD, ("batch", "length", "act_embed")), cache


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
    self.scan_layers = cfg.scan_layers
    # model.remat = "auto" is chosen when traced (`_remat_for`), from the micro-batch's
    # tokens and the mesh's devices: these fields (static, not parameters) decide it.
    self.remat_fields = ml_collections.FrozenConfigDict(
        {k: cfg[k] for k in ("remat", "d_model", "d_ff", "n_heads", "n_layers",
                             *attention.KERNEL_FIELDS)})
    # Read by init_cache and lev_jax.decode (static: not parameters).
    self.vocab_size, self.max_seq_len, self.dtype = cfg.vocab_size, cfg.max_seq_len, dtype
    self.cache_shape = (cfg.n_layers, cfg.n_kv_heads, cfg.head_dim)
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
    return self.head_logits(ids_BxL, positions_BxL, segment_ids_BxL).astype(jnp.float32)

  def head_logits(self, ids_BxL: jax.Array, positions_BxL: jax.Array | None = None,
                  segment_ids_BxL: jax.Array | None = None) -> jax.Array:
    """The logits [B, L, V_padded] in config.model.logits_dtype, as the head's matmul
    returns them (the dense loss keeps bfloat16 ones so; lev_jax.loss). Arguments as
    `__call__`."""
    logits_BxLxV = self.embedding.unembed(self.hidden(ids_BxL, positions_BxL,
                                                      segment_ids_BxL))
    return constrain(logits_BxLxV, ("batch", "length", "act_vocab"))

  def hidden(self, ids_BxL: jax.Array, positions_BxL: jax.Array | None = None,
             segment_ids_BxL: jax.Array | None = None) -> jax.Array:
    """The final hidden states [B, L, D] (compute dtype, after the final RMSNorm): what
    the head projects to logits (`__call__`) and the chunked loss takes (lev_jax.loss).
    Arguments as `__call__`."""
    if positions_BxL is None:
      positions_BxL = jnp.broadcast_to(jnp.arange(ids_BxL.shape[1]), ids_BxL.shape)
    x_BxLxD = constrain(self.embedding.embed(ids_BxL), ("batch", "length", "act_embed"))
    apply = lambda b, x, p, s: b(x, p, s)
    policy = remat_policy(self._remat_for(ids_BxL.shape, segment_ids_BxL is not None))
    if policy is not None:
      apply = nnx.remat(apply, policy=policy)
    if self.scan_layers:
      scanned = nnx.scan(apply, in_axes=(0, nnx.Carry, None, None), out_axes=nnx.Carry)
      x_BxLxD = scanned(self.blocks, x_BxLxD, positions_BxL, segment_ids_BxL)
    else:
      for block in self.blocks:
        x_BxLxD = apply(block, x_BxLxD, positions_BxL, segment_ids_BxL)
    return self.final_norm(x_BxLxD)

  def _remat_for(self, shape_BxL: tuple[int, int], segments: bool) -> str:
    """model.remat for a trace of [B, L] ids: the configured policy, or for "auto"
    lev_jax.remat.choose over the active mesh's devices (one device outside a mesh)."""
    m = self.remat_fields
    if m.remat != "auto":
      return m.remat
    active = sharding.active()
    devices = list(active[0].devices.flat) if active else jax.devices()[:1]
    kernel, _ = attention.choose_for(m, target.platform(), seq_len=shape_BxL[1],
                                     segments=segments)
    return remat_lib.choose(m, tokens=shape_BxL[0] * shape_BxL[1], seq_len=shape_BxL[1],
                            n_devices=len(devices),
                            memory_bytes=topology.device_memory_bytes(devices[0]),
                            xla_attention=kernel == "xla")[0]

  def init_cache(self, batch_size: int, max_len: int, dtype=None) -> dict:
    """An empty key/value cache: {"k", "v"}, each zeros [n_layers, B, S, G, K].

    S = max_len slots, G = n_kv_heads, K = head_dim; dtype defaults to the compute
    dtype (config.model.dtype). The same layout serves scan_layers True and False.
    """
    n_layers, g, k = self.cache_shape
    shape = (n_layers, batch_size, max_len, g, k)
    dtype = self.dtype if dtype is None else jnp.dtype(dtype)
    return {"k": jnp.zeros(shape, dtype), "v": jnp.zeros(shape, dtype)}

  def decode(self, ids_BxT: jax.Array, positions_BxT: jax.Array, cache: dict,
             cache_index: jax.Array | int, key_valid_BxS: jax.Array
             ) -> tuple[jax.Array, dict]:
    """T new tokens through the model with a key/value cache (Pope et al. 2022, Sec. 2).

    Args:
      ids_BxT: int32 token ids of the new tokens (T = prompt length for the prefill,
        1 per generated token).
      positions_BxT: int RoPE positions of the new tokens (for a left-padded row they
        restart at 0 at its first real token).
      cache: from `init_cache` (or a previous call): {"k", "v"} [n_layers, B, S, G, K].
      cache_index: int scalar, the slot of the first new token; the new keys and values
        go to slots [cache_index, cache_index + T).
      key_valid_BxS: bool, which slots hold real tokens (False: left padding). Slots
        after a query's own are never attended (causal), valid or not.
    Returns:
      (logits_BxTxV float32, V = padded vocab with padded ids at -1e9; the updated cache).
    Raises:
      ValueError: a concrete cache_index with cache_index + T outside [0, S].
    No rematerialisation here: decode is for inference only.
    """
    t, s = ids_BxT.shape[1], cache["k"].shape[2]
    if isinstance(cache_index, int) and not 0 <= cache_index <= s - t:
      raise ValueError(f"cache_index = {cache_index}: expected 0 <= cache_index and "
                       f"cache_index + T = {cache_index + t} <= cache length S = {s}")
    x_BxTxD = constrain(self.embedding.embed(ids_BxT), ("batch", "length", "act_embed"))
    apply = lambda b, x, c: b.decode(x, positions_BxT, c, cache_index, key_valid_BxS)
    if self.scan_layers:
      scanned = nnx.scan(apply, in_axes=(0, nnx.Carry, 0), out_axes=(nnx.Carry, 0))
      x_BxTxD, cache = scanned(self.blocks, x_BxTxD, cache)
    else:
      for i, block in enumerate(self.blocks):
        x_BxTxD, layer = apply(block, x_BxTxD, {"k": cache["k"][i], "v": cache["v"][i]})
        cache = {n: cache[n].at[i].set(layer[n]) for n in ("k", "v")}
    logits_BxTxV = self.embedding.unembed(self.final_norm(x_BxTxD)).astype(jnp.float32)
    return constrain(logits_BxTxV, ("batch", "length", "act_vocab")), cache
