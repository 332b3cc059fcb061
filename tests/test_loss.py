"""The chunked cross-entropy and z-loss (lev_jax/loss.py) against the dense loss."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from conftest import tiny_config
from lev_jax import loss, sharding, topology, train
from lev_jax.config import ConfigError, validate


def _batch(c, seed=0):
  rng = np.random.default_rng(seed)
  b, l = c.train.global_batch_size, c.train.seq_len
  ids = rng.integers(0, c.model.vocab_size, (b, l + 1)).astype(np.int32)
  return {"inputs": ids[:, :-1], "targets": ids[:, 1:],
          "weights": (rng.random((b, l)) < 0.8).astype(np.float32)}


def _loss_and_grads(c, params, graphdef, batch, z_loss=0.0):
  cfg = jax.tree.map(lambda x: x, c.train)
  fn = lambda p: train._sum_loss(p, graphdef, batch, cfg, z_loss)  # noqa: SLF001
  return jax.jit(jax.value_and_grad(fn, has_aux=True))(params)


def _rel(a, b):
  return float(jnp.max(jnp.abs(a - b)) / jnp.maximum(jnp.max(jnp.abs(b)), 1e-30))


@pytest.mark.parametrize("embedding,token_chunk,vocab_chunk,z_loss", [
    ("tied", 16, 128, 0.0),    # 4 token chunks x 3 vocab chunks (recomputing backward)
    ("lev", 16, 0, 1e-2),      # whole vocab: the gradient made in the forward pass
    ("untied", 0, 64, 1e-2),
])
def test_chunked_loss_equals_the_dense_loss(embedding, token_chunk, vocab_chunk, z_loss):
  """Loss to 1e-6 relative and every gradient to 1e-5 (float32, CPU), z-loss included."""
  c = tiny_config(embedding)
  model = train.create_model(c)
  from flax import nnx  # noqa: PLC0415
  graphdef, params = nnx.split(model, nnx.Param)
  batch = _batch(c)
  (dense, dense_aux), dense_g = _loss_and_grads(c, params, graphdef, batch, z_loss)
  c.train.loss_impl = "chunked"
  c.train.loss_token_chunk, c.train.loss_vocab_chunk = token_chunk, vocab_chunk
  validate(c)
  (chunked, chunked_aux), chunked_g = _loss_and_grads(c, params, graphdef, batch, z_loss)
  assert abs(float(chunked) - float(dense)) <= 1e-6 * abs(float(dense))
  for a, b in zip(chunked_aux, dense_aux):  # cross-entropy sum, targets, z-loss sum
    np.testing.assert_allclose(float(a), float(b), rtol=1e-6)
  assert (float(dense_aux[2]) > 0) == (z_loss > 0)
  for (path, g), ref in zip(jax.tree_util.tree_flatten_with_path(chunked_g)[0],
                            jax.tree.leaves(dense_g)):
    assert _rel(g, ref) <= 1e-5, jax.tree_util.keystr(path)


def test_z_loss_is_logged_and_changes_the_update_but_not_the_loss_metric():
  c = tiny_config("tied")
  c.train.loss_impl = "chunked"
  batch = _batch(c)
  results = {}
  for z in (0.0, 1e-1):
    c.optim.z_loss = z
    part, state = train.create_train_state(c)
    state, m = train.make_train_step(part, c)(state, batch)
    results[z] = (m, state["params"])
  (m0, p0), (m1, p1) = results[0.0], results[1e-1]
  assert "z_loss" not in m0 and float(m1["z_loss"]) > 0
  assert float(m1["loss"]) == pytest.approx(float(m0["loss"]), rel=1e-6)  # cross-entropy
  assert any(_rel(a, b) > 1e-4 for a, b in zip(jax.tree.leaves(p1), jax.tree.leaves(p0)))


def test_chunked_loss_with_gradient_accumulation_is_the_one_batch_update():
  c = tiny_config("tied")
  c.train.loss_impl, c.train.loss_vocab_chunk = "chunked", 128
  c.train.global_batch_size = 8
  batch = _batch(c)
  out = []
  for n_micro in (1, 4):
    c.train.grad_accum_steps = n_micro
    part, state = train.create_train_state(c)
    state, m = train.make_train_step(part, c)(state, batch)
    out.append((m, state["params"]))
  (m1, p1), (m4, p4) = out
  for key in ("loss", "grad_norm", "tokens"):
    assert float(m4[key]) == pytest.approx(float(m1[key]), rel=1e-5), key
  # Parameters after one AdamW step, whose first update is ~ lr * sign(g): a gradient
  # entry near 0 may flip, so this only checks the update is the same one.
  for a, b in zip(jax.tree.leaves(p4), jax.tree.leaves(p1)):
    assert _rel(a, b) <= 1e-3


def test_the_eval_step_gives_the_dense_per_token_nll():
  c = tiny_config("lev")
  part, state = train.create_train_state(c)
  batch = _batch(c)
  dense = train.make_eval_step(part, c)(state["params"], batch)
  c.train.loss_impl, c.train.loss_token_chunk = "chunked", 16
  chunked = train.make_eval_step(part, c)(state["params"], batch)
  np.testing.assert_allclose(chunked, dense, rtol=1e-5, atol=1e-6)


def test_the_chunked_loss_never_holds_the_tokens_x_vocab_logits():
  """Compiled train step, 1,024 tokens x 8,192 ids: the dense loss's program has
  [1024, 8192] buffers (float32 logits and their gradient, 32 MiB each); the chunked
  loss's has none, with 256-token chunks over the whole vocab (gradient in the forward
  pass) or 512-id vocab chunks (recomputing backward), and 40 % of the dense
  temporaries or less (the model's own are a few MiB)."""
  temps, programs = {}, {}
  for name, settings in {"dense": ("dense", 0, 0), "tokens": ("chunked", 256, 0),
                         "vocab": ("chunked", 0, 512)}.items():
    c = tiny_config("tied")
    c.model.vocab_size, c.train.global_batch_size, c.train.seq_len = 8192, 16, 64
    c.train.loss_impl, c.train.loss_token_chunk, c.train.loss_vocab_chunk = settings
    part = train.partition(c)
    state = train.abstract_state(part, c)
    compiled = train.make_train_step(part, c).lower(
        state, train.abstract_batch(part, c, c.train.global_batch_size)).compile()
    temps[name] = compiled.memory_analysis().temp_size_in_bytes
    programs[name] = compiled.as_text()
  assert "f32[16,64,8192]" in programs["dense"] or "f32[1024,8192]" in programs["dense"]
  for name in ("tokens", "vocab"):
    assert not any(s in programs[name] for s in ("[16,64,8192]", "[1024,8192]")), name
    assert temps[name] <= 0.4 * temps["dense"], temps
  assert "f32[256,8192]" in programs["tokens"]


def test_bfloat16_logits_round_once_and_halve_the_stored_logits():
  """model.logits_dtype = bfloat16 (bfloat16 compute): each logit is the float32 one
  rounded to bfloat16 (within 2^-7 relative: XLA:CPU may round partial sums too), and
  the train step's head matmul returns bfloat16 (lev-compile shows the bytes this
  saves on a TPU: docs/results.md, "The head and attention")."""
  from flax import nnx  # noqa: PLC0415
  programs, logits = {}, {}
  for dtype in ("float32", "bfloat16"):
    c = tiny_config("lev")
    c.model.vocab_size, c.train.global_batch_size, c.train.seq_len = 8100, 4, 64
    c.model.dtype, c.model.logits_dtype = "bfloat16", dtype
    validate(c)
    model = train.create_model(c)
    x_BxLxD = jax.random.normal(jax.random.key(0), (4, 64, c.model.d_model), jnp.bfloat16)
    logits[dtype] = model.embedding.unembed(x_BxLxD)
    assert logits[dtype].dtype == jnp.dtype(dtype)
    logits[dtype] = logits[dtype].astype(jnp.float32)
    part = train.partition(c)
    programs[dtype] = train.make_train_step(part, c).lower(
        train.abstract_state(part, c), train.abstract_batch(part, c, 4)).as_text()
  ref, got = logits["float32"][..., :8100], logits["bfloat16"][..., :8100]
  np.testing.assert_allclose(got, ref, rtol=2**-7, atol=1e-6)
  assert not np.array_equal(got, ref)
  padded = logits["bfloat16"][..., 8100:]  # the padded ids (to 8,192), at PAD_LOGIT
  assert float(jnp.max(padded)) == float(jnp.bfloat16(-1e9))
  # The head's matmul (and so its gradient) in the traced program: [.., 8192] bf16 only
  # with bfloat16 logits.
  head = "(tensor<256x32xbf16>, tensor<32x8192xbf16>) -> tensor<256x8192x"
  assert head + "bf16>" in programs["bfloat16"] and head + "f32>" in programs["float32"]
  assert head + "f32>" not in programs["bfloat16"]


def test_the_bfloat16_logits_cross_entropy_is_the_float32_softmax_of_them():
  """The dense loss's custom VJP for bfloat16 logits: nll and log Z as the float32
  softmax of the widened logits (optax), and their gradients (cross-entropy and z-loss
  weights) as autodiff's, rounded once to bfloat16."""
  k1, k2, k3 = jax.random.split(jax.random.key(0), 3)
  logits = (4 * jax.random.normal(k1, (3, 5, 384))).astype(jnp.bfloat16)
  targets = jax.random.randint(k2, (3, 5), 0, 384)
  w = jax.random.uniform(k3, (3, 5))

  def objective(ce):
    def f(l):
      nll, log_z = ce(l, targets)
      return jnp.sum(w * nll) + 0.1 * jnp.sum(w * log_z**2), (nll, log_z)
    return jax.jit(jax.value_and_grad(f, has_aux=True))

  def autodiff(l, t):
    l32 = l.astype(jnp.float32)
    return (optax.softmax_cross_entropy_with_integer_labels(l32, t),
            jax.nn.logsumexp(l32, axis=-1))

  (_, (nll, log_z)), g = objective(loss._low_precision_cross_entropy)(logits)  # noqa: SLF001
  (_, (nll_ref, log_z_ref)), g_ref = objective(autodiff)(logits)
  np.testing.assert_allclose(nll, nll_ref, rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(log_z, log_z_ref, rtol=1e-6)
  assert g.dtype == jnp.bfloat16
  np.testing.assert_allclose(g.astype(jnp.float32), g_ref.astype(jnp.float32),
                             rtol=2**-8, atol=1e-7)


@pytest.mark.parametrize("field,value,needle", [
    ("train.loss_impl", "blockwise", "one of 'auto', 'dense', 'chunked'"),
    ("train.loss_token_chunk", 24, "a divisor of the 64 tokens per micro-batch"),
    ("train.loss_vocab_chunk", 100, "a divisor of the 384 ids of the padded vocab"),
    ("train.loss_vocab_chunk", -128, "0 (automatic) or a divisor"),
    ("optim.z_loss", -1e-4, "a finite number >= 0"),
    ("model.logits_dtype", "float16", "one of 'float32', 'bfloat16'"),
    ("train.loss_token_chunk", 16, "0 with train.loss_impl = 'dense', which has no chunks"),
])
def test_bad_loss_settings_are_one_line_config_errors(field, value, needle):
  c = tiny_config("tied")
  section, name = field.split(".")
  c[section][name] = value
  with pytest.raises(ConfigError, match=f"config.{field} = ") as e:
    validate(c)
  assert needle in str(e.value) and "\n" not in str(e.value)


def test_auto_loss_is_chunked_only_where_the_dense_logits_crowd_memory():
  c = tiny_config("tied")  # 64 tokens a micro-batch, 384 padded ids
  c.train.loss_impl = "auto"
  dense_bytes = 64 * 384 * (4 + 4)  # float32 logits + a float32 buffer of their size
  assert loss.dense_logits_bytes(c, 1) == dense_bytes
  assert loss.dense_logits_bytes(c, 4) == dense_bytes // 4
  assert loss.choose(c, 1, None)[0] == "dense"  # a CPU: memory unknown
  assert loss.choose(c, 1, 4 * dense_bytes)[0] == "dense"  # exactly a quarter
  impl, why = loss.choose(c, 1, 4 * dense_bytes - 1)
  assert impl == "chunked" and "over 1/4" in why
  assert loss.choose(c, 2, 4 * dense_bytes - 1)[0] == "dense"  # half the tokens each
  c.model.logits_dtype = "bfloat16"  # 2 + 4 bytes a logit
  assert loss.choose(c, 1, 4 * dense_bytes - 1)[0] == "dense"
  c.train.loss_impl = "dense"  # an explicit choice stays
  assert loss.choose(c, 1, 1) == ("dense", "train.loss_impl")
  # the steps resolve it; an unresolved auto never reaches the loss
  c.train.loss_impl = "auto"
  assert loss.resolved_train_cfg(c, sharding.make_mesh(c.mesh)).loss_impl == "dense"
  with pytest.raises(ValueError, match="must be resolved"):
    loss.loss_sums(None, {"weights": jnp.ones((1, 1))}, c.train)


def test_tpu_memory_is_known_for_compile_only_devices():
  class Device:  # what lev_jax.topology reads of a device
    platform, device_kind = "tpu", "TPU v5"
  assert topology.device_memory_bytes(Device()) == 95 * 2**30
  Device.platform = "cpu"
  assert topology.device_memory_bytes(Device()) is None


def test_chunk_size_defaults_and_errors():
  # Automatic vocab chunks: the whole vocab up to 65,536 padded ids, above it ~8,192.
  assert loss.vocab_chunk_size(384, 0) == 384
  assert loss.vocab_chunk_size(65_536, 0) == 65_536
  assert loss.vocab_chunk_size(200_064, 0) == 8_336  # o200k: 24 chunks
  assert loss.vocab_chunk_size(65_664, 0) == 8_208  # 128 x 513 ids: 8 chunks
  assert loss.vocab_chunk_size(200_064, 200_064) == 200_064  # the whole vocab, asked for
  assert loss.vocab_chunk_size(384, 128) == 128
  with pytest.raises(ConfigError, match=r"e\.g\. 4,168, 6,252, 8,336, 12,504"):
    loss.vocab_chunk_size(200_064, 8192)
  # Automatic token chunks: float32 logits per device within LOGITS_CHUNK_BYTES.
  assert loss.token_chunk_size(64, 0, 384) == 64
  assert loss.token_chunk_size(4096, 0, 200_064) == 256  # 195 MiB; 512 would be 391 MiB
  assert loss.token_chunk_size(262_144, 0, 200_064, shards=64) == 16_384  # 256 a device
  assert loss.token_chunk_size(64, 16, 384) == 16
  with pytest.raises(ConfigError, match="loss_token_chunk = 24"):
    loss.token_chunk_size(64, 24, 384)
