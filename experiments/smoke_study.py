"""Seeded check of LEV's learning-rate multiplier at the smoke configs' own budget
(issue 11): tied, and Leviathan at optim.lev_lr_multiplier 1 and 3, 3 seeds each.

  lev-study --study=experiments/smoke_study.py --root=runs/smoke_study --run

experiments/fidelity_study.py chose lev_lr_multiplier = 3 on its validation split at
vocabulary 32k and a 65,536-token budget. This study asks whether that choice holds
where the default job runs: experiments/smoke.py unchanged (2,048-id vocabulary, 300
steps x 16 x 128 = 614,400 tokens, 9.4x the fidelity budget, lr 3e-3), except that 5 %
of the training documents are held out as a test split (data.test_fraction), on which
the final table is reported. Seed i sets init and data order in every cell (paired).

Both multipliers are pinned here, so the study means the same whatever the default.
Cost on a 2-core CPU: tied ~1.5 min, Leviathan ~5 min per run (9 runs, ~35 min).
"""

from pathlib import Path

from lev_jax.experiments import load_experiment

SEEDS = (0, 1, 2)
CELLS = {"tied": ("tied", None), "leviathan-lr1": ("leviathan", 1.0),
         "leviathan-lr3": ("leviathan", 3.0)}
TEST_FRACTION = 0.05
FINAL_EVAL_BATCHES = 12  # lev-study's validation / test evaluation (x 16 x 128 targets)
# Seed 0 of every cell first, so that a study cut short still compares all three.
RUNGS = tuple(f"{cell}_s{s}" for s in SEEDS for cell in CELLS)


def _smoke():
  """experiments/smoke.py (beside this file)."""
  return load_experiment(Path(__file__).with_name("smoke.py"))


def get_config(run: str = "leviathan-lr3_s0"):
  if run not in RUNGS:
    raise ValueError(f"experiments/smoke_study.py: unknown run {run!r}; expected "
                     f"<cell>_s<seed> with cell in {', '.join(CELLS)} and seed in {SEEDS}")
  cell, seed = run.rsplit("_s", 1)
  variant, multiplier = CELLS[cell]
  c = _smoke().get_config(variant)
  c.name = f"smoke_study_{run}"
  c.seed = c.data.seed = int(seed)
  c.optim.lev_lr_multiplier = 1.0 if multiplier is None else multiplier
  c.data.test_fraction = TEST_FRACTION
  c.train.keep_checkpoints = 1
  return c
