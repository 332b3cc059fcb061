"""Tied, untied and LEV embeddings behind one interface.

Every embedding has `embed(ids_BxL) -> x_BxLxD` (compute dtype) and
`unembed(x_BxLxD) -> logits_BxLxV` (float32, V = padded vocab, padded ids masked to
-1e9 so they are never predicted). The decoder touches nothing else.

  tied    one V x D table used by the input gather and the output matmul (one array).
  untied  a V x D input table and a separate D x V output head.
  lev     LEV (lev_jax.lev) for the input and an untied D x V output head
          (Leviathan, arXiv 2601.22040 Sec. 3).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_collections
from flax import nnx

from lev_jax.config import ConfigError, padded_vocab_size
from lev_jax.lev import LEV
from lev_jax.sharding import constrain, take_rows

PAD_LOGIT = -1e9


def _mask_padded(logits_BxLxV: jax.Array, vocab_size: int) -> jax.Array:
  valid_V = jnp.arange(logits_BxLxV.shape[-1]) < vocab_size
  return jnp.where(valid_V, logits_BxLxV, PAD_LOGIT)


class _Head(nnx.Module):
  """The untied output projection D -> V, shared by `untied` and `lev`."""

  def _init_head(self, d_model, padded_vocab, std, rngs, param_dtype):
    w = std * jax.random.normal(rngs.params(), (d_model, padded_vocab), param_dtype)
    self.head = nnx.Param(w, logical_axes=("embed", "vocab"))

  def unembed(self, x_BxLxD: jax.Array) -> jax.Array:
    logits = jnp.einsum("bld,dv->blv", x_BxLxD, self.head[...].astype(x_BxLxD.dtype))
    return _mask_padded(logits.astype(jnp.float32), self.vocab_size)


class TiedEmbedding(nnx.Module):
  """One V x D table: input rows and output projection are the same array."""

  def __init__(self, vocab_size, padded_vocab, d_model, *, std, dtype, rngs, param_dtype):
    self.vocab_size, self.dtype = vocab_size, dtype
    w = std * jax.random.normal(rngs.params(), (padded_vocab, d_model), param_dtype)
    self.table = nnx.Param(w, logical_axes=("vocab", "embed"))

  def embed(self, ids_BxL: jax.Array) -> jax.Array:
    return take_rows(self.table[...], ids_BxL, self.dtype)

  def unembed(self, x_BxLxD: jax.Array) -> jax.Array:
    logits = jnp.einsum("bld,vd->blv", x_BxLxD, self.table[...].astype(x_BxLxD.dtype))
    return _mask_padded(logits.astype(jnp.float32), self.vocab_size)


class UntiedEmbedding(_Head):
  """A V x D input table and a separate D x V head (ablation)."""

  def __init__(self, vocab_size, padded_vocab, d_model, *, std, dtype, rngs, param_dtype):
    self.vocab_size, self.dtype = vocab_size, dtype
    w = std * jax.random.normal(rngs.params(), (padded_vocab, d_model), param_dtype)
    self.table = nnx.Param(w, logical_axes=("vocab", "embed"))
    self._init_head(d_model, padded_vocab, std, rngs, param_dtype)

  def embed(self, ids_BxL: jax.Array) -> jax.Array:
    return take_rows(self.table[...], ids_BxL, self.dtype)


class LEVEmbedding(_Head):
  """LEV input embedding + untied D x V head: the Leviathan model.

  `lev_mode`: `table` evaluates LEV once at every id of the padded vocab and gathers
  (cost ~V rows per step); `tokens` evaluates LEV per token (cost B*L rows); `auto`
  picks the cheaper at trace time.
  """

  def __init__(self, vocab_size, padded_vocab, d_model, lev_cfg, *, std, dtype, rngs,
               param_dtype):
    self.vocab_size, self.dtype, self.mode = vocab_size, dtype, lev_cfg.mode
    self.lev = LEV(padded_vocab, d_model, lev_cfg, rngs=rngs, param_dtype=param_dtype,
                   init_std=std)
    self._init_head(d_model, padded_vocab, std, rngs, param_dtype)

  def embed(self, ids_BxL: jax.Array) -> jax.Array:
    use_table = self.mode == "table" or (
        self.mode == "auto" and self.lev.vocab_size < ids_BxL.size)
    if use_table:
      # The table is computed with its rows spread over every device ("lev_rows"); it
      # is all-gathered (V*D per device, in the compute dtype) and each device gathers
      # its own ids locally. Table mode runs only where V < B*L, so this moves less than
      # the B*L*D all-reduce over all devices that XLA picks for the gather on its own;
      # resharding the rows to the vocab layout for take_rows is a full
      # rematerialisation in XLA.
      table_VxD = constrain(self.lev.table().astype(self.dtype), (None, None))
      return jnp.take(table_VxD, ids_BxL, axis=0)
    return self.lev(ids_BxL).astype(self.dtype)


@nnx.jit
def input_table(embedding) -> jax.Array:
  """float32 [V_padded, D]: the input embedding of every id, in one compiled program:
  LEV evaluated at every id for `lev` (LEV.md "The map"), the table itself otherwise."""
  if isinstance(embedding, LEVEmbedding):
    return embedding.lev.table()
  return embedding.table[...].astype(jnp.float32)


def make_embedding(model_cfg: ml_collections.ConfigDict, lev_cfg: ml_collections.ConfigDict,
                   *, rngs: nnx.Rngs, dtype, param_dtype):
  """Builds the embedding named by `model_cfg.embedding`.

  Raises:
    ConfigError: unknown `model.embedding`.
  """
  v = model_cfg.vocab_size
  vp = padded_vocab_size(v, model_cfg.vocab_multiple)
  kw = dict(std=model_cfg.init_std, dtype=dtype, rngs=rngs, param_dtype=param_dtype)
  kind = model_cfg.embedding
  if kind == "tied":
    return TiedEmbedding(v, vp, model_cfg.d_model, **kw)
  if kind == "untied":
    return UntiedEmbedding(v, vp, model_cfg.d_model, **kw)
  if kind == "lev":
    return LEVEmbedding(v, vp, model_cfg.d_model, lev_cfg, **kw)
  raise ConfigError(f"config.model.embedding = {kind!r}: expected one of 'tied', 'untied', 'lev'")
