"""The train state and the pure, jitted train and eval steps.

State (a dict pytree, saved whole by Orbax):
  params     nnx.State of float32 parameters
  opt_state  optax state (sharded/shaped like params)
  step       int32 []: optimizer steps taken
  rng        uint32 [2]: key data for stochastic parts (reserved; no dropout today)

Batches: {"inputs": int32 [B, L], "targets": int32 [B, L], "weights": float32 [B, L]}.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import ml_collections
import optax
from flax import nnx

from lev_jax.model import Decoder
from lev_jax.optimizer import learning_rate_schedule, make_optimizer


def create_model(config: ml_collections.ConfigDict, seed: int | None = None) -> Decoder:
  """The initialised model; initialisation runs as one compiled program (fast on CPU)."""
  seed = config.seed if seed is None else seed
  return nnx.jit(lambda: Decoder(config, rngs=nnx.Rngs(seed)))()


def abstract_model(config: ml_collections.ConfigDict) -> Decoder:
  """The model with ShapeDtypeStruct leaves: builds any size without memory."""
  return nnx.eval_shape(lambda: Decoder(config, rngs=nnx.Rngs(config.seed)))


def create_train_state(config: ml_collections.ConfigDict):
  """Returns (graphdef, state) with freshly initialised params and optimizer state."""
  graphdef, params = nnx.split(create_model(config), nnx.Param)
  tx = make_optimizer(config)
  state = {
      "params": params,
      "opt_state": tx.init(params),
      "step": jnp.zeros((), jnp.int32),
      "rng": jax.random.key_data(jax.random.key(config.seed + 1)),
  }
  return graphdef, state


def token_nll(graphdef, params, batch) -> jax.Array:
  """float32 [B, L] negative log-likelihood of each target (ids >= vocab masked)."""
  model = nnx.merge(graphdef, params)
  logits_BxLxV = model(batch["inputs"])
  return optax.softmax_cross_entropy_with_integer_labels(logits_BxLxV, batch["targets"])


def _sum_loss(params, graphdef, batch):
  nll_BxL = token_nll(graphdef, params, batch)
  w_BxL = batch["weights"]
  return jnp.sum(nll_BxL * w_BxL), jnp.sum(w_BxL)


def make_train_step(graphdef, config: ml_collections.ConfigDict):
  """Builds `train_step(state, batch) -> (state, metrics)`, jitted, state donated.

  The global batch is split into train.grad_accum_steps micro-batches; gradients of the
  summed token loss are accumulated in float32 and divided by the total number of real
  target tokens, so accumulation is exact (same update as one big batch).
  Metrics (float32 scalars): loss (mean nll per real target), grad_norm (before
  clipping), lr, tokens (real targets in this step).
  """
  tx = make_optimizer(config)
  schedule = learning_rate_schedule(config)
  n_micro = config.train.grad_accum_steps
  grad_fn = jax.value_and_grad(_sum_loss, has_aux=True)

  def train_step(state, batch):
    params = state["params"]
    if n_micro == 1:
      (loss_sum, n_tokens), grads = grad_fn(params, graphdef, batch)
    else:
      micro = jax.tree.map(lambda x: x.reshape(n_micro, -1, *x.shape[1:]), batch)

      def body(carry, mb):
        (l, n), g = grad_fn(params, graphdef, mb)
        return jax.tree.map(jnp.add, carry, (l, n, g)), None

      zeros = (jnp.zeros(()), jnp.zeros(()), jax.tree.map(jnp.zeros_like, params))
      (loss_sum, n_tokens, grads), _ = jax.lax.scan(body, zeros, micro)
    denom = jnp.maximum(n_tokens, 1.0)
    grads = jax.tree.map(lambda g: g / denom, grads)
    updates, opt_state = tx.update(grads, state["opt_state"], params)
    new_state = dict(state, params=optax.apply_updates(params, updates),
                     opt_state=opt_state, step=state["step"] + 1)
    metrics = {"loss": loss_sum / denom, "grad_norm": optax.tree.norm(grads),
               "lr": schedule(state["step"]), "tokens": n_tokens}
    return new_state, metrics

  return jax.jit(train_step, donate_argnums=0)


def make_eval_step(graphdef):
  """Builds `eval_step(params, batch) -> nll_BxL` (float32, unweighted), jitted."""
  return jax.jit(functools.partial(token_nll, graphdef))
