"""Schedule shape, decay mask, clipping."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from conftest import tiny_config
from lev_jax.optimizer import decay_mask, learning_rate_schedule, make_optimizer
from lev_jax.train import create_model


def test_warmup_then_cosine_to_the_floor():
  c = tiny_config()
  c.train.steps, c.optim.warmup_steps, c.optim.lr, c.optim.min_lr_ratio = 100, 10, 1e-3, 0.1
  lr = learning_rate_schedule(c)
  assert float(lr(0)) == 0.0
  assert float(lr(5)) == pytest.approx(5e-4)
  assert float(lr(10)) == pytest.approx(1e-3)
  assert float(lr(100)) == pytest.approx(1e-4)
  values = [float(lr(s)) for s in range(10, 101)]
  assert all(a >= b for a, b in zip(values, values[1:]))


def _mask_by_name(config):
  params = nnx.state(create_model(config), nnx.Param)
  mask = decay_mask(params, config.optim)
  flat = jax.tree_util.tree_flatten_with_path(mask)[0]
  return {jax.tree_util.keystr(p, simple=True, separator="/"): m for p, m in flat}


def test_decay_on_matrices_only_by_default():
  mask = _mask_by_name(tiny_config("lev"))
  assert mask["blocks/0/attn/wq/value"] and mask["embedding/head/value"]
  assert mask["embedding/lev/spline_delta/value"]
  assert not mask["blocks/0/attn_norm/scale/value"] and not mask["final_norm/scale/value"]
  # LEV's per-head LayerNorm parameters are [H, S] but are norms: excluded by default.
  assert not mask["embedding/lev/ln_scale/value"] and not mask["embedding/lev/ln_bias/value"]


def test_no_decay_patterns_and_modes():
  c = tiny_config("lev")
  c.optim.no_decay = ("embedding/lev",)
  mask = _mask_by_name(c)
  assert not any(v for k, v in mask.items() if k.startswith("embedding/lev"))
  assert mask["embedding/head/value"]
  c.optim.decay_mask = "none"
  assert not any(_mask_by_name(c).values())
  c.optim.decay_mask, c.optim.no_decay = "all", ()
  assert all(_mask_by_name(c).values())


def test_global_norm_clipping_rescales_gradients_before_adam():
  """Clipped run on (g1, g2) == unclipped run on the hand-clipped (g1, g2)."""
  def run(clip_norm, grads):
    c = tiny_config()
    c.optim.clip_norm, c.optim.warmup_steps = clip_norm, 0
    tx = make_optimizer(c)
    params = {"w": jnp.ones((2, 2))}
    state = tx.init(params)
    for g in grads:
      updates, state = tx.update({"w": g}, state, params)
      params = jax.tree.map(jnp.add, params, updates)
    return np.asarray(params["w"])

  g1 = jnp.array([[3e3, 0.0], [0.0, 4e3]])    # norm 5e3 -> scaled by 1/5e3
  g2 = jnp.array([[0.1, -0.2], [0.05, 0.0]])  # norm < 1 -> untouched
  clipped = run(1.0, [g1, g2])
  by_hand = run(1e12, [g1 / 5e3, g2])
  unclipped = run(1e12, [g1, g2])
  np.testing.assert_allclose(clipped, by_hand, rtol=1e-6)
  assert np.abs(clipped - unclipped).max() > 1e-6
