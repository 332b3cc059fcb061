"""Train-step time of Leviathan vs tied (and untied) at the smoke and a medium shape.

  python benchmarks/step_time.py [--reps 7] [--shapes smoke,medium] [--ids zipf]

One process, synthetic token batches (no input pipeline), the real jitted train step
(forward, backward, AdamW) with state donation. Every variant is compiled and warmed up
first; then repetitions are interleaved (tied, untied, leviathan ..., tied, ...) so that
load on the machine hits all variants alike. Printed per variant: the median seconds
per optimizer step, tokens/s, the median of the per-repetition ratios to tied (paired),
LEV's rows per micro-batch and its share of the model FLOPs (flops.py, analytic),
and XLA's temporary memory for the step (`compile().memory_analysis()`).

Leviathan variants: every `lev.mode` (table, tokens, unique; auto is one of them) with
the fused core (`lev.impl = "fused"`, the default), and the reference core in the mode
auto picks. Token ids are drawn from Zipf(1.0) over the vocabulary (`--ids zipf`,
like text) or uniformly (`--ids uniform`); `unique` gets a bound (`lev.unique_size`) of
the batch's distinct ids rounded up to a multiple of 128, as a user would set it from
their data.
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

from lev_jax import flops, sharding  # noqa: E402
from lev_jax.config import padded_vocab_size, validate  # noqa: E402
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


def token_batch(config, kind: str, seed: int = 0) -> dict:
  """int32 inputs/targets [B, L] drawn from Zipf(1.0) over the vocab or uniformly."""
  rng = np.random.default_rng(seed)
  shape = (config.train.global_batch_size, config.train.seq_len + 1)
  v = config.model.vocab_size
  if kind == "zipf":
    p = 1.0 / np.arange(1, v + 1)
    ids = rng.choice(v, size=shape, p=p / p.sum())
  else:
    ids = rng.integers(0, v, shape)
  ids = ids.astype(np.int32)
  return {"inputs": ids[:, :-1], "targets": ids[:, 1:],
          "weights": np.ones(ids[:, 1:].shape, np.float32)}


def variants(shape: str, batch: dict):
  """(name, config) pairs of one shape: tied, untied, and the Leviathan variants."""
  make = SHAPES[shape]
  distinct = len(np.unique(batch["inputs"]))
  out = [("tied", make("tied")), ("untied", make("untied"))]
  for mode in ("table", "tokens", "unique"):
    c = make("leviathan")
    c.lev.update(mode=mode, unique_size=-(-distinct // 128) * 128 if mode == "unique" else 0)
    out.append((f"leviathan {mode}", c))
  c = make("leviathan")
  c.lev.impl = "reference"
  out.append(("leviathan auto, reference core", c))
  return out, distinct


class Timed:
  """One compiled, warmed-up train step and its repetitions."""

  def __init__(self, config, batch, mesh=None):
    validate(config)
    self.config = config
    part, self.state = create_train_state(config, mesh)
    self.step = make_train_step(part, config)
    self.batch = sharding.to_global(batch, part.batch_sharding)
    for _ in range(3):
      self.state, m = self.step(self.state, self.batch)
    jax.block_until_ready(m)
    self.times = []

  def run_once(self):
    t0 = time.perf_counter()
    self.state, m = self.step(self.state, self.batch)
    jax.block_until_ready(m)
    self.times.append(time.perf_counter() - t0)


def time_step(config, steps: int, mesh=None) -> float:
  """Median seconds of one jitted train step on `mesh` (default: config.mesh), uniform ids."""
  timed = Timed(config, token_batch(config, "uniform"), mesh)
  for _ in range(steps):
    timed.run_once()
  return statistics.median(timed.times)


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--reps", type=int, default=7)
  p.add_argument("--shapes", default="smoke,medium")
  p.add_argument("--ids", default="zipf", choices=("zipf", "uniform"))
  args = p.parse_args()
  unknown = [s for s in args.shapes.split(",") if s not in SHAPES]
  if unknown:
    p.error(f"--shapes: unknown {', '.join(unknown)}; expected a comma-separated subset of "
            f"{', '.join(SHAPES)}")
  print(f"jax {jax.__version__} on {jax.devices()[0].device_kind}, {args.reps} interleaved "
        f"repetitions, ids {args.ids}; seconds per optimizer step (median)")
  for shape in args.shapes.split(","):
    batch = token_batch(SHAPES[shape]("tied"), args.ids)
    named, distinct = variants(shape, batch)
    runs = [(name, Timed(c, batch)) for name, c in named]
    for _ in range(args.reps):
      for _, timed in runs:
        timed.run_once()
    c0 = runs[0][1].config
    tokens = c0.train.global_batch_size * c0.train.seq_len
    vocab = padded_vocab_size(c0.model.vocab_size, c0.model.vocab_multiple)
    print(f"\n{shape}: {tokens} tokens per step, padded vocab {vocab}, {distinct} distinct "
          "input ids in the batch")
    print(f"{'variant':<32} {'step_s':>8} {'tokens/s':>9} {'vs tied':>8} {'LEV rows':>9} "
          f"{'LEV FLOP share':>15}")
    tied_times = runs[0][1].times
    for name, timed in runs:
      c = timed.config
      ratio = statistics.median(t / b for t, b in zip(timed.times, tied_times))
      if c.model.embedding == "lev":
        f = flops.train_flops_per_step(c)
        rows, share = f"{flops.lev_rows_per_micro_batch(c):,}", f"{f['lev'] / f['total']:.1%}"
      else:
        rows = share = "-"
      med = statistics.median(timed.times)
      print(f"{name:<32} {med:8.4f} {tokens / med:9,.0f} {ratio:7.2f}x {rows:>9} {share:>15}",
            flush=True)


if __name__ == "__main__":
  main()
