"""LEV's fused and vectorized cores (lev.impl = "fused" | "vectorized") against the
reference path, and unique-id mode."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from conftest import tiny_config
from lev_jax.lev import (LEV, bspline_basis, bspline_window, evaluation_plan, lev_embed,
                         lev_modes_fused, signed_log_product)

# One pytest-xdist worker runs this file (--dist loadgroup): the values several tests
# compare with (cached below, each a compiled program) are then computed once.
pytestmark = pytest.mark.xdist_group("lev_fused")


def _lev_with_params(cfg, seed=0, delta_std=None, scale=None):
  lev = LEV(384, 32, cfg, rngs=nnx.Rngs(seed))
  params = lev.param_dict()
  key = jax.random.key(seed + 10)
  # Perturb every parameter away from its init so each one matters.
  for i, name in enumerate(sorted(params)):
    noise = jax.random.normal(jax.random.fold_in(key, i), params[name].shape)
    params[name] = params[name] + 0.05 * noise
  if delta_std is not None:
    params["spline_delta"] = delta_std * jax.random.normal(
        jax.random.fold_in(key, 99), params["spline_delta"].shape)
  if scale is not None:
    params["basis_scale"] = jnp.full_like(params["basis_scale"], scale)
  return lev, params


def _value_and_grads(params, ids, cfg, base):
  """(embeddings, gradients of a random projection of them), in one program."""
  target = jax.random.normal(jax.random.key(5), (*ids.shape, 32))

  def out_and_grads(p):
    out, vjp = jax.vjp(lambda q: lev_embed(q, ids, cfg, base), p)
    return out, vjp(target)[0]

  return jax.jit(out_and_grads)(params)


def _assert_close_tree(a, b, rtol):
  for (path, x), y in zip(jax.tree_util.tree_flatten_with_path(a)[0], jax.tree.leaves(b)):
    x, y = np.asarray(x), np.asarray(y)
    scale = max(float(np.abs(y).max()), 1e-30)
    err = float(np.abs(x - y).max()) / scale
    assert err <= rtol, f"{jax.tree_util.keystr(path)}: max |diff| / max |ref| = {err:.2e}"


@functools.lru_cache(maxsize=None)
def _case(basis, sigmoid, chunk, delta_std, scale):
  """(LEV, its perturbed parameters, ids [3, 40]) of a core test's case; the parameters
  do not depend on lev.impl or lev.log_group."""
  cfg = tiny_config(basis=basis, sigmoid=sigmoid, chunk_size=chunk).lev
  lev, params = _lev_with_params(cfg, delta_std=delta_std, scale=scale)
  return lev, params, jax.random.randint(jax.random.key(2), (3, 40), 0, 384)


@functools.lru_cache(maxsize=None)
def _case_values(case, **lev_settings):
  """(embeddings, gradients) of `_case(*case)` on the CPU with the config's lev settings
  `lev_settings`: the reference's are shared by both cores' tests, the fused core's by
  the off-the-CPU test."""
  basis, sigmoid, chunk = case[:3]
  lev, params, ids = _case(*case)
  cfg = tiny_config(basis=basis, sigmoid=sigmoid, chunk_size=chunk, **lev_settings).lev
  return _value_and_grads(params, ids, cfg, lev.base)


@pytest.mark.parametrize("basis,sigmoid,chunk,delta_std,scale", [
    ("normalized", "half", 4096, None, None),
    ("normalized", "full", 16, 3.0, None),      # large delta: negative and tiny factors
    ("khronos", "full", 4096, None, 2.5),       # scale < n_knots - 1: > 3 knots active
    ("khronos", "half", 16, 3.0, None),
])
@pytest.mark.parametrize("impl", ["fused", "vectorized"])
def test_core_equals_reference_in_values_and_gradients(impl, basis, sigmoid, chunk,
                                                       delta_std, scale):
  case = (basis, sigmoid, chunk, delta_std, scale)
  ref_out, ref_grads = _case_values(case, impl="reference")
  out, grads = _case_values(case, impl=impl, log_group=4)
  _assert_close_tree(out, ref_out, 1e-5)
  _assert_close_tree(grads, ref_grads, 1e-5)


@pytest.mark.parametrize("basis,sigmoid,chunk,delta_std,scale", [
    ("normalized", "half", 4096, None, None),
    ("normalized", "full", 16, 3.0, None),
    ("khronos", "full", 16, None, 2.5),
])
def test_off_the_cpu_windows_recomputed_from_t_equal_the_cpu_path(basis, sigmoid, chunk,
                                                                  delta_std, scale):
  """Traced for a TPU or GPU (lev-compile), the fused core takes the spline input t
  and recomputes each coordinate's window inside its loop and backward pass
  (lev_modes_from_spline); on the CPU it gets materialised windows. Same values and
  gradients, to float32 rounding."""
  from lev_jax import target  # noqa: PLC0415
  case = (basis, sigmoid, chunk, delta_std, scale)
  cfg = tiny_config(basis=basis, sigmoid=sigmoid, chunk_size=chunk, log_group=4,
                    impl="fused").lev
  lev, params, ids = _case(*case)
  out, grads = _case_values(case, impl="fused", log_group=4)
  trace = lambda: str(jax.make_jaxpr(lambda p: lev_embed(p, ids, cfg, lev.base))(params))
  cpu_jaxpr = trace()
  with target.compiling_for("gpu"):  # plain dot_general and the spline source
    gpu_jaxpr = trace()
    spline_out, spline_grads = _value_and_grads(params, ids, cfg, lev.base)
  # The CPU trace has dense()'s two CPU custom VJPs (seed and output projections) and
  # the window core; the GPU trace only the spline core.
  assert (cpu_jaxpr.count("custom_vjp_call"), gpu_jaxpr.count("custom_vjp_call")) == (3, 1)
  _assert_close_tree(spline_out, out, 1e-6)
  _assert_close_tree(spline_grads, grads, 1e-5)


def test_the_spline_source_keeps_no_window_for_the_backward_pass():
  """The memory fix: the fused core's residuals off the CPU are t, delta and the modes;
  no [N, H, S, W] window array (its W = 3 minor axis is padded 42-fold by XLA:TPU)."""
  from lev_jax.lev import lev_modes_from_spline  # noqa: PLC0415
  n, h, s, j, r = 64, 2, 8, 6, 4
  t = jax.random.uniform(jax.random.key(0), (n, h, s))
  delta = 0.1 * jax.random.normal(jax.random.key(1), (h, s, j, r))
  spline = lambda t, d: lev_modes_from_spline(t, None, d, "normalized", 1e-6, 4)
  residuals = jax.eval_shape(lambda t, d: jax.vjp(spline, t, d)[1], t, delta)  # abstract
  shapes = {tuple(x.shape) for x in jax.tree.leaves(residuals)}
  assert (n, h, s, 3) not in shapes and (s, n, h, 3) not in shapes, shapes
  windowed = lambda t, d: lev_modes_fused(*bspline_window(t, j, float(j - 1), True), d,
                                          1e-6, 4)
  # One program, not op by op (each op its own small compile).
  np.testing.assert_allclose(*jax.jit(lambda t, d: (spline(t, d), windowed(t, d)))(t, delta),
                             rtol=1e-6)


def test_the_vectorized_core_keeps_only_t_and_the_modes_for_the_backward_pass():
  """Its residuals are t [N, H, S], delta, the modes [N, H, R]: phi [N, H, S, R] is
  recomputed in the backward pass, never kept (nor the [N, H, S, J] basis)."""
  from lev_jax.lev import lev_modes_vectorized  # noqa: PLC0415
  n, h, s, j, r = 64, 2, 8, 6, 4
  t = jax.random.uniform(jax.random.key(0), (n, h, s))
  delta = 0.1 * jax.random.normal(jax.random.key(1), (h, s, j, r))
  vectorized = lambda t, d: lev_modes_vectorized(t, None, d, "normalized", 1e-6)
  residuals = jax.eval_shape(lambda t, d: jax.vjp(vectorized, t, d)[1], t, delta)
  shapes = sorted({tuple(x.shape) for x in jax.tree.leaves(residuals)})
  assert shapes == sorted({(n, h, s), (h, s, j, r), (n, h, r)}), shapes
  windowed = lambda t, d: lev_modes_fused(*bspline_window(t, j, float(j - 1), True), d,
                                          1e-6, 4)
  np.testing.assert_allclose(
      *jax.jit(lambda t, d: (vectorized(t, d), windowed(t, d)))(t, delta), rtol=1e-5)


VECTORIZED_DIMS = 48, 2, 8, 16, 4  # n, h, s, j, r


def _values_and_grads_at(core, t, sc, delta, g_modes):
  out, vjp = jax.vjp(core, t, sc, delta)
  return out, vjp(g_modes)


@functools.lru_cache(maxsize=None)
def _dense_formula_case(basis, delta_std, scale):
  """((t, scale, delta, g_modes), (values, gradients) of jax's autodiff of the plain
  dense formula there): the vectorized-backward test's inputs and reference, one
  program for both platforms' cases."""
  n, h, s, j, r = VECTORIZED_DIMS
  t = jax.random.uniform(jax.random.key(0), (n, h, s))
  t = t.at[0, 0].set(jnp.asarray([0.0, 1.0, 0.5, 1e-7, 1 - 1e-7, 1 / 30, 2 / 30, 29 / 30]))
  delta = delta_std * jax.random.normal(jax.random.key(1), (h, s, j, r))
  g_modes = jax.random.normal(jax.random.key(2), (n, h, r))
  sc = None if scale is None else jnp.asarray(scale)

  def dense(t, sc, d):
    knot_scale = float(j - 1) if sc is None else sc[:, None, None]
    b = bspline_basis(t, j, knot_scale, basis == "normalized")
    phi = jnp.einsum("nhsj,hsjr->nhsr", b, d, precision=jax.lax.Precision.HIGHEST)
    return signed_log_product(phi + b.sum(-1)[..., None], axis=2, eps=1e-6)

  inputs = (t, sc, delta, g_modes)
  return inputs, jax.jit(lambda: _values_and_grads_at(dense, *inputs))()


@pytest.mark.parametrize("platform", ["cpu", "gpu"])
@pytest.mark.parametrize("basis,delta_std,scale", [
    ("normalized", 0.1, None),
    ("normalized", 3.0, None),                  # negative and tiny factors
    ("khronos", 0.1, [2.5, 15.0]),              # > 3 knots active, and the paper's 15
    ("khronos", 3.0, [5.0, 7.5]),
])
def test_the_vectorized_backward_equals_autodiff_of_the_dense_formula(platform, basis,
                                                                      delta_std, scale):
  """The vectorized core's custom backward (t's gradient as one reduction of g_phi times
  phi's derivative in t, delta's as one dot whose basis operand is rebuilt from t, no
  [N, H, S, J] basis gradient) against jax's autodiff of the plain dense formula, values
  and gradients to t, the KHRONOS scale and delta, to float32 rounding; traced for the
  CPU and off it (one reduction in the product)."""
  from lev_jax import target  # noqa: PLC0415
  from lev_jax.lev import lev_modes_vectorized  # noqa: PLC0415
  n, h, s, j, _ = VECTORIZED_DIMS
  inputs, (ref_out, ref_grads) = _dense_formula_case(basis, delta_std,
                                                     scale and tuple(scale))
  with target.compiling_for(platform):
    # One trace: its jaxpr is read below, and it is what runs.
    traced = jax.jit(lambda: _values_and_grads_at(
        lambda t, sc, d: lev_modes_vectorized(t, sc, d, basis, 1e-6), *inputs)).trace()
    out, grads = traced.lower().compile()()
  # Both sides ~1e-6 from a float64 evaluation at XLA's default level; under these
  # tests' XLA flags (conftest: optimisation level 0) delta's gradient in the large-delta
  # KHRONOS case is 8.5e-6 off (the previous backward: 1.9e-6), as the tiny factors
  # amplify the rounding of phi.
  _assert_close_tree(out, ref_out, 2e-6)
  _assert_close_tree(grads, ref_grads, 1e-5)
  # No [N, H, S, J] array (a minor knot axis) in the forward or the backward; one dot
  # (delta's gradient) over the rows.
  text = str(traced.jaxpr)
  assert f"f32[{n},{h},{s},{j}]" not in text
  assert text.count("dot_general") == 1


def test_window_is_the_basis_restricted_to_its_three_knots():
  t = jax.random.uniform(jax.random.key(0), (64, 5))
  t = t.at[0].set(jnp.array([0.0, 1.0, 0.5, 1e-7, 1 - 1e-7]))
  t = t.at[1].set(jnp.array([1 / 30, 1 / 10, 0.3, 2 / 30, 29 / 30]))  # half-way points
  # One program, not op by op (each op its own small compile).
  dense, (weights, knots) = jax.jit(lambda t: (bspline_basis(t, 16, 15.0, True),
                                               bspline_window(t, 16, 15.0, True)))(t)
  dense = np.asarray(dense)
  scattered = np.zeros_like(dense)
  np.add.at(scattered, (*np.indices(knots.shape[:-1])[:, ..., None], np.asarray(knots)),
            np.asarray(weights))
  np.testing.assert_allclose(scattered, dense, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("log_group", [1, 4, 8])
def test_group_products_never_overflow_and_the_sign_parity_is_exact(log_group):
  # phi of one coordinate group ~1e6 (8 of them overflow a float32 product), another
  # ~1e-7 (underflow), exact zeros and negatives.
  n, h, s, j, r = 5, 2, 16, 6, 3
  key = jax.random.key(0)
  delta = jax.random.normal(key, (h, s, j, r))
  delta = delta.at[:, :8].multiply(1e6).at[:, 8:12].set(-1.0 + 1e-7)
  delta = delta.at[:, 12].set(-1.0)  # phi = 0 exactly (w sums to 1)
  w = jax.random.uniform(jax.random.fold_in(key, 1), (n, h, s, 3)) + 0.1
  w = w / w.sum(-1, keepdims=True)
  # One-hot windows where phi is tiny or zero, so float32 phi has no cancellation error.
  w = w.at[:, :, 8:13].set(jnp.array([0.0, 1.0, 0.0]))
  k = jax.random.randint(jax.random.fold_in(key, 2), (n, h, s, 3), 0, j)
  eps = 1e-6
  phi = np.einsum("nhsw,nhswr->nhsr", np.asarray(w, np.float64),
                  1 + np.asarray(delta, np.float64)[np.arange(h)[None, :, None, None],
                                                    np.arange(s)[None, None, :, None],
                                                    np.asarray(k)])
  exact = np.prod(np.where(phi < 0, phi - eps, phi + eps), axis=2)
  dense_phi = jnp.asarray(phi, jnp.float32)
  # One program, not op by op (each op its own small compile).
  modes, reference = map(np.asarray, jax.jit(lambda w, k, d, phi: (
      lev_modes_fused(w, k, d, eps, log_group), signed_log_product(phi, 2, eps)))(
          w, k, delta, dense_phi))
  assert np.isfinite(modes).all()
  np.testing.assert_array_equal(np.sign(modes), np.sign(exact))
  np.testing.assert_allclose(modes, exact, rtol=2e-5)
  # The reference's float32 log-space product agrees to its own rounding (one log per
  # factor sums more rounding error than one per group).
  np.testing.assert_allclose(modes, reference, rtol=1e-4)


def test_bad_log_group_and_eps_are_errors():
  w = jnp.ones((2, 1, 6, 3)) / 3
  k = jnp.zeros((2, 1, 6, 3), jnp.int32)
  d = jnp.zeros((1, 6, 4, 2))
  with pytest.raises(ValueError, match="log_group = 4: expected a divisor of d_seed = 6"):
    lev_modes_fused(w, k, d, 1e-6, 4)
  with pytest.raises(ValueError, match="log_eps = 1e-40"):
    lev_modes_fused(w, k, d, 1e-40, 3)


@pytest.mark.parametrize("mode,vocab,n,size,expected", [
    ("table", 384, 1000, 0, ("table", 384)), ("tokens", 384, 100, 0, ("tokens", 100)),
    ("auto", 384, 1000, 0, ("table", 384)), ("auto", 384, 100, 0, ("tokens", 100)),
    ("unique", 384, 100, 0, ("unique", 50)), ("unique", 384, 1000, 64, ("unique", 64)),
    ("auto", 384, 1000, 64, ("unique", 64)), ("auto", 384, 100, 200, ("tokens", 100)),
])
def test_evaluation_plan(mode, vocab, n, size, expected):
  assert evaluation_plan(mode, vocab, n, size) == expected


def _embed_and_grads(mode, unique_size, ids, **lev):
  """LEV embeddings of ids and the gradient of a fixed projection of them, by mode."""
  from lev_jax.embeddings import make_embedding  # noqa: PLC0415
  c = tiny_config(mode=mode, unique_size=unique_size, **lev)
  emb = make_embedding(c.model, c.lev, rngs=nnx.Rngs(0), dtype=jnp.float32,
                       param_dtype=jnp.float32)
  graphdef, params = nnx.split(emb, nnx.Param)
  target = jax.random.normal(jax.random.key(5), (*ids.shape, c.model.d_model))

  def loss(p):
    x = nnx.merge(graphdef, p).embed(ids)
    return jnp.sum(x * target), x

  (_, x), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(params)
  return np.asarray(x), grads


def test_unique_mode_equals_table_mode_also_when_the_bound_overflows():
  ids = jax.random.randint(jax.random.key(3), (4, 16), 0, 12)  # <= 12 distinct ids
  ids = ids.at[0, 0].set(299)
  x_table, g_table = _embed_and_grads("table", 0, ids)
  for bound in (24, 8):  # 8 < the distinct ids: the exact fallback runs
    x_unique, g_unique = _embed_and_grads("unique", bound, ids)
    # Same math on 24 or 384 rows: XLA may round the out_proj matmul differently.
    _assert_close_tree(x_unique, x_table, 1e-6)
    _assert_close_tree(g_unique, g_table, 1e-6)


def test_lev_remat_gives_the_same_values_and_gradients_and_saves_no_lev_residual():
  """lev.remat: the embedding under jax.checkpoint (the same values and gradients to
  1e-6: the same ops, which XLA may fuse differently), and the forward pass hands the
  backward pass no [rows, h, d_seed] residual."""
  ids = jax.random.randint(jax.random.key(3), (4, 16), 0, 300)
  x_plain, g_plain = _embed_and_grads("tokens", 0, ids)
  x_remat, g_remat = _embed_and_grads("tokens", 0, ids, remat=True)
  _assert_close_tree(x_remat, x_plain, 1e-6)
  _assert_close_tree(g_remat, g_plain, 1e-6)
  from lev_jax.embeddings import make_embedding  # noqa: PLC0415
  for remat in (False, True):
    c = tiny_config(mode="tokens", impl="vectorized", remat=remat)
    emb = make_embedding(c.model, c.lev, rngs=nnx.Rngs(0), dtype=jnp.float32,
                         param_dtype=jnp.float32)
    graphdef, params = nnx.split(emb, nnx.Param)
    embed = lambda p: nnx.merge(graphdef, p).embed(ids)
    residuals = jax.eval_shape(lambda p: jax.vjp(embed, p)[1], params)  # abstract
    shapes = {tuple(r.shape) for r in jax.tree.leaves(residuals)}
    per_row = (64, c.lev.n_heads, c.lev.d_seed)  # t of the vectorized core, 64 tokens
    assert (per_row in shapes) != remat, shapes


def test_unique_mode_loss_is_bitwise_the_table_mode_loss():
  from lev_jax.train import _sum_loss, abstract_model, create_model  # noqa: PLC0415
  ids = jax.random.randint(jax.random.key(3), (4, 16), 0, 12).at[0, 0].set(299)
  batch = {"inputs": ids, "targets": jnp.roll(ids, -1, axis=1),
           "weights": jnp.ones(ids.shape, jnp.float32)}
  # One initialisation: lev.mode does not change the parameters, only the program.
  params = nnx.state(create_model(tiny_config(mode="table", unique_size=24)), nnx.Param)
  losses = []
  for mode in ("table", "unique"):
    graphdef = nnx.split(abstract_model(tiny_config(mode=mode, unique_size=24)), nnx.Param)[0]
    losses.append(float(jax.jit(_sum_loss, static_argnums=1)(params, graphdef, batch)[0]))
  assert losses[0] == losses[1]


def test_train_steps_with_the_fused_core_follow_the_reference():
  # LEV runs before the layer stack, so model.scan_layers does not change its program;
  # the scanned layout (the ladder's) is the one checked.
  from lev_jax.train import create_train_state, make_train_step, partition  # noqa: PLC0415
  rng = np.random.default_rng(0)
  batch = {"inputs": rng.integers(0, 300, (4, 16)).astype(np.int32),
           "targets": rng.integers(0, 300, (4, 16)).astype(np.int32),
           "weights": np.ones((4, 16), np.float32)}
  runs = {}
  initial = None  # one initialisation: lev.impl does not change the state
  for impl in ("reference", "fused"):
    c = tiny_config(impl=impl, mode="tokens")
    c.model.scan_layers = True
    if initial is None:
      part, initial = create_train_state(c)
    else:
      part = partition(c)
    state = jax.tree.map(jnp.copy, initial)  # each run's own: a step donates its state
    step = make_train_step(part, c)
    trace = []
    for _ in range(3):
      state, metrics = step(state, batch)
      trace.append((float(metrics["loss"]), float(metrics["grad_norm"])))
    runs[impl] = trace
  # Losses and gradient norms, not parameters: Adam's m / sqrt(v) turns float32 noise
  # in near-zero gradients into full-size updates of either sign.
  np.testing.assert_allclose(runs["fused"], runs["reference"], rtol=2e-5)


def test_impl_pallas_routes_the_window_basis_to_the_pallas_core(monkeypatch):
  # The kernels themselves are checked against the reference in test_lev_pallas.py (in
  # the Pallas interpreter, slow on CPU); here: lev_embed hands them the same inputs as
  # the fused core gets.
  from lev_jax import lev_pallas  # noqa: PLC0415
  calls = []

  def spy(weights, knots, delta, *, log_eps, log_group):
    calls.append((weights.shape, knots.shape, delta.shape, log_eps, log_group))
    return lev_modes_fused(weights, knots, delta, log_eps, log_group)

  monkeypatch.setattr(lev_pallas, "lev_modes_pallas", spy)
  cfg = tiny_config(impl="pallas", log_group=4).lev
  lev, params = _lev_with_params(cfg)
  ids = jnp.arange(10)
  fused = tiny_config(impl="fused", log_group=4).lev
  # One jitted program for both (op by op, each core dispatched seconds of small ops).
  out, ref = jax.jit(lambda p: (lev_embed(p, ids, cfg, lev.base),
                                lev_embed(p, ids, fused, lev.base)))(params)
  np.testing.assert_array_equal(np.asarray(out), np.asarray(ref))
  assert calls == [((10, 2, 8, 3), (10, 2, 8, 3), (2, 8, 6, 4), 1e-6, 4)]



def test_a_bfloat16_phi_gradient_keeps_the_values_and_rounds_the_gradients_once():
  """lev.phi_grad_dtype = "bfloat16" (the vectorized core): the same modes, bit for bit,
  and gradients to t, the KHRONOS scale and delta within the rounding of g_phi to
  bfloat16, <= 2**-9 of each element: each gradient is a sum of such elements times
  float32 factors, so its error is <= 2**-9 of the sum of its terms' magnitudes, here
  within 2x the largest gradient (2**-8 below; measured 5e-4 .. 1e-3)."""
  from lev_jax.lev import lev_modes_vectorized  # noqa: PLC0415
  n, h, s, j, r = 24, 2, 8, 6, 4
  t = jax.random.uniform(jax.random.key(0), (n, h, s))
  scale = jnp.asarray([2.5, 5.0])
  delta = 3.0 * jax.random.normal(jax.random.key(1), (h, s, j, r))  # negative factors too
  g_modes = jax.random.normal(jax.random.key(2), (n, h, r))

  def reference(t, sc, d):
    basis = bspline_basis(t, j, sc[:, None, None], False)
    phi = jnp.einsum("nhsj,hsjr->nhsr", basis, d) + basis.sum(-1)[..., None]
    return signed_log_product(phi, axis=2, eps=1e-6)

  def value_and_grads(core):
    out, vjp = jax.vjp(core, t, scale, delta)
    return out, vjp(g_modes)

  vectorized = lambda dtype: jax.jit(lambda: value_and_grads(
      lambda t, sc, d: lev_modes_vectorized(t, sc, d, "khronos", 1e-6, dtype)))()
  ref_out, ref_grads = jax.jit(lambda: value_and_grads(reference))()
  f32_out, f32_grads = vectorized("float32")
  out, grads = vectorized("bfloat16")
  np.testing.assert_array_equal(out, f32_out)
  _assert_close_tree(out, ref_out, 1e-5)
  _assert_close_tree(f32_grads, ref_grads, 1e-5)
  _assert_close_tree(grads, ref_grads, 2 ** -8)
  for g, f32_g in zip(grads, f32_grads):  # rounded: a dtype the core ignored would match
    assert float(np.abs(g - f32_g).max()) > 0


def test_off_the_cpu_the_vectorized_product_is_one_reduction():
  """Traced for a TPU or GPU, the vectorized core's log-sum and negative count over the
  seed coordinates are one variadic reduction (XLA:TPU reads phi's inputs once, not
  twice); on the CPU two sums, whose float32 bits every CPU figure was made with. Same
  modes to float32 rounding (the backward pass does not use them)."""
  from lev_jax import target  # noqa: PLC0415
  from lev_jax.lev import lev_modes_vectorized  # noqa: PLC0415
  t = jax.random.uniform(jax.random.key(0), (16, 2, 8))
  delta = 3.0 * jax.random.normal(jax.random.key(1), (2, 8, 6, 4))
  # A new function per trace: jit and make_jaxpr cache a function's trace.
  core = lambda: lambda t, d: lev_modes_vectorized(t, None, d, "normalized", 1e-6)
  cpu_jaxpr, cpu_out = str(jax.make_jaxpr(core())(t, delta)), jax.jit(core())(t, delta)
  with target.compiling_for("gpu"):
    gpu_jaxpr, gpu_out = str(jax.make_jaxpr(core())(t, delta)), jax.jit(core())(t, delta)
  assert (cpu_jaxpr.count(" reduce["), gpu_jaxpr.count(" reduce[")) == (0, 1)
  _assert_close_tree(gpu_out, cpu_out, 1e-6)
