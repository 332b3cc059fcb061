"""lev_pallas: the Pallas separable product equals the dense reference, values and VJP.

The kernels run in the Pallas interpreter on CPU; the compiled paths are only lowered
(to Triton and to Mosaic), since no accelerator runs these tests.
"""

import functools
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import run_on_8_devices
from lev_jax.lev import signed_log_product
from lev_jax.lev_pallas import lev_modes_pallas

N, H, J, R = 20, 2, 6, 8  # N is not a multiple of the row block.
EPS = 1e-6
HIGHEST = jax.lax.Precision.HIGHEST
# One pytest-xdist worker runs this file (--dist loadgroup), so the tests that share
# `_modes_and_grads`'s compiled program (same shapes) trace and lower it once.
pytestmark = pytest.mark.xdist_group("lev_pallas")


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


# --- the kernel inside a sharded program (lev.py: sharding.map_rows) ---------------

def _mesh_worker():
  """On 8 simulated CPU devices: LEV embeddings and their gradients with the Pallas
  core under a (2, 2, 2) mesh's activation rules vs the fused core on one device."""
  import json  # noqa: PLC0415
  import sys  # noqa: PLC0415
  sys.path.insert(0, os.path.dirname(__file__))
  from conftest import tiny_config  # noqa: PLC0415
  from flax import nnx  # noqa: PLC0415
  from lev_jax import sharding  # noqa: PLC0415
  from lev_jax.lev import LEV, lev_embed  # noqa: PLC0415
  assert jax.device_count() == 8
  out = {}
  for basis in ("normalized", "khronos"):
    import ml_collections  # noqa: PLC0415
    frozen = lambda **kw: ml_collections.FrozenConfigDict(tiny_config(**kw).lev)
    fused = frozen(impl="fused", basis=basis, chunk_size=64)
    pallas = frozen(impl="pallas", basis=basis, chunk_size=64)
    lev = LEV(384, 32, fused, rngs=nnx.Rngs(0))
    params = lev.param_dict()
    ids = jax.random.randint(jax.random.key(1), (4, 50), 0, 384)  # 200 ids: 4 chunks
    target_BxLxD = jax.random.normal(jax.random.key(2), (4, 50, 32))

    def loss(p, cfg):
      x = lev_embed(p, ids, cfg, lev.base)
      return jnp.sum(x * target_BxLxD), x

    grad = jax.value_and_grad(loss, has_aux=True)
    (_, x_ref), g_ref = jax.jit(grad, static_argnums=1)(params, fused)
    c = tiny_config()
    c.mesh.data, c.mesh.fsdp, c.mesh.tensor = 2, 2, 2
    mesh = sharding.make_mesh(c.mesh)
    with sharding.activation_sharding(mesh, sharding.rules_from_config(c)):
      (_, x), g = jax.jit(grad, static_argnums=1)(params, pallas)
      hlo = jax.jit(grad, static_argnums=1).lower(params, pallas).as_text()
    rel = lambda a, b: float(np.max(np.abs(np.asarray(a) - np.asarray(b)))
                             / (np.max(np.abs(np.asarray(b))) + 1e-30))
    out[basis] = {"x": rel(x, x_ref),
                  "grads": max(rel(g[k], g_ref[k]) for k in g_ref),
                  "shard_map": "shard_map" in hlo or "sdy.manual_computation" in hlo}
  print(json.dumps(out))


def test_pallas_core_inside_a_sharded_program_equals_the_fused_core():
  """lev.impl=pallas on a (2, 2, 2) mesh of 8 simulated devices runs the kernel in a
  shard_map over the LEV rows (XLA cannot partition a Pallas call; on TPU it refuses
  with "Mosaic kernels cannot be automatically partitioned"), and equals the fused
  core on one device: values and gradients to 1e-5 (relative to the largest entry)."""
  result, _ = run_on_8_devices(__file__, "mesh")
  for basis, err in result.items():
    assert err["shard_map"], f"{basis}: no shard_map in the lowered program"
    assert err["x"] <= 1e-5 and err["grads"] <= 1e-5, f"{basis}: {err}"


if __name__ == "__main__":
  _mesh_worker()
