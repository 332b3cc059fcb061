"""Tied, untied and LEV embeddings behind one interface.

Every embedding has `embed(ids_BxL) -> x_BxLxD` (compute dtype),
`unembed(x_BxLxD) -> logits_BxLxV` (config.model.logits_dtype, float32 by default;
V = padded vocab, padded ids masked to -1e9 so they are never predicted) and `head_DxV()` (the output projection, for the
chunked loss in lev_jax/loss.py). The decoder touches nothing else.

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

from lev_jax.config import EMBEDDINGS, ConfigError, padded_vocab_size
from lev_jax.dense import dense
from lev_jax.lev import LEV, dense_plan, evaluation_plan
from lev_jax.sharding import constrain, take_rows

PAD_LOGIT = -1e9


def mask_padded_logits(logits_xV: jax.Array, vocab_size: int,
                       fill: float = PAD_LOGIT) -> jax.Array:
  """The logits with every padded id (last-axis index >= vocab_size) set to `fill`.

  Args:
    logits_xV: float [..., V], V = the padded vocab.
    vocab_size: the real vocab (config.model.vocab_size).
    fill: PAD_LOGIT (-1e9, the model's logits: finite, never predicted) or -inf (the
      decoder's token choice: never sampled at any temperature).
  Returns:
    Same shape and dtype; ids < vocab_size unchanged.
  """
  valid_V = jnp.arange(logits_xV.shape[-1]) < vocab_size
  return jnp.where(valid_V, logits_xV, fill)


def _logits(x_BxLxD: jax.Array, w_DxV: jax.Array, vocab_size: int,
            logits_dtype=jnp.float32) -> jax.Array:
  """Logits [B, L, V] = x . w_DxV (the head, D x padded V), padded ids at PAD_LOGIT.

  The matmul takes its inputs in the compute dtype (x's), accumulates in float32 and
  returns `logits_dtype` (config.model.logits_dtype; preferred_element_type,
  jax.lax.dot_general docs): float32 keeps the accumulator's bits; bfloat16 rounds
  each logit once on the way out (MaxText's default, `logits_dot_in_fp32: False`), so
  a train step stores bfloat16 [B, L, V] logits and gradient, half the bytes
  (lev_jax.loss takes them to float32 inside its reductions).
  """
  logits_BxLxV = dense(x_BxLxD, w_DxV.astype(x_BxLxD.dtype),
                       preferred_element_type=logits_dtype)
  return mask_padded_logits(logits_BxLxV, vocab_size)


class _Head(nnx.Module):
  """The untied output projection D -> V, shared by `untied` and `lev`."""

  def _init_head(self, d_model, padded_vocab, std, rngs, param_dtype):
    w = std * jax.random.normal(rngs.params(), (d_model, padded_vocab), param_dtype)
    self.head = nnx.Param(w, logical_axes=("embed", "vocab"))

  def unembed(self, x_BxLxD: jax.Array) -> jax.Array:
    return _logits(x_BxLxD, self.head[...], self.vocab_size, self.logits_dtype)

  def head_DxV(self) -> jax.Array:
    """The output head [D, padded V] (param dtype), for the chunked loss (lev_jax.loss)."""
    return self.head[...]


class TiedEmbedding(nnx.Module):
  """One V x D table: input rows and output projection are the same array."""

  def __init__(self, vocab_size, padded_vocab, d_model, *, std, dtype, rngs, param_dtype,
               logits_dtype=jnp.float32, grad_dtype=None):
    self.vocab_size, self.dtype, self.logits_dtype = vocab_size, dtype, logits_dtype
    self.grad_dtype = grad_dtype
    w = std * jax.random.normal(rngs.params(), (padded_vocab, d_model), param_dtype)
    self.table = nnx.Param(w, logical_axes=("vocab", "embed"))

  def embed(self, ids_BxL: jax.Array) -> jax.Array:
    return take_rows(self.table[...], ids_BxL, self.dtype, grad_dtype=self.grad_dtype)

  def unembed(self, x_BxLxD: jax.Array) -> jax.Array:
    return _logits(x_BxLxD, self.table[...].T, self.vocab_size, self.logits_dtype)

  def head_DxV(self) -> jax.Array:
    """The output projection [D, padded V]: the table, transposed (param dtype)."""
    return self.table[...].T


class UntiedEmbedding(_Head):
  """A V x D input table and a separate D x V head (ablation)."""

  def __init__(self, vocab_size, padded_vocab, d_model, *, std, dtype, rngs, param_dtype,
               logits_dtype=jnp.float32, grad_dtype=None):
    self.vocab_size, self.dtype, self.logits_dtype = vocab_size, dtype, logits_dtype
    self.grad_dtype = grad_dtype
    w = std * jax.random.normal(rngs.params(), (padded_vocab, d_model), param_dtype)
    self.table = nnx.Param(w, logical_axes=("vocab", "embed"))
    self._init_head(d_model, padded_vocab, std, rngs, param_dtype)

  def embed(self, ids_BxL: jax.Array) -> jax.Array:
    return take_rows(self.table[...], ids_BxL, self.dtype, grad_dtype=self.grad_dtype)


class LEVEmbedding(_Head):
  """LEV input embedding + untied D x V head: the Leviathan model.

  `lev.mode` decides the rows LEV is evaluated on per micro-batch
  (`lev.evaluation_plan`, shared with the FLOP model): `table` (every id, then a
  gather), `tokens` (one row per token), `unique` (the distinct ids of the micro-batch
  under a static bound, then a gather) or `auto` (the fewest rows).
  """

  def __init__(self, vocab_size, padded_vocab, d_model, lev_cfg, *, std, dtype, rngs,
               param_dtype, logits_dtype=jnp.float32):
    self.vocab_size, self.dtype, self.mode = vocab_size, dtype, lev_cfg.mode
    self.logits_dtype = logits_dtype
    self.unique_size, self.remat = lev_cfg.unique_size, lev_cfg.remat
    self.lev = LEV(padded_vocab, d_model, lev_cfg, rngs=rngs, param_dtype=param_dtype,
                   init_std=std)
    self._init_head(d_model, padded_vocab, std, rngs, param_dtype)

  def _embed_table(self, ids_BxL: jax.Array) -> jax.Array:
    # The table is computed with its rows spread over every device ("lev_rows"); it
    # is all-gathered (V*D per device, in the compute dtype) and each device gathers
    # its own ids locally. Table mode runs only where V < B*L, so this moves less than
    # the B*L*D all-reduce over all devices that XLA picks for the gather on its own;
    # resharding the rows to the vocab layout for take_rows is a full
    # rematerialisation in XLA.
    table_VxD = constrain(self.lev.table().astype(self.dtype), (None, None))
    return jnp.take(table_VxD, ids_BxL, axis=0)

  def _embed_tokens(self, ids_BxL: jax.Array) -> jax.Array:
    return self.lev(ids_BxL).astype(self.dtype)

  def _embed_unique(self, ids_BxL: jax.Array, bound: int, fallback) -> jax.Array:
    """LEV on the distinct ids only (at most `bound`), gathered back to every position.

    jnp.unique with a static size pads the distinct ids with id 0 and truncates when
    there are more than `bound`; then some id is not its own unique entry, which is
    checked exactly and sends the whole micro-batch to `fallback` (lax.cond: only one
    branch runs). Gradients reach LEV's parameters through the gather (summed over
    the positions sharing an id).
    """
    ids_N = ids_BxL.reshape(-1)
    unique_U, inverse_N = jnp.unique(ids_N, size=bound, fill_value=0, return_inverse=True)
    inverse_N = inverse_N.reshape(-1)
    fits = jnp.all(unique_U[inverse_N] == ids_N)
    return jax.lax.cond(
        fits,
        lambda: jnp.take(self.lev(unique_U).astype(self.dtype), inverse_N,
                         axis=0).reshape(*ids_BxL.shape, -1),
        lambda: fallback(ids_BxL))

  def embed(self, ids_BxL: jax.Array) -> jax.Array:
    """LEV's embedding of ids_BxL, [B, L, D] in the compute dtype; with `lev.remat`
    under jax.checkpoint (nothing saved: the backward pass evaluates LEV again)."""
    if self.remat:
      return nnx.remat(type(self)._embed)(self, ids_BxL)
    return self._embed(ids_BxL)

  def _embed(self, ids_BxL: jax.Array) -> jax.Array:
    strategy, rows = evaluation_plan(self.mode, self.lev.vocab_size, ids_BxL.size,
                                     self.unique_size)
    if strategy == "table":
      return self._embed_table(ids_BxL)
    if strategy == "tokens":
      return self._embed_tokens(ids_BxL)
    dense, _ = dense_plan(self.lev.vocab_size, ids_BxL.size)
    fallback = self._embed_table if dense == "table" else self._embed_tokens
    return self._embed_unique(ids_BxL, rows, fallback)


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
  kw = dict(std=model_cfg.init_std, dtype=dtype, rngs=rngs, param_dtype=param_dtype,
            logits_dtype=jnp.dtype(model_cfg.logits_dtype))
  kind = model_cfg.embedding
  # config.model.embedding_grad_dtype (absent from configs saved before it existed)
  grad_dtype = jnp.dtype(model_cfg.get("embedding_grad_dtype", "float32"))
  if kind == "tied":
    return TiedEmbedding(v, vp, model_cfg.d_model, grad_dtype=grad_dtype, **kw)
  if kind == "untied":
    return UntiedEmbedding(v, vp, model_cfg.d_model, grad_dtype=grad_dtype, **kw)
  if kind == "lev":
    return LEVEmbedding(v, vp, model_cfg.d_model, lev_cfg, **kw)
  raise ConfigError(f"config.model.embedding = {kind!r}: expected one of "
                    + ", ".join(repr(e) for e in EMBEDDINGS))
