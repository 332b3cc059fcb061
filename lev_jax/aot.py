"""Ahead-of-time compilation of the train and eval steps for a TPU slice, on any host.

JAX compiles for a TPU topology without its chips once libtpu is importable
(`jax.experimental.topologies.get_topology_desc` gives compile-only devices; JAX docs
"Ahead-of-time lowering and compilation"). `compile_steps` builds exactly what
`lev-train` runs on that slice (`train.partition` of the config on the config's mesh
over the slice's chips, `train.abstract_state`, `train.make_train_step` /
`make_eval_step` lowered with abstract, sharded arguments), compiles it with XLA:TPU and
reads back the compiler's own figures:

  memory   `Compiled.memory_analysis()` per chip: arguments (parameters, optimizer state
           and the batch), outputs, aliased (donated) bytes, temporaries, generated code.
           total = arguments + outputs - aliased + temporaries + code.
  FLOPs    `Compiled.cost_analysis()["flops"]`, per chip.
  time     `cost_analysis()["optimal_seconds"]`: XLA:TPU's cost-model ESTIMATE of one
           step, never a measurement. The cost model counts a loop's body once, so a
           program with loops (scanned layers, LEV's chunk and coordinate loops, gradient
           accumulation) is estimated from loop-free compiles of the same step instead
           (`_estimate_time`: layers unrolled at depth 1 and 2 and extrapolated, LEV's
           loops unrolled, one micro-batch), labelled so. The cost model prices no Mosaic
           kernel: with splash attention, attention's model FLOPs at the peak bf16
           rate are added (`_price_splash`, a lower bound), labelled so. Where the
           model returns no positive value (XLA:GPU has none), the roofline ESTIMATE
           max(flops / peak bf16 FLOP/s, bytes accessed / HBM bandwidth) is used and
           labelled so.
  fit      XLA:TPU itself refuses a program whose buffers exceed the chip's HBM
           (RESOURCE_EXHAUSTED); `compile_steps` turns that into a `StepReport` with
           `error` set, the required and available bytes, and the largest buffers from
           the compiled module's memory-usage report.

Topologies (TPU slices, NVIDIA GPUs) and their compile-only devices: lev_jax/topology.py.

Every call here touches no device and writes nothing but the optional HLO dump.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import shutil
import tempfile
import time

import jax
import ml_collections

from lev_jax import flops as flops_lib
from lev_jax import attention as attention_lib
from lev_jax import gpu_targets, loss as loss_lib, sharding, target, train
from lev_jax import remat as remat_lib
from lev_jax.topology import AotError, Chip, GiB, Topology, first_line, topology_devices


@dataclasses.dataclass
class StepReport:
  """What the compiler says about one step on one chip. Bytes per chip; FLOPs per chip;
  seconds are the compiler's estimate (`time_source`), never a measurement."""
  step: str                        # "train" or "eval"
  device_kind: str                 # jax device_kind of the chips (for the bf16 peak)
  chips: int
  hbm_bytes: int
  tokens: int                      # tokens per step (global)
  analytic_flops: float            # lev_jax.flops model FLOPs per step, all chips
  compile_s: float                 # wall time of lowering + compiling, this host
  estimate_compile_s: float = 0.0  # the loop-free compiles behind the time estimate
  arguments_bytes: int = 0
  outputs_bytes: int = 0
  alias_bytes: int = 0
  temp_bytes: int = 0
  code_bytes: int = 0
  compiler_flops: float | None = None   # per chip
  bytes_accessed: float | None = None   # per chip
  step_s: float | None = None
  time_source: str = ""            # "cost model", "roofline" or "" (none)
  splash_s: float = 0.0            # splash attention's share of step_s (`_price_splash`)
  error: str = ""                  # set when XLA:TPU refused the program
  required_bytes: int | None = None     # from a RESOURCE_EXHAUSTED message
  available_bytes: int | None = None
  largest_buffers: list = dataclasses.field(default_factory=list)  # [(bytes, shapes)]

  @property
  def fits(self) -> bool:
    return not self.error

  @property
  def total_bytes(self) -> int:
    return (self.arguments_bytes + self.outputs_bytes - self.alias_bytes + self.temp_bytes
            + self.code_bytes)

  @property
  def hbm_fraction(self) -> float:
    return self.total_bytes / self.hbm_bytes

  @property
  def tokens_per_s(self) -> float | None:
    return self.tokens / self.step_s if self.step_s else None

  @property
  def mfu(self) -> float | None:
    peak = flops_lib.peak_flops_per_device(self.device_kind)
    if not self.step_s or not peak:
      return None
    return self.analytic_flops / (self.step_s * self.chips * peak)

  def as_dict(self) -> dict:
    d = dataclasses.asdict(self)
    d.update(fits=self.fits, total_bytes=self.total_bytes, hbm_fraction=self.hbm_fraction,
             tokens_per_s=self.tokens_per_s, mfu=self.mfu,
             analytic_flops_per_chip=self.analytic_flops / self.chips)
    d["largest_buffers"] = [{"bytes": b, "shapes": s} for b, s in self.largest_buffers]
    return d


_OOM = re.compile(r"required for HLO temporaries \(([\d.]+)([KMGT])\).*available HBM "
                  r"\(([\d.]+)([KMGT])\)", re.S)
_UNITS = {"K": 2 ** 10, "M": 2 ** 20, "G": 2 ** 30, "T": 2 ** 40}


def largest_buffers(dump_dir: str, module: str, n: int = 5) -> list[tuple[int, str]]:
  """The `n` largest allocations of a compiled module, from XLA's memory-usage report
  (`*<module>*memory-usage-report.txt`, written by --xla_dump_to): (bytes, the shapes of
  the values sharing that allocation). [] when no report was written."""
  names = sorted(f for f in os.listdir(dump_dir)
                 if module in f and f.endswith("memory-usage-report.txt"))
  if not names:
    return []
  rows = []
  with open(os.path.join(dump_dir, names[-1])) as f:
    for line in f:
      m = re.match(r"\s*[\d.]+\w+\(\s*\d+%\);\s*([\d.]+)(\w+);\s*\d+;\s*\d+;\s*(.*)$", line)
      if m:
        size = float(m[1]) * {"B": 1, "KiB": 2 ** 10, "MiB": 2 ** 20, "GiB": 2 ** 30,
                              "TiB": 2 ** 40}.get(m[2], 1)
        rows.append((int(size), m[3].strip()))
  return sorted(rows, key=lambda r: -r[0])[:n]


def _compile_one(name, lower, args, report: StepReport, dump_dir: str, chip: Chip):
  module = f"jit_{name}"
  options = {"xla_dump_to": dump_dir, "xla_dump_hlo_module_re": f".*{module}.*",
             "xla_dump_hlo_as_text": True}
  t0 = time.perf_counter()
  try:
    compiled = lower(*args).compile(compiler_options=options)
  except Exception as e:  # XLA:TPU raises JaxRuntimeError("RESOURCE_EXHAUSTED: ...")
    text = str(e)
    if "RESOURCE_EXHAUSTED" not in text:
      raise
    report.compile_s = time.perf_counter() - t0
    report.error = first_line(e)
    m = _OOM.search(text)
    if m:
      report.required_bytes = int(float(m[1]) * _UNITS[m[2]])
      report.available_bytes = int(float(m[3]) * _UNITS[m[4]])
    report.largest_buffers = largest_buffers(dump_dir, module)
    return report
  report.compile_s = time.perf_counter() - t0
  mem = compiled.memory_analysis()
  report.arguments_bytes = int(mem.argument_size_in_bytes)
  report.outputs_bytes = int(mem.output_size_in_bytes)
  report.alias_bytes = int(mem.alias_size_in_bytes)
  report.temp_bytes = int(mem.temp_size_in_bytes)
  report.code_bytes = int(mem.generated_code_size_in_bytes)
  if report.total_bytes > report.hbm_bytes:  # XLA:GPU compiles it anyway (only warns)
    report.error = (f"needs {_gib(report.total_bytes)} GiB per device, "
                    f"{_gib(report.hbm_bytes)} GiB of HBM")
    report.required_bytes, report.available_bytes = report.total_bytes, report.hbm_bytes
  cost = gpu_targets.cost_analysis(compiled)  # the compiler's, else HloCostAnalysis
  report.compiler_flops = cost.get("flops")
  report.bytes_accessed = cost.get("bytes accessed")
  seconds = cost.get("optimal_seconds")
  if seconds is not None and seconds > 0:
    report.step_s, report.time_source = float(seconds), "cost model"
  elif report.compiler_flops:
    peak = flops_lib.peak_flops_per_device(chip.device_kind)
    roofline = max(report.compiler_flops / peak if peak else 0.0,
                   (report.bytes_accessed or 0.0) / chip.hbm_bytes_per_s)
    report.step_s, report.time_source = roofline, "roofline"
  report.largest_buffers = largest_buffers(dump_dir, module)
  return report


def compile_steps(config: ml_collections.ConfigDict, topology: Topology,
                  steps: tuple[str, ...] = ("train", "eval"),
                  dump_hlo: str | None = None,
                  estimate_time: bool = True) -> list[StepReport]:
  """Compiles `config`'s train and/or eval step for `topology` (no device touched).

  Args:
    config: a validated experiment config; its mesh must span topology.chips (DCN axes:
      topology.num_slices).
    steps: which steps, in order: "train" (train.global_batch_size, the donated state),
      "eval" (eval.batch_size, the params).
    dump_hlo: a folder for XLA's dumps of each step (optimized HLO, buffer assignment,
      memory-usage report); None: a temporary folder, removed afterwards.
    estimate_time: for a program with loops (`_has_loops`), estimate the step time from
      loop-free compiles (`_estimate_time`: two more compiles per step); False keeps
      the cost model's figure of the looped program, which counts each loop body once.
  Returns:
    One StepReport per step; `error` is set (and nothing raised) when XLA:TPU refused
    the step for memory.
  Raises:
    AotError: libtpu, topology or mesh problems (one line).
    sharding.ShardingError / ConfigError: a mesh, rule or batch that does not fit.
  """
  devices = topology_devices(topology)
  _check_dcn(config, topology)
  mesh = sharding.make_mesh(config.mesh, devices=devices)
  part = train.partition(config, mesh)
  state = train.abstract_state(part, config)
  dump = dump_hlo or tempfile.mkdtemp(prefix="lev_compile_")
  # JAX's persistent compilation cache cannot hold compile-only executables (it warns
  # "PjRtCompiler must be constructed with a Client"): off while compiling here.
  cache = jax.config.jax_enable_compilation_cache
  jax.config.update("jax_enable_compilation_cache", False)
  try:
    with target.compiling_for(topology.platform):
      reports = [_compile_step(step, config, part, state, dump, topology) for step in steps]
      loss_impl, _ = loss_lib.resolve(config, mesh)
      if estimate_time and _has_loops(config, loss_impl):
        _estimate_time(config, topology, devices, reports, loss_impl)
      if attention_lib.resolve(config, topology.platform)[0] == "splash":
        _price_splash(config, topology, reports)
      return reports
  finally:
    jax.config.update("jax_enable_compilation_cache", cache)
    if dump_hlo is None:
      shutil.rmtree(dump, ignore_errors=True)


def _compile_step(step, config, part, state, dump, topology) -> StepReport:
  """Lowers and compiles one step ("train" or "eval") for the topology's chips."""
  if step == "train":
    fn, name = train.make_train_step(part, config), "train_step"
    args = (state, train.abstract_batch(part, config, config.train.global_batch_size))
    tokens = flops_lib.tokens_per_step(config)
    analytic = flops_lib.train_flops_per_step(config)["total"]
  elif step == "eval":
    fn, name = train.make_eval_step(part, config), "eval_step"
    args = (state["params"], train.abstract_batch(part, config, config.eval.batch_size))
    tokens = config.eval.batch_size * config.train.seq_len
    analytic = _eval_flops(config)
  else:
    raise ValueError(f"step {step!r}: expected 'train' or 'eval'")
  chip = topology.chip
  report = StepReport(step, chip.device_kind, topology.chips, chip.hbm_bytes, tokens,
                      analytic, 0.0)
  step_dump = os.path.join(dump, step)
  os.makedirs(step_dump, exist_ok=True)
  return _compile_one(name, fn.lower, args, report, step_dump, chip)


def _has_loops(config, loss_impl: str) -> bool:
  """Whether the step's program loops: scanned layers, LEV (its chunks and the fused
  core's coordinate loops), the chunked loss (its token and vocab chunks; `loss_impl`
  is train.loss_impl resolved for the devices) or gradient accumulation."""
  m = config.model
  return ((m.scan_layers and m.n_layers > 1) or m.embedding == "lev"
          or loss_impl == "chunked" or config.train.grad_accum_steps > 1)


def _estimate_time(config, topology: Topology, devices, reports, loss_impl: str) -> None:
  """XLA's cost models count a loop's body once: a scanned layer stack, LEV's loops and
  gradient accumulation would be estimated at one iteration. The step's time and FLOPs
  are estimated instead from loop-free compiles of the same step: layers unrolled at
  depth 1 and 2, LEV's and the chunked loss's loops unrolled (target.unrolled_loops),
  one micro-batch; with
  every layer and micro-batch the same program, the estimate is
  n_micro x (t(1) + (L - 1) (t(2) - t(1))), labelled so. Memory stays the real
  program's."""
  n, n_micro = config.model.n_layers, config.train.grad_accum_steps
  shallow = {}
  for depth in sorted({1, min(n, 2)}):
    c = config.copy_and_resolve_references()
    c.train.loss_impl = loss_impl  # the real step's loss, resolved once
    c.model.n_layers, c.model.scan_layers = depth, False
    c.train.global_batch_size //= n_micro
    c.train.grad_accum_steps = 1
    part = train.partition(c, sharding.make_mesh(c.mesh, devices=devices))
    state = train.abstract_state(part, c)
    with tempfile.TemporaryDirectory(prefix="lev_compile_cost_") as dump, \
        target.unrolled_loops():
      shallow[depth] = {r.step: r for r in (
          _compile_step(report.step, c, part, state, dump, topology) for report in reports
          if report.fits)}
  for report in reports:
    one, two = shallow[1].get(report.step), shallow[min(n, 2)].get(report.step)
    if not (one and two and one.fits and two.fits and one.step_s and two.step_s):
      continue
    report.estimate_compile_s = one.compile_s + (two.compile_s if two is not one else 0.0)
    micro = n_micro if report.step == "train" else 1
    report.step_s = micro * (one.step_s + (n - 1) * (two.step_s - one.step_s))
    report.compiler_flops = micro * (one.compiler_flops + (n - 1) * (
        two.compiler_flops - one.compiler_flops))
    report.time_source = (
        f"{two.time_source} of loop-free compiles (layers unrolled at depth 1 and 2, "
        f"LEV's loops unrolled{', one micro-batch' if micro > 1 else ''}), extrapolated "
        f"to {n} layers{f' x {micro} micro-batches' if micro > 1 else ''}")


def _price_splash(config, topology: Topology, reports) -> None:
  """Adds splash attention to each step's time estimate. XLA's cost model gives a Mosaic
  kernel (a custom call) no cost, so a splash step's estimate would leave attention out;
  its model FLOPs (lev_jax/flops.py: the causal half, forward + backward, the forward
  again where model.remat recomputes it; the forward alone for eval) at the chip's peak
  bf16 rate are added instead: a lower bound on the kernel's time, labelled so."""
  peak = flops_lib.peak_flops_per_device(topology.chip.device_kind)
  if not peak:
    return
  attention = flops_lib.train_flops_per_step(config)["attention"]
  remat, _ = remat_lib.resolve(config, topology.chips, topology.chip.hbm_bytes, "splash")
  train_attention = attention + flops_lib.remat_flops_per_step(config, remat)["attention"]
  eval_attention = (attention // 3 * config.eval.batch_size
                    // config.train.global_batch_size)
  for r in reports:
    if not (r.fits and r.step_s):
      continue
    flops = train_attention if r.step == "train" else eval_attention
    r.splash_s = flops / topology.chips / peak
    r.step_s += r.splash_s
    r.time_source += (" + splash attention at its model FLOPs at the peak bf16 rate (the "
                      "cost model prices no Mosaic kernel; a lower bound)")


def _eval_flops(config) -> float:
  """Model FLOPs of one eval batch: the forward third of a train step of that batch."""
  c = config.copy_and_resolve_references()
  c.train.global_batch_size, c.train.grad_accum_steps = config.eval.batch_size, 1
  return flops_lib.train_flops_per_step(c)["total"] / 3


def _check_dcn(config, topology: Topology) -> None:
  m = config.mesh
  dcn = [m.dcn_data, m.dcn_fsdp, m.dcn_tensor]
  if -1 in dcn:
    return  # filled in by make_mesh from the devices left over
  if math.prod(dcn) != topology.num_slices:
    raise AotError(f"config.mesh (dcn_data, dcn_fsdp, dcn_tensor) = {tuple(dcn)} spans "
                   f"{math.prod(dcn)} slices; the topology has {topology.num_slices} "
                   f"(--num_slices): set e.g. --config.mesh.dcn_data={topology.num_slices}")


def _gib(n: float) -> str:
  return f"{n / GiB:.2f}"


def format_step(report: StepReport, hbm_label: str) -> str:
  """A step's table: memory per chip against HBM, FLOPs, and the compiler's ESTIMATES."""
  r = report
  if not r.fits:
    return f"{r.step} step: DOES NOT FIT ({r.error})"
  free = 1.0 - r.hbm_fraction
  lines = [
      f"{r.step} step ({r.tokens:,} tokens), compiled in {r.compile_s:.0f} s on this host"
      + (f" (+ {r.estimate_compile_s:.0f} s of loop-free compiles for the time estimate)"
         if r.estimate_compile_s else ""),
      f"  {'per chip':<34}{'GiB':>9}",
      f"  {'state + batch (arguments)':<34}{_gib(r.arguments_bytes):>9}",
      f"  {'temporaries':<34}{_gib(r.temp_bytes):>9}",
      f"  {'outputs not donated':<34}{_gib(r.outputs_bytes - r.alias_bytes):>9}",
      f"  {'generated code':<34}{_gib(r.code_bytes):>9}",
      f"  {'total':<34}{_gib(r.total_bytes):>9}  of {hbm_label} HBM "
      f"({r.hbm_fraction:.0%} used, {free:.0%} free)",
  ]
  if r.compiler_flops is not None:
    lines.append(f"  FLOPs per chip: {r.compiler_flops:.3e} (compiler), "
                 f"{r.analytic_flops / r.chips:.3e} (model FLOPs, lev_jax/flops.py)")
  if r.step_s:
    mfu = f", MFU {r.mfu:.1%}" if r.mfu is not None else ""
    lines.append(f"  step time {r.step_s:.3g} s, {r.tokens_per_s:,.0f} tokens/s{mfu}: "
                 f"compiler ESTIMATE ({r.time_source}), not a measurement")
  else:
    lines.append("  step time: the compiler gave no estimate")
  return "\n".join(lines)


_DTYPE_BYTES = {"pred": 1, "s8": 1, "u8": 1, "bf16": 2, "f16": 2, "s16": 2, "f32": 4,
                "s32": 4, "u32": 4, "f64": 8, "s64": 8}


def _largest_shape(shapes: str) -> str:
  """The largest of the shapes sharing one allocation ("f32[8,512], 2×bf16[64,8]")."""
  def size(shape):
    m = re.match(r"(?:\d+×)?(\w+)\[([\d,]*)\]", shape.strip())
    if not m:
      return 0
    return _DTYPE_BYTES.get(m[1], 4) * math.prod(int(d) for d in m[2].split(",") if d)
  return max(shapes.split(", "), key=size).strip()


def short_steps(reports: list[StepReport], min_free: float = 0.0) -> list[StepReport]:
  """The steps lev-compile refuses: those that do not fit, and those that leave less
  than `min_free` (a fraction in [0, 1)) of each chip's HBM free."""
  return [r for r in reports if not r.fits or r.hbm_fraction > 1.0 - min_free]


def shortfall_line(report: StepReport, topology: Topology, config,
                   min_free: float = 0.0) -> str:
  """One line for a step that does not fit, or (compiled, `min_free` > 0) leaves less
  than `min_free` of each chip's HBM free: how much is missing against what may be
  used, the largest buffers and the levers that reduce per-chip memory (the mesh as
  compiled: config.mesh's -1 axis resolved for the slice's chips)."""
  r = report
  if r.fits:
    need, have = r.total_bytes, int(r.hbm_bytes * (1.0 - min_free))
    verb = f"leaves less than {min_free:.0%} of HBM free on"
    usable = (f"{_gib(have)} GiB usable ({_gib(r.hbm_bytes)} GiB HBM with {min_free:.0%} "
              "kept free)")
  else:
    need, have = r.required_bytes, r.available_bytes
    verb, usable = "does not fit", f"{_gib(have)} GiB available"
  what = (f"needs {_gib(need)} GiB per chip, {usable} (short by {_gib(need - have)} GiB)"
          if need and have else r.error)
  biggest = "; ".join(f"{_gib(b)} GiB {_largest_shape(shapes)}"
                      for b, shapes in r.largest_buffers[:3])
  ici, dcn = sharding.mesh_shapes(config.mesh, topology.chips)  # -1 resolved, as compiled
  mesh = f"data {ici[0]}, fsdp {ici[1]}, tensor {ici[2]}"
  if math.prod(dcn) > 1:
    mesh += f"; DCN {' x '.join(map(str, dcn))}"
  remat = config.model.remat
  if remat == "auto":
    kernel, _ = attention_lib.resolve(config, topology.platform)
    remat += ": " + remat_lib.resolve(config, topology.chips, topology.chip.hbm_bytes,
                                      kernel)[0]
  levers = (f"levers: train.grad_accum_steps (now {config.train.grad_accum_steps}), "
            f"model.remat (now {remat}), the mesh (now {mesh}) or a larger slice")
  return (f"the {r.step} step of {config.name} {verb} {topology.name}: {what}"
          + (f"; largest buffers: {biggest}" if biggest else "") + f"; {levers}")
