"""Median train-step time of tied vs Leviathan, at the smoke shape and a larger one.

  python benchmarks/step_time.py [--steps 20] [--shapes smoke,medium]

One process, synthetic token batches (no input pipeline), the real jitted train step
(forward, backward, AdamW) with state donation. Reports the median of `--steps` timed
steps after 3 warm-up steps, and the ratio leviathan / tied. For LEV both evaluation
modes are timed: `table` (LEV over the whole padded vocab once per step, then a gather)
and `tokens` (LEV per token); `auto` picks table when vocab < tokens per micro-batch.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import jax
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "experiments"))

import smoke  # noqa: E402

from lev_jax import sharding  # noqa: E402
from lev_jax.config import validate  # noqa: E402
from lev_jax.train import create_train_state, make_train_step  # noqa: E402


def medium(variant):
  """A d_model=512, 4-layer model, 8k vocab, 8 x 256 tokens, LEV at paper defaults."""
  c = smoke.get_config(variant)
  c.model.update(vocab_size=8192, d_model=512, n_layers=4, n_heads=8, n_kv_heads=8,
                 head_dim=64, d_ff=1536)
  c.lev.update(d_seed=128, n_heads=8, n_knots=16, rank=64)
  c.train.update(seq_len=256, global_batch_size=8)
  return c


SHAPES = {"smoke": smoke.get_config, "medium": medium}


def time_step(config, steps: int, mesh=None) -> float:
  """Median seconds of one jitted train step on `mesh` (default: config.mesh)."""
  validate(config)
  part, state = create_train_state(config, mesh)
  step_fn = make_train_step(part, config)
  rng = np.random.default_rng(0)
  shape = (config.train.global_batch_size, config.train.seq_len)
  batch = {"inputs": rng.integers(0, config.model.vocab_size, shape).astype(np.int32),
           "targets": rng.integers(0, config.model.vocab_size, shape).astype(np.int32),
           "weights": np.ones(shape, np.float32)}
  batch = sharding.to_global(batch, part.batch_sharding)
  for _ in range(3):
    state, m = step_fn(state, batch)
  jax.block_until_ready(m)
  times = []
  for _ in range(steps):
    t0 = time.perf_counter()
    state, m = step_fn(state, batch)
    jax.block_until_ready(m)
    times.append(time.perf_counter() - t0)
  return statistics.median(times)


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--steps", type=int, default=20)
  p.add_argument("--shapes", default="smoke,medium")
  args = p.parse_args()
  print(f"jax {jax.__version__} on {jax.devices()[0].device_kind}, "
        f"{args.steps} timed steps, median seconds per optimizer step")
  print(f"{'shape':<8} {'variant':<18} {'step_s':>8} {'tokens/s':>10} {'vs tied':>8}")
  for shape in args.shapes.split(","):
    runs = [("tied", "tied", None), ("leviathan", "leviathan", "table"),
            ("leviathan", "leviathan", "tokens")]
    tied_s = None
    for label, variant, mode in runs:
      c = SHAPES[shape](variant)
      if mode:
        c.lev.mode = mode
      s = time_step(c, args.steps)
      tied_s = tied_s or s
      tokens = c.train.global_batch_size * c.train.seq_len
      name = label + (f" ({mode})" if mode else "")
      print(f"{shape:<8} {name:<18} {s:8.4f} {tokens / s:10,.0f} {s / tied_s:8.2f}x",
            flush=True)


if __name__ == "__main__":
  main()
