"""A ladder rung's train step per loss, logits precision, attention kernel and remat,
compiled for a TPU slice: per-chip memory and the estimated step time of each.

  python benchmarks/head_attention_compile.py                   # tied_200m, both setups
  python benchmarks/head_attention_compile.py --setups pod --rungs tied_200m,leviathan_200m
  python benchmarks/head_attention_compile.py --setups small --out runs/head_attention

Setups (each a slice and a batch; the rung's config from experiments/ladder.py otherwise):
  pod    the ladder's slice, v5p-128, the rung's own global batch (512 x 512), with the
         step-time estimate (loop-free compiles; a few minutes a variant on 2 cores).
  mid    16 v5p chips (v5p-32) at the same global batch (16,384 tokens a chip), memory
         only (1.5 to 4 minutes a cell).
  small  4 v5p chips (v5p:2x2x1) at the same global batch of 512 x 512 (65,536 tokens a
         chip), memory only: what fits where memory is short.
Variants (--variants, comma-separated; by default every one on BEFORE). LADDER_VARIANTS
start from the rung as experiments/ladder.py sets it (every `auto` resolved for the
slice: the program line of its JSON):
  ladder                  the ladder's own program
  ladder_dense_xla        its loss and attention set to dense and xla; the same for
  ladder_dense_splash     the other three pairs (its bfloat16 logits and scores, its
  ladder_chunked_xla      lookup gradient, model.remat=auto and the automatic vocab
  ladder_chunked_splash   chunks kept)
The others are each on top of BEFORE: the rung's program before issue 24 (the dense
loss, float32 logits, XLA attention with float32 scores, a float32 lookup gradient, no
remat), whatever experiments/ladder.py now sets:
  dense             BEFORE itself
  dense_bf16        the dense loss with model.logits_dtype = bfloat16
  chunked           train.loss_impl = chunked (automatic token chunks, whole vocab)
  chunked_vocab     train.loss_impl = chunked, vocab chunks of 8,336 ids
  splash            the dense loss, model.attention = splash
  chunked_splash    both
  chunked_splash_dots   both, and model.remat = dots_no_batch
  chunked_splash_full   both, and model.remat = full

Each cell is one `lev-compile --steps=train --json=OUT/SETUP/RUNG/VARIANT.json` run in
its own process (benchmarks/pod_compile.py's `compile_cell`; resumable: a cell whose
JSON exists is not compiled again), then one Markdown table, and where `ladder_{loss}_
{kernel}` cells were compiled a second one, per rung, of the four pairs side by side
with the fastest estimate that fits. Memory is XLA:TPU's buffer
assignment per chip; every time is XLA's cost-model ESTIMATE for a program compiled on
this CPU host, never a measurement. Splash attention's Mosaic kernel declares no cost to
XLA's model: lev-compile adds it at its model FLOPs at the peak bf16 rate (a lower
bound on the kernel's time; records from before that leave it out), marked so.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from pod_compile import compile_cell  # noqa: E402  pylint: disable=wrong-import-position

SETUPS = {"pod": ("v5p-128", True),  # (topology, estimate the step time)
          "mid": ("v5p-32", False),
          "small": ("v5p:2x2x1", False)}
# Every variant starts from the rung's program before issue 24, whatever the ladder sets
# now (it trains with bfloat16 logits and the platform's attention kernel since), so the
# published tables (docs/results.md) are reproduced.
BEFORE = ("--config.train.loss_impl=dense", "--config.model.logits_dtype=float32",
          "--config.model.attention=xla", "--config.model.attention_logits_dtype=float32",
          "--config.model.embedding_grad_dtype=float32", "--config.model.remat=none")
# The chunked loss over the whole padded vocab (200,064 ids) per token chunk, as the
# published rows were compiled (train.loss_vocab_chunk = 0 now cuts it: lev_jax/loss.py).
WHOLE_VOCAB = ("--config.train.loss_impl=chunked", "--config.train.loss_vocab_chunk=200064")
LADDER_VARIANTS = {
    "ladder": (),
    **{f"ladder_{loss}_{kernel}": (f"--config.train.loss_impl={loss}",
                                   f"--config.model.attention={kernel}")
       for loss in ("dense", "chunked") for kernel in ("xla", "splash")},
}
VARIANTS = {
    "dense": (),
    "dense_bf16": ("--config.model.logits_dtype=bfloat16",),
    "chunked": WHOLE_VOCAB,
    "chunked_vocab": ("--config.train.loss_impl=chunked",
                      "--config.train.loss_vocab_chunk=8336"),
    "splash": ("--config.model.attention=splash",),
    "chunked_splash": WHOLE_VOCAB + ("--config.model.attention=splash",),
    "chunked_splash_dots": WHOLE_VOCAB + ("--config.model.attention=splash",
                                          "--config.model.remat=dots_no_batch"),
    "chunked_splash_full": WHOLE_VOCAB + ("--config.model.attention=splash",
                                          "--config.model.remat=full"),
}


def row(setup: str, rung: str, variant: str, rec: dict) -> str:
  """One Markdown row of a cell's record (lev-compile's JSON)."""
  step = rec["steps"][0]
  gib = lambda b: f"{b / 2**30:.2f}" if b is not None else "n/a"
  if not step["fits"]:
    need = step.get("required_bytes")
    return (f"| {setup} | {rung} | {variant} | does not fit: needs {gib(need)} GiB | "
            f"{gib(step['temp_bytes'])} | n/a |")
  seconds = step["step_s"] if "loop-free" in step["time_source"] else None
  time = "n/a (memory only)" if seconds is None else f"{seconds:.4f}"
  if seconds is not None and step.get("splash_s"):  # lev_jax/aot.py _price_splash
    time += " (splash at its FLOPs at the peak rate: a lower bound)"
  elif seconds is not None and "splash" in variant:  # a record from before the pricing
    time += " (splash kernel not priced)"
  return (f"| {setup} | {rung} | {variant} | {gib(step['total_bytes'])} | "
          f"{gib(step['temp_bytes'])} | {time} |")


PAIRS = [(loss, kernel) for loss in ("dense", "chunked") for kernel in ("xla", "splash")]


def rung_table(cells: dict) -> str:
  """Markdown: one row per (setup, rung) of the four `ladder_{loss}_{kernel}` cells
  compiled, each cell "step estimate s, GiB a chip", and the fastest that fits.

  cells: {(setup, rung): {variant: lev-compile record}}; rows without any of the four
  are left out, and an uncompiled pair is "-"."""
  rows = ["| setup | rung | " + " | ".join(f"{l} + {k}" for l, k in PAIRS)
          + " | fastest (ESTIMATE) |", "|---|---|" + "---|" * (len(PAIRS) + 1)]
  for (setup, rung), recs in cells.items():
    found = {pair: recs[f"ladder_{pair[0]}_{pair[1]}"]["steps"][0] for pair in PAIRS
             if f"ladder_{pair[0]}_{pair[1]}" in recs}
    if not found:
      continue
    texts, timed = [], {}
    for pair in PAIRS:
      step = found.get(pair)
      if step is None:
        texts.append("-")
      elif not step["fits"]:
        texts.append("does not fit")
      elif "loop-free" in step["time_source"]:
        timed[pair] = step["step_s"]
        texts.append(f"{step['step_s']:.4f} s, {step['total_bytes'] / 2**30:.2f} GiB")
      else:
        texts.append(f"{step['total_bytes'] / 2**30:.2f} GiB")
    best = min(timed, key=timed.get) if timed else None
    rows.append(f"| {setup} | {rung} | " + " | ".join(texts) + " | "
                + (f"{best[0]} + {best[1]}" if best else "n/a (memory only)") + " |")
  return "\n".join(rows)


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--rungs", default="tied_200m", help="comma-separated ladder rungs")
  p.add_argument("--setups", default="pod,small", help=f"some of {', '.join(SETUPS)}")
  p.add_argument("--variants", default=",".join(VARIANTS),
                 help=f"some of {', '.join([*LADDER_VARIANTS, *VARIANTS])}")
  p.add_argument("--out", default="runs/head_attention_compile",
                 help="output folder (resumable)")
  args = p.parse_args(argv)
  def pick(value: str, known, flag: str) -> list[str]:
    names = [x for x in value.split(",") if x]
    if not names or any(x not in known for x in names):
      p.error(f"{flag}={value}: expected some of {', '.join(known)}")
    return names

  setups = pick(args.setups, SETUPS, "--setups")
  variants = pick(args.variants, [*LADDER_VARIANTS, *VARIANTS], "--variants")
  rungs = [r for r in args.rungs.split(",") if r]
  from lev_jax.experiments import load_experiment  # pylint: disable=import-outside-toplevel
  ladder = load_experiment(REPO / "experiments" / "ladder.py")
  unknown = [r for r in rungs if r not in ladder.RUNGS]
  if unknown or not rungs:
    p.error(f"--rungs={args.rungs}: expected some of {', '.join(ladder.RUNGS)}")
  out = Path(args.out).resolve()
  rows = ["| setup | rung | variant | per chip (GiB) | temporaries (GiB) "
          "| step (s, ESTIMATE) |", "|---|---|---|---|---|---|"]
  cells = {}
  for setup in setups:
    topology, estimate = SETUPS[setup]
    for rung in rungs:
      for variant in variants:
        flags = LADDER_VARIANTS.get(variant, BEFORE + VARIANTS.get(variant, ()))
        rec = compile_cell(rung, topology, out / setup, estimate, overrides=flags,
                           name=variant)
        rows.append(row(f"{setup} ({topology})", rung, variant, rec))
        cells.setdefault((f"{setup} ({topology})", rung), {})[variant] = rec
  table = "\n".join(rows)
  by_rung = rung_table(cells)
  if by_rung.count("\n") > 1:  # some loss x attention cells: one row per rung as well
    table += "\n\n" + by_rung
  print(table)
  out.mkdir(parents=True, exist_ok=True)
  (out / "table.md").write_text(table + "\n")
  return 0


if __name__ == "__main__":
  sys.exit(main())
