"""Ablations of Leviathan at the cell where it loses most (issue 25, item 3): debian_books,
d192-L3, vocabulary 8k, the scale study's budget; one config change per ablation cell,
3 seeds each, against the scale study's own tied, untied and Leviathan runs of that cell.

  lev-study --study=experiments/ablation_study.py --root=runs/scale \\
      --report_dir=runs/scale/report_ablation --run
  lev-train --config=experiments/ablation_study.py:leviathan_d192_debian_books_rank32_s0 \\
      --workdir=runs/x

Why. In experiments/scale_study.py Leviathan (LEV input + untied head) trails untied on
debian_books at every size, most consistently at d192-L3 (validation perplexity +15 %,
+17 % at seeds 0 and 1). Each ablation changes one thing of Leviathan's default config
there, so its cell vs the default Leviathan and vs untied says whether that thing is
(part of) the cause; the report gives, per ablation, the fraction of the Leviathan-vs-
untied gap it closes (lev_jax/ladder/study.py `gap_closed`) and LEV's final gradient
norm and update ratio (train/grad_norm/lev, train/update_ratio/lev).

Cells (ABLATIONS; run `leviathan_d192_debian_books_<ablation>_s<seed>`):
  idperm     lev.id_permutation = True: a fixed random permutation of ids before LEV's
             base-b digits (ids sorted by frequency put tokens of similar counts in shared
             codebook rows)
  mult1      optim.lev_lr_multiplier = 1 (default 3)
  mult10     optim.lev_lr_multiplier = 10
  levwarm    optim.lev_warmup_steps = 32, 4x the study's 8: the same peak LEV lr reached
             more gently. Chosen over 0 because mult10 already tests a more aggressive LEV
             start; with mult1 and mult10 this separates "LEV's lr is too high early on"
             (levwarm helps, mult1 may) from "LEV's lr is wrong throughout" (mult* move it,
             levwarm does not). 32 of 64 steps: LEV is at full lr from mid-run on.
  levwd0     optim.lev_weight_decay = 0 (default: optim.weight_decay)
  clipex     optim.clip_mode = exclude_lev (LEV's gradient outside the clipped norm)
  matchinit  lev.out_proj_init = match_table (LEV's output at the scale of a table's init)
  knots32    lev.n_knots = 32 (default 16; one reading of the paper's v1)
  rank32     lev.rank = 32 (the scale study's 16 doubled)
  rmsnorm    lev.output_norm = rmsnorm (a learned-gain RMS norm on LEV's output)
  scale      lev.output_norm = scale (a learned scale on LEV's output)
LEV's d_seed and heads are not ablated here: lev-study does not take them as factors.

Baselines: `tied_`, `untied_` and `leviathan_d192_debian_books_s<seed>`, whose configs are
experiments/scale_study.py's exactly (same names, same `name` field), so with
--root=runs/scale the scale study's finished runs are reused, not retrained (lev-train
refuses a finished run under other settings; tests/test_ladder_study.py checks the
equality). The report must then go elsewhere than ROOT/report (the scale study's):
--report_dir as above.

Run order = priority: per seed (0, 1, 2), the three baselines of that seed (already
trained for seeds 0 and 1 in runs/scale: skipped) and then the 11 ablations; so the first
runs trained are seed 0 of every ablation, and a study cut short still pairs each
finished ablation seed with its baselines.

Budget: experiments/scale_study.py's exactly (64 steps x 16 x 128 = 131,072 tokens per
run, lr warm-up 8, evaluation every 16 steps, FINAL_EVAL_BATCHES = 12). 33 new runs
(the 9 baselines are the scale study's); measured there on the shared 2-core CPU, a
d192-L3 Leviathan run takes ~2 min from start to its final evaluation (seeds 0 and 1:
73-102 s between the first and last logged step), plus ~10 s of lev-study's evaluation:
~1-1.5 h for the 33, more under load; each run resumes, so the study can be stopped
and restarted at any time. Run it when the scale study is not training in the same ROOT
(two lev-trains on one run: the second fails at once on the run's lock, and is retried
by the next lev-study).
"""

from pathlib import Path

from lev_jax.experiments import load_experiment

SEEDS = (0, 1, 2)
KINDS = ("tied", "untied", "leviathan")
CELL = "d192_debian_books"  # the scale study's size and corpus
# name -> {dotted config field: value}: one change to the scale study's Leviathan config.
ABLATIONS = {
    "idperm": {"lev.id_permutation": True},
    "mult1": {"optim.lev_lr_multiplier": 1.0},
    "mult10": {"optim.lev_lr_multiplier": 10.0},
    "levwarm": {"optim.lev_warmup_steps": 32},
    "levwd0": {"optim.lev_weight_decay": 0.0},
    "clipex": {"optim.clip_mode": "exclude_lev"},
    "matchinit": {"lev.out_proj_init": "match_table"},
    "knots32": {"lev.n_knots": 32},
    "rank32": {"lev.rank": 32},
    "rmsnorm": {"lev.output_norm": "rmsnorm"},
    "scale": {"lev.output_norm": "scale"},
}


# experiments/scale_study.py (beside this file): the baselines' configs and the budget.
_SCALE = load_experiment(Path(__file__).with_name("scale_study.py"))
FINAL_EVAL_BATCHES = _SCALE.FINAL_EVAL_BATCHES
RUNGS = tuple([f"{kind}_{CELL}_s{s}" for kind in KINDS]
              + [f"leviathan_{CELL}_{a}_s{s}" for a in ABLATIONS] for s in SEEDS)
RUNGS = tuple(run for group in RUNGS for run in group)
assert len(RUNGS) == len(set(RUNGS)) == len(SEEDS) * (len(KINDS) + len(ABLATIONS))


def get_config(run: str = f"leviathan_{CELL}_rank32_s0"):
  if run not in RUNGS:
    raise ValueError(f"experiments/ablation_study.py: unknown run {run!r}; expected "
                     f"<kind>_{CELL}_s<seed> with kind in {', '.join(KINDS)}, or "
                     f"leviathan_{CELL}_<ablation>_s<seed> with ablation in "
                     f"{', '.join(ABLATIONS)}; seed in {SEEDS}")
  prefix, seed = run.rsplit("_s", 1)
  if prefix in (f"{kind}_{CELL}" for kind in KINDS):  # a baseline: the scale study's run
    return _SCALE.get_config(run)
  ablation = prefix.removeprefix(f"leviathan_{CELL}_")
  c = _SCALE.get_config(f"leviathan_{CELL}_s{seed}")
  c.name = f"ablation_{run}"
  for field, value in ABLATIONS[ablation].items():
    section, key = field.split(".")
    c[section][key] = value
  return c
