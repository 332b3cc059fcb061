"""lev_pallas: the Pallas separable product equals the dense reference, values and VJP.

The kernels run in the Pallas interpreter on CPU; the compiled paths are only lowered
(to Triton and to Mosaic), since no accelerator runs these tests.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lev_jax.lev import signed_log_product
from lev_jax.lev_pallas import lev_modes_pallas

N, H, J, R = 20, 2, 6, 8  # N is not a multiple of the row block.
EPS = 1e-6
HIGHEST = jax.lax.Precision.HIGHEST


def _reference(weights_NxHxSxW, knots_NxHxSxW, delta_HxSxJxR):
  """Dense basis, phi by einsum, lev.signed_log_product: the plain-jnp path."""
  j = delta_HxSxJxR.shape[2]
  basis_NxHxSxJ = (jax.nn.one_hot(knots_NxHxSxW, j) * weights_NxHxSxW[..., None]).sum(-2)
  phi_NxHxSxR = jnp.einsum("nhsj,hsjr->nhsr", basis_NxHxSxJ, 1.0 + delta_HxSxJxR,
                           precision=HIGHEST)
  return signed_log_product(phi_NxHxSxR, axis=2, eps=EPS)


@functools.partial(jax.jit, static_argnames="log_group")
def _modes_and_grads(weights, knots, delta, g_modes, log_group):
  """(modes, (g_weights, g_delta)) of the kernel and of the reference, one compile."""
  def both(fn):
    modes, vjp = jax.vjp(lambda w, d: fn(w, knots, d), weights, delta)
    return modes, vjp(g_modes)
  kernel = lambda w, k, d: lev_modes_pallas(w, k, d, log_eps=EPS, log_group=log_group,
                                            block_rows=16)
  return both(kernel), both(_reference)


def _check(weights, knots, delta, log_group, rtol):
  g_modes = jax.random.normal(jax.random.key(9), (N, H, R))
  (modes, grads), (ref_modes, ref_grads) = jax.tree.map(
      np.asarray, _modes_and_grads(weights, knots, delta, g_modes, log_group=log_group))
  assert modes.shape == (N, H, R) and modes.dtype == np.float32
  np.testing.assert_allclose(modes, ref_modes, rtol=rtol, atol=rtol * 1e-3 * abs(ref_modes).max())
  for name, got, want in zip(["weights", "delta"], grads, ref_grads):
    assert np.isfinite(got).all(), name
    np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol * 0.1 * abs(want).max(),
                               err_msg=f"gradient of {name}")
  return modes


@pytest.mark.parametrize("window", ["three", "dense"])
def test_values_and_gradients_match_dense_reference(window):
  s = 16 if window == "three" else 8  # "three" shares the adversarial test's compile.
  k_c, k_w, k_d = jax.random.split(jax.random.key(0), 3)
  if window == "three":  # nearest knot c and c -1, c + 1; a slot off the grid weighs 0.
    c = jax.random.randint(k_c, (N, H, s, 1), 0, J)
    raw = c + jnp.arange(-1, 2)
    knots = jnp.clip(raw, 0, J - 1)
    weights = jnp.where((raw >= 0) & (raw < J), jax.random.uniform(k_w, raw.shape), 0.0)
    log_group, scale = 8, 0.7
  else:  # KHRONOS: every knot, in a shuffled slot order.
    knots = jnp.broadcast_to(jax.random.permutation(k_c, J), (N, H, s, J))
    weights = jax.random.uniform(k_w, (N, H, s, J)) / 3
    log_group, scale = 2, 2.0
  delta = scale * jax.random.normal(k_d, (H, s, J, R))
  modes = _check(weights, knots, delta, log_group, rtol=1e-5)
  assert (modes < 0).sum() > 10 and (modes > 0).sum() > 10  # both signs exercised


def test_adversarial_factors_finite_exact_sign():
  """Zeros, tiny and negative factors and factors ~1e6 in groups of 8: a direct product
  of a group overflows (1e48) or underflows (1e-48) float32; the modes (~1) do not."""
  s, log_group = 16, 8
  rng = np.random.default_rng(0)
  magnitude = np.where(np.arange(s)[:, None, None] < log_group,
                       1e6 * rng.uniform(0.5, 2.0, (s, J, R)),
                       rng.choice([0.0, 1e-7, 5e-7, 2e-6], (s, J, R)))
  table = (rng.choice([-1.0, 1.0], (H, s, J, R)) * magnitude).astype(np.float32)
  delta = jnp.asarray(table - 1.0)  # one-hot weights: phi = 1 + delta = table (rounded)
  knots = jnp.asarray(np.stack([rng.integers(0, J, (N, H, s))] * 3, -1), jnp.int32)
  weights = jnp.asarray(np.array([0.0, 1.0, 0.0], np.float32) * np.ones((N, H, s, 1)))
  modes = _check(weights, knots, delta, log_group, rtol=1e-4)

  phi = (1.0 + np.asarray(delta))[np.arange(H)[None, :, None], np.arange(s)[None, None, :],
                                  np.asarray(knots)[..., 1]]  # [N, H, S, R], float32
  with np.errstate(over="ignore"):  # the direct float32 products the kernel avoids
    assert np.isinf(np.prod(np.abs(phi[:, :, :log_group]) + EPS, 2)).all()
  assert (np.prod(np.abs(phi[:, :, log_group:]) + EPS, 2) < 1e-38).all()
  assert (phi == 0).any() and (phi < 0).any()
  exact = np.prod(np.abs(phi.astype(np.float64)) + EPS, 2)
  parity = 1.0 - 2.0 * ((phi < 0).sum(2) % 2)
  assert np.isfinite(modes).all() and (modes != 0).all()
  np.testing.assert_array_equal(np.sign(modes), parity)
  np.testing.assert_allclose(np.abs(modes), exact, rtol=1e-5)


@pytest.mark.parametrize("platform", ["cuda", "tpu"])
def test_compiled_path_lowers(platform):
  """Forward and backward lower to Triton / Mosaic custom calls (not compiled here)."""
  s, w = 8, 3
  def fn(weights, knots, delta, g):
    modes, vjp = jax.vjp(lambda x, d: lev_modes_pallas(
        x, knots, d, log_eps=EPS, log_group=4, interpret=False,
        platform="gpu" if platform == "cuda" else platform), weights, delta)
    return modes, vjp(g)
  shapes = [((N, H, s, w), jnp.float32), ((N, H, s, w), jnp.int32),
            ((H, s, J, R), jnp.float32), ((N, H, R), jnp.float32)]
  lowered = jax.jit(fn).trace(*[jax.ShapeDtypeStruct(*a) for a in shapes]).lower(
      lowering_platforms=(platform,))
  target = "__gpu$xla.gpu.triton" if platform == "cuda" else "tpu_custom_call"
  assert lowered.as_text().count(target) == 2


@pytest.mark.parametrize("change,match", [
    (dict(log_group=3), "log_group"),
    (dict(log_group=128), "log_group"),
    (dict(log_eps=0.0), "log_eps"),
    (dict(block_rows=24), "block_rows"),
    (dict(block_rank=8), "block_rank"),
    (dict(knots=np.zeros((N, H, 8, 3), np.float32)), "integer"),
    (dict(delta=np.zeros((H, 4, J, R), np.float32)), "delta"),
    (dict(interpret=False, platform="cpu"), "platform"),
])
def test_rejects_bad_arguments(change, match):
  args = dict(weights=np.zeros((N, H, 8, 3), np.float32),
              knots=np.zeros((N, H, 8, 3), np.int32),
              delta=np.zeros((H, 8, J, R), np.float32), log_eps=EPS, log_group=4)
  args.update(change)
  with pytest.raises(ValueError, match=match):
    lev_modes_pallas(args.pop("weights"), args.pop("knots"), args.pop("delta"), **args)
