"""`lev-compile`: compile the train and eval steps for a TPU slice, on any host.

  lev-compile --config=experiments/ladder.py:leviathan_1.2b --topology=v5p-128
  lev-compile --config=experiments/smoke.py:tied --topology=v5p:2x2x1 --json=compile.json
  lev-compile --config=experiments/ladder.py:tied_200m --topology=v5e-256 \
    --dump_hlo=/tmp/hlo --min_free=0.1

Compiles the program lev-train would run on that slice (same config, mesh, rules,
grad accumulation, remat, scan_layers) with XLA:TPU, touching no device: libtpu must be
installed (`pip install -e '.[tpu-aot]'`, the version jax[tpu] pins); for NVIDIA GPUs
(`--topology=h100-8`, `h200-16`) jax's CUDA plugin and ptxas (BUILD.md, "Compiling for
NVIDIA GPUs without one"). Prints, per step
and per chip, the state, temporaries and total memory against the chip's HBM, the
compiler's FLOPs beside the model FLOPs of lev_jax/flops.py, and the compiler's
ESTIMATED step time, tokens/s and MFU (estimates, never measurements). Several slices:
--num_slices=N with the config's DCN mesh axes spanning N.

Exit status: 0 when every step fits, 2 with one line when a step does not (the
shortfall, the largest buffers, the levers) or on bad input. Writes nothing but
--json and --dump_hlo.
"""

from __future__ import annotations

import json
import os
import re

from absl import flags, logging
from ml_collections import config_flags

from lev_jax.cli import common
from lev_jax.config import padded_vocab_size
from lev_jax.experiments import experiments_dir

PROG = "lev-compile"
STEPS = ("train", "eval")


def _define_flags():
  config_flags.DEFINE_config_file(
      "config", str(experiments_dir() / "ladder.py") + ":leviathan_200m",
      "Experiment file and variant, e.g. experiments/ladder.py:tied_1.2b.")
  flags.DEFINE_string("topology", "v5p-128", "TPU slice: GENERATION-COUNT as Cloud TPU "
                      "names it (v5p-128, v5e-256, v6e-16, v4-32) or GENERATION:SHAPE "
                      "(v5p:4x4x4, v6e:4x4); or NVIDIA GPUs: h100-8, h200-16 (hosts of "
                      "8; needs the CUDA plugin, BUILD.md).")
  flags.DEFINE_integer("num_slices", 1, "Identical slices joined over DCN (the config's "
                       "mesh.dcn_* axes must span them).", lower_bound=1)
  flags.DEFINE_list("steps", list(STEPS), "Steps to compile: train, eval.")
  common.define_path("json", None, "Also write the figures as JSON to this file.",
                     what="a JSON file to write, or leave the flag out")
  common.define_path("dump_hlo", None, "Keep XLA's dumps (optimized HLO, buffer "
                     "assignment, memory-usage report) under this folder, one per step.",
                     what="a folder for the dumps, or leave the flag out")
  flags.DEFINE_bool("estimate_time", True, "Estimate the step time from loop-free "
                    "compiles when the program loops (scanned layers, LEV, grad "
                    "accumulation: XLA's cost model counts a loop body once), two more "
                    "compiles per step; when off, memory and the looped program's own "
                    "figures only.")
  flags.DEFINE_float("min_free", 0.0, "Fail (exit 2) unless this fraction of each chip's "
                     "HBM stays free, e.g. 0.1.", lower_bound=0.0, upper_bound=0.99)
  # absl's bounds compare, and nan passes every comparison
  flags.register_validator("min_free", lambda v: v is None or v == v,
                           message="expected a fraction in [0.0, 0.99], not nan")


def _check_outputs(json_path: str | None, dump_hlo: str | None) -> None:
  """Every output path checked before anything is compiled or written."""
  for flag, path in (("--json", json_path), ("--dump_hlo", dump_hlo)):
    if path is not None and not path.strip():
      common.fail(PROG, f"{flag} is empty: expected a path")
    inside = path and (common.checkpoint_tree_error(flag, path)
                       or common.within_owned_folder_error(flag, path))
    if inside:  # newcomer pass 9: --json inside an export passed
      common.fail(PROG, inside)
  if json_path:
    parent = os.path.dirname(os.path.abspath(json_path))
    if os.path.isdir(json_path):
      common.fail(PROG, f"--json={json_path} is a folder: expected a file path")
    if not os.path.isdir(parent):
      above = parent
      while not os.path.exists(above):
        above = os.path.dirname(above)
      if above == parent or not os.path.isdir(above):  # newcomer pass 7: "does not exist"
        common.fail(PROG, f"--json={json_path}: {above} is a file, not a folder; expected a "
                    "file in an existing folder you can write to")
      common.fail(PROG, f"--json={json_path}: folder {parent} does not exist; expected a "
                  "file in an existing folder you can write to")
    problem = common.output_file_error(f"--json={json_path}", json_path)
    if problem:  # an unwritable folder, a device, a dangling link
      common.fail(PROG, problem)
  if dump_hlo and os.path.exists(dump_hlo) and not os.path.isdir(dump_hlo):
    common.fail(PROG, f"--dump_hlo={dump_hlo} is a file: expected a folder")


def flag_named(line: str, topology: str) -> str:
  """`line` with its leading `topology 'NAME'` (lev_jax.topology's errors about the
  value) as the flag the user typed: `--topology=NAME`."""
  return re.sub(r"^topology '?" + re.escape(topology) + r"'?(?=[:( ])",
                lambda _: f"--topology={topology}", line)


def program_line(config, topology) -> str:
  """The choices that decide the compiled program's memory and time, in one line: the
  loss (train.loss_impl resolved for the topology's chips and memory), the logits'
  dtype, the attention kernel (model.attention resolved for the topology's platform),
  layer remat and, for LEV, its core, rows, chunk and remat."""
  from lev_jax import attention, loss, remat  # pylint: disable=g-import-not-at-top
  m, lv = config.model, config.lev
  kernel, _ = attention.resolve(config, topology.platform)
  loss_impl, _ = loss.choose(config, topology.chips, topology.chip.hbm_bytes)
  policy, _ = remat.resolve(config, topology.chips, topology.chip.hbm_bytes, kernel)
  auto = lambda requested: " (auto)" if requested == "auto" else ""
  chunks = ""
  if loss_impl == "chunked":
    padded = padded_vocab_size(m.vocab_size, m.vocab_multiple)
    vocab_chunk = loss.vocab_chunk_size(padded, config.train.loss_vocab_chunk)
    chunks = (" over the whole vocab" if vocab_chunk == padded
              else f" in vocab chunks of {vocab_chunk:,} ids")
  line = (f"loss {loss_impl}{auto(config.train.loss_impl)}{chunks}, logits {m.logits_dtype}, "
          f"attention {kernel}{auto(m.attention)}, model.remat {policy}{auto(m.remat)}, "
          f"{m.dtype} compute")
  if m.embedding == "lev":
    line += (f"; LEV {lv.impl} core, lev.mode {lv.mode}, chunks of {lv.chunk_size:,} ids, "
             f"lev.remat {lv.remat}")
  return line


def default_config_note(flag, config, topology: str) -> str | None:
  """The line logged before compiling when --config was left out (`flag`, the config
  flag): which experiment the default is, e.g. "no --config: compiling the default,
  .../experiments/ladder.py:leviathan_200m (leviathan_200m), for --topology=v5p-128";
  None when --config was given."""
  if flag.present:
    return None
  default = flag.default_as_str.strip("'")
  return (f"no --config: compiling the default, {default} ({config.name}), for "
          f"--topology={topology}")


def main(argv):
  if len(argv) > 1:
    common.fail_unexpected(PROG, argv[1:])
  common.quiet_library_logs()
  f = flags.FLAGS
  steps = tuple(f.steps)
  bad = [s for s in steps if s not in STEPS] or ([] if steps else ["(none)"])
  if bad:
    common.fail(PROG, f"--steps={','.join(f.steps)}: expected some of {', '.join(STEPS)}")
  _check_outputs(f.json, f.dump_hlo)
  import jax  # pylint: disable=g-import-not-at-top
  if "JAX_PLATFORMS" not in os.environ:
    # No device is used: never start a TPU or GPU backend (on a TPU VM, a training job
    # may hold the chips).
    jax.config.update("jax_platforms", "cpu")
  common.backend_or_exit(PROG)  # JAX_PLATFORMS naming a backend this machine lacks
  from lev_jax import aot, topology as topo_lib  # pylint: disable=g-import-not-at-top
  from lev_jax.config import (ConfigError, check_platform,  # pylint: disable=g-import-not-at-top
                              validate)
  from lev_jax import sharding  # pylint: disable=g-import-not-at-top
  from lev_jax.gpu_targets import GpuTargetError  # pylint: disable=g-import-not-at-top
  from lev_jax.sharding import ShardingError  # pylint: disable=g-import-not-at-top
  config = common.config_or_exit(PROG)
  try:
    validate(config)
    topology = topo_lib.parse_topology(f.topology, f.num_slices)
    check_platform(config, topology.platform)
    compiler = topo_lib.check_compiler(topology)
    note = default_config_note(f["config"], config, topology.name)
    if note:  # minutes of compiling: say what, before they start
      logging.info(note)
    reports = aot.compile_steps(config, topology, steps, dump_hlo=f.dump_hlo,
                                estimate_time=f.estimate_time)
  except (ConfigError, ShardingError, topo_lib.AotError, GpuTargetError) as e:
    common.fail(PROG, flag_named(common.first_line(e), f.topology))
  chip = topology.chip
  hbm = f"{chip.hbm_bytes / topo_lib.GiB:.1f} GiB"
  ici, dcn = sharding.mesh_shapes(config.mesh, topology.chips)
  print(f"{PROG}: {config.name} on {topology.name} ({topology.chips} x {chip.device_kind}"
        f"{f', {topology.num_slices} slices' if topology.num_slices > 1 else ''}, {hbm} "
        f"HBM per chip); mesh data {ici[0]} x fsdp {ici[1]} x tensor {ici[2]} (DCN "
        f"{' x '.join(map(str, dcn))}); jax {jax.__version__}, {compiler}")
  print(f"{PROG}: {program_line(config, topology)}")
  for r in reports:
    print(aot.format_step(r, hbm))
  if f.json:
    record = {"config": config.name, "topology": topology.name,
              "jax_topology": topology.jax_name, "num_slices": topology.num_slices,
              "chips": topology.chips, "device_kind": chip.device_kind,
              "hbm_bytes_per_chip": chip.hbm_bytes, "jax": jax.__version__,
              "compiler": compiler,
              "program": program_line(config, topology), "estimates": "step_s, tokens_per_s and mfu are the "
              "compiler's estimates, not measurements",
              "steps": [r.as_dict() for r in reports]}
    tmp = f.json + ".tmp"
    with open(tmp, "w") as out:
      json.dump(record, out, indent=1, allow_nan=False, default=_finite)
    os.replace(tmp, f.json)
  short = aot.short_steps(reports, f.min_free)
  if short:
    common.fail(PROG, aot.shortfall_line(short[0], topology, config, f.min_free))


def _finite(x):
  raise TypeError(f"not JSON serialisable: {x!r}")


def run():
  common.define_or_exit(PROG, _define_flags)
  common.run(PROG, main, __name__)


if __name__ == "__main__":
  run()
