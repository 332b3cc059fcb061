"""Schedule shape, decay mask, clipping modes, parameter groups and their diagnostics,
LEV's learning-rate multiplier and output-projection init."""

import functools
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import conftest

# Two layers here: what these tests check depends on the layer stack.
tiny_config = functools.partial(conftest.tiny_config, n_layers=2)
from lev_jax.lev import LEV
from lev_jax.optimizer import (decay_mask, group_adamw, group_diagnostics,
                               learning_rate_schedule, make_clipping, make_optimizer,
                               param_group, schedule_count)
from lev_jax.train import abstract_model, partition


def test_warmup_then_cosine_to_the_floor():
  """lr(count) is the rate of update count + 1: lr/10 first, peak at update 10, floor
  at update 100 (the last)."""
  c = tiny_config()
  c.train.steps, c.optim.warmup_steps, c.optim.lr, c.optim.min_lr_ratio = 100, 10, 1e-3, 0.1
  lr = learning_rate_schedule(c)
  assert float(lr(0)) == pytest.approx(1e-4)
  assert float(lr(4)) == pytest.approx(5e-4)
  assert float(lr(9)) == pytest.approx(1e-3)
  assert float(lr(99)) == pytest.approx(1e-4)
  values = [float(lr(s)) for s in range(9, 100)]
  assert all(a >= b for a, b in zip(values, values[1:]))


def test_the_first_update_trains():
  """Warm-up from update 1's value: the first AdamW update moves the parameters."""
  c = tiny_config()
  c.train.steps, c.optim.warmup_steps, c.optim.weight_decay = 100, 10, 0.0
  tx = make_optimizer(c)
  params = {"w": jnp.ones((2, 2))}
  updates, _ = tx.update({"w": jnp.full((2, 2), 0.5)}, tx.init(params), params)
  # Adam's first step is lr * g / |g| = lr(update 1) = lr / warmup_steps per element.
  np.testing.assert_allclose(np.asarray(updates["w"]), -c.optim.lr / 10, rtol=1e-5)


def _mask_by_name(config):
  params = nnx.state(abstract_model(config), nnx.Param)  # the mask reads paths and shapes
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


def _decay_factors(scan_layers: bool) -> dict:
  """{role path: param after five zero-gradient AdamW updates / param before (1 + after
  where it was 0)}, with the
  stacked layer axis unrolled so both layouts name a parameter alike. With a zero
  gradient AdamW's update is -lr * weight_decay * param where it decays: the factor does
  not depend on the value, so every parameter starts at 1 (no init program to compile)."""
  c = tiny_config("lev")
  c.model.scan_layers, c.optim.warmup_steps, c.optim.weight_decay = scan_layers, 0, 0.1
  params = jax.tree.map(lambda x: jnp.ones(x.shape, x.dtype),
                        nnx.state(abstract_model(c), nnx.Param))
  tx = make_optimizer(c)
  state, new = tx.init(params), params
  update = jax.jit(tx.update)  # one compile; op by op, each update dispatched ~100 ops
  for _ in range(5):
    updates, state = update(jax.tree.map(jnp.zeros_like, params), state, new)
    new = optax.apply_updates(new, updates)
  out = {}
  for (path, before), after in zip(jax.tree_util.tree_flatten_with_path(params)[0],
                                   jax.tree.leaves(new)):
    name = jax.tree_util.keystr(path, simple=True, separator="/")
    before, after = np.asarray(before), np.asarray(after)
    ratio = np.where(before == 0, 1.0 + after, after / np.where(before == 0, 1, before))
    if scan_layers and name.startswith("blocks/"):
      for i in range(c.model.n_layers):
        out[name.replace("blocks/", f"blocks/{i}/", 1)] = float(np.median(ratio[i]))
    else:
      out[name] = float(np.median(ratio))
  return out


def test_weight_decay_by_role_is_the_same_with_and_without_scan_layers():
  """A stacked norm scale is rank 2 but still a norm: no decay in either layout."""
  stacked, unstacked = _decay_factors(True), _decay_factors(False)
  assert stacked.keys() == unstacked.keys()
  assert stacked["blocks/0/attn_norm/scale/value"] == 1.0
  assert stacked["blocks/1/mlp_norm/scale/value"] == 1.0
  assert stacked["blocks/0/attn/wq/value"] < 1.0
  for name in stacked:
    assert stacked[name] == pytest.approx(unstacked[name], rel=1e-6), name


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


# --- parameter groups, per-group diagnostics and LEV's optimiser options -------------

def _toy_params():
  """A params tree with one leaf per group, named like the model's paths."""
  k = iter(jax.random.split(jax.random.key(0), 8))
  return {"embedding": {"lev": {"codebooks": jax.random.normal(next(k), (3, 4)),
                                "ln_scale": jnp.ones((4,))},
                        "head": jax.random.normal(next(k), (4, 6))},
          "blocks": {"0": {"wq": jax.random.normal(next(k), (4, 4))}},
          "final_norm": {"scale": jnp.ones((4,))}}


def _groups(tree):
  """{group: float32 [n] all of the group's values, flattened}."""
  parts = {}
  for p, x in jax.tree_util.tree_flatten_with_path(tree)[0]:
    parts.setdefault(param_group(p), []).append(np.ravel(x))
  return {g: np.concatenate(v) for g, v in parts.items()}


def _options(clip_mode="global", lev_lr_multiplier=1.0, clip_norm=1.0, **optim):
  c = tiny_config()
  c.optim.update({"clip_mode": clip_mode, "lev_lr_multiplier": lev_lr_multiplier,
                  "clip_norm": clip_norm, "warmup_steps": 0, **optim})
  return c


def _first_update(config, grads):
  """The first update of make_optimizer(config) on _toy_params(), in one jitted program."""
  tx = make_optimizer(config)
  params = _toy_params()
  return jax.jit(lambda g: tx.update(g, tx.init(params), params)[0])(grads)


@pytest.mark.parametrize("embedding,groups", [
    ("tied", {"embedding_table", "backbone"}),
    ("untied", {"embedding_table", "head", "backbone"}),
    ("lev", {"lev", "head", "backbone"})])
def test_param_group_of_every_model_parameter(embedding, groups):
  params = nnx.state(abstract_model(tiny_config(embedding)), nnx.Param)
  by_path = {jax.tree_util.keystr(p, simple=True, separator="/"): param_group(p)
             for p, _ in jax.tree_util.tree_flatten_with_path(params)[0]}
  assert set(by_path.values()) == groups
  assert by_path["blocks/0/attn/wq/value"] == by_path["final_norm/scale/value"] == "backbone"
  if embedding == "lev":
    assert {g for p, g in by_path.items() if p.startswith("embedding/lev/")} == {"lev"}
    assert param_group("embedding/lev/out_proj/value") == "lev"
  assert param_group("embedding/table/value") == "embedding_table"
  # The train step logs exactly the groups the model has (no `lev` for tied).
  keys = jax.eval_shape(group_diagnostics, params, params, params).keys()
  assert set(keys) == {f"{m}/{g}" for m in ("grad_norm", "update_ratio") for g in groups}


def test_group_norms_sum_in_quadrature_and_update_ratio_is_the_rms_ratio():
  params, grads = _toy_params(), jax.tree.map(lambda x: 3.0 * x + 0.1, _toy_params())
  updates = jax.tree.map(lambda x: -0.01 * x, params)
  d = jax.jit(group_diagnostics)(grads, updates, params)
  total = sum(float(d[f"grad_norm/{g}"]) ** 2 for g in ("lev", "head", "backbone"))
  assert np.sqrt(total) == pytest.approx(float(optax.tree.norm(grads)), rel=1e-6)
  lev = np.concatenate([np.ravel(grads["embedding"]["lev"][n]) for n in ("codebooks", "ln_scale")])
  assert float(d["grad_norm/lev"]) == pytest.approx(np.linalg.norm(lev), rel=1e-6)
  for g in ("lev", "head", "backbone"):  # updates = -0.01 * params in every group
    assert float(d[f"update_ratio/{g}"]) == pytest.approx(0.01, rel=1e-5)


def test_lev_lr_multiplier_moves_only_lev():
  grads = jax.tree.map(lambda x: 0.01 * jnp.ones_like(x), _toy_params())
  base = _groups(_first_update(_options(), grads))
  frozen = _groups(_first_update(_options(lev_lr_multiplier=0.0), grads))
  double = _groups(_first_update(_options(lev_lr_multiplier=2.0), grads))
  assert float(np.abs(base["lev"]).max()) > 0
  assert float(np.abs(frozen["lev"]).max()) == 0.0  # multiplier 0: LEV stays put
  np.testing.assert_allclose(double["lev"], 2.0 * base["lev"], rtol=1e-6)
  for g in ("head", "backbone"):
    np.testing.assert_array_equal(frozen[g], base[g])
    np.testing.assert_array_equal(double[g], base[g])


def test_per_group_clipping_clips_only_the_group_over_its_threshold():
  grads = jax.tree.map(jnp.zeros_like, _toy_params())
  grads["embedding"]["lev"]["codebooks"] = jnp.full((3, 4), 10.0)   # norm ~34.6
  grads["blocks"]["0"]["wq"] = jnp.full((4, 4), 0.1)                # norm 0.4
  grads["embedding"]["head"] = jnp.full((4, 6), 0.1)                # norm ~0.49
  clip = lambda mode: jax.jit(lambda g: make_clipping(_options(mode).optim).update(g, None)[0])
  clipped = _groups(clip("per_group")(grads))
  assert float(np.linalg.norm(clipped["lev"])) == pytest.approx(1.0, rel=1e-6)
  np.testing.assert_array_equal(clipped["backbone"], _groups(grads)["backbone"])
  np.testing.assert_array_equal(clipped["head"], _groups(grads)["head"])
  # Global clipping (today's default) shrinks every group by the same factor instead.
  clipped = _groups(clip("global")(grads))
  assert float(clipped["backbone"].max()) < 0.01


def test_exclude_lev_keeps_a_huge_lev_gradient_out_of_the_other_groups_clipping():
  def grads(lev_scale):
    g = jax.tree.map(lambda x: 0.05 * jnp.ones_like(x), _toy_params())
    g["embedding"]["lev"]["codebooks"] = lev_scale * jnp.ones((3, 4))
    return g

  def backbone_update(mode, lev_scale):
    return _groups(_first_update(_options(mode, clip_norm=0.1), grads(lev_scale)))["backbone"]
  np.testing.assert_array_equal(backbone_update("exclude_lev", 1e6),
                                backbone_update("exclude_lev", 1e-3))
  assert np.abs(backbone_update("global", 1e6) - backbone_update("global", 1e-3)).max() > 1e-4


def test_opt_state_structure_is_the_same_for_every_option():
  """(EmptyState, adamw state) whatever clip_mode / lev_lr_multiplier: checkpoints written
  under one option restore under another, and partition() shards it (tree_map_params)."""
  default = jax.eval_shape(make_optimizer(_options()).init, _toy_params())
  for mode in ("global", "per_group", "exclude_lev"):
    for mult in (1.0, 0.0, 3.0):
      for lev in ({}, {"lev_weight_decay": 0.0}, {"lev_warmup_steps": 5}):
        tx = make_optimizer(_options(mode, mult, **lev))
        state = jax.eval_shape(tx.init, _toy_params())
        assert jax.tree.structure(state) == jax.tree.structure(default), (mode, mult, lev)
        assert schedule_count(state).shape == ()
  c = tiny_config("lev")
  c.optim.update(clip_mode="exclude_lev", lev_lr_multiplier=2.0)
  shardings = partition(c).state_sharding["opt_state"]
  default_shardings = partition(tiny_config("lev")).state_sharding["opt_state"]
  assert jax.tree.structure(shardings) == jax.tree.structure(default_shardings)


def test_match_table_init_scales_lev_output_to_the_table_std():
  sample = jnp.linspace(0, 383, 256).astype(jnp.int32)

  @nnx.jit  # one compiled program: fast on CPU
  def build():
    paper = LEV(384, 32, tiny_config().lev, rngs=nnx.Rngs(0), init_std=0.05)
    matched = LEV(384, 32, tiny_config(out_proj_init="match_table").lev, rngs=nnx.Rngs(0),
                  init_std=0.05)
    rms = [jnp.sqrt(jnp.mean(lev(sample) ** 2)) for lev in (paper, matched)]
    return paper, matched, rms

  paper, matched, (paper_rms, matched_rms) = build()
  assert float(matched_rms) == pytest.approx(0.05, rel=1e-4)
  assert float(paper_rms) != pytest.approx(0.05, rel=0.05)
  p, m = paper.param_dict(), matched.param_dict()
  for name in p:  # only out_proj changes, by one factor
    if name != "out_proj":
      np.testing.assert_array_equal(p[name], m[name])
  ratio = np.asarray(m["out_proj"] / p["out_proj"])
  np.testing.assert_allclose(ratio, ratio.flat[0], rtol=1e-5)


def test_group_adamw_with_levs_values_equal_to_the_global_ones_is_bitwise_adamw():
  """The chain behind lev_weight_decay / lev_warmup_steps, given LEV the global values,
  makes optax.adamw's updates bit for bit over warm-up steps with decay."""
  c = _options(warmup_steps=2, weight_decay=0.1)
  adamw = optax.adamw(learning_rate_schedule(c), b1=c.optim.b1, b2=c.optim.b2,
                      eps=c.optim.eps, weight_decay=0.1,
                      mask=lambda p: decay_mask(p, c.optim))
  params = _toy_params()
  grads = [jax.tree.map(lambda x, i=i: jnp.sin(x * (i + 1)), params) for i in range(3)]

  def run(tx):  # one program per optimizer: XLA may round a shared program's ops apart
    def steps():
      state, ups = tx.init(params), []
      for g in grads:
        u, state = tx.update(g, state, params)
        ups.append(u)
      return ups
    return jax.jit(steps)()

  ours, theirs = run(group_adamw(c)), run(adamw)
  for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(theirs)):
    np.testing.assert_array_equal(a, b)


def test_lev_weight_decay_and_lev_warmup_steps_change_only_levs_updates():
  lr = float(learning_rate_schedule(_options())(0))
  zero = jax.tree.map(jnp.zeros_like, _toy_params())  # the update is then the decay alone
  base = _groups(_first_update(_options(weight_decay=0.1), zero))
  decayed = _first_update(_options(weight_decay=0.1, lev_weight_decay=0.5), zero)
  np.testing.assert_allclose(decayed["embedding"]["lev"]["codebooks"],
                             -lr * 0.5 * _toy_params()["embedding"]["lev"]["codebooks"],
                             rtol=1e-6)
  assert float(np.abs(decayed["embedding"]["lev"]["ln_scale"]).max()) == 0.0  # no_decay
  grads = jax.tree.map(lambda x: 0.01 * jnp.ones_like(x), _toy_params())
  warm = _first_update(_options(lev_warmup_steps=4), grads)
  plain = _groups(_first_update(_options(), grads))
  # Update 1 of a 4-step warm-up runs at lr / 4; the rest at the full rate (no warm-up).
  lev_lr = float(learning_rate_schedule(_options(), 4)(0))
  assert lev_lr == pytest.approx(_options().optim.lr / 4) and lr > 3 * lev_lr
  np.testing.assert_allclose(_groups(warm)["lev"], plain["lev"] * lev_lr / lr, rtol=1e-6)
  for g in ("head", "backbone"):
    np.testing.assert_array_equal(_groups(decayed)[g], base[g])
    np.testing.assert_array_equal(_groups(warm)[g], plain[g])
