"""The device mesh and the one table of logical axis rules.

Mesh axes (MaxText / T5X convention):
  data    pure data parallelism (parameters replicated)
  fsdp    data parallelism with parameters and optimizer state split (ZeRO-3 / FSDP)
  tensor  tensor (model) parallelism: heads, MLP hidden units and vocab split
Each axis has an ICI size (devices within a slice / node) and a DCN size (slices or
nodes); -1 means "whatever is left". Source: JAX docs "Distributed arrays and automatic
parallelization"; jax.experimental.mesh_utils.create_hybrid_device_mesh.

Every parameter carries `logical_axes` metadata (set in model.py, embeddings.py, lev.py)
and `constrain()` names the key activations. `LOGICAL_AXIS_RULES` below is the only
place that maps those names to mesh axes; config.mesh.rules overrides entries by name.
A logical name that no rule covers is an error, as is a sharded dimension that the mesh
does not divide. `take_rows()` is the input lookup into a table whose vocab rows the
rules split (an explicit shard_map gather + psum).
"""

from __future__ import annotations

import contextlib
import functools
import math
from typing import Sequence

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import nnx
from jax.experimental import mesh_utils
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P

MESH_AXES = ("data", "fsdp", "tensor")

# logical axis -> mesh axes it is split over (empty: replicated). The one rules table.
LOGICAL_AXIS_RULES: tuple[tuple[str, tuple[str, ...]], ...] = (
    # activations
    ("batch", ("data", "fsdp")),
    ("length", ()),
    ("act_embed", ()),
    ("act_heads", ("tensor",)),
    ("act_mlp", ("tensor",)),
    ("act_vocab", ("tensor",)),
    ("lev_rows", ("data", "fsdp", "tensor")),  # ids whose LEV rows are evaluated
    # parameters: FSDP on the model dimension, tensor parallelism on heads / mlp / vocab
    ("embed", ("fsdp",)),
    ("heads", ("tensor",)),
    ("kv_heads", ("tensor",)),
    ("head_dim", ()),
    ("mlp", ("tensor",)),
    ("vocab", ("tensor",)),
    ("layers", ()),
    # LEV: small tensors replicated; its output projection is split on `embed` above
    ("lev_coords", ()),
    ("lev_codes", ()),
    ("lev_seed", ()),
    ("lev_seed_out", ()),
    ("lev_heads", ()),
    ("lev_knots", ()),
    ("lev_rank", ()),
)


class ShardingError(ValueError):
  """An impossible mesh, a missing rule or a dimension the mesh does not divide."""


def rules_from_config(config: ml_collections.ConfigDict) -> dict[str, tuple[str, ...]]:
  """LOGICAL_AXIS_RULES with config.mesh.rules ((name, (mesh axes...)), ...) applied."""
  rules = dict(LOGICAL_AXIS_RULES)
  entries = config.mesh.rules
  expected = "expected ((logical_name, (mesh_axis, ...)), ...), e.g. (('embed', ('data', 'fsdp')),)"
  if isinstance(entries, str) or not all(
      isinstance(e, (tuple, list)) and len(e) == 2 and isinstance(e[0], str) for e in entries):
    raise ShardingError(f"config.mesh.rules = {entries!r}: {expected}")
  seen = set()
  for name, axes in entries:
    if name not in rules:
      raise ShardingError(f"config.mesh.rules: unknown logical axis {name!r}; known names: "
                          f"{', '.join(rules)}")
    if name in seen:
      raise ShardingError(f"config.mesh.rules: {name!r} is given twice")
    seen.add(name)
    axes = (axes,) if isinstance(axes, str) else tuple(axes)
    bad = [a for a in axes if a not in MESH_AXES]
    if bad:
      raise ShardingError(f"config.mesh.rules: {name!r} -> {axes}: unknown mesh axes {bad}; "
                          f"expected names from {MESH_AXES}")
    rules[name] = axes
  return rules


def _fill(sizes: list[int], total: int, what: str) -> list[int]:
  if sizes.count(-1) > 1:
    raise ShardingError(f"{what} = {tuple(sizes)}: at most one axis may be -1")
  if any(s == 0 or s < -1 for s in sizes):
    raise ShardingError(f"{what} = {tuple(sizes)}: sizes must be positive or -1")
  known = math.prod(s for s in sizes if s != -1)
  if -1 not in sizes:
    if known != total:
      raise ShardingError(f"{what} = {tuple(sizes)} has {known} devices; this job has {total}")
    return sizes
  if total % known:
    raise ShardingError(f"{what} = {tuple(sizes)} does not divide {total} devices")
  return [total // known if s == -1 else s for s in sizes]


def mesh_shapes(mesh_cfg: ml_collections.ConfigDict, n_devices: int) -> tuple[list, list]:
  """(ici_shape, dcn_shape), each [data, fsdp, tensor], with -1 filled in.

  Raises:
    ShardingError: naming the sizes when they cannot multiply to n_devices.
  """
  ici = [mesh_cfg.data, mesh_cfg.fsdp, mesh_cfg.tensor]
  dcn = [mesh_cfg.dcn_data, mesh_cfg.dcn_fsdp, mesh_cfg.dcn_tensor]
  ici_what, dcn_what = "config.mesh (data, fsdp, tensor)", \
      "config.mesh (dcn_data, dcn_fsdp, dcn_tensor)"
  if -1 in dcn:
    if -1 in ici:
      raise ShardingError(f"{ici_what} = {tuple(ici)} and {dcn_what} = {tuple(dcn)}: only "
                          "one of the two may contain -1")
    ici = _fill(ici, math.prod(ici), ici_what)
    if n_devices % math.prod(ici):
      raise ShardingError(f"{ici_what} = {tuple(ici)} does not divide {n_devices} devices")
    dcn = _fill(dcn, n_devices // math.prod(ici), dcn_what)
  else:
    dcn = _fill(dcn, math.prod(dcn), dcn_what)
    if n_devices % math.prod(dcn):
      raise ShardingError(f"{dcn_what} = {tuple(dcn)} does not divide {n_devices} devices")
    ici = _fill(ici, n_devices // math.prod(dcn), ici_what)
  return ici, dcn


def make_mesh(mesh_cfg: ml_collections.ConfigDict, devices: Sequence | None = None) -> Mesh:
  """The (data, fsdp, tensor) mesh over `devices` (default: all devices of the job).

  With DCN sizes > 1 (several TPU slices or GPU nodes) the devices are laid out so that
  each DCN axis crosses slices and each ICI axis stays within one.
  """
  devices = list(jax.devices() if devices is None else devices)
  ici, dcn = mesh_shapes(mesh_cfg, len(devices))
  if math.prod(dcn) > 1:
    try:
      grid = mesh_utils.create_hybrid_device_mesh(
          ici, dcn, devices, process_is_granule=devices[0].platform != "tpu")
    except ValueError as e:  # e.g. DCN sizes that do not match the slices / hosts
      raise ShardingError(f"config.mesh DCN sizes {tuple(dcn)} (ICI {tuple(ici)}) do not fit "
                          f"this job's slices / hosts: {e}") from e
  else:
    grid = mesh_utils.create_device_mesh(ici, devices, allow_split_physical_axes=True)
  return Mesh(grid, MESH_AXES, axis_types=(AxisType.Auto,) * len(MESH_AXES))


def spec_for(names: Sequence[str | None], shape: Sequence[int], mesh_sizes: dict[str, int],
             rules: dict[str, tuple[str, ...]], what: str, strict: bool = True) -> P:
  """PartitionSpec of an array with logical axis `names`.

  A mesh axis is used at most once (first dimension wins). With strict=True, a
  dimension that its mesh axes do not divide raises; otherwise that dimension is left
  unsplit (used for activations).

  Raises:
    ShardingError: a name without a rule, or (strict) an indivisible dimension.
  """
  if len(names) != len(shape):
    raise ShardingError(f"{what}: logical axes {tuple(names)} do not match shape {tuple(shape)}")
  used, spec = set(), []
  for name, size in zip(names, shape):
    if name is None:
      spec.append(None)
      continue
    if name not in rules:
      raise ShardingError(f"{what}: logical axis {name!r} has no rule in LOGICAL_AXIS_RULES "
                          "(lev_jax/sharding.py) or config.mesh.rules")
    axes = tuple(a for a in rules[name] if a not in used and mesh_sizes.get(a, 1) > 1)
    n = math.prod(mesh_sizes[a] for a in axes)
    if axes and size % n:
      if strict:
        raise ShardingError(f"{what}: dimension {name!r} of size {size} is not divisible by "
                            f"mesh axes {axes} of total size {n}")
      axes = ()
    used.update(axes)
    spec.append(None if not axes else axes[0] if len(axes) == 1 else axes)
  return P(*spec)


def param_logical_axes(path, var: nnx.Variable) -> tuple[str, ...]:
  """The logical axis names of every dimension of a parameter, one per dimension.

  Args:
    path: the parameter's key path in nnx.state(model, nnx.Param) (or its "/"-joined
      string), e.g. "blocks/attn/wq".
    var: the nnx.Variable (its `logical_axes` metadata names the unstacked dims).
  Returns:
    `logical_axes`, with "layers" first when model.scan_layers stacked the parameter
    (one more dimension than names, under `blocks/`).
  Raises:
    ShardingError: the parameter has no `logical_axes` metadata.
  """
  if not isinstance(path, str):
    path = jax.tree_util.keystr(tuple(path), simple=True, separator="/")
  names = var.get_metadata().get("logical_axes")
  if names is None:
    raise ShardingError(f"parameter {path} has no logical_axes metadata: every "
                        "parameter needs one")
  names = tuple(names)
  if len(names) + 1 == len(var.shape) and "/blocks/" in f"/{path}":
    names = ("layers", *names)  # stacked by model.scan_layers
  return names


def param_specs(model_or_state, mesh_sizes: dict[str, int], rules) -> nnx.State:
  """A State like nnx.state(model, nnx.Param) whose leaves are PartitionSpecs.

  Raises:
    ShardingError: a parameter without `logical_axes` metadata or a rule, or a
      dimension the mesh does not divide (the message names the parameter path).
  """
  state = (model_or_state if isinstance(model_or_state, nnx.State)
           else nnx.state(model_or_state, nnx.Param))

  def one(path, var):
    what = "parameter " + jax.tree_util.keystr(path, simple=True, separator="/")
    return var.replace(spec_for(param_logical_axes(path, var), var.shape, mesh_sizes,
                                rules, what))

  return jax.tree_util.tree_map_with_path(one, state,
                                          is_leaf=lambda x: isinstance(x, nnx.Variable))


def mesh_sizes(mesh: Mesh) -> dict[str, int]:
  return dict(zip(mesh.axis_names, mesh.devices.shape))


# --- activations -------------------------------------------------------------------

_ACTIVE: list = []  # [(mesh, rules)] while a train/eval step is traced


@contextlib.contextmanager
def activation_sharding(mesh: Mesh, rules: dict[str, tuple[str, ...]]):
  """Within this context, `constrain()` pins activations to the rules on `mesh`."""
  _ACTIVE.append((mesh, rules))
  try:
    yield
  finally:
    _ACTIVE.pop()


def constrain(x: jax.Array, names: Sequence[str | None]) -> jax.Array:
  """with_sharding_constraint by logical names; a no-op outside activation_sharding."""
  if not _ACTIVE:
    return x
  mesh, rules = _ACTIVE[-1]
  spec = spec_for(names, x.shape, mesh_sizes(mesh), rules, "activation", strict=False)
  return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, spec))


def active() -> tuple[Mesh, dict] | None:
  """(mesh, rules) of the innermost `activation_sharding`, or None outside one."""
  return _ACTIVE[-1] if _ACTIVE else None


def split_count(name: str) -> int:
  """How many ways the active rules split the logical axis `name` (the product of the
  sizes of its mesh axes); 1 outside `activation_sharding` or without a rule."""
  if active() is None:
    return 1
  mesh, rules = active()
  sizes = mesh_sizes(mesh)
  return math.prod(sizes.get(a, 1) for a in rules.get(name, ()))


def _axes(entry) -> tuple[str, ...]:
  """The mesh axes of one PartitionSpec entry (None, "a" or ("a", "b"))."""
  return () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)


def take_rows(table_VxD: jax.Array, ids: jax.Array, dtype=None,
              names: tuple[str, str] = ("vocab", "embed"), grad_dtype=None) -> jax.Array:
  """`jnp.take(table_VxD, ids, axis=0).astype(dtype)` for a table whose rows may be split
  over the mesh.

  Outside `activation_sharding`, or when the rules split the table's rows (logical axis
  `names[0]`) over no mesh axis of size > 1, this is the plain gather (with D split
  over FSDP, XLA gathers each device's D slice for all ids and redistributes with an
  all-to-all). Otherwise it is a shard_map: each device keeps its [V/n, D/m] block of
  the table (n, m = product of the vocab / embed mesh axes), gathers the ids that fall
  in its V/n rows, writes zeros for the others, and a psum over the vocab axes adds the
  n partial results; the caller's sharding constraint then redistributes D.
  Cost per step: an all-reduce over the vocab axes of each device's output block,
  B*L*D / (batch axes x embed axes, outside the vocab axes) elements, and int32 ids
  all-gathered over the axes that split both the batch and the table; no table is
  gathered, and the gradient is a local scatter-add into each device's block, summed
  over the batch axes that the table does not use. The alternatives cost more at scale
  (V = 200k, D = 2048): XLA's own gather of a vocab-split table (which it reports as an
  "involuntary full rematerialization") or an explicit all-gather replicates the table
  on every device, 800 MB in bfloat16; a one-hot matmul costs 2*B*L*V*D FLOPs.

  Args:
    table_VxD: [V, D] rows, with logical axes `names` (looked up in the active rules;
      a mesh axis that does not divide its dimension leaves it unsplit).
    ids: int [B, ...] row indices in [0, V); B is split like the `batch` rule where the
      mesh divides it. In the shard_map an id outside [0, V) gives a zero row (the
      plain gather gives NaN).
    dtype: dtype of the result, cast before the psum (bfloat16 halves the traffic);
      None keeps the table's.
    names: logical axes of the table's two dimensions.
    grad_dtype: None (default): the table's gradient is the float32 scatter-add of the
      rows' cotangents (autodiff of the gather). A narrower dtype (config.model.
      embedding_grad_dtype = bfloat16): the rows are gathered from the table cast to
      `dtype` (the same values) and the float32 scatter-add is rounded once to
      `grad_dtype` (`gather_rounding_grad`).
  Returns:
    [*ids.shape, D] in `dtype`: bitwise the plain gather's values (each output element is
    one table element plus zeros).

  Source: JAX docs "Manual parallelism with shard_map" (jax.shard_map, jax.lax.psum,
  jax.lax.axis_index).
  """
  dtype = table_VxD.dtype if dtype is None else dtype
  if _ACTIVE:
    mesh, rules = _ACTIVE[-1]
    sizes = mesh_sizes(mesh)
    vocab_axes, embed_axes = map(_axes, spec_for(names, table_VxD.shape, sizes, rules, "table",
                                                 strict=False))
  rounding = grad_dtype is not None and jnp.dtype(grad_dtype) != table_VxD.dtype
  gather = ((lambda t, i: gather_rounding_grad(t, i, jnp.dtype(dtype), jnp.dtype(grad_dtype)))
            if rounding else (lambda t, i: jnp.take(t, i, axis=0).astype(dtype)))
  if not _ACTIVE or not vocab_axes:
    return gather(table_VxD, ids)
  batch = _axes(spec_for(("batch",) + (None,) * (ids.ndim - 1), ids.shape, sizes, rules, "ids",
                         strict=False)[0])
  batch = tuple(a for a in batch if a not in vocab_axes + embed_axes) or None
  rows_V = table_VxD.shape[0] // math.prod(sizes[a] for a in vocab_axes)

  def local(table_vxd, ids_local):
    local_ids = ids_local - jax.lax.axis_index(vocab_axes) * rows_V
    mine = (local_ids >= 0) & (local_ids < rows_V)
    rows = gather(table_vxd, jnp.where(mine, local_ids, 0))
    return jax.lax.psum(jnp.where(mine[..., None], rows, jnp.zeros((), dtype)), vocab_axes)

  ids_spec = (batch,) + (None,) * (ids.ndim - 1)
  table_spec = P(vocab_axes, embed_axes or None)
  return jax.shard_map(local, mesh=mesh, in_specs=(table_spec, P(*ids_spec)),
                       out_specs=P(*ids_spec, embed_axes or None))(table_VxD, ids)


def map_rows(fn, rows: Sequence[jax.Array], replicated: Sequence = (),
             name: str = "lev_rows") -> jax.Array:
  """`fn(*rows, *replicated)` run by each device on its share of the rows.

  For computations XLA cannot partition itself (Pallas / Mosaic kernels): axis 0 of
  every `rows` array is split over the mesh axes of the logical axis `name` (padded
  with zero rows to a multiple of their size), the `replicated` arguments are whole on
  every device, and the [rows, ...] result comes back split the same way. Gradients of
  the replicated arguments are the sum of every device's contribution (shard_map's
  transpose of an unsplit input). Outside `activation_sharding`, or when the rule
  splits over no mesh axis of size > 1, this is `fn` itself.

  Args:
    fn: a function of arrays whose rows are independent; returns one array [N, ...].
    rows: arrays with the same leading size N.
    replicated: arrays (or None) every device needs whole (parameters).
  Returns:
    fn's result, [N, ...].

  Source: JAX docs "Manual parallelism with shard_map" (jax.shard_map).
  """
  if not _ACTIVE:
    return fn(*rows, *replicated)
  mesh, rules = _ACTIVE[-1]
  sizes = mesh_sizes(mesh)
  if name not in rules:
    raise ShardingError(f"map_rows: logical axis {name!r} has no rule")
  axes = tuple(a for a in rules[name] if sizes.get(a, 1) > 1)
  if not axes:
    return fn(*rows, *replicated)
  n, shards = rows[0].shape[0], math.prod(sizes[a] for a in axes)
  pad = -n % shards
  if pad:
    rows = [jnp.pad(x, [(0, pad)] + [(0, 0)] * (x.ndim - 1)) for x in rows]
  row_specs = tuple(P(axes, *([None] * (x.ndim - 1))) for x in rows)
  rep_specs = tuple(None if x is None else P() for x in replicated)
  out_ndim = jax.eval_shape(fn, *rows, *replicated).ndim
  # check_vma=False: a pallas_call's output carries no varying-axes type.
  out = jax.shard_map(fn, mesh=mesh, in_specs=(*row_specs, *rep_specs),
                      out_specs=P(axes, *([None] * (out_ndim - 1))),
                      check_vma=False)(*rows, *replicated)
  return out[:n] if pad else out


# --- host data -> global arrays ----------------------------------------------------

def batch_sharding(mesh: Mesh, rules) -> NamedSharding:
  """Sharding of [B, L] token batches: B split over the `batch` rule's axes."""
  axes = tuple(a for a in rules["batch"] if mesh_sizes(mesh).get(a, 1) > 1)
  return NamedSharding(mesh, P(axes or None, None))


def check_batch(global_batch: int, sizes: dict[str, int], rules, what: str,
                processes: int | None = None):
  """Raises ShardingError unless `global_batch` divides over the batch axes and hosts.

  Args:
    sizes: mesh axis sizes, e.g. `mesh_sizes(mesh)`.
    processes: the job's process count (default `jax.process_count()`; given by a
      pre-flight check that runs before any JAX backend exists).
  """
  axes = [a for a in rules["batch"] if sizes.get(a, 1) > 1]
  n = math.prod(sizes[a] for a in axes)
  if global_batch % n:
    raise ShardingError(f"{what} is {global_batch}, not divisible by the batch mesh axes "
                        f"{tuple(axes)} of total size {n}")
  processes = jax.process_count() if processes is None else processes
  if global_batch % processes:
    raise ShardingError(f"{what} is {global_batch}, not divisible by the "
                        f"{processes} processes")


def to_global(local_batch: dict, sharding: NamedSharding) -> dict:
  """This process's rows of a batch -> global jax.Arrays (each host feeds its share)."""
  return {k: jax.make_array_from_process_local_data(sharding, np.asarray(v))
          for k, v in local_batch.items()}


def full_to_global(full_batch: dict, sharding: NamedSharding) -> dict:
  """A batch that every process holds whole (eval) -> global jax.Arrays."""
  return {k: jax.make_array_from_callback(np.shape(v), sharding,
                                          lambda idx, v=v: np.asarray(v)[idx])
          for k, v in full_batch.items()}


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def gather_rounding_grad(table_VxD: jax.Array, ids: jax.Array, dtype, grad_dtype) -> jax.Array:
  """`jnp.take(table_VxD, ids, axis=0).astype(dtype)`, its gradient rounded once.

  Forward: the rows of the table cast to `dtype` (bitwise the rows cast after the
  gather). Backward: the float32 scatter-add of the cotangents into a zero [V, D] table
  (autodiff's gradient of the gather, exactly), rounded once to `grad_dtype`, returned in
  the table's dtype. Each cotangent row is already a `dtype` value (the activations'
  dtype), so the rounding adds at most one such error per table element.

  Why: XLA:TPU stores a float32 [V, D / fsdp] table shard column-major when D / fsdp is
  not a multiple of 128 (less padding), while its gather and scatter-add want rows: the
  plain gather then transposes the float32 table, its gradient and both Adam moments every
  step. Gathered from the compute-dtype cast and rounded to it, the only transposes left
  are of two compute-dtype copies (what MaxText's embedding lookup compiles to).
  `python benchmarks/maxtext_compare.py` (docs/results.md) measures the effect.

  Args:
    table_VxD: [V, D] float (the parameter).
    ids: int [...] row indices; out-of-range ids follow jnp.take's default mode.
    dtype: the result's dtype (the compute dtype).
    grad_dtype: the dtype the table's gradient is rounded to.
  Returns:
    [*ids.shape, D] in `dtype`.
  Source: JAX docs "Custom derivative rules" (jax.custom_vjp).
  """
  return jnp.take(table_VxD.astype(dtype), ids, axis=0)


def _gather_fwd(table_VxD, ids, dtype, grad_dtype):
  rows = gather_rounding_grad(table_VxD, ids, dtype, grad_dtype)
  return rows, (ids, jax.ShapeDtypeStruct(table_VxD.shape, table_VxD.dtype))


def _gather_bwd(dtype, grad_dtype, residuals, g_rows):
  ids, table = residuals
  zeros_VxD = jnp.zeros(table.shape, jnp.float32)
  _, transpose = jax.vjp(lambda t: jnp.take(t, ids, axis=0), zeros_VxD)
  g_VxD = transpose(g_rows.astype(jnp.float32))[0]
  return g_VxD.astype(grad_dtype).astype(table.dtype), np.zeros(ids.shape, jax.dtypes.float0)


gather_rounding_grad.defvjp(_gather_fwd, _gather_bwd)
