"""AdamW with gradient clipping and a warm-up + cosine schedule (optax), and the
parameter groups used by the per-group diagnostics and LEV's optimiser options.

Parameter groups (`param_group`), one name per parameter path:
  lev              LEV's parameters (`embedding/lev/...`: codebooks, seed_proj, LayerNorm,
                   spline_delta, out_proj, basis_scale)
  embedding_table  the input table (`embedding/table`); for `tied` it is also the output
                   head (one array), so tied models have no `head` group
  head             the untied output head (`embedding/head`; `untied` and `lev`)
  backbone         everything else (decoder blocks, final norm)

Options (config.optim): `clip_mode` = "global" (one norm over all parameters),
"per_group" (each group clipped by its own norm) or "exclude_lev" (one norm over all
but LEV; LEV by its own norm), each clipping to `clip_norm`; `lev_lr_multiplier` scales
LEV's AdamW update (learning rate * multiplier, schedule and decoupled decay included);
`lev_weight_decay` and `lev_warmup_steps` (-1: the global value) give LEV its own
decoupled decay and warm-up (`group_adamw`). All are built so that the optimizer state
has the same structure for every option value (`(EmptyState(), adamw state)`, as with
plain global clipping), so checkpoints restore across option changes;
optax.multi_transform would instead nest one inner state per label.

Source: optax docs (`optax.adamw`, `optax.clip_by_global_norm`,
`optax.warmup_cosine_decay_schedule`, `optax.GradientTransformation`); Loshchilov &
Hutter 2019 for decoupled decay.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import ml_collections
import optax
from flax import nnx

from lev_jax.sharding import param_logical_axes

GROUPS = ("lev", "embedding_table", "head", "backbone")


def param_group(path) -> str:
  """The group (one of GROUPS) of a parameter.

  Args:
    path: a "/"-joined path as `jax.tree_util.keystr(keypath, simple=True,
      separator="/")` writes it (e.g. "embedding/lev/codebooks/value"), or a key path
      from `jax.tree_util.tree_flatten_with_path` over the model's nnx.State.
  Returns:
    "lev", "embedding_table", "head" or "backbone" (see the module docstring).
  """
  if not isinstance(path, str):
    path = jax.tree_util.keystr(tuple(path), simple=True, separator="/")
  names = path.split("/")
  if names[0] == "embedding" and len(names) > 1:
    return {"lev": "lev", "table": "embedding_table", "head": "head"}.get(names[1], "backbone")
  return "backbone"


def _group_sq_sums(tree, key: Callable[[str], str] = lambda g: g) -> dict:
  """{key(group): float32 [] sum of squares of the group's leaves}, groups in tree order."""
  sums = {}
  for path, x in jax.tree_util.tree_flatten_with_path(tree)[0]:
    k = key(param_group(path))
    sums[k] = sums.get(k, 0.0) + jnp.sum(jnp.square(x.astype(jnp.float32)))
  return sums


def group_diagnostics(grads, updates, params) -> dict:
  """Per-group gradient norm and update / parameter RMS ratio, as float32 scalars.

  Args:
    grads: the gradient pytree (like `params`), after accumulation and normalisation,
      before clipping.
    updates: the optimizer's updates (added to `params` by optax.apply_updates).
    params: the parameters the updates apply to (before the step).
  Returns:
    {"grad_norm/<group>": ||grads_g||_2, "update_ratio/<group>": rms(updates_g) /
    rms(params_g)} for each group present in `params` (no `lev` entry for a tied
    model). rms over a group = sqrt(sum of squares / number of elements), so the ratio
    is ||updates_g|| / ||params_g|| (dimensionless: the relative change of the step).
    The group norms sum in quadrature to the global gradient norm.
  """
  g2, u2, p2 = _group_sq_sums(grads), _group_sq_sums(updates), _group_sq_sums(params)
  out = {}
  for g in g2:
    out[f"grad_norm/{g}"] = jnp.sqrt(g2[g])
    out[f"update_ratio/{g}"] = jnp.sqrt(u2[g] / jnp.maximum(p2[g], 1e-30))
  return out


def clip_by_group_norm(max_norm: float, clip_set: Callable[[str], str]
                       ) -> optax.GradientTransformation:
  """Clips each set of parameter groups by its own global norm (stateless).

  The leaves of every clip set s (those with clip_set(param_group(path)) == s) are
  rescaled by max_norm / ||g_s|| when ||g_s|| >= max_norm, as optax.clip_by_global_norm
  does for the whole tree; other sets are untouched.

  Args:
    max_norm: the threshold (config.optim.clip_norm), > 0.
    clip_set: maps a group name to the name of its clip set.
  Returns:
    An optax.GradientTransformation with optax.EmptyState (as clip_by_global_norm).
  """
  def init_fn(params):
    del params
    return optax.EmptyState()

  def update_fn(updates, state, params=None):
    del params
    norms = {s: jnp.sqrt(v) for s, v in _group_sq_sums(updates, clip_set).items()}

    def clip(path, g):
      n = norms[clip_set(param_group(path))].astype(g.dtype)
      return jnp.where(n < max_norm, g, (g / n) * max_norm)
    return jax.tree_util.tree_map_with_path(clip, updates), state

  return optax.GradientTransformation(init_fn, update_fn)


def scale_group_updates(inner: optax.GradientTransformation, multipliers: dict
                        ) -> optax.GradientTransformation:
  """`inner` with the updates of group g multiplied by multipliers.get(g, 1.0).

  For inner = optax.adamw(lr, ..., weight_decay), whose update is -lr * (adam direction
  + weight_decay * param), this equals adamw with learning rate lr * multiplier on that
  group (schedule and decoupled decay included), without a second optimizer state: the
  state is inner's own, unchanged in structure.
  """
  def update_fn(updates, state, params=None):
    updates, state = inner.update(updates, state, params)
    scale = lambda path, u: u * multipliers.get(param_group(path), 1.0)
    return jax.tree_util.tree_map_with_path(scale, updates), state

  return optax.GradientTransformation(inner.init, update_fn)


def learning_rate_schedule(config: ml_collections.ConfigDict,
                           warmup_steps: int | None = None) -> optax.Schedule:
  """The learning rate of each optimizer update: linear warm-up, then cosine decay.

  Update k (k = 1 .. train.steps; optax passes count = k - 1, the updates already
  applied) uses lr * k / warmup_steps for k <= warmup_steps, then a cosine from lr down
  to lr * min_lr_ratio at k = train.steps. The first update therefore trains (lr /
  warmup_steps, not 0: warm-up counted from update 1, not from a zero-lr update 0).
  Counts are optimizer steps, not micro-batches. `warmup_steps` (default
  optim.warmup_steps) replaces the warm-up length: LEV's own schedule
  (optim.lev_warmup_steps).

  Source: optax.warmup_cosine_decay_schedule (evaluated at count + 1).
  """
  o = config.optim
  warmup = o.warmup_steps if warmup_steps is None else warmup_steps
  schedule = optax.warmup_cosine_decay_schedule(
      init_value=0.0, peak_value=o.lr, warmup_steps=warmup,
      decay_steps=config.train.steps, end_value=o.lr * o.min_lr_ratio)
  return lambda count: schedule(count + 1)


def role_ndim(path, x) -> int:
  """The number of dimensions a parameter has in its role, whatever the layout.

  An nnx.Variable is judged by its logical axes without the "layers" axis that
  model.scan_layers stacks in front (sharding.param_logical_axes): a norm scale is 1
  whether stacked [n_layers, d_model] or not [d_model], a projection 2 or more. A bare
  array (no metadata) is judged by its rank.
  """
  if isinstance(x, nnx.Variable):
    return sum(n != "layers" for n in param_logical_axes(path, x))
  return x.ndim


def schedule_count(opt_state) -> jax.Array:
  """int32 []: the updates applied so far, as the learning-rate schedule counts them
  (optax.ScaleByScheduleState.count in `make_optimizer`'s state). It stays behind the
  train step after a step the NaN guard skipped (train.nan_policy = skip_step), so
  learning_rate_schedule(config)(schedule_count(state)) is the rate the next update
  uses. Source: optax.tree_utils.tree_get_all_with_path.
  """
  found = [v for p, v in optax.tree_utils.tree_get_all_with_path(opt_state, "count")
           if getattr(p[-1], "tuple_name", None) == "ScaleByScheduleState"]
  if len(found) != 1:
    raise ValueError(f"optimizer state: expected one ScaleByScheduleState, found {len(found)}")
  return found[0]


def decay_mask(params, optim: ml_collections.ConfigDict):
  """Boolean pytree like `params`: True where weight decay applies.

  `decay_mask`: "matrices" (parameters whose role is a matrix or larger, by
  `role_ndim`: projections, tables, LEV codebooks and splines; not norm scales or
  biases, stacked by model.scan_layers or not), "all" or "none". Paths containing any
  substring in `optim.no_decay` are excluded in addition.

  Args:
    params: nnx.State of nnx.Param (as trained) or a pytree of arrays.
  Raises:
    ShardingError: a parameter Variable without `logical_axes` metadata.
  """
  def decide(path, x):
    if optim.decay_mask == "none":
      keep = False
    elif any(s in jax.tree_util.keystr(path, simple=True, separator="/")
             for s in optim.no_decay):
      keep = False
    else:
      keep = optim.decay_mask == "all" or role_ndim(path, x) >= 2
    return x.replace(keep) if isinstance(x, nnx.Variable) else keep
  return jax.tree_util.tree_map_with_path(decide, params,
                                          is_leaf=lambda x: isinstance(x, nnx.Variable))


def lev_weight_decay(optim: ml_collections.ConfigDict) -> float:
  """LEV's decoupled weight decay: optim.lev_weight_decay, or optim.weight_decay for -1."""
  return optim.weight_decay if optim.lev_weight_decay == -1 else optim.lev_weight_decay


def lev_warmup_steps(optim: ml_collections.ConfigDict) -> int:
  """LEV's warm-up steps: optim.lev_warmup_steps, or optim.warmup_steps for -1."""
  return optim.warmup_steps if optim.lev_warmup_steps == -1 else optim.lev_warmup_steps


def add_group_decayed_weights(weight_decays: dict, default: float
                              ) -> optax.GradientTransformation:
  """optax.add_decayed_weights with the rate weight_decays.get(group, default) per
  parameter group (`param_group`): update + rate * param. Stateless (EmptyState, as
  optax's for a constant rate); wrap it in optax.masked for a decay mask."""
  def init_fn(params):
    del params
    return optax.EmptyState()

  def update_fn(updates, state, params):
    rate = lambda path: weight_decays.get(param_group(path), default)
    return jax.tree_util.tree_map_with_path(lambda p, g, x: g + rate(p) * x, updates,
                                            params), state

  return optax.GradientTransformation(init_fn, update_fn)


def scale_by_group_schedule(schedules: dict, default: optax.Schedule
                            ) -> optax.GradientTransformation:
  """optax.scale_by_schedule with the schedule schedules.get(group, default) per
  parameter group (`param_group`), all at one count. Its state is optax's
  ScaleByScheduleState (`schedule_count` finds it)."""
  def init_fn(params):
    del params
    return optax.ScaleByScheduleState(count=jnp.zeros([], jnp.int32))

  def update_fn(updates, state, params=None):
    del params
    step_sizes = {g: fn(state.count) for g, fn in schedules.items()}
    step_size = default(state.count)  # each schedule evaluated once, as optax does

    def scale(path, g):
      return jnp.array(step_sizes.get(param_group(path), step_size), dtype=g.dtype) * g
    updates = jax.tree_util.tree_map_with_path(scale, updates)
    return updates, optax.ScaleByScheduleState(count=optax.safe_increment(state.count))

  return optax.GradientTransformation(init_fn, update_fn)


def group_adamw(config: ml_collections.ConfigDict) -> optax.GradientTransformation:
  """optax.adamw (scale_by_adam -> masked decay -> -learning rate), with LEV's own
  decoupled decay rate (`lev_weight_decay`) and warm-up (`lev_warmup_steps`).

  The same transformations as optax.adamw in the same chain, so the state has the same
  structure and, with LEV's values equal to the global ones, the updates are bitwise
  adamw's (tests/test_optimizer.py). Source: optax.adamw (optax 0.2.8).
  """
  o = config.optim
  lr = learning_rate_schedule(config)
  lev_lr = learning_rate_schedule(config, lev_warmup_steps(o))
  decay = add_group_decayed_weights({"lev": lev_weight_decay(o)}, o.weight_decay)
  return optax.chain(
      optax.scale_by_adam(b1=o.b1, b2=o.b2, eps=o.eps),
      optax.masked(decay, lambda p: decay_mask(p, o)),
      scale_by_group_schedule({"lev": lambda count: -lev_lr(count)},
                              lambda count: -lr(count)))


def make_clipping(optim: ml_collections.ConfigDict) -> optax.GradientTransformation:
  """The clipping of `optim.clip_mode` at `optim.clip_norm` (stateless).

  "global": optax.clip_by_global_norm over all parameters (one norm).
  "per_group": each group of `param_group` clipped by its own norm.
  "exclude_lev": one norm over every group but `lev`; `lev` clipped by its own norm.

  Raises:
    ValueError: unknown clip_mode (config.validate names the field first).
  """
  mode = optim.clip_mode
  if mode == "global":
    return optax.clip_by_global_norm(optim.clip_norm)
  if mode == "per_group":
    return clip_by_group_norm(optim.clip_norm, lambda g: g)
  if mode == "exclude_lev":
    return clip_by_group_norm(optim.clip_norm, lambda g: "lev" if g == "lev" else "rest")
  raise ValueError(f"config.optim.clip_mode = {mode!r}: expected 'global', 'per_group' "
                   "or 'exclude_lev'")


def make_optimizer(config: ml_collections.ConfigDict) -> optax.GradientTransformation:
  """clipping(clip_mode, clip_norm) -> adamw(schedule, b1, b2, eps, weight_decay, mask),
  with LEV's updates scaled by optim.lev_lr_multiplier when it is not 1, and LEV's own
  decay and warm-up (`group_adamw`) when optim.lev_weight_decay / lev_warmup_steps
  differ from the global values (else optax.adamw itself, the program of old).

  The state is `(EmptyState(), adamw state)` for every option value.
  """
  o = config.optim
  if lev_weight_decay(o) != o.weight_decay or lev_warmup_steps(o) != o.warmup_steps:
    adam = group_adamw(config)
  else:
    adam = optax.adamw(learning_rate_schedule(config), b1=o.b1, b2=o.b2, eps=o.eps,
                       weight_decay=o.weight_decay, mask=lambda p: decay_mask(p, o))
  if o.lev_lr_multiplier != 1.0:
    adam = scale_group_updates(adam, {"lev": float(o.lev_lr_multiplier)})
  return optax.chain(make_clipping(o), adam)
