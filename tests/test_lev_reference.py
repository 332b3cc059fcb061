"""lev_jax.lev.lev_embed (float32) against the float64 NumPy reference of LEV.md.

Random ids and random parameters, every parameter perturbed away from its init (LayerNorm
scale / bias, delta, KHRONOS scale) so each one changes the output; values to ~1e-6
relative, gradients of a random projection by central differences of the reference.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from conftest import tiny_config
from lev_jax.lev import LEV, lev_embed
from lev_reference import digit_base, digits_of, lev_reference

VOCAB, D_MODEL = 384, 32


def _setup(basis, sigmoid, seed=0):
  cfg = tiny_config(basis=basis, sigmoid=sigmoid).lev
  lev = nnx.eval_shape(lambda: LEV(VOCAB, D_MODEL, cfg, rngs=nnx.Rngs(seed)))  # shapes only
  rng = np.random.default_rng(seed)
  params = {k: np.zeros(v.shape) for k, v in nnx.to_pure_dict(nnx.state(lev, nnx.Param)).items()}
  params["codebooks"] = rng.normal(0.0, 0.5, params["codebooks"].shape)
  params["seed_proj"] = rng.normal(0.0, 0.5, params["seed_proj"].shape)
  params["ln_scale"] = 1.0 + rng.normal(0.0, 0.3, params["ln_scale"].shape)
  params["ln_bias"] = rng.normal(0.0, 0.3, params["ln_bias"].shape)
  params["spline_delta"] = rng.normal(0.0, 0.3, params["spline_delta"].shape)
  params["out_proj"] = rng.normal(0.0, 1.0, params["out_proj"].shape)
  if basis == "khronos":
    params["basis_scale"] = cfg.n_knots - 1.0 + rng.normal(0.0, 1.0, params["basis_scale"].shape)
  # float32-representable, so both sides see exactly the same numbers.
  params = {k: v.astype(np.float32).astype(np.float64) for k, v in params.items()}
  ids = np.concatenate([[0, VOCAB - 1], rng.integers(0, VOCAB, 14)])
  ref = lambda p: lev_reference(p, ids, vocab_size=VOCAB, n_coords=cfg.n_coords,
                                n_knots=cfg.n_knots, sigmoid=sigmoid, basis=basis,
                                ln_eps=cfg.ln_eps, log_eps=cfg.log_eps)
  proj = rng.normal(size=(ids.size, D_MODEL))

  @jax.jit  # one compiled program: the embeddings and d<E, proj>/d params
  def ours(p):
    out, vjp = jax.vjp(lambda q: lev_embed(q, jnp.asarray(ids, jnp.int32), cfg, lev.base), p)
    return out, vjp(jnp.asarray(proj, jnp.float32))[0]

  return params, proj, ref, ours, rng


def test_reference_digits_are_base_b_most_significant_first():
  assert digit_base(384, 3) == 8 and digit_base(200_064, 3) == 59 and digit_base(125, 3) == 5
  assert digits_of(8 * 8 * 3 + 8 * 2 + 5, 8, 3) == [3, 2, 5]
  lev = nnx.eval_shape(lambda: LEV(VOCAB, D_MODEL, tiny_config().lev, rngs=nnx.Rngs(0)))
  assert lev.base == digit_base(VOCAB, 3)


@pytest.mark.parametrize("basis", ["normalized", "khronos"])
@pytest.mark.parametrize("sigmoid", ["half", "full"])
def test_lev_embed_matches_the_float64_reference(basis, sigmoid):
  params, proj, ref, ours, rng = _setup(basis, sigmoid)
  want = ref(params)
  p32 = {k: jnp.asarray(v, jnp.float32) for k, v in params.items()}
  got, grads = ours(p32)
  got = np.asarray(got, np.float64)
  assert got.shape == want.shape == (16, D_MODEL)
  rel = np.abs(got - want).max() / np.abs(want).max()
  assert rel < 3e-6, f"max |lev_embed - reference| / max |reference| = {rel:.2e}"

  # Gradient of a random projection <E, proj>: JAX's (float32, reverse mode) vs central
  # differences of the float64 reference, at up to 3 random coordinates of every parameter.
  loss = lambda p: float(np.sum(ref(p) * proj))
  for name, value in params.items():
    g = np.asarray(grads[name], np.float64)
    scale = np.abs(g).max()
    assert scale > 0, f"no gradient reaches {name}"
    for flat in rng.choice(value.size, min(3, value.size), replace=False):
      idx = np.unravel_index(flat, value.shape)
      h = 1e-5 * max(1.0, abs(value[idx]))
      plus, minus = dict(params), dict(params)
      plus[name], minus[name] = value.copy(), value.copy()
      plus[name][idx] += h
      minus[name][idx] -= h
      fd = (loss(plus) - loss(minus)) / (2 * h)
      assert abs(g[idx] - fd) <= 1e-4 * scale + 1e-4 * abs(fd), (
          f"{basis}/{sigmoid} d/d {name}{list(idx)}: jax.grad {g[idx]:.6e}, "
          f"finite differences {fd:.6e}")
