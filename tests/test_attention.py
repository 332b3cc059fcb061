"""attention: the kernel behind config.model.attention, its choice and its refusals.

Splash runs in the Pallas interpreter on CPU (model.attention_interpret / interpret=True)
and must equal xla in values and gradients (float32, 1e-5 of the largest entry; in
bfloat16 as close to the float32 result as xla is): with
and without segment ids, with grouped-query heads, and once in a shard_map on 8
simulated devices. cudnn lowers for "cuda" from this CPU host (see
`test_cudnn_lowers_for_cuda`). A train step with splash (auto, traced for a TPU) with
segment ids and grouped-query heads over tensor = 2 compiles for a v5p slice (libtpu)
in lev-compile's test, tests/test_cli_compile.py (its Mosaic kernels in the dump).
"""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from conftest import run_on_8_devices
from lev_jax import attention, sharding, target
from lev_jax.config import ConfigError, validate
from lev_jax.model import Decoder

L, BLOCK = 256, 128  # two query and two key blocks: one causal block skipped per row


def _inputs(b, h, g, k=16, segments=True, dtype=jnp.float32):
  """q [B, L, H, K], k / v [B, L, G, K], segment ids [B, L] (3 to 6 documents a row,
  or None) and an output weight w [B, L, H, K]."""
  rng = np.random.default_rng(0)
  q, kk, v, w = (jnp.asarray(rng.standard_normal(s), dtype)
                 for s in [(b, L, h, k), (b, L, g, k), (b, L, g, k), (b, L, h, k)])
  seg = None
  if segments:
    seg = jnp.asarray(np.cumsum(rng.random((b, L)) < 0.02, axis=1), jnp.int32)
  return q, kk, v, seg, w


def _value_and_grads(impl, q, k, v, seg, w, **kw):
  loss = lambda q, k, v: jnp.sum(attention.attend(q, k, v, seg, impl, **kw).astype(w.dtype)
                                 * w)
  return jax.value_and_grad(loss, argnums=(0, 1, 2))(q, k, v)


def _rel(a, b):
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  return float(np.max(np.abs(a - b)) / (np.max(np.abs(b)) + 1e-30))


def _mean_rel(a, b):
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  return float(np.mean(np.abs(a - b)) / (np.mean(np.abs(b)) + 1e-30))


def _config(make_config, **model):
  c = make_config("tied")
  c.train.seq_len = c.model.max_seq_len = L
  for name, value in model.items():
    c.model[name] = value
  return c


# --- the choice ----------------------------------------------------------------------

def test_auto_is_xla_on_cpu_splash_on_tpu_and_cudnn_on_gpu_where_they_fit(make_config):
  c = _config(make_config)
  assert attention.resolve(c, "cpu")[0] == "xla"
  c.model.attention_interpret = True  # only for an explicit splash
  assert attention.resolve(c, "cpu")[0] == "xla"
  impl, reason = attention.resolve(c, "tpu")
  assert impl == "splash" and "blocks q 256 x kv 256" in reason  # 512 clipped to L
  c.train.seq_len = 200
  impl, reason = attention.resolve(c, "tpu")
  assert impl == "xla" and "train.seq_len = 200" in reason and "\n" not in reason
  assert attention.resolve(c, "gpu")[0] == "xla"  # float32
  c.model.dtype = "bfloat16"
  assert attention.resolve(c, "gpu")[0] == "cudnn"
  c.data.segment_masking = True  # the mask becomes cuDNN's bias
  assert attention.resolve(c, "gpu")[0] == "cudnn"
  c.model.head_dim = 160  # past pre-Hopper cuDNN: auto stays xla, explicit cudnn may try
  assert attention.resolve(c, "gpu")[0] == "xla"
  c.model.attention = "cudnn"
  assert attention.resolve(c, "gpu")[0] == "cudnn"
  c.model.attention = "xla"
  assert attention.resolve(c, "tpu")[0] == "xla"


@pytest.mark.parametrize("change,where,match", [
    ({"model.attention": "flash"}, "validate",
     r"config.model.attention = 'flash': expected one of 'auto', 'xla', 'splash', 'cudnn'"),
    ({"model.attention": "cudnn"}, "validate",
     r"config.model.dtype = 'float32': expected 'bfloat16' or 'float16' with "
     r"model.attention = 'cudnn' \(cuDNN flash attention, an NVIDIA GPU kernel, has no "
     r"float32 kernel; off a GPU use 'auto' or 'xla'\)"),  # newcomer pass 19 (C03)
    ({"model.attention": "cudnn", "model.dtype": "bfloat16", "model.head_dim": 12},
     "validate", r"config.model.head_dim = 12: expected a multiple of 8"),
    ({"model.attention": "splash", "train.seq_len": 200}, "validate",
     r"config.train.seq_len = 200: expected a multiple of 128 with model.attention"),
    ({"model.attention": "splash", "train.seq_len": 384, "model.max_seq_len": 384,
      "model.splash_block_kv": 256}, "validate",
     r"config.model.splash_block_kv = 256: expected a divisor of train.seq_len = 384, or "
     r">= it"),
    ({"model.attention_logits_dtype": "bfloat16"}, "validate",
     r"config.model.attention_logits_dtype = 'bfloat16': expected 'float32' unless "
     r"model.dtype = 'bfloat16'"),
    ({"model.attention_logits_dtype": "float16", "model.dtype": "bfloat16"}, "validate",
     r"config.model.attention_logits_dtype = 'float16': expected one of 'float32', "
     r"'bfloat16'"),
    ({"model.splash_block_q": 100}, "validate",
     r"config.model.splash_block_q = 100: expected a positive multiple of 128"),
    ({"model.attention": "splash"}, "resolve",
     r"config.model.attention = 'splash': expected a TPU program \(this one is for 'cpu'\); "
     r"model.attention_interpret = True"),
    ({"model.attention": "cudnn", "model.dtype": "bfloat16"}, "resolve",
     r"config.model.attention = 'cudnn': expected an NVIDIA GPU program"),
    ({"model.attention": "splash"}, "trace",
     r"config.model.attention = 'splash': expected a TPU program"),
    ({"model.attention": "flash"}, "build", r"config.model.attention = 'flash'"),
])
def test_bad_attention_settings_are_one_line_config_errors(make_config, change, where,
                                                           match):
  c = _config(make_config)
  for field, value in change.items():
    section, name = field.split(".")
    c[section][name] = value
  with pytest.raises(ConfigError, match=match) as err:
    if where == "validate":
      validate(c)
    elif where == "resolve":
      validate(c)
      attention.resolve(c, "cpu")
    else:
      model = nnx.eval_shape(lambda: Decoder(c, rngs=nnx.Rngs(0)))
      if where == "trace":  # the platform is checked when the step is traced
        nnx.eval_shape(lambda m: m(jnp.zeros((1, L), jnp.int32)), model)
  assert "\n" not in str(err.value)


def test_decode_stays_xla_whatever_model_attention_says(make_config):
  c = _config(make_config, attention="splash")  # would refuse the CPU if it ran
  model = nnx.eval_shape(lambda: Decoder(c, rngs=nnx.Rngs(0)))
  logits, _ = nnx.eval_shape(
      lambda m: m.decode(jnp.zeros((2, 4), jnp.int32), jnp.zeros((2, 4), jnp.int32),
                         m.init_cache(2, 32), 0, jnp.ones((2, 32), bool)), model)
  assert logits.shape == (2, 4, 384)


# --- splash (Pallas interpreter) against xla -------------------------------------------

@pytest.mark.parametrize("segments", [False, True])
def test_splash_equals_xla_in_values_and_gradients(segments):
  q, k, v, seg, w = _inputs(2, 4, 2, segments=segments)  # GQA: 2 query heads a key head
  want = _value_and_grads("xla", q, k, v, seg, w)
  got = jax.jit(lambda *a: _value_and_grads("splash", *a, block_q=BLOCK, block_kv=BLOCK,
                                            interpret=True))(q, k, v, seg, w)
  errors = [_rel(a, b) for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want))]
  assert max(errors) <= 1e-5, f"value, dq, dk, dv: {errors}"


def test_bfloat16_splash_is_as_close_to_float32_as_bfloat16_xla():
  """bfloat16 q, k, v: both kernels return bfloat16 outputs and gradients, each entry
  rounded (2^-9 relative on average, ~2e-3), so they cannot agree closer than that.
  Against the float32 result on the same inputs, splash's mean relative difference is
  within 1.25x xla's own plus 1e-4 for the value and every gradient (measured: value
  0.0044 vs 0.0075; dq, dk, dv 0.0025 vs 0.0022-0.0023)."""
  q, k, v, seg, w = _inputs(2, 4, 2, dtype=jnp.bfloat16)
  f32 = lambda *a: [x.astype(jnp.float32) for x in a]
  truth = jax.jit(lambda *a: _value_and_grads("xla", *f32(*a), seg, f32(w)[0]))(q, k, v)
  xla = jax.jit(lambda *a: _value_and_grads("xla", *a, seg, f32(w)[0]))(q, k, v)
  splash = jax.jit(lambda *a: _value_and_grads("splash", *a, seg, f32(w)[0], block_q=BLOCK,
                                               block_kv=BLOCK, interpret=True))(q, k, v)
  errors = {name: [_mean_rel(a, b) for a, b in zip(jax.tree.leaves(r),
                                                   jax.tree.leaves(truth))]
            for name, r in (("xla", xla), ("splash", splash))}
  for mine, theirs in zip(errors["splash"], errors["xla"]):
    assert mine <= 1.25 * theirs + 1e-4, errors


@pytest.mark.parametrize("segments", [False, True])
def test_bfloat16_scores_are_as_close_to_float32_as_bfloat16_inputs_allow(segments):
  """model.attention_logits_dtype = bfloat16 (MaxText's dot_product precision): the
  [B, H, L, L] scores, exp and value product in bfloat16. In float32 it is the float32
  kernel to float32 rounding (the same math: masked, max-shifted, normalised after the
  value product); in bfloat16, against the float32 result on the same inputs, its mean
  relative difference is within 3x that of bfloat16 inputs through the float32 kernel
  plus 2e-3 for the value and every gradient (measured without / with segments: value
  0.0077 vs 0.0022 / 0.0015 vs 0.0075; dq 0.0064 / 0.0066 vs 0.0028; dk 0.0062 / 0.0063
  vs 0.0028; dv 0.0046 / 0.0041 vs 0.0027-0.0028), and the scores' dtype is bfloat16 in
  the traced program."""
  q, k, v, seg, w = _inputs(2, 4, 2, segments=segments)  # GQA
  want = _value_and_grads("xla", q, k, v, seg, w)
  same = _value_and_grads("xla", q, k, v, seg, w, logits_dtype="bfloat16")  # float32 in
  assert max(_rel(a, b) for a, b in zip(jax.tree.leaves(same), jax.tree.leaves(want))) < 1e-5
  f32 = lambda *a: [x.astype(jnp.float32) for x in a]
  bq, bk, bv = (x.astype(jnp.bfloat16) for x in (q, k, v))
  truth = jax.jit(lambda *a: _value_and_grads("xla", *f32(*a), seg, w))(bq, bk, bv)
  xla = jax.jit(lambda *a: _value_and_grads("xla", *a, seg, w))(bq, bk, bv)
  low = jax.jit(lambda *a: _value_and_grads("xla", *a, seg, w, logits_dtype="bfloat16"))(
      bq, bk, bv)
  errors = {name: [_mean_rel(a, b) for a, b in zip(jax.tree.leaves(r),
                                                   jax.tree.leaves(truth))]
            for name, r in (("xla", xla), ("low", low))}
  for mine, theirs in zip(errors["low"], errors["xla"]):
    assert mine <= 3 * theirs + 2e-3, errors
  scores = [e for e in jax.make_jaxpr(lambda *a: attention.attend(
      *a, seg, "xla", logits_dtype="bfloat16"))(bq, bk, bv).eqns
            if e.primitive.name == "dot_general"][0].outvars[0].aval
  assert scores.dtype == jnp.bfloat16 and scores.size == 2 * 4 * L * L  # [B, H, L, L]


def _mesh_worker():
  """On 8 simulated CPU devices: splash under a (data 2, fsdp 2, tensor 2) mesh's
  activation rules (a shard_map over batch and heads) vs xla in one program."""
  from lev_jax.config import base_config  # noqa: PLC0415
  assert jax.device_count() == 8
  q, k, v, seg, w = _inputs(4, 4, 2)
  want = jax.jit(lambda *a: _value_and_grads("xla", *a))(q, k, v, seg, w)
  c = base_config()
  c.mesh.data, c.mesh.fsdp, c.mesh.tensor = 2, 2, 2
  fn = jax.jit(lambda *a: _value_and_grads("splash", *a, block_q=BLOCK, block_kv=BLOCK,
                                           interpret=True))
  with sharding.activation_sharding(sharding.make_mesh(c.mesh), sharding.rules_from_config(c)):
    got = fn(q, k, v, seg, w)
    hlo = fn.lower(q, k, v, seg, w).as_text()
  print(json.dumps({
      "errors": [_rel(a, b) for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want))],
      "shard_map": "sdy.manual_computation" in hlo or "shard_map" in hlo,
      # each device: 1 of the 4 rows (data x fsdp), 2 of the 4 query heads (tensor)
      "local_q": "tensor<1x256x2x16xf32>" in hlo}))


def test_splash_in_a_shard_map_over_batch_and_heads_on_8_devices_equals_xla():
  result, _ = run_on_8_devices(__file__, "mesh")
  assert result["shard_map"] and result["local_q"], result
  assert max(result["errors"]) <= 1e-5, f"value, dq, dk, dv: {result['errors']}"


# --- compiled or lowered for the accelerators -------------------------------------------

def test_cudnn_lowers_for_cuda(monkeypatch):
  """auto, chosen in a trace for a GPU (target.compiling_for), is cudnn for bfloat16;
  its attention with GQA and segment ids, value and gradients, lowers for "cuda" on
  this CPU host to cuDNN fused-attention custom calls, forward and backward.

  jax 0.10.2's cudnn path asks the CUDA plugin for the cuDNN version while tracing
  (jax._src.cudnn.fused_attention_stablehlo.check_cudnn_version, which raises
  "cuDNN is not detected." without jax-cuda12-plugin). Without the plugin this test
  answers 9.8 in its place; the lowering itself is jax's, with or without it.
  """
  from jax._src import lib as jax_lib  # noqa: PLC0415
  from jax._src.cudnn import fused_attention_stablehlo as cudnn_lib  # noqa: PLC0415
  if jax_lib.cuda_versions is None:
    monkeypatch.setattr(cudnn_lib, "check_cudnn_version", lambda: 90800)
  q, k, v, seg, w = _inputs(2, 4, 2, dtype=jnp.bfloat16)
  with target.compiling_for("gpu"):
    impl, _ = attention.choose("auto", target.platform(), dtype=q.dtype, seq_len=L,
                               head_dim=16, segments=True, block_q=512, block_kv=512)
    assert impl == "cudnn"
    fn = jax.jit(lambda *a: _value_and_grads(impl, *a))
    hlo = fn.trace(q, k, v, seg, w).lower(lowering_platforms=("cuda",)).as_text()
  assert "__cudnn$fmhaScaleBiasSoftmax" in hlo  # the segment mask as cuDNN's bias
  assert "__cudnn$fmhaScaleBiasSoftmaxBackward" in hlo


if __name__ == "__main__":
  _mesh_worker()
