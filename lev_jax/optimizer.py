"""AdamW with global-norm clipping and a warm-up + cosine schedule (optax).

Source: optax docs (`optax.adamw`, `optax.clip_by_global_norm`,
`optax.warmup_cosine_decay_schedule`); Loshchilov & Hutter 2019 for decoupled decay.
"""

from __future__ import annotations

import jax
import ml_collections
import optax


def learning_rate_schedule(config: ml_collections.ConfigDict) -> optax.Schedule:
  """Linear warm-up from 0 to optim.lr over warmup_steps, then cosine to lr*min_lr_ratio.

  The schedule spans train.steps optimizer steps (not micro-batches).
  """
  o = config.optim
  return optax.warmup_cosine_decay_schedule(
      init_value=0.0, peak_value=o.lr, warmup_steps=o.warmup_steps,
      decay_steps=config.train.steps, end_value=o.lr * o.min_lr_ratio)


def decay_mask(params, optim: ml_collections.ConfigDict):
  """Boolean pytree like `params`: True where weight decay applies.

  `decay_mask`: "matrices" (ndim >= 2: projections, tables, LEV codebooks and
  splines; not norms or biases), "all" or "none". Paths containing any substring in
  `optim.no_decay` are excluded in addition.
  """
  def decide(path, x):
    if optim.decay_mask == "none":
      return False
    name = jax.tree_util.keystr(path, simple=True, separator="/")
    if any(s in name for s in optim.no_decay):
      return False
    return optim.decay_mask == "all" or x.ndim >= 2
  return jax.tree_util.tree_map_with_path(decide, params)


def make_optimizer(config: ml_collections.ConfigDict) -> optax.GradientTransformation:
  """clip_by_global_norm(clip_norm) -> adamw(schedule, b1, b2, eps, weight_decay, mask)."""
  o = config.optim
  return optax.chain(
      optax.clip_by_global_norm(o.clip_norm),
      optax.adamw(learning_rate_schedule(config), b1=o.b1, b2=o.b2, eps=o.eps,
                  weight_decay=o.weight_decay, mask=lambda p: decay_mask(p, o)),
  )
