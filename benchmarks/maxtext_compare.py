"""Our train step beside MaxText's, compiled for the same TPU slice and shape.

  python benchmarks/maxtext_compare.py --maxtext_python /work/maxtext_env/bin/python
  python benchmarks/maxtext_compare.py --maxtext_python /work/maxtext_env/bin/python \\
    --ours_python .venv/bin/python,/work/maxtext_env/bin/python --json cmp.json
  python benchmarks/maxtext_compare.py --maxtext_python ... \\
    --extra_ours=--config.train.loss_impl=chunked

Compiles, on this CPU host and touching no TPU, MaxText's train step (its own
`train_compile`, https://github.com/AI-Hypercomputer/maxtext) and ours (`lev-compile
--steps=train`) for one topology, each in its own process, and prints one Markdown table
of the compiler's per-chip figures: FLOPs, temporaries, total memory, the estimated step
time and bytes accessed, with ours / MaxText ratios.

MaxText needs its own environment (Python >= 3.12, its jax and libtpu):

  python3.12 -m venv /work/maxtext_env
  /work/maxtext_env/bin/pip install "jax[tpu]==0.12.0" "maxtext[tpu]==0.2.5"
  # ours on the same compiler (optional, a row of its own):
  /work/maxtext_env/bin/pip install --no-deps -e .

The shape is the rung's of experiments/ladder.py (d_model, heads, head_dim, d_ff, the
padded vocab, seq_len, bf16 activations, float32 params, tied embedding (a Leviathan
rung: MaxText's untied model, its nearest program), AdamW with the
rung's betas, eps, weight decay and clipping) with `--n_layers` layers and a global
batch of `--global_batch` sequences, the same attention kernel on both sides
(`--attention`: plain XLA, ours model.attention=xla and MaxText attention=dot_product;
or splash, ours splash and MaxText flash), pure FSDP over every chip, the same
remat (`--remat`) and scan (`--scan_layers`) on both.

Remat "none": MaxText 0.2.5 turns the string "none" given on its command line into
None, and its unscanned decoder wraps each layer in jax.checkpoint unless
remat_policy == "none", so `remat_policy=none` compiles MaxText with every layer fully
rematerialised (its "full"). For "none" the MaxText side therefore runs `train_compile`
through this file (`--maxtext_driver`): the same `train_compile.main`, with the parsed
config's remat_policy kept as the string "none" (no jax.checkpoint around the layers).
`--remat full` runs MaxText's stock command line. With `--scan_layers`, MaxText's
scanned decoder wraps the layer body in jax.checkpoint whatever the policy (None, full
remat, for "none"): a scanned comparison at remat none is not remat-matched, and the
report says so.

Every time here is XLA:TPU's cost-model ESTIMATE (`cost_analysis()["optimal_seconds"]`)
of a program compiled on this CPU host, never a measurement; memory is the compiler's
buffer assignment per chip. With `--scan_layers` both programs loop over the layers and
the cost model counts the loop body once, for MaxText and ours alike (ours then runs
with --noestimate_time so both rows are the looped programs' own figures).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PROG = "maxtext_compare"
GiB = 2 ** 30
ESTIMATE_NOTE = ("every step time is XLA:TPU's cost-model ESTIMATE for a program compiled "
                 "on a CPU host, never a measurement")
MAXTEXT_MODULE = "maxtext.trainers.pre_train.train_compile"
DRIVER_FLAG = "--maxtext_driver"
REMATS = ("none", "full")  # the policies with the same meaning on both sides
# --attention -> (ours model.attention, MaxText attention): the same kernel on both sides
ATTENTION = {"xla": ("xla", "dot_product"), "splash": ("splash", "flash")}
# TensorCores per chip in a Cloud TPU name (v5p-8 = 4 chips); MaxText names slices so.
_CORES_PER_CHIP = {"v4": 2, "v5p": 2, "v5e": 1, "v5litepod": 1, "v6e": 1}


class CompareError(Exception):
  """A bad argument or a side that could not be run: one line for the user."""


# ---------------------------------------------------------------------------------------
# Arguments
# ---------------------------------------------------------------------------------------

def parse_args(argv: list[str]) -> argparse.Namespace:
  p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
  p.add_argument("--maxtext_python", default=None,
                 help="Python of an environment with MaxText installed (required), e.g. "
                      "/work/maxtext_env/bin/python")
  p.add_argument("--ours_python", default=sys.executable,
                 help="Python(s) with lev_jax and libtpu for our side, comma-separated "
                      "(one table row each; default: this Python)")
  p.add_argument("--rung", default="tied_200m",
                 help="a rung of experiments/ladder.py: tied_* against MaxText's tied "
                      "model, leviathan_* against its untied one (MaxText has no LEV)")
  p.add_argument("--n_layers", type=int, default=2)
  p.add_argument("--global_batch", type=int, default=64, help="sequences per step")
  p.add_argument("--topology", default="v5p:2x2x1",
                 help="TPU slice as lev-compile names it (v5p:2x2x1, v5p-8, v6e:4x4)")
  p.add_argument("--maxtext_topology", default=None,
                 help="MaxText's compile_topology for it (default: derived, v5p:2x2x1 -> "
                      "v5p-8)")
  p.add_argument("--attention", default="xla", choices=tuple(ATTENTION),
                 help="xla: plain XLA attention on both sides (ours model.attention=xla, "
                      "MaxText attention=dot_product); splash: the TPU kernel on both "
                      "(ours splash, MaxText flash), which the cost model prices on "
                      "neither side")
  p.add_argument("--remat", default="none", choices=REMATS,
                 help="model.remat for ours and remat_policy for MaxText")
  p.add_argument("--scan_layers", action="store_true",
                 help="scan over the layers on both sides (cost model counts one layer)")
  p.add_argument("--extra_ours", action="append", default=[],
                 help="one more lev-compile flag for our side only, e.g. "
                      "--extra_ours=--config.train.loss_impl=chunked (repeatable)")
  p.add_argument("--extra_maxtext", action="append", default=[],
                 help="one more MaxText key=value for its side only (repeatable)")
  p.add_argument("--json", default=None, help="also write the figures to this file")
  p.add_argument("--timeout", type=float, default=3600.0,
                 help="seconds per compile before it is abandoned")
  a = p.parse_args(argv)
  check_args(a)
  return a


def check_args(a: argparse.Namespace) -> None:
  """Every argument checked before anything is compiled (CompareError, one line)."""
  if not a.maxtext_python:
    raise CompareError("--maxtext_python is required: the Python of an environment with "
                       "MaxText installed (python3.12 -m venv ENV; ENV/bin/pip install "
                       "'jax[tpu]==0.12.0' 'maxtext[tpu]==0.2.5')")
  if not ours_pythons(a.ours_python):
    raise CompareError("--ours_python is empty: expected one or more Pythons, "
                       "comma-separated")
  for flag, value in (("--maxtext_python", a.maxtext_python),
                      *(("--ours_python", p) for p in ours_pythons(a.ours_python))):
    if not (os.path.isfile(value) and os.access(value, os.X_OK)):
      raise CompareError(f"{flag}={value}: no such executable")
  if not a.rung.startswith(("tied_", "leviathan_")):
    raise CompareError(f"--rung={a.rung}: expected a rung of experiments/ladder.py "
                       "(tied_200m, leviathan_200m, ...)")
  if a.n_layers < 1:
    raise CompareError(f"--n_layers={a.n_layers}: expected a positive number")
  if a.global_batch < 1:
    raise CompareError(f"--global_batch={a.global_batch}: expected a positive number")
  chips = topology_chips(a.topology)  # raises on a malformed name
  if a.global_batch % chips:
    raise CompareError(f"--global_batch={a.global_batch} does not split over the {chips} "
                       f"chips of {a.topology} (MaxText's per_device_batch_size)")
  if a.maxtext_topology is None:
    a.maxtext_topology = maxtext_topology(a.topology)
  for extra in a.extra_ours:
    if not extra.startswith("--"):
      raise CompareError(f"--extra_ours={extra}: expected a lev-compile flag, e.g. "
                         "--extra_ours=--config.train.loss_impl=chunked")
  for extra in a.extra_maxtext:
    if "=" not in extra or extra.startswith("-"):
      raise CompareError(f"--extra_maxtext={extra}: expected MaxText's key=value, e.g. "
                         "--extra_maxtext=num_vocab_tiling=4")
  if a.json:
    parent = os.path.dirname(os.path.abspath(a.json))
    if os.path.isdir(a.json) or not os.path.isdir(parent):
      raise CompareError(f"--json={a.json}: expected a file path in an existing folder")
  if not a.timeout > 0:
    raise CompareError(f"--timeout={a.timeout}: expected a positive number of seconds")


def ours_pythons(value: str) -> list[str]:
  return [p.strip() for p in value.split(",") if p.strip()]


_TOPOLOGY = re.compile(r"^(?P<gen>[a-z0-9]+)(?:-(?P<count>\d+)|:(?P<shape>\d+(?:x\d+)*))$")


def _split_topology(name: str) -> tuple[str, int]:
  m = _TOPOLOGY.match(name.strip().lower())
  if not m or m["gen"] not in _CORES_PER_CHIP:
    raise CompareError(f"--topology={name}: expected GENERATION:SHAPE (v5p:2x2x1, v6e:4x4) "
                       f"or GENERATION-COUNT (v5p-8), GENERATION one of "
                       f"{', '.join(sorted(_CORES_PER_CHIP))}")
  gen, cores = m["gen"], _CORES_PER_CHIP[m["gen"]]
  if m["count"] is not None:
    count = int(m["count"])
    if count < 1 or count % cores:
      raise CompareError(f"--topology={name}: {gen}-N counts TensorCores ({cores} per chip)")
    return gen, count // cores
  return gen, math.prod(int(s) for s in m["shape"].split("x"))


def topology_chips(name: str) -> int:
  return _split_topology(name)[1]


def maxtext_topology(name: str) -> str:
  """lev-compile's topology name -> MaxText's compile_topology (v5p:2x2x1 -> v5p-8)."""
  gen, chips = _split_topology(name)
  gen = "v5e" if gen == "v5litepod" else gen
  return f"{gen}-{chips * _CORES_PER_CHIP[gen]}"


# ---------------------------------------------------------------------------------------
# The two sides' commands
# ---------------------------------------------------------------------------------------

def rung_shape(rung: str) -> dict:
  """The rung's model and optimizer settings that MaxText's command needs, from
  experiments/ladder.py (needs lev_jax and ml_collections importable here)."""
  sys.path.insert(0, str(REPO))
  from lev_jax.config import padded_vocab_size  # pylint: disable=import-outside-toplevel
  from lev_jax.experiments import load_experiment  # pylint: disable=import-outside-toplevel
  try:
    c = load_experiment(REPO / "experiments" / "ladder.py").get_config(rung)
  except ValueError as e:
    raise CompareError(f"--rung={rung}: {e}") from e
  m, o = c.model, c.optim
  if m.embedding not in ("tied", "lev"):
    raise CompareError(f"--rung={rung}: model.embedding = {m.embedding!r}; expected a tied "
                       "or Leviathan rung")
  # MaxText has no LEV: a Leviathan rung is set beside MaxText's untied model (its own
  # input table and a separate head), the nearest program it has.
  return {"tied": m.embedding == "tied", "d_model": m.d_model, "n_heads": m.n_heads,
          "n_kv_heads": m.n_kv_heads,
          "head_dim": m.head_dim, "d_ff": m.d_ff,
          "vocab": padded_vocab_size(m.vocab_size, m.vocab_multiple),
          "seq_len": c.train.seq_len, "dtype": m.dtype, "param_dtype": m.param_dtype,
          "norm_eps": m.norm_eps, "rope_theta": m.rope_theta,
          "b1": o.b1, "b2": o.b2, "eps": o.eps, "weight_decay": o.weight_decay,
          "clip_norm": o.clip_norm, "z_loss": o.z_loss}


def _yaml_number(x) -> str:
  """A number as OmegaConf reads it back as one (1e-05 is a string to YAML 1.1)."""
  if isinstance(x, float) and not x.is_integer():
    text = repr(x)
    if "e" in text and "." not in text.split("e")[0]:
      mantissa, exp = text.split("e")
      text = f"{mantissa}.0e{exp}"
    return text
  return str(int(x)) if isinstance(x, float) else str(x)


def maxtext_overrides(shape: dict, a: argparse.Namespace, output_dir: str) -> list[str]:
  """MaxText's key=value arguments for the same step as ours."""
  chips = topology_chips(a.topology)
  kv = {
      "compile_topology": a.maxtext_topology, "compile_topology_num_slices": 1,
      "run_name": "maxtext_compare", "base_output_directory": output_dir,
      "dataset_type": "synthetic", "enable_checkpointing": "false",
      "base_emb_dim": shape["d_model"], "base_num_query_heads": shape["n_heads"],
      "base_num_kv_heads": shape["n_kv_heads"], "head_dim": shape["head_dim"],
      "base_mlp_dim": shape["d_ff"], "base_num_decoder_layers": a.n_layers,
      "vocab_size": shape["vocab"], "max_target_length": shape["seq_len"],
      "per_device_batch_size": a.global_batch // chips,
      "dtype": shape["dtype"], "weight_dtype": shape["param_dtype"],
      # tied: the embedding table is the head; for a Leviathan rung, untied
      "logits_via_embedding": str(shape.get("tied", True)).lower(),
      "attention": ATTENTION[a.attention][1],   # dot_product: plain XLA, as ours' xla
      "ici_fsdp_parallelism": chips,            # pure FSDP, as ours' mesh.fsdp=-1
      "remat_policy": a.remat, "scan_layers": str(a.scan_layers).lower(),
      "enable_dropout": "false", "dropout_rate": 0,
      "normalization_layer_epsilon": _yaml_number(shape["norm_eps"]),
      "rope_max_timescale": _yaml_number(shape["rope_theta"]),
      "opt_type": "adamw", "adam_b1": _yaml_number(shape["b1"]),
      "adam_b2": _yaml_number(shape["b2"]), "adam_eps": _yaml_number(shape["eps"]),
      "adam_weight_decay": _yaml_number(shape["weight_decay"]),
      "gradient_clipping_threshold": _yaml_number(shape["clip_norm"]),
      "z_loss_multiplier": _yaml_number(shape["z_loss"]),
  }
  args = [f"{k}={v}" for k, v in kv.items()]
  return args + list(a.extra_maxtext)  # later keys win in OmegaConf.from_cli


def maxtext_command(a: argparse.Namespace, overrides: list[str]) -> list[str]:
  """MaxText's train_compile: its stock command line, or (remat none) through this file's
  driver, which keeps remat_policy the string "none" (module docstring)."""
  remat = [o.split("=", 1)[1] for o in overrides if o.startswith("remat_policy=")]
  if remat and remat[-1].lower() == "none":
    return [a.maxtext_python, str(Path(__file__).resolve()), DRIVER_FLAG, *overrides]
  return [a.maxtext_python, "-m", MAXTEXT_MODULE, *overrides]


def ours_command(python: str, a: argparse.Namespace, json_path: str) -> list[str]:
  cmd = [python, "-m", "lev_jax.cli.compile",
         f"--config=experiments/ladder.py:{a.rung}",
         f"--config.model.n_layers={a.n_layers}",
         f"--config.train.global_batch_size={a.global_batch}",
         f"--config.model.scan_layers={a.scan_layers}",
         f"--config.model.attention={ATTENTION[a.attention][0]}",
         f"--config.model.remat={a.remat}",
         "--config.mesh.data=1", "--config.mesh.fsdp=-1", "--config.mesh.tensor=1",
         f"--topology={a.topology}", "--steps=train", f"--json={json_path}"]
  if a.scan_layers:
    cmd.append("--noestimate_time")  # the looped program's own figures, as MaxText's
  return cmd + list(a.extra_ours)


# ---------------------------------------------------------------------------------------
# Reading MaxText's output
# ---------------------------------------------------------------------------------------

_NUMBER = r"([-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|nan|inf))"


def parse_maxtext_output(text: str) -> dict:
  """train_compile's own lines -> per-chip figures.

  It prints `Cost analysis: {...}` (Compiled.cost_analysis(), a dict with 'flops',
  'bytes accessed', 'optimal_seconds' and per-operand entries) and `Memory analysis:
  CompiledMemoryStats(name=bytes, ...)`. Raises CompareError naming what is missing."""
  cost_line = _last_line_with(text, "Cost analysis:")
  mem_line = _last_line_with(text, "Memory analysis:")
  if cost_line is None or mem_line is None:
    missing = " and ".join(w for w, l in (("'Cost analysis:'", cost_line),
                                           ("'Memory analysis:'", mem_line)) if l is None)
    raise CompareError(f"MaxText's output has no {missing} line (did train_compile finish?)")
  cost = {}
  for key in ("flops", "bytes accessed", "optimal_seconds", "transcendentals"):
    m = re.search(r"'" + re.escape(key) + r"':\s*" + _NUMBER, cost_line)
    cost[key] = float(m[1]) if m else None
  if cost["flops"] is None:
    raise CompareError("MaxText's cost analysis has no 'flops' entry")
  mem = {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", mem_line)}
  need = ("argument_size_in_bytes", "output_size_in_bytes", "alias_size_in_bytes",
          "temp_size_in_bytes", "generated_code_size_in_bytes")
  if any(k not in mem for k in need):
    raise CompareError("MaxText's memory analysis lacks "
                       + ", ".join(k for k in need if k not in mem))
  seconds = cost["optimal_seconds"]
  return figures(flops=cost["flops"], bytes_accessed=cost["bytes accessed"],
                 step_s=seconds if seconds is not None and seconds > 0 else None,
                 arguments=mem["argument_size_in_bytes"], outputs=mem["output_size_in_bytes"],
                 alias=mem["alias_size_in_bytes"], temp=mem["temp_size_in_bytes"],
                 code=mem["generated_code_size_in_bytes"],
                 time_source="cost model" if seconds is not None and seconds > 0 else "")


def _last_line_with(text: str, marker: str) -> str | None:
  lines = [l for l in text.splitlines() if marker in l]
  return lines[-1].split(marker, 1)[1] if lines else None


def figures(flops, bytes_accessed, step_s, arguments, outputs, alias, temp, code,
            time_source) -> dict:
  """One side's per-chip figures; total = arguments + outputs - aliased + temporaries +
  code, as lev-compile adds them."""
  return {"flops": flops, "bytes_accessed": bytes_accessed, "step_s": step_s,
          "time_source": time_source, "arguments_bytes": arguments,
          "outputs_bytes": outputs, "alias_bytes": alias, "temp_bytes": temp,
          "code_bytes": code, "total_bytes": arguments + outputs - alias + temp + code}


def ours_figures(record: dict) -> dict:
  """lev-compile's --json record -> the same per-chip figures."""
  step = next(s for s in record["steps"] if s["step"] == "train")
  if step.get("error"):
    raise CompareError(f"our train step did not compile: {step['error']}")
  # lev-compile adds splash attention at its FLOPs at peak (lev_jax/aot.py
  # `_price_splash`); MaxText's kernel is unpriced, so the comparison leaves it out too.
  f = figures(flops=step["compiler_flops"], bytes_accessed=step["bytes_accessed"],
              step_s=step["step_s"] - step.get("splash_s", 0.0), arguments=step["arguments_bytes"],
              outputs=step["outputs_bytes"], alias=step["alias_bytes"],
              temp=step["temp_bytes"], code=step["code_bytes"],
              time_source=step["time_source"])
  f["model_flops"] = step.get("analytic_flops_per_chip")  # lev_jax/flops.py, per chip
  return f


UNDERCOUNT = 0.9  # compiler FLOPs below this share of the model FLOPs: a loop counted once


def model_flops(ours: list[dict]) -> float | None:
  """The step's model FLOPs per chip (lev_jax/flops.py, from ours' lev-compile record):
  the same model on both sides, so the yardstick for MaxText's count too."""
  return next((s["model_flops"] for s in ours if s.get("model_flops")), None)


def undercounted(side: dict, model: float | None) -> bool:
  """Whether the compiler's FLOPs fall well short of the model FLOPs: the program loops
  (scanned layers, a chunked loss, ...) and XLA's cost model counted a loop body once,
  so its FLOPs, bytes and time are undercounts."""
  return bool(model and side.get("flops") is not None
              and side["flops"] < UNDERCOUNT * model)


# ---------------------------------------------------------------------------------------
# Running
# ---------------------------------------------------------------------------------------

def _run(cmd: list[str], timeout: float, log_path: Path) -> tuple[int, str, float]:
  """(exit status, stdout + stderr, seconds); the output is also kept in log_path."""
  start = time.perf_counter()
  try:
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout)
    rc, out = proc.returncode, proc.stdout + proc.stderr
  except subprocess.TimeoutExpired as e:
    rc = 124
    out = ((e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes)
           else (e.stdout or "")) + f"\n{PROG}: timed out after {timeout:.0f} s"
  log_path.write_text(out)
  return rc, out, time.perf_counter() - start


def _last_error(out: str) -> str:
  lines = [l.strip() for l in out.strip().splitlines() if l.strip()]
  errors = [l for l in lines if re.search(r"error|Error|timed out", l)]
  return (errors or lines or ["(no output)"])[-1][:400]


def probe_versions(python: str, dists: tuple[str, ...]) -> dict:
  """Installed versions of `dists` in another Python ({} entries None when absent)."""
  code = ("import importlib.metadata as m, json, sys\n"
          "v = {}\n"
          "for d in sys.argv[1:]:\n"
          "  try: v[d] = m.version(d)\n"
          "  except m.PackageNotFoundError: v[d] = None\n"
          "print(json.dumps(v))")
  proc = subprocess.run([python, "-c", code, *dists], capture_output=True, text=True,
                        timeout=120)
  if proc.returncode:
    raise CompareError(f"{python} could not report its packages: {_last_error(proc.stderr)}")
  return json.loads(proc.stdout.strip().splitlines()[-1])


def run_maxtext(a, shape, work: Path) -> dict:
  versions = probe_versions(a.maxtext_python, ("maxtext", "jax", "jaxlib", "libtpu"))
  if not versions.get("maxtext"):
    raise CompareError(f"--maxtext_python={a.maxtext_python}: MaxText is not installed "
                       "there (pip install 'maxtext[tpu]==0.2.5', Python >= 3.12)")
  if not versions.get("libtpu"):
    raise CompareError(f"--maxtext_python={a.maxtext_python}: libtpu is not installed there "
                       "(pip install 'jax[tpu]')")
  overrides = maxtext_overrides(shape, a, str(work / "maxtext_output"))
  cmd = maxtext_command(a, overrides)
  print(f"{PROG}: compiling MaxText {versions['maxtext']}'s train step "
        f"(jax {versions['jax']}, libtpu {versions['libtpu']}) ...", flush=True)
  rc, out, took = _run(cmd, a.timeout, work / "maxtext.log")
  side = {"side": f"MaxText {versions['maxtext']}", "versions": versions,
          "command": shlex.join(cmd), "wall_s": took, "log": str(work / "maxtext.log"),
          "remat": a.remat + (" (driver: remat_policy kept as the string 'none')"
                              if DRIVER_FLAG in cmd else "")}
  if rc:
    side["error"] = f"exit {rc}: {_last_error(out)}"
    return side
  try:
    side.update(parse_maxtext_output(out))
  except CompareError as e:
    side["error"] = str(e)
  return side


def run_ours(python: str, a, work: Path, index: int) -> dict:
  versions = probe_versions(python, ("lev_jax", "jax", "jaxlib", "libtpu"))
  json_path = work / f"ours_{index}.json"
  cmd = ours_command(python, a, str(json_path))
  print(f"{PROG}: compiling our train step (jax {versions['jax']}, libtpu "
        f"{versions['libtpu']}, {python}) ...", flush=True)
  rc, out, took = _run(cmd, a.timeout, work / f"ours_{index}.log")
  side = {"side": "ours", "python": python, "versions": versions, "command": shlex.join(cmd),
          "wall_s": took, "log": str(work / f"ours_{index}.log")}
  if rc or not json_path.exists():
    side["error"] = f"exit {rc}: {_last_error(out)}"
    return side
  try:
    side.update(ours_figures(json.loads(json_path.read_text())))
  except CompareError as e:
    side["error"] = str(e)
  return side


# ---------------------------------------------------------------------------------------
# The table
# ---------------------------------------------------------------------------------------

METRICS = (  # (key, column title, scale, format)
    ("flops", "FLOPs per chip (TFLOP)", 1e12, "{:.2f}"),
    ("temp_bytes", "temporaries (GiB)", GiB, "{:.2f}"),
    ("total_bytes", "total (GiB)", GiB, "{:.2f}"),
    ("step_s", "step time (s, compiler ESTIMATE)", 1.0, "{:.4f}"),
    ("bytes_accessed", "bytes accessed (GB)", 1e9, "{:.1f}"),
)


# Figures of the cost model (a loop body counted once undercounts them); memory is the
# buffer assignment of the whole program either way.
COST_MODEL_KEYS = ("flops", "step_s", "bytes_accessed")


def side_label(side: dict) -> str:
  v = side.get("versions", {})
  return f"{side['side']} (jax {v.get('jax')}, libtpu {v.get('libtpu')})"


def ratios(ours: dict, maxtext: dict) -> dict:
  """ours / MaxText for every metric both have (None where either lacks it)."""
  out = {}
  for key, *_ in METRICS:
    x, y = ours.get(key), maxtext.get(key)
    out[key] = x / y if x is not None and y else None
  return out


def render_table(maxtext: dict, ours: list[dict]) -> str:
  """Markdown: MaxText's row, then each of ours with an `ours / MaxText` row under it; a
  side whose FLOPs are an undercount (`undercounted`) is marked "loop counted once"."""
  model = model_flops(ours)
  head = "| per chip | " + " | ".join(title for _, title, _, _ in METRICS) + " |"
  rows = [head, "|---" * (len(METRICS) + 1) + "|"]

  def row(label, side):
    if undercounted(side, model):
      label += " [loop counted once: undercount]"
    if side.get("error"):
      return f"| {label} | " + " | ".join(["failed"] * len(METRICS)) + " |"
    cells = [("—" if side.get(k) is None else fmt.format(side[k] / scale))
             for k, _, scale, fmt in METRICS]
    return f"| {label} | " + " | ".join(cells) + " |"

  rows.append(row(side_label(maxtext), maxtext))
  for side in ours:
    rows.append(row(side_label(side), side))
    if not side.get("error") and not maxtext.get("error"):
      r = ratios(side, maxtext)
      loop = undercounted(side, model) or undercounted(maxtext, model)
      rows.append("| ours / MaxText | " + " | ".join(
          "n/c" if loop and k in COST_MODEL_KEYS else "—" if r[k] is None
          else f"{r[k]:.2f}x" for k, *_ in METRICS) + " |")
  return "\n".join(rows)


def render_report(a, shape: dict, maxtext: dict, ours: list[dict]) -> str:
  chips = topology_chips(a.topology)
  lines = [
      f"{a.rung} with {a.n_layers} layers (d_model {shape['d_model']}, {shape['n_heads']} "
      f"heads x {shape['head_dim']}, d_ff {shape['d_ff']}, vocab {shape['vocab']:,}), "
      f"global batch {a.global_batch} x {shape['seq_len']}, {shape['dtype']} activations, "
      f"{shape['param_dtype']} params, "
      + ("plain XLA attention" if a.attention == "xla" else
         "splash attention (ours splash, MaxText flash; the cost model prices the kernel "
         "on neither side)")
      + f", FSDP {chips}, remat "
      f"{a.remat}, scan_layers {a.scan_layers}; {a.topology} (MaxText "
      f"{a.maxtext_topology}), compiled on this CPU host.",
      f"Per chip; {ESTIMATE_NOTE}."
      + (" Scanned layers: the cost model counts the layer loop's body once on both "
         "sides." if a.scan_layers else "")
      + (" MaxText's scanned decoder rematerialises every layer even at remat none "
         "(jax.checkpoint with policy None): not remat-matched."
         if a.scan_layers and a.remat == "none" else ""),
      "",
      render_table(maxtext, ours),
      "",
  ]
  model = model_flops(ours)
  if model:
    lines.append(f"Model FLOPs per chip (lev_jax/flops.py): {model / 1e12:.2f} TFLOP.")
  for side in [maxtext, *ours]:
    if side.get("error"):
      lines.append(f"{side_label(side)} failed: {side['error']} (log: {side['log']})")
    elif undercounted(side, model):
      lines.append(
          f"{side_label(side)}: the compiler counts {side['flops'] / 1e12:.2f} TFLOP per "
          f"chip, under {UNDERCOUNT:.0%} of the model's {model / 1e12:.2f}: the program "
          "loops and XLA's cost model counted a loop body once, so its FLOPs, bytes "
          "accessed and step time are undercounts, not comparable (n/c); its memory is "
          "the whole program's.")
  lines.append(f"MaxText's command ({maxtext.get('remat', a.remat)}):")
  lines.append(f"  {maxtext['command']}")
  for side in ours:
    lines.append(f"ours ({side['python']}):")
    lines.append(f"  {side['command']}")
  return "\n".join(lines)


# ---------------------------------------------------------------------------------------
# The MaxText-side driver (runs inside MaxText's environment: stdlib + MaxText only)
# ---------------------------------------------------------------------------------------

def maxtext_driver(overrides: list[str]) -> None:
  """MaxText's train_compile.main with remat_policy kept as the string "none".

  MaxText's config parser turns a "none" value into None; its unscanned decoder then
  wraps every layer in jax.checkpoint (policy None: nothing saved) because None !=
  "none". Here the parsed config gets the string back, so the layers are not
  rematerialised, as `remat_policy: none` intends. Everything else is MaxText's own."""
  from absl import app  # pylint: disable=import-outside-toplevel
  from maxtext.configs import pyconfig  # pylint: disable=import-outside-toplevel
  from maxtext.trainers.pre_train import train_compile  # pylint: disable=import-outside-toplevel

  initialize = pyconfig.initialize

  def initialize_keeping_none(argv, *args, **kwargs):
    config = initialize(argv, *args, **kwargs)
    if config.remat_policy is None:
      object.__getattribute__(config, "_flat_config")["remat_policy"] = "none"
      try:  # deepcopies rebuild from the pydantic model: keep it there too
        object.__getattribute__(config, "_pydantic_config").remat_policy = "none"
      except Exception:  # pylint: disable=broad-exception-caught
        pass
      print(f"{PROG} driver: remat_policy kept as the string 'none' (layers not "
            "rematerialised)", flush=True)
    return config

  pyconfig.initialize = initialize_keeping_none
  app.run(train_compile.main, argv=["train_compile", *overrides])


# ---------------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
  argv = sys.argv[1:] if argv is None else argv
  if argv[:1] == [DRIVER_FLAG]:
    maxtext_driver(argv[1:])
    return 0
  try:
    a = parse_args(argv)
    shape = rung_shape(a.rung)
    # Each side's full output (and MaxText's output directory) stays here afterwards.
    work = Path(tempfile.mkdtemp(prefix="maxtext_compare_"))
    print(f"{PROG}: logs in {work}", flush=True)
    maxtext = run_maxtext(a, shape, work)
    ours = [run_ours(p, a, work, i) for i, p in enumerate(ours_pythons(a.ours_python))]
    report = render_report(a, shape, maxtext, ours)
  except CompareError as e:
    print(f"{PROG}: error: {e}", file=sys.stderr)
    return 2
  print(report)
  if a.json:
    record = {
        "rung": a.rung, "n_layers": a.n_layers, "global_batch": a.global_batch,
        "topology": a.topology, "maxtext_topology": a.maxtext_topology, "remat": a.remat,
        "scan_layers": a.scan_layers, "shape": shape, "extra_ours": a.extra_ours,
        "extra_maxtext": a.extra_maxtext, "estimates": ESTIMATE_NOTE,
        "per_chip": True, "model_flops_per_chip": model_flops(ours),
        "undercounted": {"maxtext": undercounted(maxtext, model_flops(ours)),
                         "ours": [undercounted(s, model_flops(ours)) for s in ours]},
        "maxtext": maxtext, "ours": ours,
        "ratios": [None if s.get("error") or maxtext.get("error") else ratios(s, maxtext)
                   for s in ours],
        "table": render_table(maxtext, ours)}
    tmp_json = a.json + ".tmp"
    with open(tmp_json, "w") as f:
      json.dump(record, f, indent=1)
    os.replace(tmp_json, a.json)
  return 1 if maxtext.get("error") or any(s.get("error") for s in ours) else 0


if __name__ == "__main__":
  sys.exit(main())
