"""Ablations of Leviathan at d192-L3 on each prose corpus (issue 25, item 3): vocabulary
8k, the scale study's budget; one config change per ablation cell (two for the combined
one), 3 seeds each, against the scale study's own tied, untied and Leviathan runs of that
cell.

  lev-study --study=experiments/ablation_study.py:ablation_debian_books --root=runs/scale \
      --run                       # the 11 ablations at debian_books (report_ablation_...)
  lev-study --study=experiments/ablation_study.py:ablation_foldoc --root=runs/scale --run
  lev-study --study=experiments/ablation_study.py:ablation_python_docs --root=runs/scale --run
  lev-study --study=experiments/ablation_study.py --root=runs/scale \
      --report_dir=runs/scale/report_ablation --run    # all three corpora, one report
  lev-train --config=experiments/ablation_study.py:leviathan_d192_debian_books_rank32_s0 \
      --workdir=runs/x

Why. In experiments/scale_study.py Leviathan (LEV input + untied head) trails untied on
debian_books at every size, most consistently at d192-L3 (validation perplexity +15 %,
+17 % at seeds 0 and 1). Each ablation changes one thing of Leviathan's default config
there, so its cell vs the default Leviathan and vs untied says whether that thing is
(part of) the cause; the report gives, per ablation, the fraction of the Leviathan-vs-
untied gap it closes (lev_jax/ladder/study.py `gap_closed`) and LEV's final gradient
norm and update ratio (train/grad_norm/lev, train/update_ratio/lev).

Cells (ABLATIONS; run `leviathan_d192_<corpus>_<ablation>_s<seed>`):
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
  knots32_scale  both knots32 and scale (the two that closed most of the gap alone)
Per corpus (CORPUS_ABLATIONS): debian_books, where Leviathan trails untied most, gets the
11 single changes (the first piece, run first); foldoc and python_docs get the two that
closed most of debian_books' gap on validation (knots32, scale) and the two together, at
the same size d192-L3 on every corpus (a size fixed in advance, not picked per corpus
from the trend's test figures). knots32_scale runs at debian_books too.
LEV's d_seed and heads are not ablated here: lev-study does not take them as factors.

Baselines: `tied_`, `untied_` and `leviathan_d192_<corpus>_s<seed>`, whose configs are
experiments/scale_study.py's exactly (same names, same `name` field), so with
--root=runs/scale the scale study's finished runs are reused, not retrained (lev-train
refuses a finished run under other settings; tests/test_ladder_study.py checks the
equality). The reports must then go elsewhere than the scale study's (ROOT/report,
ROOT/report_<corpus>): a piece's goes to ROOT/report_ablation_<corpus>, the whole
study's to --report_dir as above.

Run order = priority: corpus by corpus (debian_books, foldoc, python_docs), inside one
per seed (0, 1, 2) the three baselines of that seed (skipped where the scale study
trained them in ROOT) and then the corpus's ablations; so a piece cut short still pairs
each finished ablation seed with its baselines.

Budget: experiments/scale_study.py's exactly (64 steps x 16 x 128 = 131,072 tokens per
run, lr warm-up 8, evaluation every 16 steps, FINAL_EVAL_BATCHES = 12). debian_books: 33
ablation runs (the 9 baselines are the scale study's); foldoc and python_docs: 9 each; measured there on the shared 2-core CPU, a
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
SIZE = "d192"  # the scale study's size name
CORPORA = ("debian_books", "foldoc", "python_docs")
# name -> {dotted config field: value}: the changes to the scale study's Leviathan config.
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
    "knots32_scale": {"lev.n_knots": 32, "lev.output_norm": "scale"},
}
SINGLE = tuple(a for a in ABLATIONS if a != "knots32_scale")
CORPUS_ABLATIONS = {"debian_books": SINGLE,
                    "foldoc": ("knots32", "scale", "knots32_scale"),
                    "python_docs": ("knots32", "scale", "knots32_scale")}


# experiments/scale_study.py (beside this file): the baselines' configs and the budget.
_SCALE = load_experiment(Path(__file__).with_name("scale_study.py"))
FINAL_EVAL_BATCHES = _SCALE.FINAL_EVAL_BATCHES


def _piece(corpus: str) -> tuple[str, ...]:
  """One corpus's runs: per seed, the three baselines and then its ablations."""
  cell = f"{SIZE}_{corpus}"
  return tuple(run for s in SEEDS for run in
               [f"{kind}_{cell}_s{s}" for kind in KINDS]
               + [f"leviathan_{cell}_{a}_s{s}" for a in CORPUS_ABLATIONS[corpus]])


PIECES = {f"ablation_{corpus}": _piece(corpus) for corpus in CORPORA}
RUNGS = tuple(run for piece in PIECES.values() for run in piece)
assert len(RUNGS) == len(set(RUNGS)) == len(SEEDS) * sum(
    len(KINDS) + len(a) for a in CORPUS_ABLATIONS.values())


def get_config(run: str = f"leviathan_{SIZE}_debian_books_rank32_s0"):
  if run not in RUNGS:
    raise ValueError(f"experiments/ablation_study.py: unknown run {run!r}; expected "
                     f"<kind>_{SIZE}_<corpus>_s<seed> with kind in {', '.join(KINDS)}, or "
                     f"leviathan_{SIZE}_<corpus>_<ablation>_s<seed> with ablation in "
                     f"{', '.join(ABLATIONS)} (at foldoc and python_docs: "
                     f"{', '.join(CORPUS_ABLATIONS['foldoc'])}); corpus in "
                     f"{', '.join(CORPORA)}; seed in {SEEDS}")
  prefix, seed = run.rsplit("_s", 1)
  rest = prefix.split("_", 2)[2]  # <corpus>[_<ablation>]
  corpus = next(c for c in CORPORA if rest == c or rest.startswith(f"{c}_"))
  cell = f"{SIZE}_{corpus}"
  if prefix in (f"{kind}_{cell}" for kind in KINDS):  # a baseline: the scale study's run
    return _SCALE.get_config(run)
  ablation = prefix.removeprefix(f"leviathan_{cell}_")
  c = _SCALE.get_config(f"leviathan_{cell}_s{seed}")
  c.name = f"ablation_{run}"
  for field, value in ABLATIONS[ablation].items():
    section, key = field.split(".")
    c[section][key] = value
  return c
