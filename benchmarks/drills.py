"""Reliability drills, end to end: lev-train killed, preempted, diverging, doubled, fed
damaged checkpoints and bad input, as an operator would meet them. Prints a table.

  python benchmarks/drills.py                    # ~5 min on a 2-core CPU
  python benchmarks/drills.py --kills=16 --root=/tmp/drills

Every run is a real `python -m lev_jax.cli.train` process on a tiny Leviathan model over the
embedded data. The reference is one uninterrupted run; each drill's final checkpoint
must equal it bit for bit (params, optimizer state, step) where the drill resumes.

  kill -9      --kills times at seeded random moments, every third one while a
               checkpoint is being written (an Orbax temporary folder exists); each
               time the same command is re-run. Then the run is finished.
  SIGTERM      exit 143, the step named; the re-run finishes.
  NaN          optim.lr = 1e6: one line, exit 1, every checkpoint finite.
  two writers  a second lev-train on a held workdir: one line, exit 2, at once.
  bit flip     64 flipped bytes in the latest step: one line, exit 2; with
               --restore_fallback the run resumes from the intact step.
  bad input    each case must end with exit 2 and exactly one "lev-train: error:"
               message (a shape mismatch lists its fields below it), no traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
SMOKE = str(REPO / "experiments" / "smoke.py")
STEPS = 24
TINY = ["--config.model.vocab_size=512", "--config.model.d_model=32",
        "--config.model.n_heads=2", "--config.model.n_kv_heads=2",
        "--config.model.head_dim=16", "--config.model.d_ff=64",
        "--config.lev.d_seed=8", "--config.lev.n_heads=2", "--config.lev.rank=4",
        "--config.train.seq_len=32", "--config.train.global_batch_size=4",
        "--config.train.checkpoint_every=3", "--config.train.log_every=1",
        "--config.train.eval_every=1000", "--config.eval.batches=1",
        "--config.eval.batch_size=2", "--config.optim.warmup_steps=1"]


def _args(workdir, *extra, steps=STEPS, config=f"{SMOKE}:leviathan"):
  return [f"--config={config}", f"--workdir={workdir}", *TINY,
          f"--config.train.steps={steps}", *extra]


def _popen(args, env):
  return subprocess.Popen([sys.executable, "-m", "lev_jax.cli.train", *args], cwd=REPO, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _run(args, env, timeout=600):
  return subprocess.run([sys.executable, "-m", "lev_jax.cli.train", *args], cwd=REPO, env=env,
                        capture_output=True, text=True, timeout=timeout)


def _one_line_error(proc, code=2) -> bool:
  lines = [l for l in proc.stderr.splitlines() if l.strip()]
  errors = [l for l in lines if l.startswith("lev-train: error:")]
  return proc.returncode == code and len(errors) == 1 and "Traceback" not in proc.stderr


def _state(workdir, step=None):
  import orbax.checkpoint as ocp
  with ocp.CheckpointManager(Path(workdir).absolute() / "checkpoints",
                             item_names=("state",)) as mgr:
    step = mgr.latest_step() if step is None else step
    state = mgr.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore()))
  import jax
  return step, [np.asarray(x) for x in jax.tree.leaves(state["state"])]


def _bitwise(a, b) -> bool:
  return a[0] == b[0] and all(np.array_equal(x, y) for x, y in zip(a[1], b[1]))


def _wait(cond, timeout=180):
  deadline = time.time() + timeout
  while time.time() < deadline and not cond():
    time.sleep(0.02)
  return cond()


def drill_kills(root, env, reference, kills, rng) -> dict:
  workdir = root / "kill9"
  mid_save = 0
  for i in range(kills):
    proc = _popen(_args(workdir), env)
    if i % 3 == 2:  # mid-save: kill while Orbax's temporary folder exists
      hit = _wait(lambda: any((workdir / "checkpoints").glob("*.orbax-checkpoint-tmp*"))
                  if (workdir / "checkpoints").exists() else False, timeout=60)
      mid_save += int(hit)
    else:
      time.sleep(rng.uniform(2.0, 9.0))  # start-up, restore, training or eval
    proc.send_signal(signal.SIGKILL)
    proc.wait()
  final = _run(_args(workdir), env)
  ok = final.returncode == 0 and _bitwise(_state(workdir), reference)
  return {"drill": f"kill -9 x{kills} ({mid_save} mid-save)", "ok": ok,
          "detail": "final state bitwise equal to the uninterrupted run" if ok
          else final.stderr[-300:]}


def drill_sigterm(root, env, reference) -> dict:
  workdir = root / "sigterm"
  proc = _popen(_args(workdir), env)
  _wait(lambda: (workdir / "metrics.jsonl").exists()
        and (workdir / "metrics.jsonl").read_text().count("\n") >= 4)
  proc.send_signal(signal.SIGTERM)
  _, stderr = proc.communicate(timeout=300)
  named = "(SIGTERM)" in stderr and proc.returncode == 143
  final = _run(_args(workdir), env)
  ok = named and final.returncode == 0 and _bitwise(_state(workdir), reference)
  return {"drill": "SIGTERM", "ok": ok,
          "detail": f"exit {proc.returncode}, re-run bitwise equal" if ok else stderr[-300:]}


def drill_nan(root, env) -> dict:
  workdir = root / "nan"
  proc = _run(_args(workdir, "--config.optim.lr=1e6", steps=40), env)
  steps = [int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit()]
  finite = all(all(np.isfinite(x).all() for x in _state(workdir, s)[1]) for s in steps)
  ok = _one_line_error(proc, code=1) and finite
  return {"drill": "NaN (optim.lr=1e6)", "ok": ok,
          "detail": (proc.stderr.strip().splitlines() or [""])[-1][:110]}


def drill_two_writers(root, env) -> dict:
  workdir = root / "two_writers"
  first = _popen(_args(workdir, steps=100000), env)
  _wait(lambda: (workdir / "metrics.jsonl").exists())
  start = time.time()
  second = _run(_args(workdir, steps=100000), env)
  took = time.time() - start
  first.send_signal(signal.SIGKILL)
  first.wait()
  ok = _one_line_error(second) and took < 30
  return {"drill": "two writers", "ok": ok,
          "detail": (second.stderr.strip().splitlines() or [""])[-1][:110]}


def drill_bit_flip(root, env) -> dict:
  workdir = root / "bitflip"
  shutil.copytree(root / "reference", workdir)
  latest = max(int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit())
  files = [p for p in (workdir / "checkpoints" / str(latest)).rglob("*")
           if p.is_file() and p.name != "checksums.json"]
  target = max(files, key=lambda p: p.stat().st_size)
  data = bytearray(target.read_bytes())
  for i in range(64):
    data[(i * 7919) % len(data)] ^= 0xFF
  target.write_bytes(bytes(data))
  refused = _run(_args(workdir, steps=STEPS + 3), env)
  fallback = _run(_args(workdir, "--restore_fallback", steps=STEPS + 3), env)
  ok = _one_line_error(refused) and fallback.returncode == 0
  return {"drill": "bit flip (64 bytes)", "ok": ok,
          "detail": "refused in one line; --restore_fallback resumed" if ok
          else (refused.stderr + fallback.stderr)[-300:]}


def drill_kill_between_saves(root, env, reference) -> dict:
  """Issue 26.3: kill -9 once a step is committed, before the next save starts; then
  64 bytes of that step's largest state file flipped. Its manifest, committed with it,
  must catch the flip; --restore_fallback resumes from an intact step (or step 0) and
  ends bitwise equal to the uninterrupted run."""
  workdir = root / "between_saves"
  ckpts = workdir / "checkpoints"
  proc = _popen(_args(workdir), env)
  hit = _wait(lambda: ckpts.is_dir() and any(p.name.isdigit() for p in ckpts.iterdir()))
  proc.send_signal(signal.SIGKILL)
  proc.wait()
  steps = sorted(int(p.name) for p in ckpts.iterdir() if p.name.isdigit()) if hit else []
  if not steps:
    return {"drill": "kill -9 between saves + bit flip", "ok": False,
            "detail": "no checkpoint was complete"}
  latest = ckpts / str(steps[-1])
  signed = (latest / "checksums.json").exists()
  target = max((p for p in (latest / "state").rglob("*") if p.is_file()),
               key=lambda p: p.stat().st_size)
  data = bytearray(target.read_bytes())
  for i in range(64):
    data[(i * 7919) % len(data)] ^= 0xFF
  target.write_bytes(bytes(data))
  refused = _run(_args(workdir), env)
  fallback = _run(_args(workdir, "--restore_fallback"), env)
  ok = (signed and _one_line_error(refused) and "differs from its checksum" in refused.stderr
        and fallback.returncode == 0 and _bitwise(_state(workdir), reference))
  return {"drill": "kill -9 between saves + bit flip", "ok": ok,
          "detail": f"step {steps[-1]}'s manifest caught it; --restore_fallback resumed, "
          "bitwise equal" if ok else (refused.stderr + fallback.stderr)[-300:]}


def bad_inputs(root) -> list[tuple[str, list[str], object]]:
  """(name, extra args, setup(workdir) or None); each must be one line, exit 2."""
  syntax = root / "broken_config.py"
  syntax.write_text("def get_config(:\n  pass\n")

  def finished(workdir):
    shutil.copytree(root / "reference", workdir)

  def mkfile(name):
    def setup(workdir):
      workdir.mkdir(parents=True)
      (workdir / name).write_text("x")
    return setup

  def mkdir(name):
    def setup(workdir):
      (workdir / name).mkdir(parents=True)
    return setup

  return [
      ("unknown field", ["--config.train.stepz=5"], None),
      ("unknown section", ["--config.nosuch.x=1"], None),
      ("optim.lr=nan", ["--config.optim.lr=nan"], None),
      ("optim.lr=inf", ["--config.optim.lr=inf"], None),
      ("optim.b2=1.0", ["--config.optim.b2=1.0"], None),
      ("optim.b1=1.5", ["--config.optim.b1=1.5"], None),
      ("weight_decay=nan", ["--config.optim.weight_decay=nan"], None),
      ("stop_at_step=-5", ["--stop_at_step=-5"], None),
      ("config syntax error", [f"--config={syntax}:leviathan"], None),
      ("other vocab on a finished run", ["--config.model.vocab_size=1024"], finished),
      ("scan_layers changed", ["--config.model.scan_layers=True"], finished),
      ("workdir is a file", [], lambda w: (w.parent.mkdir(parents=True, exist_ok=True),
                                           w.write_text("x"))),
      ("checkpoints is a file", [], mkfile("checkpoints")),
      ("metrics.jsonl is a folder", [], mkdir("metrics.jsonl")),
      ("garbage checkpoint folder", [], lambda w: (finished(w), mkdir("checkpoints/45")(w),
                                                   (w / "checkpoints/45/x").write_text("x"))),
      ("deleted checkpoint config", [], lambda w: (finished(w), shutil.rmtree(
          w / "checkpoints" / str(STEPS) / "config"))),
  ]


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--root", default="runs/drills", help="scratch folder (emptied first)")
  parser.add_argument("--kills", type=int, default=8)
  parser.add_argument("--seed", type=int, default=0)
  a = parser.parse_args()
  root = Path(a.root).absolute()
  shutil.rmtree(root, ignore_errors=True)
  root.mkdir(parents=True)
  env = dict(os.environ, JAX_PLATFORMS="cpu", JAX_COMPILATION_CACHE_DIR=str(root / "jax_cache"),
             JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")
  rng = random.Random(a.seed)
  start = time.time()
  ref = _run(_args(root / "reference"), env)
  if ref.returncode:
    sys.exit(f"drills: the reference run failed:\n{ref.stderr[-2000:]}")
  reference = _state(root / "reference")
  rows = [drill_kills(root, env, reference, a.kills, rng), drill_sigterm(root, env, reference),
          drill_nan(root, env), drill_two_writers(root, env), drill_bit_flip(root, env),
          drill_kill_between_saves(root, env, reference)]
  clear = []
  for i, (name, extra, setup) in enumerate(bad_inputs(root)):
    workdir = root / f"bad_{i}"
    if setup is not None:
      setup(workdir)
    config = [x.split("=", 1)[1] for x in extra if x.startswith("--config=")]
    extra = [x for x in extra if not x.startswith("--config=")]
    args = _args(workdir, *extra, **({"config": config[0]} if config else {}))
    proc = _run(args, env)
    clear.append((name, _one_line_error(proc), (proc.stderr.strip().splitlines() or [""])[-1]))
  print("| drill | result | detail |\n|---|---|---|")
  for r in rows:
    print(f"| {r['drill']} | {'pass' if r['ok'] else 'FAIL'} | {r['detail']} |")
  n_clear = sum(ok for _, ok, _ in clear)
  print(f"| bad input | {n_clear} / {len(clear)} one line, exit 2 | "
        + "; ".join(name for name, ok, _ in clear if not ok) + " |")
  for name, ok, line in clear:
    print(f"  {'ok ' if ok else 'BAD'} {name}: {line[:120]}")
  print(f"\n{time.time() - start:.0f} s; commit {_commit()}; python {sys.version.split()[0]}")
  sys.exit(0 if all(r["ok"] for r in rows) and n_clear == len(clear) else 1)


def _commit() -> str:
  try:
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                          text=True).stdout.strip() or "unknown"
  except OSError:
    return "unknown"


if __name__ == "__main__":
  main()
