"""Do the first train steps give the same float32 bits on another CPU and thread count?

  python benchmarks/cpu_portability.py                          # all machines below
  python benchmarks/cpu_portability.py --steps 5 --variants leviathan

Runs the first STEPS train steps of experiments/smoke.py (each variant, seed 0, on
fixed random token batches: a numerics check, not a data check) in a fresh process per
"machine", and compares a SHA-256 of the parameters after every step, and the step's
reported loss and gradient norm, bit for bit against `native`:

  native           this CPU, XLA's own thread count
  threads=N        NPROC=N: XLA:CPU's intra-op thread-pool size
  one-cpu          `taskset -c 0`: one schedulable CPU, where lev_jax/portable.py sets
                   NPROC=2 (one thread sums some reductions in another order)
  haswell          `qemu-x86_64 -cpu Haswell-v4`: the same program on an emulated Intel
                   Haswell (AVX2, no AVX-512, other cache sizes): needs qemu-user
                   (`apt-get install qemu-user`, QEMU >= 7.2 for AVX2); skipped with a
                   line when it is absent. Emulation is slow: ~2 s a step.
  haswell-default  the same with LEV_JAX_PORTABLE_CPU=0 (XLA's default flags and
                   thread count; lev_jax.dense's layout stays): shows that the
                   comparison detects a difference (expected: differs)

Prints one line per machine and variant ("same bits" or the first differing step) and
exits 1 when a machine other than haswell-default differs. What the results mean and
what is not covered: lev_jax/portable.py.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
VARIANTS = ("tied", "untied", "leviathan")


def _worker(variant: str, steps: int, out: str) -> None:
  import numpy as np  # pylint: disable=g-import-not-at-top
  import jax
  sys.path.insert(0, str(REPO))
  from lev_jax import train
  from lev_jax.experiments import experiments_dir, load_experiment
  config = load_experiment(experiments_dir() / "smoke.py").get_config(variant)
  part, state = train.create_train_state(config)
  step = train.make_train_step(part, config)
  rng = np.random.default_rng(0)
  b, l, v = config.train.global_batch_size, config.train.seq_len, config.model.vocab_size
  steps_out = []
  for _ in range(steps):
    ids = rng.integers(0, v, size=(b, l + 1)).astype(np.int32)
    batch = {"inputs": ids[:, :-1], "targets": ids[:, 1:],
             "weights": np.ones((b, l), np.float32)}
    state, metrics = step(state, batch)
    digest = hashlib.sha256()
    for leaf in jax.tree.leaves(state["params"]):
      digest.update(np.asarray(leaf).tobytes())
    steps_out.append({"params_sha256": digest.hexdigest(),
                      **{k: float(metrics[k]).hex() for k in ("loss", "grad_norm")}})
  Path(out).write_text(json.dumps({"steps": steps_out,
                                   "xla_flags": os.environ.get("XLA_FLAGS", ""),
                                   "nproc": os.environ.get("NPROC")}))


def _machines(threads: list[int], qemu: str | None) -> list[tuple[str, list[str], dict]]:
  machines = [("native", [], {})]
  machines += [(f"threads={n}", [], {"NPROC": str(n)}) for n in threads]
  if shutil.which("taskset"):
    machines.append(("one-cpu", ["taskset", "-c", "0"], {}))
  if qemu:
    emulate = [qemu, "-cpu", "Haswell-v4"]
    machines += [("haswell", emulate, {}),
                 ("haswell-default", emulate, {"LEV_JAX_PORTABLE_CPU": "0"})]
  return machines


def _run(prefix, env_extra, variant, steps, out) -> dict:
  env = {k: val for k, val in os.environ.items() if k not in ("XLA_FLAGS", "NPROC")}
  env.update(env_extra, JAX_PLATFORMS="cpu", PYTHONPATH=str(REPO))
  cmd = [*prefix, sys.executable, __file__, "--worker", variant, str(steps), str(out)]
  done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
  if done.returncode != 0:
    raise SystemExit(f"cpu_portability: {' '.join(cmd)} failed:\n{done.stderr[-2000:]}")
  return json.loads(Path(out).read_text())


def _compare(ref: dict, got: dict) -> str:
  """'same bits', or the first step whose parameters differ, and the first whose
  reported loss or gradient norm (metrics only) differs."""
  first = lambda keys: next((i + 1 for i, (a, b) in enumerate(zip(ref["steps"], got["steps"]))
                             if any(a[k] != b[k] for k in keys)), None)
  params, metrics = first(["params_sha256"]), first(["loss", "grad_norm"])
  if params is None and metrics is None:
    return "same bits"
  return (f"parameters {'same bits' if params is None else f'differ from step {params}'}"
          f"; loss / grad_norm {'same bits' if metrics is None else f'differ from step {metrics}'}")


def main() -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--steps", type=int, default=10)
  ap.add_argument("--variants", default=",".join(VARIANTS))
  ap.add_argument("--threads", default="3,8,16", help="NPROC values to compare")
  ap.add_argument("--worker", nargs=3, help=argparse.SUPPRESS)
  args = ap.parse_args()
  if args.worker:
    _worker(args.worker[0], int(args.worker[1]), args.worker[2])
    return 0
  variants = args.variants.split(",")
  unknown = sorted(set(variants) - set(VARIANTS))
  if unknown:
    ap.error(f"--variants: unknown {unknown}; expected some of {', '.join(VARIANTS)}")
  qemu = shutil.which("qemu-x86_64")
  if not qemu:
    print("cpu_portability: qemu-x86_64 not found: the emulated-CPU machines are skipped "
          "(apt-get install qemu-user)")
  failed = False
  with tempfile.TemporaryDirectory() as tmp:
    for variant in variants:
      ref = None
      for name, prefix, env in _machines([int(n) for n in args.threads.split(",")], qemu):
        got = _run(prefix, env, variant, args.steps, Path(tmp) / f"{variant}_{name}.json")
        if ref is None:
          ref = got
          last = got["steps"][-1]
          print(f"{variant:9s} native: {args.steps} steps, final loss "
                f"{float.fromhex(last['loss']):.9g}, params {last['params_sha256'][:12]}",
                flush=True)
          continue
        verdict = _compare(ref, got)
        failed |= verdict != "same bits" and name != "haswell-default"
        print(f"{variant:9s} {name}: {verdict}", flush=True)
  return 1 if failed else 0


if __name__ == "__main__":
  sys.exit(main())
