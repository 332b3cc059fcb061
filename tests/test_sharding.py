"""Mesh, logical axis rules, golden PartitionSpecs, and 1-device == 8-device training."""

import functools
import json
import math
import os
import re
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

from conftest import run_on_8_devices
import conftest

# Two layers here: what these tests check depends on the layer stack.
tiny_config = functools.partial(conftest.tiny_config, n_layers=2)
from lev_jax import sharding
from lev_jax.config import ConfigError
from lev_jax.sharding import ShardingError
from lev_jax.train import abstract_model
from lev_jax.experiments import experiments_dir, load_experiment

HERE = Path(__file__).resolve().parent
GOLDEN = HERE / "golden"
# name: (data, fsdp, tensor) of standard meshes (v5p-16 / v5p-128 / 2 x 64-chip slices)
MESHES = {"fsdp8": (1, 8, 1), "fsdp64_tp2": (1, 64, 2), "dp2_fsdp16_tp4": (2, 16, 4)}
# 1-device == 8-device training: each pure axis once, and all three at once with LEV
# (compiles dominate that test).
# (2, 2, 2) splits every axis at once; it subsumes the pure data-parallel (8, 1, 1) case.
EQUIVALENCE_MESHES = {"tied": ((1, 8, 1), (1, 1, 8)), "lev": ((2, 2, 2),)}


def _ladder():
  return load_experiment(experiments_dir() / "ladder.py")


def test_mesh_sizes_fill_and_errors():
  m = tiny_config().mesh
  assert sharding.mesh_shapes(m, 8) == ([1, 8, 1], [1, 1, 1])
  m.data, m.fsdp, m.tensor = 2, -1, 2
  assert sharding.mesh_shapes(m, 8) == ([2, 2, 2], [1, 1, 1])
  m.dcn_data = 2
  assert sharding.mesh_shapes(m, 16) == ([2, 2, 2], [2, 1, 1])
  m.fsdp, m.dcn_data = 2, -1
  assert sharding.mesh_shapes(m, 32) == ([2, 2, 2], [4, 1, 1])
  m.fsdp, m.dcn_data = 3, 1
  with pytest.raises(sharding.ShardingError, match=r"\(2, 3, 2\) has 12 devices; this job has 8"):
    sharding.mesh_shapes(m, 8)
  m.fsdp, m.data = -1, 3
  with pytest.raises(sharding.ShardingError, match=r"\(3, -1, 2\) does not divide 8 devices"):
    sharding.mesh_shapes(m, 8)
  m.fsdp, m.data = -1, -1
  with pytest.raises(sharding.ShardingError, match="at most one axis may be -1"):
    sharding.mesh_shapes(m, 8)
  m.data, m.fsdp, m.tensor = 2, 2, 2
  with pytest.raises(sharding.ShardingError, match="has 8 devices; this job has 4"):
    sharding.mesh_shapes(m, 4)


def test_spec_rules_missing_rule_and_indivisible_dimension():
  rules = dict(sharding.LOGICAL_AXIS_RULES)
  sizes = {"data": 2, "fsdp": 4, "tensor": 2}
  assert sharding.spec_for(("embed", "mlp"), (64, 32), sizes, rules, "w") == jax.P("fsdp", "tensor")
  assert sharding.spec_for(("batch", "length"), (8, 5), sizes, rules, "x") == \
      jax.P(("data", "fsdp"), None)
  with pytest.raises(sharding.ShardingError, match="w: logical axis 'experts' has no rule"):
    sharding.spec_for(("experts", "embed"), (4, 64), sizes, rules, "w")
  with pytest.raises(sharding.ShardingError, match="'mlp' of size 33 is not divisible by mesh "
                     r"axes \('tensor',\) of total size 2"):
    sharding.spec_for(("embed", "mlp"), (64, 33), sizes, rules, "w")
  # Activations are left unsplit where the mesh does not divide them.
  assert sharding.spec_for(("batch",), (3,), sizes, rules, "x", strict=False) == jax.P(None)


def test_batch_that_the_mesh_does_not_divide_names_the_sizes():
  rules = dict(sharding.LOGICAL_AXIS_RULES)
  sharding.check_batch(16, {"data": 2, "fsdp": 4, "tensor": 2}, rules, "train.global_batch_size")
  with pytest.raises(sharding.ShardingError, match=r"train.global_batch_size is 12, not "
                     r"divisible by the batch mesh axes \('data', 'fsdp'\) of total size 8"):
    sharding.check_batch(12, {"data": 2, "fsdp": 4, "tensor": 2}, rules, "train.global_batch_size")


def test_config_rules_override_by_name():
  c = tiny_config()
  c.mesh.rules = (("embed", ("data", "fsdp")), ("vocab", ()))
  rules = sharding.rules_from_config(c)
  assert rules["embed"] == ("data", "fsdp") and rules["vocab"] == () and rules["mlp"] == ("tensor",)
  c.mesh.rules = (("embed", ("pipeline",)),)
  with pytest.raises(sharding.ShardingError, match="unknown mesh axes"):
    sharding.rules_from_config(c)
  c.mesh.rules = (("embedd", ("data",)),)
  with pytest.raises(sharding.ShardingError, match="unknown logical axis 'embedd'; known"):
    sharding.rules_from_config(c)
  c.mesh.rules = (("embed", ("data",)), ("embed", ()))
  with pytest.raises(sharding.ShardingError, match="'embed' is given twice"):
    sharding.rules_from_config(c)
  c.mesh.rules = tuple("garbage")  # what --config.mesh.rules=garbage becomes
  with pytest.raises(sharding.ShardingError, match=r"expected \(\(logical_name"):
    sharding.rules_from_config(c)


def test_every_parameter_has_logical_axes_and_the_tied_table_is_one_spec():
  for embedding in ("tied", "untied", "lev"):
    c = tiny_config(embedding)
    c.model.n_heads = c.model.n_kv_heads = 4
    specs = sharding.param_specs(abstract_model(c), {"data": 1, "fsdp": 4, "tensor": 2},
                                 sharding.rules_from_config(c))
    flat = {jax.tree_util.keystr(p, simple=True, separator="/"): s
            for p, s in jax.tree_util.tree_flatten_with_path(specs)[0]}
    assert flat["blocks/0/attn/wq/value"] == jax.P("fsdp", "tensor", None)
    assert flat["blocks/0/mlp/w_down/value"] == jax.P("tensor", "fsdp")
    if embedding == "tied":
      assert flat["embedding/table/value"] == jax.P("tensor", "fsdp")
    else:
      assert flat["embedding/head/value"] == jax.P("fsdp", "tensor")
    if embedding == "lev":
      assert flat["embedding/lev/spline_delta/value"] == jax.P(None, None, None, None)
      assert flat["embedding/lev/out_proj/value"] == jax.P(None, None, "fsdp")


def test_scanned_layers_get_a_replicated_layers_axis():
  c = tiny_config("lev")
  c.model.scan_layers = True
  specs = sharding.param_specs(abstract_model(c), {"data": 1, "fsdp": 4, "tensor": 2},
                               sharding.rules_from_config(c))
  assert specs["blocks"]["attn"]["wq"].get_value() == jax.P(None, "fsdp", "tensor", None)


def golden_specs(config, mesh) -> dict:
  sizes = dict(zip(sharding.MESH_AXES, mesh))
  specs = sharding.param_specs(abstract_model(config), sizes, sharding.rules_from_config(config))
  return {jax.tree_util.keystr(p, simple=True, separator="/"): [
      s if s is None or isinstance(s, str) else list(s) for s in spec]
      for p, spec in jax.tree_util.tree_flatten_with_path(specs)[0]}


@pytest.mark.parametrize("mesh", list(MESHES))
@pytest.mark.parametrize("variant", ["tied_200m", "leviathan_200m", "tied_400m", "leviathan_400m",
                                     "tied_800m", "leviathan_800m", "tied_1.2b", "leviathan_1.2b"])
def test_golden_sharding(variant, mesh):
  """PartitionSpec of every parameter, checked in: a rules change shows up in review.

  Regenerate after an intended change: LEV_JAX_UPDATE_GOLDEN=1 pytest tests/test_sharding.py
  """
  got = golden_specs(_ladder().get_config(variant), MESHES[mesh])
  path = GOLDEN / f"sharding_{variant}_{mesh}.json"
  if os.environ.get("LEV_JAX_UPDATE_GOLDEN"):
    path.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
  assert got == json.loads(path.read_text()), f"{path.name} differs: rules or model changed"


# --- 1 device vs 8 simulated devices (in a subprocess: the device count is fixed at import)

# The 8-device tests share one subprocess (each python start-up with jax and lev_jax
# imported is ~3 CPU-s): the xdist_group keeps them on one pytest-xdist worker
# (pyproject: --dist loadgroup), which builds the module fixture once.
EIGHT_DEVICES = pytest.mark.xdist_group("sharding_8_devices")
# Printed to stderr before each part of the subprocess's work: a test reads the XLA log
# lines of its own compiles.
STDERR_PART = "=== lev_jax test part: "


@pytest.fixture(scope="module")
def eight_device_results() -> tuple[dict, dict]:
  """({part: its JSON result}, {part: its stderr}) of one run of `_eight_device_worker`."""
  results, stderr = run_on_8_devices(__file__)
  parts = re.split("^" + re.escape(STDERR_PART) + r"(\S+)\n", stderr, flags=re.M)[1:]
  return results, dict(zip(parts[::2], parts[1::2]))


def _eight_device_worker():
  """Every 8-device part in one process, one JSON line: {part: its result}."""
  results = {}
  for part, work in [*((f"lookup_{g}", functools.partial(_lookup_worker, g))
                       for g in LOOKUP_CASES), ("equivalence", _equivalence_worker)]:
    print(STDERR_PART + part, file=sys.stderr, flush=True)
    results[part] = work()
  print(json.dumps(results))


def _equivalence_worker():
  from lev_jax.train import create_train_state, make_train_step
  results = {}
  rng = np.random.default_rng(0)
  batches = [{"inputs": rng.integers(0, 300, (8, 16)).astype(np.int32),
              "targets": rng.integers(0, 300, (8, 16)).astype(np.int32),
              "weights": np.ones((8, 16), np.float32)} for _ in range(3)]
  cases = [(e, shape) for e, shapes in EQUIVALENCE_MESHES.items()
           for shape in ((1, 1, 1), *shapes)]
  for embedding, shape in cases:
    c = tiny_config(embedding)
    if shape != (1, 1, 1):  # the chunked loss; Leviathan: 4 token x 3 vocab chunks
      # (recomputing backward), tied: 4 token chunks over the whole vocab (gradient
      # made in the forward pass)
      c.train.loss_impl, c.train.loss_token_chunk, c.train.loss_vocab_chunk = (
          "chunked", 32, 128 if embedding == "lev" else 0)
    c.model.n_heads = c.model.n_kv_heads = 8
    c.model.head_dim = 4
    c.model.n_layers = 1  # every layer is split alike; one compiles faster on 8 devices
    c.train.global_batch_size = 8
    c.eval.batch_size = 8
    c.mesh.data, c.mesh.fsdp, c.mesh.tensor = shape
    devices = jax.devices()[:int(np.prod(shape))]
    mesh = sharding.make_mesh(c.mesh, devices)
    part, state = create_train_state(c, mesh)
    step = make_train_step(part, c)
    losses, grad_norms = [], []
    for b in batches:
      state, m = step(state, sharding.to_global(b, part.batch_sharding))
      losses.append(float(m["loss"]))
      grad_norms.append({k: float(v) for k, v in m.items() if k.startswith("grad_norm")})
    wq = state["params"]["blocks"][0]["attn"]["wq"][...]
    results[f"{embedding}{shape}"] = {
        "losses": losses, "grad_norms": grad_norms, "wq_spec": str(wq.sharding.spec),
        "wq_devices": len(wq.sharding.device_set),
        "params": [np.asarray(p, np.float64).ravel()[:64].tolist()
                   for p in jax.tree.leaves(state["params"])]}
  return results


@EIGHT_DEVICES
def test_one_device_and_eight_device_meshes_give_the_same_losses(eight_device_results):
  """3 steps of tied and Leviathan on 8-device meshes (EQUIVALENCE_MESHES) vs 1 device:
  the 8-device runs use the chunked loss (lev_jax/loss.py; Leviathan 4 token x 3 vocab
  chunks of the split head, tied 4 token chunks over the whole vocab), the 1-device
  runs the dense loss. Each step's loss and gradient norms (the whole and each
  parameter group's, before clipping), and the parameters after the 3 steps.

  Tolerances: losses and gradient norms rtol 2e-5 (the same float32 math, with
  reductions split across devices in a different order); parameters rtol 1e-4, atol
  1e-6 (three Adam updates divide by the gradients' square roots).
  """
  results = eight_device_results[0]["equivalence"]
  for embedding, shapes in EQUIVALENCE_MESHES.items():
    ref = results[f"{embedding}(1, 1, 1)"]
    assert ref["losses"][-1] < ref["losses"][0]
    for shape in map(str, shapes):
      got, where = results[f"{embedding}{shape}"], f"{embedding} {shape}"
      np.testing.assert_allclose(got["losses"], ref["losses"], rtol=2e-5, err_msg=where)
      assert [sorted(g) for g in got["grad_norms"]] == [sorted(g) for g in ref["grad_norms"]]
      for step, (g, r) in enumerate(zip(got["grad_norms"], ref["grad_norms"])):
        for name in r:
          np.testing.assert_allclose(g[name], r[name], rtol=2e-5,
                                     err_msg=f"{where} step {step + 1} {name}")
      for p, r in zip(got["params"], ref["params"], strict=True):
        np.testing.assert_allclose(p, r, rtol=1e-4, atol=1e-6, err_msg=where)
      assert got["wq_devices"] == 8
  assert results["tied(1, 8, 1)"]["wq_spec"] == str(jax.P("fsdp", None, None))
  assert results["lev(2, 2, 2)"]["wq_spec"] == str(jax.P("fsdp", "tensor", None))


LOOKUP_CASES = {  # embedding, config.mesh.rules, compute dtype
    "tables": [("tied", (), "float32"), ("untied", (), "bfloat16"),
               ("tied", (("vocab", ("fsdp", "tensor")),), "float32")],  # vocab axes split B
    "lev": [("lev", (), "float32")]}  # table mode


def _lookup_worker(group: str):
  """Input lookups and their gradients on a (2, 2, 2) mesh vs one device (largest
  difference relative to the largest magnitude); for "tables", also one tied train step
  compiled (for its XLA log; from the state's shapes, nothing run)."""
  import jax.numpy as jnp
  from flax import nnx
  from jax.sharding import NamedSharding
  from lev_jax.embeddings import make_embedding
  from lev_jax.train import abstract_batch, abstract_state, make_train_step, partition
  rng = np.random.default_rng(0)
  ids_BxL = rng.integers(0, 384, (8, 16)).astype(np.int32)  # padded ids included
  w_BxLxD = rng.normal(size=(8, 16, 32)).astype(np.float32)
  rel = lambda a, b: float(jnp.max(jnp.abs(a.astype(jnp.float32) - b.astype(jnp.float32)))
                           / jnp.maximum(jnp.max(jnp.abs(a.astype(jnp.float32))), 1e-30))
  results = {}
  for kind, rules, dtype in LOOKUP_CASES[group]:
    c = tiny_config(kind, mode="table")
    c.mesh.rules = rules
    emb = make_embedding(c.model, c.lev, rngs=nnx.Rngs(0), dtype=jnp.dtype(dtype),
                         param_dtype=jnp.float32)
    graphdef, params = nnx.split(emb, nnx.Param)
    embed = lambda p, ids: nnx.merge(graphdef, p).embed(ids)
    loss = lambda p, ids: jnp.sum(embed(p, ids).astype(jnp.float32) * w_BxLxD)
    # A new jit per call: a jit traced outside activation_sharding would be reused.
    fns = lambda: jax.jit(lambda p, ids: (embed(p, ids), jax.grad(loss)(p, ids)))
    ref = fns()(params, ids_BxL)
    c.mesh.data, c.mesh.fsdp, c.mesh.tensor = 2, 2, 2
    mesh, rule_map = sharding.make_mesh(c.mesh), sharding.rules_from_config(c)
    specs = sharding.param_specs(params, sharding.mesh_sizes(mesh), rule_map)
    params = jax.device_put(params, jax.tree.map(lambda s: NamedSharding(mesh, s), specs))
    ids = jax.device_put(ids_BxL, sharding.batch_sharding(mesh, rule_map))
    with sharding.activation_sharding(mesh, rule_map):
      got = fns()(params, ids)
    grad_errs = jax.tree.leaves(jax.tree.map(rel, ref[1], got[1]))
    results[f"{kind} {rules} {dtype}"] = {"rows": rel(ref[0], got[0]), "grads": max(grad_errs)}
  if group == "tables":
    c = tiny_config("tied")
    c.model.n_heads = c.model.n_kv_heads = 8
    c.model.head_dim = 4
    c.model.n_layers = 1  # every layer is split alike; the table's lookup is the question
    c.train.global_batch_size = c.eval.batch_size = 8
    c.mesh.data, c.mesh.fsdp, c.mesh.tensor = 2, 2, 2
    part = partition(c, sharding.make_mesh(c.mesh))
    make_train_step(part, c).lower(abstract_state(part, c),
                                   abstract_batch(part, c, 8)).compile()
  return results


def test_rounded_lookup_gradient_is_the_float32_scatter_add_rounded_once():
  """model.embedding_grad_dtype = bfloat16 (sharding.gather_rounding_grad): the rows are
  bitwise the plain lookup's; the table's gradient is autodiff's float32 scatter-add
  rounded once to bfloat16 (not summed in bfloat16, as a gather from the cast table
  would: ids repeat here), through the tied embedding built from a config."""
  import jax.numpy as jnp
  from flax import nnx
  from lev_jax.embeddings import make_embedding
  c = tiny_config("tied")
  c.model.dtype = "bfloat16"
  c.model.embedding_grad_dtype = "bfloat16"
  ids_BxL = jnp.asarray(np.random.default_rng(0).integers(0, 7, (4, 64)), jnp.int32)
  w_BxLxD = jnp.asarray(np.random.default_rng(1).normal(size=(4, 64, c.model.d_model)),
                        jnp.bfloat16)
  emb = make_embedding(c.model, c.lev, rngs=nnx.Rngs(0), dtype=jnp.bfloat16,
                       param_dtype=jnp.float32)
  graphdef, params = nnx.split(emb, nnx.Param)
  table = params["table"][...]
  weighted = lambda rows: jnp.sum((rows * w_BxLxD).astype(jnp.float32))
  plain = lambda t: jnp.take(t, ids_BxL, axis=0).astype(jnp.bfloat16)
  rows = nnx.merge(graphdef, params).embed(ids_BxL)
  np.testing.assert_array_equal(np.asarray(rows, np.float32), np.asarray(plain(table), np.float32))
  got = jax.grad(lambda p: weighted(nnx.merge(graphdef, p).embed(ids_BxL)))(params)
  got = got["table"][...]
  exact = jax.grad(lambda t: weighted(plain(t)))(table)
  summed_in_bf16 = jax.grad(
      lambda t: weighted(jnp.take(t.astype(jnp.bfloat16), ids_BxL, axis=0)))(table)
  assert got.dtype == jnp.float32
  np.testing.assert_array_equal(got, exact.astype(jnp.bfloat16).astype(jnp.float32))
  assert not np.array_equal(exact, exact.astype(jnp.bfloat16).astype(jnp.float32))
  assert not np.array_equal(got, summed_in_bf16)


@EIGHT_DEVICES
@pytest.mark.parametrize("group", list(LOOKUP_CASES))
def test_vocab_split_lookups_equal_one_device_without_rematerialization(group,
                                                                       eight_device_results):
  """Input lookups with a vocab-split table on a (2, 2, 2) mesh (LOOKUP_CASES: vocab over
  `tensor` and over (fsdp, tensor); LEV's computed table) equal one device's gather:
  rows exactly for the tables, gradients to 1e-6 (relative; LEV's sums over V rows run
  in another order). Compiling them, and a tied train step, logs no XLA "Involuntary
  full rematerialization" (spmd_partitioner.cc, on stderr), as jnp.take on the
  vocab-split tied table did.
  """
  errors = eight_device_results[0][f"lookup_{group}"]
  stderr = eight_device_results[1][f"lookup_{group}"]
  assert len(errors) == len(LOOKUP_CASES[group]), errors
  for case, err in errors.items():
    assert err["rows"] <= (0.0 if group == "tables" else 1e-6), f"{case}: {err}"
    assert err["grads"] <= 1e-6, f"{case}: {err}"
  assert "Involuntary full rematerialization" not in stderr, stderr[-3000:]


if __name__ == "__main__":
  sys.path.insert(0, str(HERE))
  _eight_device_worker()


@pytest.mark.parametrize("job,mesh,needle", [
    (("gpu", 2, 2), {}, None),
    (("gpu", 2, 1), {"dcn_data": 2}, None),  # one DCN granule per process (node)
    (("tpu", 4, 4), {"dcn_data": 2}, "spans 2 DCN groups; this job has 1 TPU slice"),
    (("gpu", 4, 8), {"dcn_data": 2}, "spans 2 DCN groups; this job has 4 processes"),
    (("cpu", 1, 8), {"tensor": 3}, "(1, -1, 3) does not divide 8 devices"),
    (("gpu", 3, 1), {}, "dimension 'embed' of size 32 is not divisible by mesh axes ('fsdp',)"),
    (("gpu", 8, 1), {"fsdp": 1, "data": -1}, "not divisible by the batch mesh axes ('data',) "
     "of total size 8"),
    # newcomer pass 19 (C29-C33): what the job's platform cannot run, before it is queued
    (("tpu", 1, 4), {"model.dtype": "float16"}, "config.model.dtype = 'float16': expected "
     "'bfloat16' or 'float32' in a TPU program (float16 compute runs on NVIDIA GPUs only)"),
    (("cpu", 1, 1), {"model.dtype": "float16"}, "in a CPU program"),
    (("cpu", 1, 1), {"model.attention": "splash"}, "config.model.attention = 'splash': "
     "expected a TPU program (this one is for 'cpu')"),
    (("tpu", 1, 4), {"model.attention": "splash", "model.attention_interpret": True},
     "config.model.attention_interpret = True: expected False in a TPU program"),
])
def test_check_job_lays_out_a_job_without_devices(make_config, job, mesh, needle):
  """What lev-train --preflight runs: the mesh for processes x devices, DCN granules
  (processes on CPU / GPU, the one slice on TPU), parameter splits and batches."""
  from lev_jax.train import check_job
  c = make_config("tied")
  for k, v in mesh.items():
    section, _, name = k.rpartition(".")
    c[section or "mesh"][name] = v
  platform, processes, devices = job
  if needle is None:
    ici, dcn = check_job(c, processes, devices, platform)
    assert math.prod(ici) * math.prod(dcn) == processes * devices
  else:
    with pytest.raises((ShardingError, ConfigError), match=re.escape(needle)):
      check_job(c, processes, devices, platform)
