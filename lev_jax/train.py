"""The train state and the pure, jitted train and eval steps, sharded over a mesh.

State (a dict pytree, saved whole by Orbax):
  params     nnx.State of float32 parameters
  opt_state  optax state (sharded/shaped like params)
  step       int32 []: optimizer steps taken
  rng        uint32 [2]: key data for stochastic parts (reserved; no dropout today)

Batches: {"inputs": int32 [B, L], "targets": int32 [B, L], "weights": float32 [B, L]},
plus "positions" and "segment_ids" int32 [B, L] when data.segment_masking is on.

`Partitioned` (T5X's "partitioner" idea) holds the mesh, the rules and the shardings of
the state and batches; the state is created directly sharded (jit with out_shardings:
no full copy on one device), and the steps are jitted with explicit in/out shardings.
Optimizer state is sharded like the parameters (optax.tree_map_params); its structure
does not depend on config.optim.clip_mode or lev_lr_multiplier (lev_jax/optimizer.py).
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import ml_collections
import optax
from flax import nnx

from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from lev_jax import attention, loss as loss_lib, sharding
from lev_jax.config import check_platform
from lev_jax.model import Decoder
from lev_jax.optimizer import (group_diagnostics, learning_rate_schedule, make_optimizer,
                               schedule_count)


def create_model(config: ml_collections.ConfigDict, seed: int | None = None) -> Decoder:
  """The initialised model; initialisation runs as one compiled program (fast on CPU)."""
  seed = config.seed if seed is None else seed
  return nnx.jit(lambda: Decoder(config, rngs=nnx.Rngs(seed)))()


def abstract_model(config: ml_collections.ConfigDict) -> Decoder:
  """The model with ShapeDtypeStruct leaves: builds any size without memory."""
  return nnx.eval_shape(lambda: Decoder(config, rngs=nnx.Rngs(config.seed)))


@dataclasses.dataclass
class Partitioned:
  """The mesh, rules and shardings of one training setup."""
  graphdef: nnx.GraphDef
  mesh: Mesh
  rules: dict
  state_sharding: dict
  batch_sharding: NamedSharding
  state_bytes: int = 0  # the parameters and the optimizer's state, all devices together

  def abstract_state(self, state_shapes) -> dict:
    """ShapeDtypeStructs carrying this setup's shardings (for Orbax restore)."""
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                        state_shapes, self.state_sharding)


def _init_state(config):
  graphdef, params = nnx.split(Decoder(config, rngs=nnx.Rngs(config.seed)), nnx.Param)
  return {"params": params, "opt_state": make_optimizer(config).init(params),
          "step": jnp.zeros((), jnp.int32),
          "rng": jax.random.key_data(jax.random.key(config.seed + 1))}


def _check_splits(config: ml_collections.ConfigDict, sizes: dict[str, int],
                  processes: int | None = None):
  """The checks `partition` and `check_job` share, on mesh axis `sizes`: every
  parameter's split (`sharding.param_specs`) and both batches (train per micro-batch,
  eval) over the batch axes and the processes (default `jax.process_count()`).

  Returns:
    (rules, graphdef, abstract params, param specs).
  Raises:
    ShardingError: a missing rule, an indivisible dimension or batch.
  """
  rules = sharding.rules_from_config(config)
  graphdef, abstract_params = nnx.split(abstract_model(config), nnx.Param)
  specs = sharding.param_specs(abstract_params, sizes, rules)
  t = config.train
  sharding.check_batch(t.global_batch_size // t.grad_accum_steps, sizes, rules,
                       "train.global_batch_size / train.grad_accum_steps", processes)
  sharding.check_batch(config.eval.batch_size, sizes, rules, "eval.batch_size", processes)
  return rules, graphdef, abstract_params, specs


def partition(config: ml_collections.ConfigDict, mesh: Mesh | None = None) -> Partitioned:
  """Shardings for `config` on `mesh` (default: config.mesh over all devices).

  Raises:
    ShardingError: impossible mesh, missing rule, or indivisible dimension / batch.
  """
  mesh = sharding.make_mesh(config.mesh) if mesh is None else mesh
  rules, graphdef, abstract_params, specs = _check_splits(config, sharding.mesh_sizes(mesh))
  param_sh = jax.tree.map(lambda s: NamedSharding(mesh, s), specs)
  replicated = NamedSharding(mesh, P())
  tx = make_optimizer(config)
  opt_shapes = jax.eval_shape(tx.init, abstract_params)
  opt_sh = optax.tree_map_params(
      tx, lambda _, s: s, opt_shapes, param_sh,
      transform_non_params=lambda _: replicated,
      is_leaf=lambda x: isinstance(x, NamedSharding))
  state_bytes = sum(int(x.size) * x.dtype.itemsize
                    for x in jax.tree.leaves((abstract_params, opt_shapes)))
  return Partitioned(graphdef, mesh, rules,
                     {"params": param_sh, "opt_state": opt_sh, "step": replicated,
                      "rng": replicated},
                     sharding.batch_sharding(mesh, rules), state_bytes)


PLATFORMS = ("cpu", "gpu", "tpu")


def check_job(config: ml_collections.ConfigDict, processes: int, devices_per_process: int,
              platform: str) -> tuple[list[int], list[int]]:
  """What `partition` checks, for a job that does not exist yet (no devices needed).

  The mesh is laid out as `make_mesh` would on `processes` x `devices_per_process`
  devices: on CPUs and GPUs each process is one DCN granule (a node), on a TPU the whole
  job is one slice (what launch/tpu.py creates). Then every parameter's split and both
  batches (train per micro-batch, eval) are checked against the mesh and the processes.

  Args:
    platform: "cpu", "gpu" or "tpu".
  Returns:
    (ici_shape, dcn_shape), each [data, fsdp, tensor].
  Raises:
    ShardingError: a mesh that does not multiply to the job's devices, DCN sizes that do
      not match its nodes / slices, a rule, dimension or batch the mesh does not fit.
    ConfigError: what the platform cannot run (config.check_platform; the attention
      kernel, attention.resolve).
  """
  if platform not in PLATFORMS:
    raise ValueError(f"platform {platform!r}: expected one of {PLATFORMS}")
  # what lev-train checks on the job's own platform (newcomer pass 19, C29-C33: a
  # float16 or splash job passed the pre-flight and died on its nodes)
  check_platform(config, platform)
  attention.resolve(config, platform)
  n = processes * devices_per_process
  ici, dcn = sharding.mesh_shapes(config.mesh, n)
  granules, kind = (1, "TPU slice") if platform == "tpu" else (processes, "process")
  if math.prod(dcn) not in (1, granules):
    raise sharding.ShardingError(
        f"config.mesh (dcn_data, dcn_fsdp, dcn_tensor) = {tuple(dcn)} spans "
        f"{math.prod(dcn)} DCN groups; this job has {granules} {kind}"
        f"{'es' if kind == 'process' and granules != 1 else ''} (one per node on CPU / GPU, "
        "one slice on TPU)")
  _check_splits(config, {a: i * d for a, i, d in zip(sharding.MESH_AXES, ici, dcn)},
                processes)
  return ici, dcn


def init_state(part: Partitioned, config: ml_collections.ConfigDict) -> dict:
  """Fresh params and optimizer state, created directly sharded (no full copy anywhere)."""
  return jax.jit(lambda: _init_state(config), out_shardings=part.state_sharding)()


def abstract_state(part: Partitioned, config: ml_collections.ConfigDict) -> dict:
  """The state's shapes, dtypes and shardings, without computing it (for a restore)."""
  return part.abstract_state(jax.eval_shape(lambda: _init_state(config)))


def create_train_state(config: ml_collections.ConfigDict, mesh: Mesh | None = None):
  """Returns (partitioned, state): fresh params and optimizer state, created sharded."""
  part = partition(config, mesh)
  return part, init_state(part, config)


def token_nll(graphdef, params, batch, train_cfg=None) -> jax.Array:
  """float32 [B, L] negative log-likelihood of each target (ids >= vocab masked), by
  train_cfg.loss_impl (lev_jax/loss.py; default: the dense loss)."""
  model = nnx.merge(graphdef, params)
  return loss_lib.token_losses(model, batch, train_cfg or loss_lib.DENSE)[0]


def _sum_loss(params, graphdef, batch, train_cfg=None, z_loss: float = 0.0):
  """(objective, (cross-entropy sum, real targets, z-loss sum)) of a batch
  (lev_jax.loss.loss_sums; default: the dense loss without z-loss)."""
  model = nnx.merge(graphdef, params)
  return loss_lib.loss_sums(model, batch, train_cfg or loss_lib.DENSE, z_loss)


def make_train_step(part: Partitioned, config: ml_collections.ConfigDict):
  """Builds `train_step(state, batch) -> (state, metrics)`: jitted, sharded, state donated.

  The global batch is split into train.grad_accum_steps micro-batches (row m of every
  group of grad_accum_steps rows goes to micro-batch m, so each device keeps its rows);
  gradients of the summed token loss are accumulated in float32 and divided by the
  total number of real target tokens, so accumulation is exact (same update as one big
  batch). Metrics (float32 scalars, replicated): loss (mean nll per real target),
  grad_norm (before clipping), update_norm (of the optimizer's update), lr, tokens
  (real targets in this step), nonfinite (1.0 when the loss, gradient norm or update
  norm was not finite: that step left params and optimizer state unchanged, the NaN
  guard; else 0.0), and per parameter group present in the model (optimizer.param_group:
  lev, embedding_table, head, backbone) grad_norm/<group> (before clipping) and
  update_ratio/<group> (rms(update) / rms(param) over the group;
  optimizer.group_diagnostics). They are computed in the step, so fetching them costs
  no extra host sync.
  """
  tx = make_optimizer(config)
  schedule = learning_rate_schedule(config)
  n_micro = config.train.grad_accum_steps
  z_loss = float(config.optim.z_loss)
  train_cfg = loss_lib.resolved_train_cfg(config, part.mesh)  # loss_impl auto resolved
  grad_fn = jax.value_and_grad(
      lambda p, mb: _sum_loss(p, part.graphdef, mb, train_cfg, z_loss), has_aux=True)

  def train_step(state, batch):
    params = state["params"]
    if n_micro == 1:
      (_, (loss_sum, n_tokens, z_sum)), grads = grad_fn(params, batch)
    else:
      micro = jax.tree.map(
          lambda x: sharding.constrain(x.reshape(-1, n_micro, *x.shape[1:]).swapaxes(0, 1),
                                       (None, "batch", "length")), batch)

      def body(carry, mb):
        (_, (l, n, z)), g = grad_fn(params, mb)
        return jax.tree.map(jnp.add, carry, (l, n, z, g)), None

      zeros = (jnp.zeros(()), jnp.zeros(()), jnp.zeros(()),
               jax.tree.map(jnp.zeros_like, params))
      (loss_sum, n_tokens, z_sum, grads), _ = jax.lax.scan(body, zeros, micro)
    denom = jnp.maximum(n_tokens, 1.0)
    grads = jax.tree.map(lambda g: g / denom, grads)
    updates, opt_state = tx.update(grads, state["opt_state"], params)
    loss, grad_norm = loss_sum / denom, optax.tree.norm(grads)
    # The NaN guard: a step with a non-finite loss, gradient or update keeps the old
    # params and optimizer state (select, exact: a finite step is bitwise unchanged).
    update_norm = optax.tree.norm(updates)
    finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm) & jnp.isfinite(update_norm)
    keep = lambda new, old: jax.tree.map(lambda n, o: jnp.where(finite, n, o), new, old)
    new_state = dict(state, params=keep(optax.apply_updates(params, updates), params),
                     opt_state=keep(opt_state, state["opt_state"]), step=state["step"] + 1)
    metrics = {"loss": loss, "grad_norm": grad_norm, "update_norm": update_norm,
               "lr": schedule(schedule_count(state["opt_state"])), "tokens": n_tokens,
               "nonfinite": 1.0 - finite.astype(jnp.float32),
               **group_diagnostics(grads, updates, params)}
    if z_loss > 0:
      metrics["z_loss"] = z_sum / denom  # mean z-loss term per real target
    return new_state, metrics

  batch_sh = part.batch_sharding  # one sharding for every [B, L] leaf of the batch
  replicated = NamedSharding(part.mesh, P())
  jitted = jax.jit(train_step, in_shardings=(part.state_sharding, batch_sh),
                   out_shardings=(part.state_sharding, replicated), donate_argnums=0)

  def step(state, batch):
    with sharding.activation_sharding(part.mesh, part.rules):
      return jitted(state, batch)

  step.lower = _lowering(jitted, part)
  return step


def _lowering(jitted, part: Partitioned):
  """`lower(*args)`: the jitted step lowered under this setup's activation rules.

  The arguments may be jax.ShapeDtypeStructs carrying shardings (`abstract_state`,
  `abstract_batch`): ahead-of-time compilation for a topology without its devices
  (lev_jax/aot.py) lowers exactly the program the trainer runs.
  """
  def lower(*args):
    with sharding.activation_sharding(part.mesh, part.rules):
      return jitted.lower(*args)
  return lower


def abstract_batch(part: Partitioned, config: ml_collections.ConfigDict,
                   batch_size: int) -> dict:
  """ShapeDtypeStructs of a [batch_size, train.seq_len] batch with the batch sharding:
  int32 inputs / targets, float32 weights, and int32 positions / segment_ids when
  data.segment_masking is on (the keys the data pipeline yields)."""
  keys = ["inputs", "targets", "weights"]
  if config.data.segment_masking:
    keys += ["positions", "segment_ids"]
  shape = (batch_size, config.train.seq_len)
  return {k: jax.ShapeDtypeStruct(shape, jnp.float32 if k == "weights" else jnp.int32,
                                  sharding=part.batch_sharding) for k in keys}


def make_eval_step(part: Partitioned, config: ml_collections.ConfigDict | None = None):
  """Builds `eval_step(params, batch) -> nll_BxL` (float32 numpy, unweighted), jitted,
  sharded; every process gets the whole result (evaluation is small). The loss is
  config.train.loss_impl's, resolved for the mesh's devices (lev_jax/loss.py `resolve`;
  no config: dense)."""
  batch_sh = part.batch_sharding
  train_cfg = None if config is None else loss_lib.resolved_train_cfg(config, part.mesh)

  def eval_step(params, batch):
    return token_nll(part.graphdef, params, batch, train_cfg)

  jitted = jax.jit(eval_step, in_shardings=(part.state_sharding["params"], batch_sh),
                   out_shardings=NamedSharding(part.mesh, P()))

  def step(params, batch):
    """batch: the whole eval batch (numpy) on every process; returns numpy [B, L]."""
    with sharding.activation_sharding(part.mesh, part.rules):
      return np.asarray(jitted(params, sharding.full_to_global(batch, part.batch_sharding)))

  step.lower = _lowering(jitted, part)
  return step
