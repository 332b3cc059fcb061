"""Per-token cross-entropy from the final hidden states: dense or chunked, and z-loss.

  dense    the head's float32 logits [B, L, V] in full, then
           optax.softmax_cross_entropy_with_integer_labels (what every figure before
           `train.loss_impl` existed was made with; the default). With
           model.logits_dtype = bfloat16 the logits stay bfloat16 and a custom-VJP
           cross-entropy takes them to float32 inside its reductions
           (`_low_precision_cross_entropy`; MaxText's default precision).
  chunked  never the whole [tokens, V] logits: the tokens are cut into chunks of
           `train.loss_token_chunk` (automatic: float32 logits of at most 256 MiB per
           device). Each chunk's float32 logits (bfloat16 or float32 operands, float32
           accumulation) give its log-sum-exp and target logit, and in the train step
           at once the chunk's gradient to the hidden states and the head, since every
           token's weight and z-loss are known there (`chunked_loss_sums`; the Liger
           kernel's fused linear cross-entropy): the dense loss's three matmuls, no
           recompute. With vocab chunks (`train.loss_vocab_chunk`; 0, automatic,
           cuts a vocab of over 65,536 padded ids into chunks of ~8,192) the vocab is
           cut too and each [token chunk, vocab chunk] of logits is folded into a running max / sum
           of exponentials, with a custom VJP that recomputes them in the backward pass
           (`chunked_log_z_and_target`: four matmuls; MaxText's vocabulary tiling,
           Wijmans et al. 2024, "Cut Your Losses in Large-Vocabulary Language Models").
           The eval step runs `chunked_log_z_and_target` (no gradient).
  auto     `resolve`: chunked where the dense loss's logits and a float32 buffer of
           their size would take more than a quarter of a device's memory, else dense
           (always dense on a CPU); what the train and eval steps, lev-compile and the
           trainer's log line use.

Token chunks are strided (chunk k holds the tokens k, k + n_chunks, ...), so tokens
split over the mesh's batch axes leave every chunk spread over all devices. Vocab
chunks are contiguous slices of the head where each device holds the whole vocab (no
copy of the head), strided where the mesh splits it (`_Vocab`); the log-sum-exp over a
split vocabulary is then reduced across devices by XLA.

z-loss (PaLM, Chowdhery et al. 2022, Sec. 5): optim.z_loss * log(Z)^2 per target, with
log Z the log-sum-exp of the token's logits; it keeps log Z near 0.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import ml_collections
import optax

from lev_jax import sharding, target, topology
from lev_jax.config import LOSS_IMPLS, ConfigError, padded_vocab_size
from lev_jax.embeddings import PAD_LOGIT

# The dense loss's settings (config.train's loss fields at their defaults).
DENSE = ml_collections.FrozenConfigDict(
    {"loss_impl": "dense", "loss_token_chunk": 0, "loss_vocab_chunk": 0})
LOGITS_CHUNK_BYTES = 256 * 2**20  # float32 logits per device per chunk, automatic sizes
# train.loss_vocab_chunk = 0 (automatic): the whole vocab per token chunk up to
# AUTO_WHOLE_VOCAB padded ids, above it vocab chunks of the divisor nearest
# AUTO_VOCAB_CHUNK. Measured on the CPU (benchmarks/head_loss.py, docs/results.md): at
# V = 32,768 chunks of 8,192 ids were 1.21x the dense loss's time, the whole vocab
# 0.82-1.01x; at V = 200,064 chunks of 8,336 ids were 0.78x (d 512) and 0.94x (d 2,048)
# with 0.04x its temporaries, the whole vocab 0.66x and 1.09x with 0.16x and 0.54x.
AUTO_WHOLE_VOCAB = 65_536
AUTO_VOCAB_CHUNK = 8_192
AUTO_MEMORY_SHARE = 4  # auto: chunked once the dense logits need > 1/4 of a device's memory


def dense_logits_bytes(config: ml_collections.ConfigDict, n_devices: int) -> int:
  """Bytes per device of the dense loss's logits [micro-batch tokens, padded V] in
  model.logits_dtype plus one float32 buffer of that shape (the softmax, or the logits'
  gradient), with the tokens spread over `n_devices`."""
  m, t = config.model, config.train
  tokens = t.global_batch_size // t.grad_accum_steps * t.seq_len
  per_logit = (2 if m.logits_dtype == "bfloat16" else 4) + 4
  return tokens * padded_vocab_size(m.vocab_size, m.vocab_multiple) * per_logit // n_devices


def choose(config: ml_collections.ConfigDict, n_devices: int,
           memory_bytes: int | None) -> tuple[str, str]:
  """What config.train.loss_impl becomes on `n_devices` devices of `memory_bytes` each
  (None: unknown, e.g. a CPU): ("dense" | "chunked", why). An explicit dense or chunked
  stays; auto is chunked when `dense_logits_bytes` exceeds memory / AUTO_MEMORY_SHARE."""
  impl = config.train.loss_impl
  if impl != "auto":
    return impl, "train.loss_impl"
  if memory_bytes is None:
    return "dense", "auto; device memory unknown (CPU)"
  need, share = dense_logits_bytes(config, n_devices), memory_bytes / AUTO_MEMORY_SHARE
  gib = lambda n: f"{n / 2**30:.1f} GiB"
  if need > share:
    return "chunked", (f"auto; the dense logits would need {gib(need)} per device, over "
                       f"1/{AUTO_MEMORY_SHARE} of its {gib(memory_bytes)}")
  return "dense", (f"auto; the dense logits need {gib(need)} per device, within "
                   f"1/{AUTO_MEMORY_SHARE} of its {gib(memory_bytes)}")


def resolve(config: ml_collections.ConfigDict, mesh) -> tuple[str, str]:
  """`choose` for the devices of `mesh` (a jax Mesh; compile-only TPU devices included:
  lev_jax/topology.py `device_memory_bytes`); the trainer logs it once."""
  devices = mesh.devices.flat
  return choose(config, mesh.devices.size, topology.device_memory_bytes(devices[0]))


def resolved_train_cfg(config: ml_collections.ConfigDict, mesh
                       ) -> ml_collections.FrozenConfigDict:
  """config.train, frozen, with loss_impl resolved for `mesh` (`resolve`)."""
  t = config.train.to_dict()
  t["loss_impl"] = resolve(config, mesh)[0]
  return ml_collections.FrozenConfigDict(t)


def _divisors(n: int) -> list[int]:
  small = [d for d in range(1, int(n ** 0.5) + 1) if n % d == 0]
  return sorted(set(small + [n // d for d in small]))


def vocab_chunk_size(padded_vocab: int, requested: int) -> int:
  """Ids per vocab chunk for train.loss_vocab_chunk = `requested`: a divisor of the
  padded vocab as given (the padded vocab itself: the whole vocab per token chunk), or
  for 0 (automatic) the whole padded vocab up to AUTO_WHOLE_VOCAB ids, above it the
  divisor nearest AUTO_VOCAB_CHUNK.

  Raises:
    ConfigError: `requested` not an integer >= 0 or not a divisor of padded_vocab (the
      nearest divisors are named).
  """
  if requested == 0:
    if padded_vocab <= AUTO_WHOLE_VOCAB:
      return padded_vocab
    return min(_divisors(padded_vocab), key=lambda d: (abs(d - AUTO_VOCAB_CHUNK), -d))
  if (isinstance(requested, bool) or not isinstance(requested, int) or requested < 0
      or padded_vocab % requested):
    size = requested if isinstance(requested, int) else padded_vocab
    near = sorted(sorted(_divisors(padded_vocab), key=lambda d: abs(d - size))[:4])
    raise ConfigError(
        f"config.train.loss_vocab_chunk = {requested!r}: expected 0 (automatic) or "
        f"a divisor of the padded vocab {padded_vocab:,} (itself: the whole vocab), e.g. "
        + ", ".join(f"{d:,}" for d in near))
  return requested


def token_chunk_size(n_tokens: int, requested: int, vocab_chunk: int,
                     shards: int = 1) -> int:
  """Tokens per token chunk: `requested` (a divisor of the micro-batch's tokens), or for
  0 the largest divisor of n_tokens whose float32 logits per device (chunk / shards x
  vocab_chunk x 4 bytes) fit LOGITS_CHUNK_BYTES (at least one token per shard).

  Args:
    shards: the devices the tokens are split over (sharding.split_count("batch")).
  Raises:
    ConfigError: `requested` < 0 or not a divisor of n_tokens.
  """
  if requested == 0:
    fits = [d for d in _divisors(n_tokens)
            if d % shards == 0 and d // shards * vocab_chunk * 4 <= LOGITS_CHUNK_BYTES]
    return max(fits) if fits else min(d for d in _divisors(n_tokens) if d >= shards)
  if (isinstance(requested, bool) or not isinstance(requested, int) or requested < 0
      or n_tokens % requested):
    raise ConfigError(
        f"config.train.loss_token_chunk = {requested!r}: expected 0 (automatic) or a "
        f"divisor of the {n_tokens:,} tokens per micro-batch "
        "(train.global_batch_size / train.grad_accum_steps x train.seq_len)")
  return requested


def _strided(x, n_chunks: int, axis: int):
  """x with `axis` (size chunk * n_chunks) cut into strided chunks, chunks leading:
  [n_chunks, ..., chunk, ...]; chunk k holds the entries k, k + n_chunks, ..."""
  shape = x.shape[:axis] + (x.shape[axis] // n_chunks, n_chunks) + x.shape[axis + 1:]
  return jnp.moveaxis(x.reshape(shape), axis + 1, 0)


def _unstrided(x, axis: int):
  """The inverse of `_strided`: [n_chunks, ..., chunk, ...] -> [..., chunk * n_chunks, ...]."""
  x = jnp.moveaxis(x, 0, axis + 1)
  return x.reshape(x.shape[:axis] + (-1,) + x.shape[axis + 2:])


class _Vocab:
  """The head's vocab chunks, as the loop reads them and writes their gradients.

  Contiguous (ids k U .. (k + 1) U - 1) where the vocab axis is whole on each device:
  slices of the head in place, and the head's gradient accumulated in place, so
  nothing head-sized is held but that gradient. Strided (ids k, k + K, ...) where the
  mesh splits the vocab ("vocab" rule): every chunk then spreads over the devices that
  hold the vocab, at the cost of one re-laid-out copy of the head ([K, D, U]).
  """

  def __init__(self, w_DxV, chunk: int):
    self.w_DxV, self.chunk = w_DxV, chunk
    self.n = w_DxV.shape[1] // chunk
    self.strided = sharding.split_count("vocab") > 1
    if self.strided:
      self.w_KxDxU = _strided(w_DxV, self.n, 1)

  def ids(self, k):
    """int [U]: the ids of chunk k."""
    u = jnp.arange(self.chunk)
    return u * self.n + k if self.strided else k * self.chunk + u

  def head(self, k):
    """[D, U]: the head's columns of chunk k."""
    if self.strided:
      return self.w_KxDxU[k]
    return jax.lax.dynamic_slice_in_dim(self.w_DxV, k * self.chunk, self.chunk, axis=1)

  def zeros(self):
    """float32 zeros for the head's gradient, in the loop's layout."""
    shape = self.w_KxDxU.shape if self.strided else self.w_DxV.shape
    return jnp.zeros(shape, jnp.float32)

  def add(self, g_w, k, g_w_DxU):
    """g_w with chunk k's gradient added."""
    if self.strided:
      return g_w.at[k].add(g_w_DxU)
    start = k * self.chunk
    old = jax.lax.dynamic_slice_in_dim(g_w, start, self.chunk, axis=1)
    return jax.lax.dynamic_update_slice_in_dim(g_w, old + g_w_DxU, start, axis=1)

  def gradient(self, g_w):
    """[D, V] in the head's dtype."""
    return (_unstrided(g_w, 1) if self.strided else g_w).astype(self.w_DxV.dtype)


def _chunk_logits(x_CxD, w_DxU, ids_U, vocab_size):
  """float32 logits [C, U] of one vocab chunk (ids_U), padded ids at the pad logit."""
  logits = jax.lax.dot_general(x_CxD, w_DxU, (((1,), (0,)), ((), ())),
                               preferred_element_type=jnp.float32)
  return jnp.where(ids_U < vocab_size, logits, PAD_LOGIT)


def _cpu_transposed(a):
  """a.T, materialised behind a barrier on the CPU so that the dots that read it run in
  the standard layout there (YNNPACK, not Eigen: lev_jax/dense.py); a.T elsewhere."""
  return jax.lax.optimization_barrier(a.T) if target.platform() == "cpu" else a.T


def _unroll():
  # lev-compile's loop-free estimate (XLA's cost model counts a loop body once):
  # target.unrolled_loops.
  return target.loops_unrolled() or 1


def _forward(x_NxD, w_DxV, targets_N, vocab_size, token_chunk, vocab_chunk):
  n_tc = x_NxD.shape[0] // token_chunk
  vocab = _Vocab(w_DxV, vocab_chunk)

  def token_chunk_fn(args):
    x_CxD, t_C = args

    def vocab_step(carry, k):
      m_C, s_C, tgt_C = carry
      ids_U = vocab.ids(k)
      logits_CxU = _chunk_logits(x_CxD, vocab.head(k), ids_U, vocab_size)
      m_new = jnp.maximum(m_C, logits_CxU.max(-1))
      s_C = s_C * jnp.exp(m_C - m_new) + jnp.exp(logits_CxU - m_new[:, None]).sum(-1)
      tgt_C = tgt_C + jnp.where(ids_U == t_C[:, None], logits_CxU, 0.0).sum(-1)
      return (m_new, s_C, tgt_C), None

    c = x_CxD.shape[0]
    init = (jnp.full((c,), -jnp.inf, jnp.float32), jnp.zeros((c,), jnp.float32),
            jnp.zeros((c,), jnp.float32))
    (m_C, s_C, tgt_C), _ = jax.lax.scan(vocab_step, init, jnp.arange(vocab.n),
                                        unroll=_unroll())
    return m_C + jnp.log(s_C), tgt_C

  _, (lse_TxC, tgt_TxC) = jax.lax.scan(
      lambda carry, args: (carry, token_chunk_fn(args)), None,
      (_strided(x_NxD, n_tc, 0), _strided(targets_N, n_tc, 0)), unroll=_unroll())
  return _unstrided(lse_TxC, 0), _unstrided(tgt_TxC, 0)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5))
def _lse_and_target(x_NxD, w_DxV, targets_N, vocab_size, token_chunk, vocab_chunk):
  return _forward(x_NxD, w_DxV, targets_N, vocab_size, token_chunk, vocab_chunk)


def _lse_and_target_fwd(x_NxD, w_DxV, targets_N, vocab_size, token_chunk, vocab_chunk):
  lse_N, tgt_N = _forward(x_NxD, w_DxV, targets_N, vocab_size, token_chunk, vocab_chunk)
  return (lse_N, tgt_N), (x_NxD, w_DxV, targets_N, lse_N)


def _lse_and_target_bwd(vocab_size, token_chunk, vocab_chunk, residuals, g):
  x_NxD, w_DxV, targets_N, lse_N = residuals
  g_lse_N, g_tgt_N = g
  n_tc = x_NxD.shape[0] // token_chunk
  vocab = _Vocab(w_DxV, vocab_chunk)
  f32, dtype = jnp.float32, x_NxD.dtype

  def token_chunk_fn(g_w, args):
    x_CxD, t_C, lse_C, g_lse_C, g_tgt_C = args
    # Every dot in the standard layout (the left operand's minor dim and the right
    # operand's major dim contracted): `_cpu_transposed`.
    xt_DxC = _cpu_transposed(x_CxD)

    def vocab_step(carry, k):
      g_x_CxD, g_w = carry
      ids_U, w_DxU = vocab.ids(k), vocab.head(k)
      logits_CxU = _chunk_logits(x_CxD, w_DxU, ids_U, vocab_size)
      # d lse / d logit = softmax; d target logit / d logit = one-hot of the target.
      g_logits_CxU = (g_lse_C[:, None] * jnp.exp(logits_CxU - lse_C[:, None])
                      + jnp.where(ids_U == t_C[:, None], g_tgt_C[:, None], 0.0))
      g_logits_CxU = jnp.where(ids_U < vocab_size, g_logits_CxU, 0.0).astype(dtype)
      wt_UxD = _cpu_transposed(w_DxU)
      g_x_CxD = g_x_CxD + jnp.dot(g_logits_CxU, wt_UxD, preferred_element_type=f32)
      g_w = vocab.add(g_w, k, jnp.dot(xt_DxC, g_logits_CxU, preferred_element_type=f32))
      return (g_x_CxD, g_w), None

    (g_x_CxD, g_w), _ = jax.lax.scan(vocab_step, (jnp.zeros(x_CxD.shape, f32), g_w),
                                     jnp.arange(vocab.n), unroll=_unroll())
    return g_w, g_x_CxD

  per_token = tuple(_strided(a, n_tc, 0)
                    for a in (x_NxD, targets_N, lse_N, g_lse_N, g_tgt_N))
  g_w, g_x_TxCxD = jax.lax.scan(token_chunk_fn, vocab.zeros(), per_token,
                                unroll=_unroll())
  return _unstrided(g_x_TxCxD, 0).astype(dtype), vocab.gradient(g_w), None


_lse_and_target.defvjp(_lse_and_target_fwd, _lse_and_target_bwd)


def _sums_forward(x_NxD, w_DxV, targets_N, weights_N, vocab_size, z_loss, token_chunk,
                  with_grads: bool):
  """Per token chunk, the float32 logits over the whole vocab, their log-sum-exp, and
  (with_grads) the gradient of the chunk's objective to x and w, right there."""
  f32, dtype = jnp.float32, x_NxD.dtype
  n_tc = x_NxD.shape[0] // token_chunk
  ids_V = jnp.arange(w_DxV.shape[1])
  wt_VxD = _cpu_transposed(w_DxV) if with_grads else None

  def chunk(g_w, args):
    x_CxD, t_C, w_C = args
    logits_CxV = _chunk_logits(x_CxD, w_DxV, ids_V, vocab_size)
    log_z_C = jax.nn.logsumexp(logits_CxV, axis=-1)
    tgt_C = jnp.take_along_axis(logits_CxV, t_C[:, None], axis=-1)[:, 0]
    sums = (jnp.sum(w_C * (log_z_C - tgt_C)), z_loss * jnp.sum(w_C * jnp.square(log_z_C)))
    if not with_grads:
      return g_w, (sums, None)
    # d objective / d logit = w (1 + 2 z log Z) softmax - w one-hot(target).
    g_logits_CxV = ((w_C * (1.0 + 2.0 * z_loss * log_z_C))[:, None]
                    * jnp.exp(logits_CxV - log_z_C[:, None]))
    g_logits_CxV = g_logits_CxV - w_C[:, None] * jax.nn.one_hot(t_C, w_DxV.shape[1],
                                                                dtype=f32)
    g_logits_CxV = jnp.where(ids_V < vocab_size, g_logits_CxV, 0.0).astype(dtype)
    g_x_CxD = jnp.dot(g_logits_CxV, wt_VxD, preferred_element_type=f32).astype(dtype)
    g_w = g_w + jnp.dot(_cpu_transposed(x_CxD), g_logits_CxV, preferred_element_type=f32)
    return g_w, (sums, g_x_CxD)

  per_token = tuple(_strided(a, n_tc, 0) for a in (x_NxD, targets_N, weights_N))
  g_w, ((ce_T, z_T), g_x_TxCxD) = jax.lax.scan(
      chunk, jnp.zeros(w_DxV.shape, f32) if with_grads else None, per_token,
      unroll=_unroll())
  sums = (jnp.sum(ce_T), jnp.sum(z_T))
  if not with_grads:
    return sums, None
  return sums, (_unstrided(g_x_TxCxD, 0), g_w.astype(w_DxV.dtype))


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6))
def _fused_sums(x_NxD, w_DxV, targets_N, weights_N, vocab_size, z_loss, token_chunk):
  (ce, z), _ = _sums_forward(x_NxD, w_DxV, targets_N, weights_N, vocab_size, z_loss,
                             token_chunk, with_grads=False)
  return ce + z, ce, z


def _fused_sums_fwd(x_NxD, w_DxV, targets_N, weights_N, vocab_size, z_loss, token_chunk):
  (ce, z), grads = _sums_forward(x_NxD, w_DxV, targets_N, weights_N, vocab_size, z_loss,
                                 token_chunk, with_grads=True)
  return (ce + z, ce, z), grads


def _fused_sums_bwd(vocab_size, z_loss, token_chunk, grads, g):
  del vocab_size, z_loss, token_chunk
  g_x_NxD, g_w_DxV = grads
  g_objective = g[0]  # the cross-entropy and z-loss sums are reported, not differentiated
  return (g_objective.astype(g_x_NxD.dtype) * g_x_NxD,
          g_objective.astype(g_w_DxV.dtype) * g_w_DxV, None, None)


_fused_sums.defvjp(_fused_sums_fwd, _fused_sums_bwd)


def chunked_log_z_and_target(x_NxD: jax.Array, w_DxV: jax.Array, targets_N: jax.Array,
                             vocab_size: int, token_chunk: int = 0,
                             vocab_chunk: int = 0) -> tuple[jax.Array, jax.Array]:
  """log Z and the target's logit of each token, without the [N, V] logits.

    logits[n, v] = x[n] . w[:, v]  (float32 accumulation; padded ids v >= vocab_size at
                                    -1e9, as embeddings.mask_padded_logits)
    log_z[n] = log sum_v exp(logits[n, v]),  target[n] = logits[n, targets[n]]
  so the cross-entropy is log_z - target. Differentiable in x and w (custom VJP that
  recomputes each chunk's logits); holds float32 [token_chunk, vocab_chunk] logits at a
  time. What the eval step and any per-token use run; the train step runs
  `chunked_loss_sums`, which needs no recompute.

  Args:
    x_NxD: final hidden states, float32 or bfloat16 (the compute dtype).
    w_DxV: the head, in x's dtype; V = the padded vocab.
    targets_N: int target ids in [0, vocab_size).
    vocab_size: the real vocab; ids at or above it are padding.
    token_chunk: tokens per chunk, a divisor of N (0: `token_chunk_size`'s choice).
    vocab_chunk: ids per chunk, a divisor of V (0: all of V; train.loss_vocab_chunk's
      automatic size is `vocab_chunk_size`'s).
  Returns:
    (log_z_N, target_N), float32.
  Raises:
    ValueError: x and w disagree on D.
    ConfigError: a chunk size that does not divide N or V.
  """
  if w_DxV.shape[0] != x_NxD.shape[1]:
    raise ValueError(f"chunked_log_z_and_target: x [N, D] = {x_NxD.shape} and w [D, V] "
                     f"= {w_DxV.shape} disagree on D")
  vc = w_DxV.shape[1] if vocab_chunk == 0 else vocab_chunk_size(w_DxV.shape[1], vocab_chunk)
  tc = token_chunk_size(x_NxD.shape[0], token_chunk, vc, sharding.split_count("batch"))
  return _lse_and_target(x_NxD, w_DxV, targets_N.astype(jnp.int32), vocab_size, tc, vc)


def chunked_loss_sums(x_NxD: jax.Array, w_DxV: jax.Array, targets_N: jax.Array,
                      weights_N: jax.Array, vocab_size: int, z_loss: float = 0.0,
                      token_chunk: int = 0) -> tuple[jax.Array, jax.Array, jax.Array]:
  """The training objective of N tokens, its gradient made in the forward pass.

    objective = sum_n weights[n] (log_z[n] - target[n] + z_loss log_z[n]^2)
  (log_z, target as `chunked_log_z_and_target`, over the whole vocab). Per token chunk
  the float32 logits [token_chunk, V] are made once, and the chunk's gradient to x and
  w follows from them at once (the per-token weights and z-loss are known there), as
  the Liger kernel's fused linear cross-entropy does: three matmuls, as the dense
  loss, against four for a recomputing backward pass. The gradients are kept from the
  forward pass and scaled by the objective's cotangent.

  Args:
    x_NxD, w_DxV, targets_N, vocab_size: as `chunked_log_z_and_target`.
    weights_N: float32 per-token weights (0 for padding).
    z_loss: optim.z_loss (>= 0).
    token_chunk: tokens per chunk, a divisor of N (0: `token_chunk_size`'s choice).
  Returns:
    float32 scalars (objective, cross-entropy sum, z-loss sum). Only the objective is
    differentiable: the other two are for logging (their cotangents are ignored).
  Raises:
    ValueError, ConfigError: as `chunked_log_z_and_target`.
  """
  if w_DxV.shape[0] != x_NxD.shape[1]:
    raise ValueError(f"chunked_loss_sums: x [N, D] = {x_NxD.shape} and w [D, V] "
                     f"= {w_DxV.shape} disagree on D")
  tc = token_chunk_size(x_NxD.shape[0], token_chunk, w_DxV.shape[1],
                        sharding.split_count("batch"))
  return _fused_sums(x_NxD, w_DxV, targets_N.astype(jnp.int32),
                     weights_N.astype(jnp.float32), vocab_size, float(z_loss), tc)


@jax.custom_vjp
def _low_precision_cross_entropy(logits_xV: jax.Array, targets_x: jax.Array
                                 ) -> tuple[jax.Array, jax.Array]:
  """(nll, log Z) [...] float32 of bfloat16 logits [..., V], softmax in float32.

  A custom VJP whose residuals are the bfloat16 logits and log Z: autodiff of the
  float32 softmax would keep the float32 copy of the logits for the backward pass (a
  [tokens, V] float32 buffer, twice the bfloat16 logits). The backward pass
  recomputes softmax = exp(logits - log Z) in float32 and returns the logits' gradient
  in their dtype. d nll / d logits = softmax - onehot(target); d log Z / d logits =
  softmax (so z-loss's gradient flows through log Z).
  """
  return _low_precision_ce_fwd(logits_xV, targets_x)[0]


def _low_precision_ce_fwd(logits_xV, targets_x):
  log_z_x = jax.nn.logsumexp(logits_xV.astype(jnp.float32), axis=-1)
  # The target logit gathered from the bfloat16 logits (then widened: exact), so that
  # no float32 [..., V] array has a consumer outside the log-sum-exp's fusion.
  target_x = jnp.take_along_axis(logits_xV, targets_x[..., None], axis=-1)[..., 0]
  target_x = target_x.astype(jnp.float32)
  return (log_z_x - target_x, log_z_x), (logits_xV, targets_x, log_z_x)


def _low_precision_ce_bwd(residuals, g):
  logits_xV, targets_x, log_z_x = residuals
  g_nll_x, g_log_z_x = g
  softmax_xV = jnp.exp(logits_xV.astype(jnp.float32) - log_z_x[..., None])
  onehot_xV = jax.nn.one_hot(targets_x, logits_xV.shape[-1], dtype=jnp.float32)
  g_xV = (g_nll_x + g_log_z_x)[..., None] * softmax_xV - g_nll_x[..., None] * onehot_xV
  return g_xV.astype(logits_xV.dtype), None


_low_precision_cross_entropy.defvjp(_low_precision_ce_fwd, _low_precision_ce_bwd)


def _head_inputs(model, batch):
  """(x [N, D] compute dtype, head [D, V] in x's dtype) of a batch."""
  x_BxLxD = model.hidden(batch["inputs"], batch.get("positions"), batch.get("segment_ids"))
  x_NxD = x_BxLxD.reshape(-1, x_BxLxD.shape[-1])
  return x_NxD, model.embedding.head_DxV().astype(x_NxD.dtype)


def _check_impl(cfg) -> None:
  if cfg.loss_impl == "auto":
    raise ValueError("train.loss_impl = 'auto' must be resolved for the devices first "
                     "(lev_jax.loss.resolved_train_cfg)")
  if cfg.loss_impl not in LOSS_IMPLS:
    raise ConfigError(f"config.train.loss_impl = {cfg.loss_impl!r}: expected one of "
                      + ", ".join(repr(i) for i in LOSS_IMPLS))


def token_losses(model, batch: dict, cfg: ml_collections.ConfigDict, z_loss: float = 0.0
                 ) -> tuple[jax.Array, jax.Array | None]:
  """Per-token cross-entropy of a batch, and log Z when z-loss needs it (eval, and the
  dense train step).

  Args:
    model: the `Decoder` (its `hidden` and its embedding's `head_DxV`).
    batch: {"inputs", "targets"} int32 [B, L], optional "positions", "segment_ids".
    cfg: config.train (loss_impl, loss_token_chunk, loss_vocab_chunk).
    z_loss: optim.z_loss; the dense loss computes log Z only when it is > 0.
  Returns:
    (nll_BxL float32, log_z_BxL float32 or None).
  Raises:
    ConfigError: an unknown loss_impl or a chunk size that does not divide.
  """
  _check_impl(cfg)
  inputs, targets = batch["inputs"], batch["targets"]
  if cfg.loss_impl == "dense":
    logits_BxLxV = model.head_logits(inputs, batch.get("positions"),
                                     batch.get("segment_ids"))
    if logits_BxLxV.dtype != jnp.float32:  # model.logits_dtype = bfloat16
      return _low_precision_cross_entropy(logits_BxLxV, targets)
    nll = optax.softmax_cross_entropy_with_integer_labels(logits_BxLxV, targets)
    log_z = jax.nn.logsumexp(logits_BxLxV, axis=-1) if z_loss > 0 else None
    return nll, log_z
  x_NxD, w_DxV = _head_inputs(model, batch)
  return _chunked_token_losses(x_NxD, w_DxV, targets, model.vocab_size, cfg)


def _chunked_token_losses(x_NxD, w_DxV, targets_BxL, vocab_size, cfg):
  vocab_chunk = vocab_chunk_size(w_DxV.shape[1], cfg.loss_vocab_chunk)
  log_z, tgt = chunked_log_z_and_target(x_NxD, w_DxV, targets_BxL.reshape(-1), vocab_size,
                                        cfg.loss_token_chunk, vocab_chunk)
  return (log_z - tgt).reshape(targets_BxL.shape), log_z.reshape(targets_BxL.shape)


def loss_sums(model, batch: dict, cfg: ml_collections.ConfigDict, z_loss: float = 0.0
              ) -> tuple[jax.Array, tuple[jax.Array, jax.Array, jax.Array]]:
  """The train step's objective of a batch and what it logs.

  Returns:
    (objective, (cross-entropy sum, real targets, z-loss sum)), float32 scalars, sums
    over the batch weighted by batch["weights"]; objective = cross-entropy sum + z-loss
    sum (PaLM Sec. 5). `dense` builds them from `token_losses` (with z_loss = 0 the
    objective is the cross-entropy itself, the program every CPU figure was made with);
    `chunked` with the whole vocab per token chunk (`vocab_chunk_size` of
    loss_vocab_chunk: the padded vocab) runs `chunked_loss_sums`, with vocab chunks
    `chunked_log_z_and_target`.
  Raises:
    ConfigError: as `token_losses`.
  """
  _check_impl(cfg)
  w_BxL = batch["weights"]
  n_targets = jnp.sum(w_BxL)
  if cfg.loss_impl == "chunked":
    x_NxD, w_DxV = _head_inputs(model, batch)
    if vocab_chunk_size(w_DxV.shape[1], cfg.loss_vocab_chunk) == w_DxV.shape[1]:
      objective, ce_sum, z_sum = chunked_loss_sums(
          x_NxD, w_DxV, batch["targets"].reshape(-1), w_BxL.reshape(-1),
          model.vocab_size, z_loss, cfg.loss_token_chunk)
      return objective, (ce_sum, n_targets, z_sum)
    nll_BxL, log_z_BxL = _chunked_token_losses(x_NxD, w_DxV, batch["targets"],
                                               model.vocab_size, cfg)
  else:
    nll_BxL, log_z_BxL = token_losses(model, batch, cfg, z_loss)
  ce_sum = jnp.sum(nll_BxL * w_BxL)
  if z_loss <= 0:
    return ce_sum, (ce_sum, n_targets, jnp.zeros(()))
  z_sum = z_loss * jnp.sum(jnp.square(log_z_BxL) * w_BxL)
  return ce_sum + z_sum, (ce_sum, n_targets, z_sum)
