"""LEV forward + backward on its own: the reference einsum path vs the fused core.

  python benchmarks/lev_core.py [--rows 2048] [--reps 5] [--log_groups 4,8]

The medium shape of benchmarks/step_time.py (d_model 512, vocab 8192) with LEV at the
paper's defaults (d_seed 128, 8 heads, 16 knots, rank 64). Each implementation is one
jitted program returning LEV's rows for `--rows` random ids and the gradients of every
LEV parameter for a fixed random cotangent. Repetitions are interleaved (reference,
fused, reference, ...) so load on the machine hits every variant alike; printed: the
median seconds, the median of the per-repetition ratios to the reference, XLA's
temporary memory for the program (`compile().memory_analysis()`), and the largest
difference from the reference relative to the largest reference value, per output.
First it prints LEV's estimated share of a 200M-1.2B ladder step on an H200 (analytic
model, `flops.lev_step_share`; `unique` with a 65,536-id bound, which 512 x 512 tokens of
Zipf(1.0) ids over o200k stay under: benchmarks/distinct_ids.py).
The Pallas kernel (lev.impl = "pallas") is for GPU/TPU: on a CPU it only runs in the
Pallas interpreter, which says nothing about its speed, so it is not timed here.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
from flax import nnx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "experiments"))

import ladder  # noqa: E402

from lev_jax import flops  # noqa: E402
from lev_jax.config import base_config  # noqa: E402
from lev_jax.lev import LEV, lev_embed  # noqa: E402


def lev_config(impl: str, log_group: int = 4):
  c = base_config().lev
  c.update(d_seed=128, n_heads=8, n_knots=16, rank=64, impl=impl, log_group=log_group)
  return c


def build(impl: str, rows: int, log_group: int, vocab: int = 8192, d_model: int = 512):
  """(jitted fn, args): LEV rows and parameter gradients for `rows` ids."""
  cfg = lev_config(impl, log_group)
  lev = LEV(vocab, d_model, cfg, rngs=nnx.Rngs(0))
  params = lev.param_dict()
  ids = jax.random.randint(jax.random.key(1), (rows,), 0, vocab)
  cot = jax.random.normal(jax.random.key(2), (rows, d_model))

  def fwd_bwd(p, ids):
    out, vjp = jax.vjp(lambda q: lev_embed(q, ids, cfg, lev.base), p)
    return out, vjp(cot)[0]

  return jax.jit(fwd_bwd), (params, ids)


def print_ladder_estimate(unique_size: int = 65_536):
  """LEV's share of a ladder step on an H200 by the analytic model (flops.lev_step_share)."""
  print("LEV's share of a training step on one H200 SXM at 50 % MFU, by the analytic "
        "FLOP + vector + memory model of lev_jax/flops.py (an estimate, not measured):")
  print(f"{'rung':<16} {'lev.mode':<28} {'rows/step':>10} {'reference':>10} {'fused':>8}")
  for size in ladder.SHAPES:
    for mode, bound in (("auto", 0), ("unique", unique_size)):
      c = ladder.get_config(f"leviathan_{size}")
      c.lev.update(mode=mode, unique_size=bound)
      ref, fused = (flops.lev_step_share(c, impl) for impl in ("reference", "fused"))
      label = mode if not bound else f"unique (<= {bound:,} ids)"
      print(f"{size:<16} {label:<28} {fused['rows']:>10,} {ref['share']:>10.2%} "
            f"{fused['share']:>8.2%}")
  print()


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--rows", type=int, default=2048)
  p.add_argument("--reps", type=int, default=5)
  p.add_argument("--log_groups", default="4,8")
  p.add_argument("--model_only", action="store_true",
                 help="print only the accelerator estimate (no timing)")
  args = p.parse_args()
  print_ladder_estimate()
  if args.model_only:
    return
  variants = {"reference": build("reference", args.rows, 4)}
  for g in (int(x) for x in args.log_groups.split(",")):
    variants[f"fused (log_group {g})"] = build("fused", args.rows, g)
  outputs, temp_mb = {}, {}
  for name, (fn, fargs) in variants.items():
    outputs[name] = jax.block_until_ready(fn(*fargs))
    temp_mb[name] = fn.lower(*fargs).compile().memory_analysis().temp_size_in_bytes / 2**20
  times = {name: [] for name in variants}
  for _ in range(args.reps):
    for name, (fn, fargs) in variants.items():
      t0 = time.perf_counter()
      jax.block_until_ready(fn(*fargs))
      times[name].append(time.perf_counter() - t0)
  ref = "reference"
  print(f"jax {jax.__version__} on {jax.devices()[0].device_kind}: LEV fwd+bwd, "
        f"{args.rows} rows, {args.reps} interleaved repetitions")
  print(f"{'implementation':<22} {'median_s':>9} {'speed-up':>9} {'temp_MiB':>9} "
        f"{'temp vs ref':>11} {'max rel diff (rows, grads)':>28}")
  ref_leaves = jax.tree.leaves(outputs[ref])
  for name in variants:
    speedup = statistics.median(r / t for r, t in zip(times[ref], times[name]))
    diffs = [float(jnp.abs(a - b).max() / jnp.abs(b).max())
             for a, b in zip(jax.tree.leaves(outputs[name]), ref_leaves)]
    print(f"{name:<22} {statistics.median(times[name]):9.3f} {speedup:8.2f}x "
          f"{temp_mb[name]:9.1f} {temp_mb[name] / temp_mb[ref]:10.3f}x "
          f"{diffs[0]:13.1e} {max(diffs[1:]):13.1e}", flush=True)


if __name__ == "__main__":
  main()
