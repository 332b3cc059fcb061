"""Decoder and embeddings: causality, tying, padded vocab, LEV modes, remat."""

import functools
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import conftest

# Two layers here: what these tests check depends on the layer stack.
tiny_config = functools.partial(conftest.tiny_config, n_layers=2)
from lev_jax.config import REMAT_POLICIES, ConfigError
from lev_jax.embeddings import PAD_LOGIT, TiedEmbedding, mask_padded_logits
from lev_jax.model import Decoder, remat_policy


def _logits(config, ids, seed=0):
  return nnx.jit(lambda m, i: m(i))(Decoder(config, rngs=nnx.Rngs(seed)), ids)


@pytest.mark.parametrize("embedding", ["tied", "untied", "lev"])
def test_causality_by_gradient(embedding):
  """d output[t] / d input[s] is zero for every s > t (inputs as embeddings)."""
  model = Decoder(tiny_config(embedding), rngs=nnx.Rngs(0))
  ids = jax.random.randint(jax.random.key(0), (1, 12), 0, 300)
  x = nnx.jit(lambda m, i: m.embedding.embed(i))(model, ids)  # LEV op by op: seconds
  pos = jnp.arange(12)[None]

  def outputs_L(x):
    h = x
    for block in model.blocks:
      h = block(h, pos)
    return model.final_norm(h)[0].sum(-1)

  jac_LxLxD = np.asarray(jax.jit(jax.jacrev(outputs_L))(x))[:, 0]
  sensitivity_LxL = np.abs(jac_LxLxD).max(-1)  # [output t, input s]
  assert np.triu(sensitivity_LxL, k=1).max() == 0.0, "a position sees the future"
  assert (np.diag(sensitivity_LxL) > 0).all() and sensitivity_LxL[-1].min() > 0


def test_causality_end_to_end_changing_a_later_token_keeps_earlier_logits():
  c = tiny_config("lev")
  model = Decoder(c, rngs=nnx.Rngs(0))
  ids = jax.random.randint(jax.random.key(1), (2, 10), 0, 300)
  changed = ids.at[:, 7].set((ids[:, 7] + 1) % 300)
  fwd = nnx.jit(lambda m, i: m(i))
  a, b = fwd(model, ids), fwd(model, changed)
  np.testing.assert_array_equal(np.asarray(a[:, :7]), np.asarray(b[:, :7]))
  assert float(jnp.abs(a[:, 7:] - b[:, 7:]).max()) > 0


def test_tied_uses_one_array_for_input_and_output():
  model = Decoder(tiny_config("tied"), rngs=nnx.Rngs(0))
  emb = model.embedding
  assert isinstance(emb, TiedEmbedding)
  emb_params = jax.tree.leaves(nnx.state(emb, nnx.Param))
  assert len(emb_params) == 1 and emb_params[0].shape == (384, 32)
  graphdef, params = nnx.split(model, nnx.Param)
  ids = jnp.array([[1, 2, 3]])

  def logit_of_unused_row(p):  # row 200 only reaches the loss through the output matmul
    return nnx.merge(graphdef, p)(ids)[0, -1, 200]

  def input_only(p):  # rows 1-3 reach it through the input gather
    m = nnx.merge(graphdef, p)
    return m.embedding.embed(ids).sum()

  g_out = jax.jit(jax.grad(logit_of_unused_row))(params)
  g_in = jax.jit(jax.grad(input_only))(params)
  assert float(jnp.abs(g_out["embedding"]["table"][...][200]).max()) > 0
  assert float(jnp.abs(g_in["embedding"]["table"][...][1]).max()) > 0
  # Changing the single table changes both the inputs and the output logits.
  p2 = jax.tree.map(lambda x: x, params)
  p2["embedding"]["table"][...] = params["embedding"]["table"][...].at[200].add(1.0)
  fwd = jax.jit(lambda p: nnx.merge(graphdef, p)(ids)[0, -1, 200])
  assert float(jnp.abs(fwd(p2) - fwd(params))) > 0


@pytest.mark.parametrize("embedding", ["tied", "untied", "lev"])
def test_padded_vocab_is_never_predicted(embedding):
  c = tiny_config(embedding)
  logits = _logits(c, jax.random.randint(jax.random.key(2), (2, 8), 0, 300))
  assert logits.shape == (2, 8, 384) and logits.dtype == jnp.float32
  probs = jax.nn.softmax(logits, axis=-1)
  assert float(probs[..., 300:].max()) == 0.0
  assert int(logits.argmax(-1).max()) < 300


def test_mask_padded_logits_fills_only_the_padded_ids():
  logits = jnp.arange(12, dtype=jnp.float32).reshape(2, 6)
  masked = np.asarray(mask_padded_logits(logits, 4))
  np.testing.assert_array_equal(masked[:, :4], np.asarray(logits)[:, :4])
  assert (masked[:, 4:] == PAD_LOGIT).all() and PAD_LOGIT == -1e9
  assert np.isneginf(np.asarray(mask_padded_logits(logits, 4, -jnp.inf))[:, 4:]).all()


def test_every_remat_name_has_a_policy():
  assert remat_policy("none") is None
  for name in REMAT_POLICIES:
    assert name == "none" or callable(remat_policy(name))
  assert remat_policy("full") is jax.checkpoint_policies.nothing_saveable


def test_lev_table_mode_equals_token_mode():
  ids = jax.random.randint(jax.random.key(3), (2, 16), 0, 300)
  table = tiny_config("lev", mode="table")
  tokens = tiny_config("lev", mode="tokens")
  np.testing.assert_allclose(np.asarray(_logits(table, ids)), np.asarray(_logits(tokens, ids)),
                             rtol=1e-4, atol=1e-5)


def test_remat_on_and_off_give_the_same_loss_and_gradients():
  ids = jax.random.randint(jax.random.key(4), (2, 16), 0, 300)

  # One set of parameters (model.remat does not change them), each policy's program.
  params = nnx.state(Decoder(tiny_config("lev"), rngs=nnx.Rngs(0)), nnx.Param)

  def loss_and_grad(remat):
    c = tiny_config("lev")
    c.model.remat = remat
    graphdef = nnx.split(nnx.eval_shape(lambda: Decoder(c, rngs=nnx.Rngs(0))), nnx.Param)[0]
    f = lambda p: nnx.merge(graphdef, p)(ids).mean()
    return jax.jit(jax.value_and_grad(f))(params)

  l0, g0 = loss_and_grad("none")
  for policy in ("full", "dots_no_batch"):
    l1, g1 = loss_and_grad(policy)
    np.testing.assert_allclose(float(l0), float(l1), rtol=1e-6)
    for a, b in zip(jax.tree.leaves(g0), jax.tree.leaves(g1)):
      np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-7)


def test_bfloat16_compute_keeps_float32_params_and_logits():
  c = tiny_config("lev")
  c.model.dtype = "bfloat16"
  model = Decoder(c, rngs=nnx.Rngs(0))
  assert {x.dtype for x in jax.tree.leaves(nnx.state(model, nnx.Param))} == {jnp.dtype("float32")}
  logits = nnx.jit(lambda m, i: m(i))(model, jnp.zeros((1, 4), jnp.int32))
  assert logits.dtype == jnp.float32 and bool(jnp.isfinite(logits[..., :300]).all())


@pytest.mark.parametrize("embedding", ["tied", "untied", "lev"])
def test_bfloat16_head_accumulates_and_returns_float32_logits(embedding):
  """bf16 inputs, float32 product: the logits equal the float32 matmul of the bf16
  operands, not its bf16 rounding (whose low 16 bits would all be zero)."""
  c = tiny_config(embedding)
  c.model.dtype = "bfloat16"
  emb = Decoder(c, rngs=nnx.Rngs(0)).embedding
  x_BxLxD = jax.random.normal(jax.random.key(1), (2, 3, c.model.d_model), jnp.bfloat16)
  logits = np.asarray(nnx.jit(lambda e, x: e.unembed(x))(emb, x_BxLxD))[..., :c.model.vocab_size]
  w = emb.table[...].T if embedding == "tied" else emb.head[...]
  expected = np.einsum("bld,dv->blv", np.asarray(x_BxLxD, np.float64),
                       np.asarray(w.astype(jnp.bfloat16), np.float64))[..., :c.model.vocab_size]
  np.testing.assert_allclose(logits, expected, rtol=1e-5, atol=1e-6)
  assert (logits.view(np.uint32) & 0xFFFF).any()


def test_unknown_embedding_is_a_config_error():
  c = tiny_config("tied")
  c.model.embedding = "hashed"
  with pytest.raises(ConfigError, match="model.embedding"):
    Decoder(c, rngs=nnx.Rngs(0))


def test_scan_over_layers_equals_the_python_loop_with_the_same_weights():
  c = tiny_config("lev")
  looped = Decoder(c, rngs=nnx.Rngs(0))
  c.model.scan_layers = True
  scanned = Decoder(c, rngs=nnx.Rngs(0))
  stacked = nnx.state(scanned.blocks, nnx.Param)
  assert jax.tree.leaves(stacked)[0].shape[0] == c.model.n_layers
  for i, block in enumerate(looped.blocks):  # give the scanned model the loop's weights
    stacked = jax.tree.map(lambda s, x: s.at[i].set(x), stacked, nnx.state(block, nnx.Param))
  nnx.update(scanned.blocks, stacked)
  nnx.update(scanned.embedding, nnx.state(looped.embedding, nnx.Param))
  nnx.update(scanned.final_norm, nnx.state(looped.final_norm, nnx.Param))
  ids = jax.random.randint(jax.random.key(5), (2, 8), 0, 300)
  fwd = nnx.jit(lambda m, i: m(i))
  np.testing.assert_allclose(np.asarray(fwd(scanned, ids)), np.asarray(fwd(looped, ids)),
                             rtol=1e-5, atol=1e-6)
  c.model.remat = "full"
  np.testing.assert_allclose(
      np.asarray(fwd(Decoder(c, rngs=nnx.Rngs(0)), ids)).shape, (2, 8, 384))


@pytest.mark.parametrize("scan_layers", [False, True])
def test_packed_documents_with_segment_ids_equal_each_document_alone(scan_layers):
  """Segment ids + restarting positions make a packed row compute each document as if
  it were alone (data.segment_masking)."""
  c = tiny_config("tied")
  c.model.scan_layers = scan_layers
  model = Decoder(c, rngs=nnx.Rngs(0))
  doc_a, doc_b = jnp.array([[5, 6, 7]]), jnp.array([[8, 9, 10, 11]])
  row = jnp.concatenate([doc_a, doc_b], axis=1)
  positions = jnp.array([[0, 1, 2, 0, 1, 2, 3]])
  segments = jnp.array([[1, 1, 1, 2, 2, 2, 2]])
  fwd = nnx.jit(lambda m, i, p, s: m(i, p, s))
  packed = np.asarray(fwd(model, row, positions, segments))
  alone_a, alone_b = np.asarray(_logits(c, doc_a)), np.asarray(_logits(c, doc_b))
  np.testing.assert_allclose(packed[:, :3], alone_a, rtol=2e-5, atol=2e-5)
  np.testing.assert_allclose(packed[:, 3:], alone_b, rtol=2e-5, atol=2e-5)
  plain = np.asarray(fwd(model, row, None, None))  # without masking B sees A
  assert np.abs(plain[:, 3:] - alone_b).max() > 1e-3
