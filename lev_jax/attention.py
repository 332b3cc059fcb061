"""The attention kernels behind config.model.attention: xla, splash (TPU), cudnn (GPU).

  impl, reason = resolve(config, target.platform())  # what "auto" becomes, and why
  out_BxLxHxK = attend(q_BxLxHxK, k_BxLxGxK, v_BxLxGxK, segment_ids_BxL, impl, ...)

Every kernel computes the same causal, grouped-query attention (query head h reads key /
value head h // (H / G)), restricted to keys of the query's own segment when segment
ids are given (packed documents, data.segment_masking):

  xla     jax.nn.dot_product_attention(implementation="xla"): the [B, H, L, L] scores,
          masked, softmax in float32. Any platform; what every CPU run uses.
  splash  Pallas splash attention (jax.experimental.pallas.ops.tpu.splash_attention):
          flash-style blocks of model.splash_block_q x model.splash_block_kv rows, the
          blocks above the causal diagonal skipped, segment ids as SegmentIds; run in a
          shard_map over the mesh's batch and head axes (XLA cannot partition a Mosaic
          kernel). TPU only, or anywhere in the Pallas interpreter
          (model.attention_interpret = True: tests, debugging).
  cudnn   jax.nn.dot_product_attention(implementation="cudnn"): cuDNN flash attention
          (NVIDIA GPUs; bfloat16 / float16). Segment ids become its mask argument, which
          jax turns into a [B, 1, L, L] additive bias (jax 0.10.2 offers packed
          sequences publicly in no other way): the fused kernel still runs, at the cost
          of that bias and its gradient in memory.
  auto    splash on TPU when train.seq_len fits its blocks, cudnn on GPU when the dtype
          and head_dim allow, else xla.

The choice is made when the step is traced, for `lev_jax.target.platform()` (the
default backend, or lev-compile's target): a model built on a CPU host and compiled
for a TPU slice traces splash. The KV-cached decode (`model.Attention.decode`) always
uses xla.

Sources: JAX API docs, jax.nn.dot_product_attention; the splash attention kernel's
docstrings (splash_attention_kernel.py: make_splash_mha, BlockSizes, SegmentIds);
MaxText's attention_op (attention=autoselected|flash|cudnn_flash_jax) for the
shard_map over batch and heads.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_collections
from jax.sharding import PartitionSpec as P

from lev_jax import sharding
from lev_jax.config import (ATTENTION_IMPLS, CUDNN_MAX_HEAD_DIM, ConfigError, cudnn_misfit,
                            splash_misfit)

HEADS = ("batch", "length", "act_heads", "head_dim")  # logical axes of q, k, v
_AUTO_CUDNN_HEAD_DIM = 128  # auto stays within every GPU generation's cuDNN limit


def _error(field: str, value, expected: str) -> ConfigError:
  return ConfigError(f"config.{field} = {value!r}: expected {expected}")


def check_name(name: str) -> str:
  """`name` when it is one of config.ATTENTION_IMPLS.

  Raises:
    ConfigError: another name (one line, listing the allowed ones).
  """
  if name not in ATTENTION_IMPLS:
    raise _error("model.attention", name,
                 "one of " + ", ".join(repr(a) for a in ATTENTION_IMPLS))
  return name


def choose(requested: str, platform: str, *, dtype, seq_len: int, head_dim: int,
           segments: bool, block_q: int, block_kv: int, interpret: bool = False
           ) -> tuple[str, str]:
  """The kernel for model.attention = `requested` in a program for `platform`.

  Args:
    requested: one of config.ATTENTION_IMPLS.
    platform: "cpu", "gpu" or "tpu" (`lev_jax.target.platform()`).
    dtype: the compute dtype (config.model.dtype).
    seq_len: L, tokens per row; head_dim: K.
    segments: whether segment ids restrict attention (data.segment_masking).
    block_q, block_kv: model.splash_block_q / _kv (clipped to seq_len).
    interpret: model.attention_interpret (splash in the Pallas interpreter).
  Returns:
    (impl, reason): "xla", "splash" or "cudnn", and why, one line without the impl:
    ("xla", "auto on tpu; splash needs train.seq_len = 200 to be a multiple of 128 ...").
  Raises:
    ConfigError: an unknown name; splash off a TPU without interpret, or with a
      seq_len its blocks do not fit; cudnn off a GPU, or with a float32 dtype, a
      head_dim it cannot take or an odd seq_len with segments. One line, naming the field.
  """
  check_name(requested)
  dtype = jnp.dtype(dtype).name
  bq, bkv = min(block_q, seq_len), min(block_kv, seq_len)
  if requested == "xla":
    return "xla", "model.attention = 'xla'"
  if requested == "splash":
    if platform != "tpu" and not interpret:
      raise _error("model.attention", "splash",
                   f"a TPU program (this one is for {platform!r}); "
                   "model.attention_interpret = True runs it in the Pallas interpreter "
                   "(slow: tests), 'auto' or 'xla' runs anywhere")
    misfit = splash_misfit(seq_len, block_q, block_kv)
    if misfit:
      raise _error(*misfit)
    where = "" if platform == "tpu" else f", in the Pallas interpreter on {platform}"
    return "splash", f"model.attention = 'splash'; blocks q {bq} x kv {bkv}{where}"
  if requested == "cudnn":
    if platform != "gpu":
      raise _error("model.attention", "cudnn", f"an NVIDIA GPU program (this one is for "
                   f"{platform!r}); 'auto' or 'xla' runs anywhere")
    misfit = cudnn_misfit(dtype, head_dim, seq_len, segments, CUDNN_MAX_HEAD_DIM)
    if misfit:
      raise _error(*misfit)
    return "cudnn", "model.attention = 'cudnn'; cuDNN flash attention"
  if platform == "tpu":
    misfit = splash_misfit(seq_len, block_q, block_kv)
    if misfit is None:
      return "splash", f"auto on tpu; blocks q {bq} x kv {bkv}"
    return "xla", "auto on tpu; splash needs {} = {!r} to be {}".format(*misfit)
  if platform == "gpu":
    misfit = cudnn_misfit(dtype, head_dim, seq_len, segments, _AUTO_CUDNN_HEAD_DIM)
    if misfit is None:
      return "cudnn", "auto on gpu; cuDNN flash attention"
    return "xla", "auto on gpu; cudnn needs {} = {!r} to be {}".format(*misfit)
  return "xla", f"auto on {platform}; splash needs a TPU, cudnn an NVIDIA GPU"


# The model fields `choose_for` reads (static: a module keeps them as a FrozenConfigDict).
KERNEL_FIELDS = ("attention", "dtype", "head_dim", "splash_block_q", "splash_block_kv",
                 "attention_interpret")


def kernel_fields(model_cfg) -> ml_collections.FrozenConfigDict:
  """The fields of config.model that decide the kernel (KERNEL_FIELDS), frozen."""
  return ml_collections.FrozenConfigDict({k: model_cfg[k] for k in KERNEL_FIELDS})


def choose_for(model_cfg, platform: str, *, seq_len: int, segments: bool
               ) -> tuple[str, str]:
  """`choose` with config.model's fields (KERNEL_FIELDS; a config.model section or
  `kernel_fields` of it) for rows of seq_len tokens, with segment ids or not.

  Returns and raises as `choose`. The one place that maps the config onto `choose`:
  the trainer's log line (`resolve`), the traced layer (`model.Attention`) and
  model.remat = "auto" (`model.Decoder`) all go through it, so they cannot disagree.
  """
  m = model_cfg
  return choose(m.attention, platform, dtype=m.dtype, seq_len=seq_len,
                head_dim=m.head_dim, segments=segments, block_q=m.splash_block_q,
                block_kv=m.splash_block_kv, interpret=m.attention_interpret)


def resolve(config: ml_collections.ConfigDict, platform: str) -> tuple[str, str]:
  """What config.model.attention becomes for a train step on `platform`: (impl, reason).

  Args:
    config: a validated experiment config (model, train.seq_len, data.segment_masking).
    platform: "cpu", "gpu" or "tpu", e.g. `lev_jax.target.platform()`.
  Returns:
    ("xla" | "splash" | "cudnn", why), as `choose`; the trainer logs
    `logging.info("attention %s (%s)", *resolve(config, target.platform()))`.
  Raises:
    ConfigError: as `choose` (e.g. splash on a CPU without model.attention_interpret).
  """
  return choose_for(config.model, platform, seq_len=config.train.seq_len,
                    segments=config.data.segment_masking)


def attend(q_BxLxHxK: jax.Array, k_BxLxGxK: jax.Array, v_BxLxGxK: jax.Array,
           segment_ids_BxL: jax.Array | None, impl: str, *, block_q: int = 512,
           block_kv: int = 512, interpret: bool = False,
           logits_dtype: str = "float32") -> jax.Array:
  """Causal grouped-query attention of L tokens with kernel `impl` (from `choose`).

  Args:
    q_BxLxHxK: queries (RoPE applied, not scaled), the compute dtype.
    k_BxLxGxK, v_BxLxGxK: keys (RoPE applied) and values, G dividing H, same dtype.
    segment_ids_BxL: int ids or None; a query attends only to keys <= its position
      with its own id (packed documents).
    impl: "xla", "splash" or "cudnn".
    block_q, block_kv: splash's blocks (clipped to L; then dividing L, multiples of 128).
    interpret: splash in the Pallas interpreter.
    logits_dtype: xla only: "float32" (jax.nn.dot_product_attention: float32 scores and
      softmax) or "bfloat16" (`_xla_low_precision`: q's dtype throughout).
  Returns:
    out_BxLxHxK, q's dtype: softmax(q k^T / sqrt(K)) v per head.
  Raises:
    ValueError: an unknown impl; the kernels' own errors for shapes they refuse.
  """
  if impl == "xla":
    q_BxLxHxK, k_BxLxGxK, v_BxLxGxK = (sharding.constrain(t, HEADS)
                                       for t in (q_BxLxHxK, k_BxLxGxK, v_BxLxGxK))
    if logits_dtype == "bfloat16":
      return _xla_low_precision(q_BxLxHxK, k_BxLxGxK, v_BxLxGxK, segment_ids_BxL)
    return jax.nn.dot_product_attention(q_BxLxHxK, k_BxLxGxK, v_BxLxGxK,
                                        mask=_segment_mask(segment_ids_BxL),
                                        is_causal=True, implementation="xla")
  if impl == "cudnn":
    names = _kernel_axes(q_BxLxHxK, k_BxLxGxK)
    q_BxLxHxK, k_BxLxGxK, v_BxLxGxK = (sharding.constrain(t, names)
                                       for t in (q_BxLxHxK, k_BxLxGxK, v_BxLxGxK))
    mask_Bx1xLxL = _segment_mask(segment_ids_BxL)
    if mask_Bx1xLxL is not None:
      mask_Bx1xLxL = sharding.constrain(mask_Bx1xLxL, ("batch", None, None, None))
    return jax.nn.dot_product_attention(q_BxLxHxK, k_BxLxGxK, v_BxLxGxK, mask=mask_Bx1xLxL,
                                        is_causal=True, implementation="cudnn")
  if impl == "splash":
    return _splash(q_BxLxHxK, k_BxLxGxK, v_BxLxGxK, segment_ids_BxL, block_q, block_kv,
                   interpret)
  raise ValueError(f"attention impl {impl!r}: expected 'xla', 'splash' or 'cudnn'")


def _xla_low_precision(q_BxLxHxK, k_BxLxGxK, v_BxLxGxK, segment_ids_BxL):
  """Causal GQA attention with the scores and softmax in q's dtype (bfloat16): q k^T
  (float32 accumulation, rounded once), masked, the row max subtracted, exponentials,
  their row sums, the value product, then the division by the sums (normalised after
  the value product, as MaxText's dot_product attention with float32_qk_product =
  float32_logits = False: its compute_local_attention). Half the bytes of the
  [B, H, L, L] scores and their gradient; equal to the float32 path to bfloat16
  rounding (tests/test_attention.py)."""
  b, length, h, k = q_BxLxHxK.shape
  g = k_BxLxGxK.shape[2]
  dtype = q_BxLxHxK.dtype
  scale = jnp.asarray(k ** -0.5, dtype)
  q_BxLxGxRxK = (q_BxLxHxK * scale).reshape(b, length, g, h // g, k)
  s_BxGxRxLxS = jnp.einsum("blgrk,bsgk->bgrls", q_BxLxGxRxK, k_BxLxGxK)
  keep = jnp.tril(jnp.ones((length, length), bool))[None, None, None]
  same_Bx1xLxL = _segment_mask(segment_ids_BxL)
  if same_Bx1xLxL is not None:
    keep = keep & same_Bx1xLxL[:, :, None]  # [B, 1, 1, L, L] against [B, G, R, L, S]
  s_BxGxRxLxS = jnp.where(keep, s_BxGxRxLxS, jnp.finfo(dtype).min)
  e_BxGxRxLxS = jnp.exp(s_BxGxRxLxS - jax.lax.stop_gradient(
      jnp.max(s_BxGxRxLxS, axis=-1, keepdims=True)))
  z_BxLxGxR = jnp.einsum("bgrls->blgr", e_BxGxRxLxS, preferred_element_type=jnp.float32)
  o_BxLxGxRxK = jnp.einsum("bgrls,bsgk->blgrk", e_BxGxRxLxS, v_BxLxGxK)
  o_BxLxGxRxK = o_BxLxGxRxK / z_BxLxGxR[..., None].astype(dtype)
  return o_BxLxGxRxK.reshape(b, length, h, k)


def _segment_mask(segment_ids_BxL: jax.Array | None) -> jax.Array | None:
  """bool [B, 1, L, L]: key j is in query i's segment (None without segment ids)."""
  if segment_ids_BxL is None:
    return None
  return segment_ids_BxL[:, None, :, None] == segment_ids_BxL[:, None, None, :]


def _kernel_axes(q_BxLxHxK: jax.Array, k_BxLxGxK: jax.Array) -> tuple:
  """Logical axes of q, k and v for a fused kernel: batch, and heads only where the
  mesh splits both H and G alike (query head h must sit with key head h // (H / G));
  length and head_dim never split (neither kernel takes a split sequence)."""
  names = ("batch", None, "act_heads", None)
  if sharding.active() is None:
    return names
  mesh, rules = sharding.active()
  sizes = sharding.mesh_sizes(mesh)
  heads = [sharding.spec_for(names, t.shape, sizes, rules, "attention", strict=False)[2]
           for t in (q_BxLxHxK, k_BxLxGxK)]
  return names if heads[0] == heads[1] else ("batch", None, None, None)


def _splash(q_BxLxHxK, k_BxLxGxK, v_BxLxGxK, segment_ids_BxL, block_q, block_kv,
            interpret):
  """Splash attention, in a shard_map over the batch and head axes of the active
  rules (each device runs the kernel on its rows and heads; no communication)."""
  # Imported here: Pallas and the kernel take seconds to import (minutes under an
  # emulated CPU: tests/test_portable.py), and only a splash program needs them.
  from jax.experimental.pallas.ops.tpu import splash_attention as splash_lib  # pylint: disable=import-outside-toplevel
  _, seq_len, _, head_dim = q_BxLxHxK.shape
  bq, bkv = min(block_q, seq_len), min(block_kv, seq_len)
  blocks = splash_lib.BlockSizes(
      block_q=bq, block_kv=bkv, block_kv_compute=bkv, block_q_dkv=bq, block_kv_dkv=bkv,
      block_kv_dkv_compute=bkv, block_q_dq=bq, block_kv_dq=bkv)
  scale = head_dim ** -0.5

  def local(q_BxLxHxK, k_BxLxGxK, v_BxLxGxK, *segment_ids):
    # The kernel takes one row [heads, L, K], q pre-scaled by 1/sqrt(K); built per
    # device for its local heads (the causal mask is the same for every head).
    mask = splash_lib.MultiHeadMask([splash_lib.CausalMask((seq_len, seq_len))]
                                    * q_BxLxHxK.shape[2])
    kernel = splash_lib.make_splash_mha(mask, block_sizes=blocks, head_shards=1,
                                        q_seq_shards=1, interpret=interpret)
    q_BxHxLxK = jnp.swapaxes(q_BxLxHxK * jnp.asarray(scale, q_BxLxHxK.dtype), 1, 2)
    k_BxGxLxK, v_BxGxLxK = jnp.swapaxes(k_BxLxGxK, 1, 2), jnp.swapaxes(v_BxLxGxK, 1, 2)
    if segment_ids:
      row = lambda q, k, v, s: kernel(q, k, v, segment_ids=splash_lib.SegmentIds(s, s))
      out_BxHxLxK = jax.vmap(row)(q_BxHxLxK, k_BxGxLxK, v_BxGxLxK, segment_ids[0])
    else:
      out_BxHxLxK = jax.vmap(kernel)(q_BxHxLxK, k_BxGxLxK, v_BxGxLxK)
    return jnp.swapaxes(out_BxHxLxK, 1, 2)

  args = (q_BxLxHxK, k_BxLxGxK, v_BxLxGxK)
  if segment_ids_BxL is not None:
    args += (segment_ids_BxL.astype(jnp.int32),)
  if sharding.active() is None:
    return local(*args)
  mesh, rules = sharding.active()
  if mesh.size == 1:
    return local(*args)
  sizes = sharding.mesh_sizes(mesh)
  names = _kernel_axes(q_BxLxHxK, k_BxLxGxK)
  batch, _, heads, _ = sharding.spec_for(names, q_BxLxHxK.shape, sizes, rules, "attention",
                                         strict=False)
  qkv = P(batch, None, heads, None)
  specs = (qkv, qkv, qkv) + ((P(batch, None),) if len(args) == 4 else ())
  # check_vma=False: a pallas_call's output carries no varying-axes type.
  return jax.shard_map(local, mesh=mesh, in_specs=specs, out_specs=qkv,
                       check_vma=False)(*args)
