"""Tied vs Leviathan train steps, LEV fused vs Pallas, bf16 vs float32, on one chip.

  python benchmarks/device_check.py --out $OUT                   # one GPU, e.g. an H200
  python benchmarks/device_check.py --tiny --platform cpu --out /tmp/device_check

Every figure is measured on the device the script runs on and labelled with it (device
kind, platform, jax and jaxlib versions, lev_jax commit). Figures from a CPU (`--tiny`,
or any run where jax found no accelerator) are not accelerator figures: they only show
that the code path runs.

What it measures, in this order (`--sections` picks and orders them):
  tied_vs_leviathan  the real jitted train step (lev_jax.train: partition, init_state,
      make_train_step: forward, backward, AdamW, state donated) of experiments/ladder.py's
      tied_200m / leviathan_200m and tied_1.2b / leviathan_1.2b, with model.n_layers cut
      to --layers and a global batch of --batch x --seq_len tokens so that they fit one
      chip; everything else (vocab 200,019, d_model, bf16 compute, LEV at the paper's
      defaults, lev.mode and chunk_size) is the ladder's. --warmup steps first (the first
      one compiles), then --reps repetitions interleaved (tied, leviathan, tied, ...) so that
      any drift hits both alike. Per config: median seconds per step, tokens/s, model
      TFLOP/s and MFU (lev_jax.flops.train_flops_per_step / (step time x the chip's
      dense bf16 peak, lev_jax.flops.PEAK_BF16_FLOPS); null where the peak is unknown,
      e.g. a CPU), and per shape the Leviathan / tied ratio (median of the
      per-repetition ratios).
  dtype  --dtype_steps train steps of the 200M Leviathan shape (layers and batch cut as
      above) with model.dtype "bfloat16" and "float32": same init (config.seed), same
      batches (Zipf(1.0) ids, so the loss has something to learn), warm-up shortened to
      half the steps so the loss moves; every step's loss, the final losses and their
      relative difference |bf16 - f32| / |f32|. float32 runs at jax's default matmul
      precision (recorded), which XLA may lower to TF32 on NVIDIA tensor cores.
  lev_impl  the Leviathan configs of both shapes with each LEV core, lev.impl "fused",
      "vectorized" (every seed coordinate at once; the ladder's core) and "pallas"
      (lev_pallas.py: Triton on a GPU, Mosaic on a TPU, the interpreter on a CPU), timed
      interleaved with the config's own core (kept from tied_vs_leviathan), with their
      ratios to it; also each one's first-step loss (same init, same batch), which the
      cores should agree on. A config that
      fails to compile or run is recorded as "failed: <first line of the error>" and
      the script goes on.
Token batches are synthetic (no input pipeline): uniform ids for the timings.

Time: each measurement starts only while less than --budget_s (420) has passed since
the script started, and repetitions stop at the budget (after --min_reps); JSON and
Markdown are rewritten after every measurement, and a watchdog writes them and exits
with status 3 at --hard_limit_s (465) should a compile hang, so that a run under an
8-minute limit always leaves its results. Not yet run on a GPU. Sizes, from XLA's
memory analysis of these steps compiled without a GPU for an H100 (BUILD.md, "Compiling
for a GPU without one"; defaults --layers 4, --batch 16 x 512): leviathan_200m 2.1 GiB
of state + 14.1 GiB temporaries, leviathan_1.2b 6.9 + 15.3 GiB; each of those compiles
took 18-26 s on a 2-core CPU, so the run's ~7 train-step compiles should fit the budget.

Writes OUT/device_check.json (strict JSON; lev_jax.workdir.loads_json reads it back)
and OUT/device_check.md; OUT is --out, else $OUT, else ./device_check_out.
"""

from __future__ import annotations

import time

_START = time.monotonic()  # before jax's import: the budget counts the whole process

import argparse  # noqa: E402
import datetime  # noqa: E402
import math  # noqa: E402
import os  # noqa: E402
import platform as _platform  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
from pathlib import Path  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SECTIONS = ("tied_vs_leviathan", "dtype", "lev_impl")
JSON_NAME, MD_NAME = "device_check.json", "device_check.md"


def parse_args(argv=None) -> argparse.Namespace:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--out", default=os.environ.get("OUT") or "device_check_out",
                 help="output folder (default: $OUT, else ./device_check_out)")
  p.add_argument("--platform", default=None,
                 help="JAX_PLATFORMS for this run (e.g. cpu); default: jax's choice")
  p.add_argument("--tiny", action="store_true",
                 help="experiments/smoke.py shapes and a few steps: the same code path "
                 "in well under a minute on a CPU")
  p.add_argument("--layers", type=int, default=None,
                 help="model.n_layers (default 4; --tiny: smoke's 2)")
  p.add_argument("--batch", type=int, default=None,
                 help="global batch in sequences (default 16; --tiny: 4)")
  p.add_argument("--seq_len", type=int, default=None,
                 help="tokens per sequence (default: the config's, 512; --tiny: 64)")
  p.add_argument("--reps", type=int, default=None,
                 help="timed repetitions per config (default 10; --tiny: 2)")
  p.add_argument("--min_reps", type=int, default=2,
                 help="repetitions run even past the budget (default 2)")
  p.add_argument("--warmup", type=int, default=None,
                 help="untimed steps before timing, the first compiles "
                 "(default 3; --tiny: 1)")
  p.add_argument("--dtype_steps", type=int, default=None,
                 help="steps of the bf16 vs float32 comparison (default 20; --tiny: 4)")
  p.add_argument("--sections", default=",".join(SECTIONS),
                 help=f"comma-separated, run in this order (default {','.join(SECTIONS)})")
  p.add_argument("--budget_s", type=float, default=420.0,
                 help="no new measurement starts after this many seconds (default 420)")
  p.add_argument("--hard_limit_s", type=float, default=None,
                 help="watchdog: write what there is and exit 3 (default budget_s + 45)")
  args = p.parse_args(argv)
  tiny = args.tiny
  for name, full, small in (("layers", 4, None), ("batch", 16, 4), ("seq_len", None, 64),
                            ("reps", 10, 2), ("warmup", 3, 1), ("dtype_steps", 20, 4)):
    if getattr(args, name) is None:
      setattr(args, name, small if tiny else full)
  if args.hard_limit_s is None:
    args.hard_limit_s = args.budget_s + 45.0
  sections = [s for s in args.sections.split(",") if s]
  unknown = [s for s in sections if s not in SECTIONS]
  if unknown:
    p.error(f"--sections: unknown {', '.join(unknown)}; expected a comma-separated subset "
            f"of {', '.join(SECTIONS)}")
  args.sections = sections
  for name in ("layers", "batch", "seq_len", "reps", "warmup", "dtype_steps"):
    v = getattr(args, name)
    if v is not None and v < 1:
      p.error(f"--{name} = {v}: expected at least 1")
  return args


ARGS = parse_args() if __name__ == "__main__" else None
if ARGS is not None and ARGS.platform:
  os.environ["JAX_PLATFORMS"] = ARGS.platform  # before jax is imported

import jax  # noqa: E402
import jaxlib  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, str(ROOT / "benchmarks"))

from step_time import token_batch  # noqa: E402

from lev_jax import flops, sharding, train  # noqa: E402
from lev_jax.config import validate  # noqa: E402
from lev_jax.experiments import experiments_dir, load_experiment  # noqa: E402
from lev_jax.workdir import json_text  # noqa: E402


def elapsed() -> float:
  return time.monotonic() - _START


def first_line(e: BaseException) -> str:
  text = str(e).strip().splitlines()
  return f"failed: {type(e).__name__}: {text[0] if text else ''}"[:500]


# ---------------------------------------------------------------- configs


def shape_configs(tiny: bool) -> dict:
  """shape -> {"tied": (name, get_config thunk), "leviathan": ...}."""
  if tiny:
    smoke = load_experiment(experiments_dir() / "smoke.py")
    return {"smoke": {k: (f"smoke.py:{k}", lambda k=k: smoke.get_config(k))
                      for k in ("tied", "leviathan")}}
  ladder = load_experiment(experiments_dir() / "ladder.py")
  return {size: {k: (f"ladder.py:{k}_{size}",
                     lambda k=k, s=size: ladder.get_config(f"{k}_{s}"))
                 for k in ("tied", "leviathan")} for size in ("200m", "1.2b")}


def cut(config, args, **lev):
  """The config with n_layers, batch and seq_len cut to one chip; one device, no
  gradient accumulation; `lev` overrides config.lev."""
  c = config
  c.model.n_layers = args.layers or c.model.n_layers
  c.train.global_batch_size = args.batch
  c.train.seq_len = args.seq_len or c.train.seq_len
  c.train.grad_accum_steps = 1
  c.eval.batch_size = args.batch
  c.mesh.update(data=1, fsdp=1, tensor=1, dcn_data=1, dcn_fsdp=1, dcn_tensor=1)
  for k, v in lev.items():
    c.lev[k] = v
  return validate(c)


def describe(name: str, c) -> dict:
  m = c.model
  out = {"config": name, "embedding": m.embedding, "n_layers": m.n_layers,
         "d_model": m.d_model, "vocab_size": m.vocab_size, "dtype": m.dtype,
         "global_batch": c.train.global_batch_size, "seq_len": c.train.seq_len,
         "tokens_per_step": flops.tokens_per_step(c),
         "model_flops_per_step": flops.train_flops_per_step(c)["total"]}
  if m.embedding == "lev":
    out.update(lev_impl=c.lev.impl, lev_plan=flops.lev_plan_line(c))
  return out


# ---------------------------------------------------------------- one train step


class Run:
  """One config's train state and jitted step on the first device, with its timings.

  Built with lev_jax.train.partition / init_state / make_train_step on a 1-device mesh;
  `warmup` steps run at once (the first compiles: `first_step_s`), their losses kept.
  """

  def __init__(self, name: str, config, batch: dict, warmup: int):
    self.name, self.config = name, config
    mesh = sharding.make_mesh(config.mesh, jax.devices()[:1])
    part = train.partition(config, mesh)
    t0 = time.perf_counter()
    self.state = train.init_state(part, config)
    jax.block_until_ready(self.state)
    self.init_s = time.perf_counter() - t0
    self.step = train.make_train_step(part, config)
    self.batch = sharding.to_global(batch, part.batch_sharding)
    self.part = part
    self.losses, self.times = [], []
    t0 = time.perf_counter()
    self.train([self.batch])
    self.first_step_s = time.perf_counter() - t0
    self.train([self.batch] * (warmup - 1))

  def train(self, batches) -> None:
    """One step per batch (already global arrays), each loss fetched."""
    for b in batches:
      self.state, m = self.step(self.state, b)
      self.losses.append(float(m["loss"]))

  def run_once(self) -> None:
    t0 = time.perf_counter()
    self.state, m = self.step(self.state, self.batch)
    jax.block_until_ready(m)
    self.times.append(time.perf_counter() - t0)

  def record(self, device_kind: str) -> dict:
    out = describe(self.name, self.config)
    out.update(init_s=self.init_s, first_step_s=self.first_step_s,
               warmup_losses=list(self.losses), reps=len(self.times),
               step_s_all=list(self.times))
    if self.times:
      med = statistics.median(self.times)
      f = out["model_flops_per_step"]
      out.update(step_s=med, tokens_per_s=out["tokens_per_step"] / med,
                 model_tflops_per_s=f / med / 1e12,
                 mfu=flops.mfu(f, med, 1, device_kind))
    return out


def interleave(runs: list[Run], args, budget: "Budget") -> None:
  """--reps rounds over `runs`; stops at the budget once --min_reps rounds are done."""
  for rep in range(args.reps):
    if rep >= args.min_reps and budget.over():
      budget.note(f"repetitions of {', '.join(r.name for r in runs)} stopped at {rep}")
      return
    for r in runs:
      r.run_once()


def paired_ratio(num: Run, den: Run) -> float | None:
  pairs = [a / b for a, b in zip(num.times, den.times)]
  return statistics.median(pairs) if pairs else None


# ---------------------------------------------------------------- report


class Budget:
  def __init__(self, budget_s: float):
    self.budget_s, self.notes = budget_s, []

  def over(self) -> bool:
    return elapsed() > self.budget_s

  def note(self, text: str) -> None:
    self.notes.append(f"{text} ({elapsed():.0f} s)")


class Report:
  """The results so far, written whole (JSON and Markdown) after every measurement."""

  def __init__(self, out: Path, header: dict, settings: dict, budget: Budget):
    self.out, self.budget, self.lock = out, budget, threading.Lock()
    self.data = {"status": "running", "phase": "start", "measured_on": header,
                 "settings": settings, "elapsed_s": 0.0, "budget_notes": budget.notes}
    for s in settings["sections"]:
      self.data[s] = {}

  def phase(self, text: str) -> None:
    print(f"[{elapsed():6.1f} s] {text}", flush=True)
    self.data["phase"] = text

  def write(self, status: str | None = None) -> None:
    with self.lock:
      if status:
        self.data["status"] = status
      self.data["elapsed_s"] = elapsed()
      self.data["memory"] = device_memory()
      self.out.mkdir(parents=True, exist_ok=True)
      for name, text in ((JSON_NAME, json_text(self.data) + "\n"),
                         (MD_NAME, markdown(self.data))):
        tmp = self.out / f".{name}.tmp"
        tmp.write_text(text)
        os.replace(tmp, self.out / name)


def device_memory() -> dict | None:
  try:
    stats = jax.devices()[0].memory_stats()
  except Exception:  # not every backend reports it
    return None
  if not stats:
    return None
  keys = ("bytes_in_use", "peak_bytes_in_use", "bytes_limit")
  return {f"{k.replace('bytes', 'gib')}": stats[k] / 2**30 for k in keys if k in stats}


def header(args) -> dict:
  d = jax.devices()[0]
  try:
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"],
                            capture_output=True, text=True, timeout=10).stdout.strip() or None
    dirty = bool(subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain"],
                                capture_output=True, text=True, timeout=10).stdout.strip())
  except (OSError, subprocess.SubprocessError):
    commit, dirty = None, None
  peak = flops.peak_flops_per_device(d.device_kind)
  cpu = d.platform == "cpu"
  return {"device_kind": d.device_kind, "platform": d.platform, "devices_used": 1,
          "devices_visible": jax.device_count(), "jax": jax.__version__,
          "jaxlib": jaxlib.__version__, "python": _platform.python_version(),
          "host": _platform.node(), "lev_jax_commit": commit, "git_dirty": dirty,
          "date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(
              timespec="seconds"),
          "peak_bf16_flops_per_s": peak,
          "note": ("measured on a CPU: not accelerator figures (MFU null)" if cpu else
                   f"measured on one {d.device_kind}")}


def _f(v, spec: str) -> str:
  if v is None:
    return "-"
  if isinstance(v, str):
    return v
  return format(v, spec) if math.isfinite(v) else str(v)


def markdown(data: dict) -> str:
  h, s = data["measured_on"], data["settings"]
  lines = ["# lev_jax device check", "",
           f"Measured on 1 x {h['device_kind']} ({h['platform']}; {h['devices_visible']} "
           f"visible), jax {h['jax']} / jaxlib {h['jaxlib']}, lev_jax "
           f"{(h['lev_jax_commit'] or '?')[:10]}{' (dirty)' if h['git_dirty'] else ''}, "
           f"{h['date_utc']}. {h['note'][:1].upper() + h['note'][1:]}.", "",
           f"Status: {data['status']} after {data['elapsed_s']:.0f} s (budget "
           f"{s['budget_s']:.0f} s). Settings: "
           f"{'smoke shapes (--tiny), ' if s['tiny'] else ''}"
           f"n_layers {s['layers'] or 'as configured'}, global batch {s['batch']} x "
           f"{s['seq_len'] or 'config'} tokens, {s['warmup']} warm-up steps (the first "
           f"compiles), up to {s['reps']} interleaved repetitions; MFU = model FLOPs "
           "(lev_jax.flops) / (median step time x the chip's dense bf16 peak).", ""]
  tvl = data.get("tied_vs_leviathan")
  if tvl:
    lines += ["## Tied vs Leviathan: train step", "",
              "| shape | config | step s (median) | tokens/s | model TFLOP/s | MFU | "
              "first step s (compile) | Leviathan / tied |",
              "|---|---|---:|---:|---:|---:|---:|---:|"]
    for shape, v in tvl.items():
      for kind in ("tied", "leviathan"):
        r = v.get(kind)
        if r is None:
          continue
        if "error" in r:
          lines.append(f"| {shape} | {r['config']} | {r['error']} | | | | | |")
          continue
        ratio = _f(v.get("leviathan_over_tied"), ".3f") if kind == "leviathan" else ""
        lines.append(f"| {shape} | {r['config']} | {_f(r.get('step_s'), '.4f')} | "
                     f"{_f(r.get('tokens_per_s'), ',.0f')} | "
                     f"{_f(r.get('model_tflops_per_s'), '.3g')} | "
                     f"{_f(r.get('mfu'), '.1%')} | "
                     f"{_f(r['first_step_s'], '.1f')} | {ratio} |")
      if "timing_error" in v:
        lines.append(f"| {shape} | timing | {v['timing_error']} | | | | | |")
    lines.append("")
  dt = data.get("dtype")
  if dt:
    lines += [f"## bf16 vs float32: {dt.get('config', '')}", ""]
    if "error" in dt:
      lines += [dt["error"], ""]
    elif "final_loss" in dt:
      lines += ["| model.dtype | loss at step 1 | loss at last step |", "|---|---:|---:|"]
      for k, losses in dt["losses"].items():
        lines.append(f"| {k} | {_f(losses[0], '.5f')} | {_f(losses[-1], '.5f')} |")
      lines += ["", f"{dt['steps']} steps, same init and batches; relative difference of "
                f"the final losses {_f(dt['final_rel_diff'], '.2e')}, largest over the "
                "steps "
                f"{_f(dt['max_rel_diff'], '.2e')}.", ""]
  li = data.get("lev_impl")
  if li:
    lines += ["## LEV cores: fused, vectorized, Pallas (Leviathan train step)", "",
              "| shape | lev.impl | step s (median) | tokens/s | MFU | first-step loss | "
              "vs the config's core |", "|---|---|---:|---:|---:|---:|---:|"]
    for shape, v in li.items():
      for impl in CORES:
        r = v.get(impl)
        if r is None:
          continue
        if "error" in r:
          lines.append(f"| {shape} | {impl} | {r['error']} | | | | |")
          continue
        ratio = _f(v.get(f"{impl}_over_{v.get('base')}"), ".3f")
        loss = r["warmup_losses"][0] if r.get("warmup_losses") else None
        lines.append(f"| {shape} | {impl} | {_f(r.get('step_s'), '.4f')} | "
                     f"{_f(r.get('tokens_per_s'), ',.0f')} | {_f(r.get('mfu'), '.1%')} | "
                     f"{_f(loss, '.5f')} | {ratio} |")
    lines.append("")
  if data["budget_notes"]:
    lines += ["Budget: " + "; ".join(data["budget_notes"]) + ".", ""]
  return "\n".join(lines)


# ---------------------------------------------------------------- sections


def build(name, config, batch, args, report, budget) -> "Run | dict":
  """A Run, or {"config", "error"} when it fails (or the budget is spent)."""
  if budget.over():
    budget.note(f"{name} skipped")
    return {"config": name, "error": "skipped: time budget spent"}
  lev = f", lev.impl={config.lev.impl}" if config.model.embedding == "lev" else ""
  report.phase(f"compiling {name} ({config.model.dtype}{lev})")
  try:
    return Run(name, config, batch, args.warmup)
  except Exception as e:  # e.g. out of memory, a kernel that does not compile
    print(f"  {first_line(e)}", flush=True)
    return {"config": name, "error": first_line(e)}


def tied_vs_leviathan(args, report, budget, kind, keep) -> None:
  for shape, named in shape_configs(args.tiny).items():
    configs = {k: cut(make(), args) for k, (_, make) in named.items()}
    batch = token_batch(configs["tied"], "uniform", seed=0)
    runs, out = {}, {}
    report.data["tied_vs_leviathan"][shape] = out
    for k, c in configs.items():
      r = build(named[k][0], c, batch, args, report, budget)
      if isinstance(r, Run):
        runs[k] = r
      else:
        out[k] = r
    report.phase(f"timing {shape}: {', '.join(runs)}")
    try:
      interleave(list(runs.values()), args, budget)
    except Exception as e:  # a step that compiled but fails at run time
      print(f"  {first_line(e)}", flush=True)
      out["timing_error"] = first_line(e)
    for k, r in runs.items():
      out[k] = r.record(kind)
    if len(runs) == 2:
      out["leviathan_over_tied"] = paired_ratio(runs["leviathan"], runs["tied"])
    if "leviathan" in runs:
      keep[shape] = runs["leviathan"]  # the fused Leviathan step, for lev_impl
    report.write()
    del runs


def dtype_check(args, report, budget) -> None:
  shape, named = next(iter(shape_configs(args.tiny).items()))
  name, make = named["leviathan"]
  out = report.data["dtype"]
  out.update(config=name, shape=shape, steps=args.dtype_steps)
  losses = {}
  for dtype in ("bfloat16", "float32"):
    c = cut(make(), args)
    c.model.dtype = dtype
    c.optim.warmup_steps = max(1, args.dtype_steps // 2)
    batches = [token_batch(c, "zipf", seed=100 + i) for i in range(args.dtype_steps)]
    if budget.over():
      budget.note(f"dtype {dtype} skipped")
      out["error"] = "skipped: time budget spent"
      break
    report.phase(f"dtype check: {name} with model.dtype={dtype}, {args.dtype_steps} steps")
    try:
      r = Run(f"{name} {dtype}", c, batches[0], warmup=1)
      r.train([sharding.to_global(b, r.part.batch_sharding) for b in batches[1:]])
    except Exception as e:
      print(f"  {first_line(e)}", flush=True)
      out["error"] = f"{dtype}: {first_line(e)}"
      break
    losses[dtype] = r.losses
    out[f"first_step_s_{dtype}"] = r.first_step_s
    del r
  if len(losses) == 2:
    lb, lf = losses["bfloat16"], losses["float32"]
    rel = [abs(b - f) / abs(f) if f else math.inf for b, f in zip(lb, lf)]
    out.update(losses=losses, final_loss={"bfloat16": lb[-1], "float32": lf[-1]},
               final_rel_diff=rel[-1], max_rel_diff=max(rel),
               warmup_steps=max(1, args.dtype_steps // 2),
               default_matmul_precision=str(jax.config.jax_default_matmul_precision))
  report.write()


CORES = ("fused", "vectorized", "pallas")  # lev.impl values timed against each other


def lev_impl(args, report, budget, kind, keep) -> None:
  for shape, named in shape_configs(args.tiny).items():
    name, make = named["leviathan"]
    out = report.data["lev_impl"].setdefault(shape, {})
    base = keep.get(shape)  # the config's own core, timed in tied_vs_leviathan
    base_impl = make().lev.impl
    out["base"] = base_impl
    if base is None:  # tied_vs_leviathan did not run (or failed): build it here
      c = cut(make(), args)
      base = build(name, c, token_batch(c, "uniform", seed=0), args, report, budget)
      if not isinstance(base, Run):
        out[base_impl] = base
        report.write()
        continue
    base.times = []
    batch = {k: np.asarray(v) for k, v in base.batch.items()}
    others = {impl: build(f"{name} lev.impl={impl}", cut(make(), args, impl=impl), batch,
                          args, report, budget) for impl in CORES if impl != base_impl}
    runs = [base] + [r for r in others.values() if isinstance(r, Run)]
    report.phase(f"timing {shape}: LEV {base_impl} vs " + ", ".join(
        impl for impl, r in others.items() if isinstance(r, Run)))
    try:
      interleave(runs, args, budget)
    except Exception as e:  # a kernel that compiles but fails at run time
      print(f"  {first_line(e)}", flush=True)
      others = {impl: r if not isinstance(r, Run) else
                {"config": f"{name} lev.impl={impl}", "error": first_line(e)}
                for impl, r in others.items()}
    out[base_impl] = base.record(kind)
    for impl, run in others.items():
      if isinstance(run, Run):
        out[impl] = run.record(kind)
        out[f"{impl}_over_{base_impl}"] = paired_ratio(run, base)
        out[f"{impl}_first_loss_abs_diff"] = abs(run.losses[0] - base.losses[0])
      else:
        out[impl] = run
    keep.pop(shape, None)
    del runs, others, base
    report.write()


# ---------------------------------------------------------------- main


def main(args) -> int:
  out = Path(args.out)
  budget = Budget(args.budget_s)
  settings = {k: getattr(args, k) for k in ("tiny", "layers", "batch", "seq_len", "reps",
                                            "min_reps", "warmup", "dtype_steps", "sections",
                                            "budget_s", "hard_limit_s")}
  head = header(args)
  report = Report(out, head, settings, budget)
  report.write()
  print(f"device check: 1 x {head['device_kind']} ({head['platform']}), jax {head['jax']}; "
        f"writing {out / JSON_NAME} and {out / MD_NAME}", flush=True)

  def hard_stop():  # on the watchdog's thread, while the main one is stuck (a compile)
    try:
      report.data["budget_notes"].append(f"hard limit {args.hard_limit_s:.0f} s hit "
                                         f"during {report.data['phase']!r}")
      report.write(status=f"incomplete: hard limit {args.hard_limit_s:.0f} s hit")
      print(f"hard limit {args.hard_limit_s:.0f} s: wrote what there is, exiting",
            flush=True)
    finally:
      os._exit(3)

  watchdog = threading.Timer(max(1.0, args.hard_limit_s - elapsed()), hard_stop)
  watchdog.daemon = True
  watchdog.start()
  kind, keep = head["device_kind"], {}
  for section in args.sections:
    if section == "tied_vs_leviathan":
      tied_vs_leviathan(args, report, budget, kind, keep)
    elif section == "dtype":
      dtype_check(args, report, budget)
    else:
      lev_impl(args, report, budget, kind, keep)
  watchdog.cancel()
  report.phase("done")
  report.write(status="complete" if not budget.notes else "complete, budget cut some parts")
  print(markdown(report.data), flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(main(ARGS))
