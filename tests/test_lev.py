"""LEV: digits, basis, log-space product, parameter count, gradients, jit."""


import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from conftest import tiny_config
from lev_jax.config import ConfigError, lev_base, validate
from lev_jax.lev import (LEV, bspline_basis, id_permutation, lev_embed, lev_param_count,
                         output_norm, signed_log_product, to_digits)


@pytest.mark.parametrize("vocab,k", [(300, 3), (384, 2), (1000, 3), (50_000, 3), (200_064, 3),
                                     (4096, 4), (27, 3)])
def test_digits_round_trip_every_id(vocab, k):
  b = lev_base(vocab, k)
  assert b ** k >= vocab and (b - 1) ** k < vocab
  ids = jnp.arange(vocab)
  digits = np.asarray(to_digits(ids, b, k))
  assert digits.min() >= 0 and digits.max() < b
  powers = b ** np.arange(k - 1, -1, -1)
  np.testing.assert_array_equal(digits @ powers, np.arange(vocab))
  assert len({tuple(d) for d in digits}) == vocab


@pytest.mark.parametrize("normalize", [True, False])
def test_bspline_basis_nonnegative_and_partition_of_unity(normalize):
  t = jax.random.uniform(jax.random.key(0), (64, 5))
  t = t.at[0, :].set(jnp.array([0.0, 1.0, 0.5, 1e-7, 1 - 1e-7]))
  basis = jax.jit(bspline_basis, static_argnums=(1, 2, 3))(t, 16, 15.0, normalize)
  assert basis.shape == (64, 5, 16)
  assert float(basis.min()) >= 0.0
  # At most 3 knots are active for a quadratic B-spline.
  assert int((basis > 0).sum(-1).max()) <= 3
  sums = np.asarray(basis.sum(-1))
  if normalize:
    np.testing.assert_allclose(sums, 1.0, rtol=1e-6)
  else:
    assert sums.min() > 0.5 and sums.max() <= 1.0 + 1e-6


def test_log_space_product_equals_direct_product_with_negative_factors():
  x = jax.random.normal(jax.random.key(1), (32, 16, 7)) * 0.5 + 0.3
  assert bool((x < 0).any()) and bool((x > 0).any())
  y = jnp.array([[-2.0, 3.0, 0.5], [-1.0, -1.0, 4.0]])
  # One program, not op by op (each op its own small compile).
  direct, logspace, y_product = jax.jit(lambda x, y: (
      jnp.prod(x, axis=1), signed_log_product(x, axis=1, eps=0.0),
      signed_log_product(y, 1, 0.0)))(x, y)
  np.testing.assert_allclose(np.asarray(logspace), np.asarray(direct), rtol=2e-5, atol=1e-30)
  # An odd number of negatives gives a negative product.
  np.testing.assert_allclose(np.asarray(y_product), [-3.0, 4.0], rtol=1e-6)


@pytest.mark.parametrize("basis,sigmoid", [("normalized", "half"), ("khronos", "full")])
@pytest.mark.parametrize("vocab,d_model", [(384, 32), (2048, 64)])
def test_param_count_formula_equals_real_count(basis, sigmoid, vocab, d_model):
  cfg = tiny_config(basis=basis, sigmoid=sigmoid).lev
  lev = LEV(vocab, d_model, cfg, rngs=nnx.Rngs(0))
  real = sum(x.size for x in jax.tree.leaves(nnx.state(lev, nnx.Param)))
  assert real == lev_param_count(vocab, d_model, cfg)


def test_paper_scale_count():
  cfg = tiny_config(d_seed=128, n_heads=8, n_knots=16, rank=64).lev
  # b = 59 for V = 200,064, k = 3: 3*59*128 + 8*(128^2 + 256 + 128*16*64 + 64*2048)
  assert lev_param_count(200_064, 2048, cfg) == 3 * 59 * 128 + 8 * (16384 + 256 + 131072 + 131072)


@pytest.mark.parametrize("basis", ["normalized", "khronos"])
def test_distinct_ids_give_distinct_embeddings(basis):
  lev = LEV(384, 32, tiny_config(basis=basis).lev, rngs=nnx.Rngs(0))
  table = np.asarray(nnx.jit(lambda m: m.table())(lev))  # one program, not op by op
  assert table.shape == (384, 32) and np.isfinite(table).all()
  dist = np.sqrt(((table[:, None] - table[None]) ** 2).sum(-1))
  dist[np.diag_indices(384)] = np.inf
  assert dist.min() > 1e-5, f"ids {np.unravel_index(dist.argmin(), dist.shape)} collide"


@pytest.mark.parametrize("basis", ["normalized", "khronos"])
def test_every_lev_parameter_gets_a_nonzero_gradient(basis):
  lev = LEV(384, 32, tiny_config(basis=basis).lev, rngs=nnx.Rngs(0))
  graphdef, params = nnx.split(lev, nnx.Param)
  ids = jnp.arange(0, 384, 5)
  target = jax.random.normal(jax.random.key(3), (ids.size, 32))

  def loss(p):
    return jnp.sum((nnx.merge(graphdef, p)(ids) - target) ** 2)

  grads = jax.jit(jax.grad(loss))(params)  # one program (op by op: seconds of dispatch)
  for path, g in jax.tree_util.tree_flatten_with_path(grads)[0]:
    assert float(jnp.abs(g).max()) > 0, f"no gradient reaches {jax.tree_util.keystr(path)}"


def test_jit_and_eager_agree_and_chunking_is_exact():
  cfg = tiny_config().lev
  lev = LEV(384, 32, cfg, rngs=nnx.Rngs(0))
  ids = jax.random.randint(jax.random.key(2), (3, 50), 0, 384)
  eager = lev(ids)
  jitted = nnx.jit(lambda m, i: m(i))(lev, ids)
  np.testing.assert_allclose(np.asarray(eager), np.asarray(jitted), rtol=1e-5, atol=1e-7)
  chunked = lev_embed(lev.param_dict(), ids, tiny_config(chunk_size=16).lev, lev.base)
  np.testing.assert_allclose(np.asarray(chunked), np.asarray(eager), rtol=1e-5, atol=1e-7)
  assert eager.shape == (3, 50, 32) and eager.dtype == jnp.float32


def test_sigmoid_variants_differ():
  table = nnx.jit(lambda m: m.table())  # one program each, not op by op
  a = table(LEV(384, 32, tiny_config(sigmoid="half").lev, rngs=nnx.Rngs(0)))
  b = table(LEV(384, 32, tiny_config(sigmoid="full").lev, rngs=nnx.Rngs(0)))
  assert float(jnp.abs(a - b).max()) > 1e-6


def test_base_too_small_is_a_config_error_naming_both_numbers():
  c = tiny_config(base=7)  # 7**3 = 343 < 384 (padded vocab)
  with pytest.raises(ConfigError, match=r"343.*384"):
    validate(c)
  with pytest.raises(ConfigError, match=r"343.*384"):
    LEV(384, 32, c.lev, rngs=nnx.Rngs(0))
  c.lev.base = 8  # 512 >= 384
  validate(c)


def test_id_permutation_is_a_pinned_deterministic_bijection():
  perm = id_permutation(384, 0)
  np.testing.assert_array_equal(np.sort(perm), np.arange(384))
  assert perm.dtype == np.int32 and not perm.flags.writeable
  # Pinned: a numpy that drew another permutation would re-map a trained model's ids.
  np.testing.assert_array_equal(perm[:8], [375, 93, 212, 36, 214, 90, 372, 334])
  np.testing.assert_array_equal(id_permutation.__wrapped__(384, 0), perm)
  assert (id_permutation(384, 1) != perm).any()


def test_id_permutation_embeds_perm_of_each_id_in_every_mode_and_core():
  """LEV with lev.id_permutation embeds id i as the plain LEV embeds perm[i], with the
  same parameters (the permutation is none of them). It is applied in LEV.__call__,
  before lev_embed and its core: table mode (LEV.table) and a per-id call (tokens;
  unique calls it on its distinct ids) are the two ways in."""
  from lev_jax.embeddings import make_embedding  # noqa: PLC0415

  def graphdef(**lev):
    c = tiny_config(**lev)
    build = lambda: make_embedding(c.model, c.lev, rngs=nnx.Rngs(0), dtype=jnp.float32,
                                   param_dtype=jnp.float32)
    return nnx.split(nnx.eval_shape(build), nnx.Param)[0]

  plain = graphdef(mode="tokens")
  permuted = {(mode, impl): graphdef(mode=mode, impl=impl, unique_size=16,
                                     id_permutation=True, permutation_seed=5)
              for mode, impl in (("table", "fused"), ("tokens", "vectorized"))}
  c = tiny_config()
  _, params = nnx.split(make_embedding(c.model, c.lev, rngs=nnx.Rngs(0), dtype=jnp.float32,
                                       param_dtype=jnp.float32), nnx.Param)
  perm = id_permutation(384, 5)
  ids = jnp.asarray([[0, 1, 2, 3, 4, 150, 298, 299]], jnp.int32)

  @jax.jit
  def embed(p):
    expected = nnx.merge(plain, p).embed(jnp.asarray(perm)[ids])
    return expected, {k: nnx.merge(g, p).embed(ids) for k, g in permuted.items()}

  expected, got = embed(params)
  for key, x in got.items():
    np.testing.assert_allclose(np.asarray(x), np.asarray(expected), rtol=1e-5, atol=1e-6,
                               err_msg=str(key))
  # Neighbouring ids 0..4 shared their leading digits; permuted, they do not all.
  assert len({int(i) // 64 for i in perm[:5]}) > 1  # b = 8, k = 3: leading digit i // 64


def test_output_norm_rmsnorm_and_scale_values_gradients_and_count():
  """lev.output_norm: rmsnorm = unit-RMS rows times g [D] (init 1), scale = s [] times
  the rows (init 1); each adds one LEV parameter with a gradient of its shape; "none"
  is the plain LEV (same draws: the new parameters take no random numbers)."""
  levs = {n: LEV(384, 32, tiny_config(output_norm=n).lev, rngs=nnx.Rngs(0))
          for n in ("none", "rmsnorm", "scale")}
  assert set(levs["rmsnorm"].param_dict()) - set(levs["none"].param_dict()) == {
      "out_norm_scale"}
  assert set(levs["scale"].param_dict()) - set(levs["none"].param_dict()) == {"out_scale"}
  for n, lev in levs.items():
    real = sum(x.size for x in jax.tree.leaves(nnx.state(lev, nnx.Param)))
    assert real == lev_param_count(384, 32, lev.cfg), n
  ids = jnp.arange(0, 384, 7)
  params = {n: lev.param_dict() for n, lev in levs.items()}
  params["rmsnorm"]["out_norm_scale"] = jnp.linspace(0.5, 2.0, 32)
  params["scale"]["out_scale"] = jnp.asarray(2.5)

  embed = lambda n, p: lev_embed(p, ids, levs[n].cfg, levs[n].base)
  # The plain rows from the same parameters: lev_embed with output_norm "none" reads
  # none of the norm's parameters.
  out = jax.jit(lambda p: (embed("none", p), embed("rmsnorm", p)))(params["rmsnorm"])
  plain, normed = np.asarray(out[0]), np.asarray(out[1])
  rms = np.sqrt((plain ** 2).mean(-1, keepdims=True) + 1e-5)
  np.testing.assert_allclose(normed, plain / rms * np.linspace(0.5, 2.0, 32), rtol=1e-5)
  np.testing.assert_array_equal(output_norm(params["scale"], plain, levs["scale"].cfg),
                                2.5 * plain)
  for n, name, shape in (("rmsnorm", "out_norm_scale", (32,)), ("scale", "out_scale", ())):
    grads = jax.eval_shape(jax.grad(lambda p, n=n: embed(n, p).sum()), params[n])
    assert grads[name].shape == shape
