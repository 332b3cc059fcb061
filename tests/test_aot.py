"""aot: tiny train / eval steps compiled for TPU slices, memory and shortfall reports.

The compile tests need libtpu (`pip install -e '.[tpu-aot]'`; `.ci/run` installs it)
and skip without it. They compile tiny models for a 4-chip v5p slice (and two slices
over DCN) on this CPU host: no TPU is touched.
"""

import importlib.util

import pytest

from lev_jax import aot, sharding, target, train
from lev_jax.sharding import ShardingError
from lev_jax.topology import AotError, GiB, parse_topology, topology_devices

needs_libtpu = pytest.mark.skipif(
    importlib.util.find_spec("libtpu") is None,
    reason="libtpu is not installed (pip install -e '.[tpu-aot]'; .ci/run installs it)")


def test_largest_buffers_are_read_from_the_memory_usage_report(tmp_path):
  (tmp_path / "module_0001.jit_train_step.cl_1.after_optimizations-memory-usage-report.txt"
   ).write_text(
      "Memory Space: default (color=0)\nTotal bytes: 123\n"
      "  cumulative_size;       size;       offset; used_by_n_values; shapes_list\n"
      "  ------------------------------------------------------------\n"
      "   12.21GiB( 55%);   12.21GiB;     17334272;               10; f32[32,512,200064]\n"
      "   18.32GiB( 83%);    6.11GiB;  13128728576;                3; bf16[200064,1,192]\n"
      "   18.69GiB( 85%);  384.00MiB;    419987456;                2; f32[32,12,512,512]\n")
  got = aot.largest_buffers(str(tmp_path), "jit_train_step", n=2)
  assert got == [(int(12.21 * 2 ** 30), "f32[32,512,200064]"),
                 (int(6.11 * 2 ** 30), "bf16[200064,1,192]")]
  assert aot.largest_buffers(str(tmp_path), "jit_eval_step") == []


def test_the_shortfall_names_the_largest_shape_of_each_buffer():
  # XLA lists the values sharing an allocation in name order, not by size.
  assert aot._largest_shape("f32[131072,128], f32[131072,65536], 2×bf16[1,768,12,64]"
                            ) == "f32[131072,65536]"
  assert aot._largest_shape("pred[8], s32[4,4]") == "s32[4,4]"


def test_compiling_for_sets_the_platform_the_model_code_sees():
  assert target.platform() == "cpu"
  with target.compiling_for("tpu"):
    assert target.platform() == "tpu"
  assert target.platform() == "cpu"
  with pytest.raises(ValueError, match="expected one of"):
    with target.compiling_for("npu"):
      pass


# --- compiled for a TPU topology (libtpu) ------------------------------------------

def _tiny(make_config, embedding, **lev):
  c = make_config(embedding, **lev)
  c.train.global_batch_size = c.eval.batch_size = 8
  c.model.n_layers = 1  # what is compiled per layer is the same; one compiles faster
  return c


@needs_libtpu
@pytest.mark.parametrize("embedding,lev", [
    ("tied", {}),
    ("lev", {"mode": "tokens"}),
    # table mode with the vectorized core (the ladder's): the memory-table test below
    ("lev", {"mode": "unique", "unique_size": 64}),
    ("lev", {"mode": "auto", "impl": "pallas"}),
])
def test_tiny_train_and_eval_steps_compile_for_a_v5p_slice(make_config, embedding, lev):
  c = _tiny(make_config, embedding, chunk_size=32, **lev)  # several LEV chunks
  # The loop-free time estimate (two more compiles a step) has its own test below; the
  # eval step (the forward of the same model) is compiled for tied. The KHRONOS basis
  # off the CPU: tests/test_lev_fused.py (traced for a GPU, against the CPU path).
  steps = ("train", "eval") if embedding == "tied" else ("train",)
  reports = aot.compile_steps(c, parse_topology("v5p:2x2x1"), steps, estimate_time=False)
  assert [r.step for r in reports] == list(steps)
  for r in reports:
    assert r.fits, r.error
    assert r.chips == 4 and r.hbm_bytes == 95 * GiB
    assert 0 < r.total_bytes < r.hbm_bytes and r.compiler_flops > 0
    # (XLA:TPU's cost model returns a negative time for unique mode's lax.cond: the
    # roofline stands in, labelled.)
    assert r.step_s > 0 and r.time_source in ("cost model", "roofline")
    assert r.tokens == 8 * c.train.seq_len


@needs_libtpu
def test_the_memory_table_and_the_loop_free_estimate(make_config, monkeypatch):
  """compile_steps' memory figures are XLA's memory_analysis() of the step lev-train
  builds: the program it compiles is the one lowered here by hand from
  train.make_train_step (same StableHLO), and its figures are those of the executable
  it compiled (kept by wrapping aot._compile_one: no third compile of the same program).
  XLA's cost model counts a loop body once: the looped program's own estimate (that
  executable's cost_analysis) misses LEV's chunk and coordinate iterations, the
  loop-free one (compile_steps' default) has them. The program is the ladder's LEV
  (table mode, vectorized core) in several chunks: its compile for the v5p slice is
  also that case of test_tiny_train_and_eval_steps_compile_for_a_v5p_slice."""
  # 3 chunks of the 384-row table (12 chunks of 32 rows: a loop-free compile 2.7x as long)
  c = _tiny(make_config, "lev", mode="table", impl="vectorized", chunk_size=128)
  c.model.n_layers = 1  # one loop-free compile (depth 1) besides the real program
  topo = parse_topology("v5p:2x2x1")
  kept = []  # (lowered, compiled) of each compile, the real program's first
  real_compile_one = aot._compile_one

  def keeping(name, lower, args, *rest):
    def lower_and_keep(*a):
      lowered = lower(*a)

      class Lowered:
        def compile(self, **kw):
          kept.append((lowered, lowered.compile(**kw)))
          return kept[-1][1]
      return Lowered()
    return real_compile_one(name, lower_and_keep, args, *rest)

  monkeypatch.setattr(aot, "_compile_one", keeping)
  (report,) = aot.compile_steps(c, topo, steps=("train",))
  assert len(kept) == 2  # the real program, then the loop-free depth-1 one
  assert report.fits, report.error
  assert report.chips == 4 and report.hbm_bytes == 95 * GiB
  assert 0 < report.total_bytes < report.hbm_bytes and report.step_s > 0
  assert report.tokens == 8 * c.train.seq_len
  lowered, compiled = kept[0]
  mesh = sharding.make_mesh(c.mesh, devices=topology_devices(topo))
  part = train.partition(c, mesh)
  with target.compiling_for("tpu"):
    by_hand = train.make_train_step(part, c).lower(
        train.abstract_state(part, c), train.abstract_batch(part, c, 8))
  assert lowered.as_text() == by_hand.as_text()
  mem = compiled.memory_analysis()
  assert (report.arguments_bytes, report.outputs_bytes, report.alias_bytes,
          report.temp_bytes, report.code_bytes) == (
              mem.argument_size_in_bytes, mem.output_size_in_bytes,
              mem.alias_size_in_bytes, mem.temp_size_in_bytes,
              mem.generated_code_size_in_bytes)
  assert report.total_bytes == (mem.argument_size_in_bytes + mem.output_size_in_bytes
                                - mem.alias_size_in_bytes + mem.temp_size_in_bytes
                                + mem.generated_code_size_in_bytes)
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, list) else cost
  assert cost["flops"] > 0 and "loop-free" in report.time_source
  assert report.compiler_flops > cost["flops"]
  assert report.step_s > cost["optimal_seconds"]


@needs_libtpu
@pytest.mark.parametrize("embedding", ["tied", "lev"])
def test_two_slices_over_dcn(make_config, embedding):
  c = _tiny(make_config, embedding, mode="tokens")
  c.mesh.dcn_data = 2
  (report,) = aot.compile_steps(c, parse_topology("v5p:2x2x1", num_slices=2),
                                steps=("train",), estimate_time=False)
  assert report.fits and report.chips == 8


@needs_libtpu
def test_a_mesh_that_does_not_divide_the_chips_and_dcn_mismatch_are_errors(make_config):
  c = _tiny(make_config, "tied")
  c.mesh.tensor = 3
  with pytest.raises(ShardingError, match=r"does not divide 4 devices"):
    aot.compile_steps(c, parse_topology("v5p:2x2x1"))
  c.mesh.tensor, c.mesh.dcn_data = 1, 2
  with pytest.raises(AotError, match=r"spans 2 slices; the topology has 1"):
    aot.compile_steps(c, parse_topology("v5p:2x2x1"))


@needs_libtpu
def test_a_step_that_does_not_fit_is_reported_with_its_largest_buffers(make_config):
  c = _tiny(make_config, "tied")
  c.model.vocab_size = 65_536  # float32 logits of 1024 x 512 tokens: 128 GiB per chip
  c.train.seq_len = 512
  c.train.global_batch_size = 1024
  (report,) = aot.compile_steps(c, parse_topology("v5e:2x2"), steps=("train",))
  assert not report.fits and "RESOURCE_EXHAUSTED" in report.error
  assert report.required_bytes > report.available_bytes > 10 * GiB
  assert report.largest_buffers and report.largest_buffers[0][0] > GiB
  line = aot.shortfall_line(report, parse_topology("v5e:2x2"), c)
  assert "\n" not in line and "train.grad_accum_steps (now 1)" in line
  assert "largest buffers: " in line and "f32[" in line


def test_the_shortfall_levers_name_the_mesh_as_compiled():
  """Issue 26: the levers printed `fsdp -1` where the header says 4: the mesh sizes are
  the ones the step was compiled with (config.mesh's -1 resolved for the chips)."""
  from lev_jax.config import base_config
  c = base_config()
  c.name = "x"
  report = aot.StepReport(step="train", device_kind="TPU v5p", chips=4, hbm_bytes=95 * GiB,
                          tokens=1, analytic_flops=1.0, compile_s=1.0,
                          required_bytes=100 * GiB, available_bytes=95 * GiB)
  line = aot.shortfall_line(report, parse_topology("v5p:2x2x1"), c)
  assert (c.mesh.data, c.mesh.fsdp, c.mesh.tensor) == (1, -1, 1)
  assert "the mesh (now data 1, fsdp 4, tensor 1) or a larger slice" in line, line
