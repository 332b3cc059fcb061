"""Scale trend at CPU scale (issue 25, item 2): tied, untied and Leviathan at four
backbone sizes, SentencePiece 8k, equal tokens per run, 3 seeds, on three prose corpora.

  lev-study --study=experiments/scale_study.py --root=runs/scale --run          # all 108 runs
  lev-study --study=experiments/scale_study.py:foldoc --root=runs/scale --run   # one corpus
  lev-train --config=experiments/scale_study.py:leviathan_d256_foldoc_s0 --workdir=runs/x

Sizes (model.d_model / n_layers; head_dim 32, n_heads = n_kv_heads = d_model / 32,
d_ff = 3 d_model, as experiments/smoke.py's d128 / 2 layers), parameters at vocabulary
8,192 (lev-params; backbone = the transformer blocks and final norm, the non-embedding
count that the trend's x axis uses):

  size      backbone     tied total   untied total   leviathan total (LEV)
  d128-L2     426,624     1,475,200      2,523,776       1,522,528 (47,328)
  d192-L3   1,439,040     3,011,904      4,584,768       3,063,328 (51,424)
  d256-L4   3,410,176     5,507,328      7,604,480       5,562,848 (55,520)
  d384-L6  11,506,560    14,652,288     17,798,016      14,716,000 (63,712)

LEV's shape is experiments/smoke.py's at every size (d_seed 32, 4 heads, 16 knots, rank
16; only its output projection grows with d_model): the question is whether the
Leviathan-vs-untied gap closes as the backbone grows with LEV's own capacity held fixed
(LEV's capacity is one of issue 25's ablations, item 3, not a second factor here).
Learning rate, schedule shape and data: experiments/smoke.py's (lr 3e-3, the current
defaults incl. optim.lev_lr_multiplier); the runs of a corpus differ only in variant,
size and seed (lev-study refuses anything else).

Data. `data.corpus` = foldoc, debian_books, python_docs (docs/data.md; the frozen
corpora shipped in lev_jax/data/corpora, python_docs the embedded default), in that
order: foldoc first (the largest, encyclopedic entries: the kind of text where issue 25
saw Leviathan lose). A SentencePiece vocabulary of 8,192 pieces is trained on each
corpus's training split. 5 % of the documents are held out as validation, 5 % more as
the test split (data.test_fraction); nothing is selected here, and the final tables are
on test, the validation figures beside them.

Seeds: seed i sets init and data order (seed, data.seed) in every cell, so the cells of
a (size, corpus) are paired by seed.

Run order = priority: corpus by corpus (foldoc, debian_books, python_docs); inside a
corpus seed 0 of every (size, variant) from the smallest size up, then seed 1, then
seed 2; so a study cut short still has a trend (seed 0) on the first corpus. Each corpus
is a piece (PIECES) that lev-study runs alone with `--study=experiments/scale_study.py:CORPUS`.

Budget. Equal tokens in every run: STEPS = 64 steps x BATCH 16 x SEQ_LEN 128 = 131,072
tokens (foldoc's training split holds 926k tokens at 8k: under one epoch everywhere),
lr warm-up 8 steps, evaluation on the way every 16 steps (2 x 8 x 128 targets), the
final validation / test evaluation on FINAL_EVAL_BATCHES = 12 batches (12,288 targets
per split). Chosen by measuring, on this 2-core CPU (shared: load average 1-5 from
other jobs while measuring, so these are upper bounds), the train step of every size
and variant (benchmarks/step_time.py's time_step: the jitted step on a synthetic
16 x 128 batch, median of 5 and of 8 steps after compilation, two passes; seconds per
step, lower / higher pass):

  size      tied          untied        leviathan
  d128-L2   0.40 / 0.52   0.74 / 0.74   0.49 / 0.76
  d192-L3   0.44 / 0.71   0.52 / 1.43   0.72 / 1.26
  d256-L4   1.25 / 1.90   1.17 / 1.76   1.13 / 1.54
  d384-L6   1.49 / 2.14   1.89 / 4.30   4.67 / 5.79

and three 20-step runs through lev-study (d128 on foldoc, load ~4): per run ~15-30 s
beyond the steps (start-up, data, compilation from the shared ROOT/jax_cache, the final
evaluations), ~3,200 tokens/s. With the lower figures, one step of each of a corpus's 36
runs sums to ~45 s (d384-L6 over half of it), so 64 steps ~48 min, plus ~15 min of
per-run overhead: ~63 min per corpus on 2 free cores, ~3 h 10 min for the whole study;
on a shared machine proportionally more (each run resumes, so the study can be stopped
and restarted at any time). Measured in the study itself on that shared CPU (load
average 3-11, nice 19), foldoc: seed 0 of the 12 cells in 39 min (with the tokenizer and
the first compilation of every shape), seed 1 in 32 min; per run from ~1 min (d128) to
~5-7 min (d384, 3.5-7.5 s per step).

The budget is early training at every size (0.14 epoch of foldoc; 0.01 tokens per
backbone parameter at d384-L6, whose loss still falls steeply at the last step): at it
the largest backbone is not the best in absolute perplexity (foldoc seed 0, tied test
ppl 692, 644, 674, 798 from d128 up; 3-seed means 732, 663, 711, 799), so the trend is
one at a fixed small budget.
"""

from pathlib import Path

from lev_jax.experiments import load_experiment, set_study_budget

VOCAB = 8192
SEEDS = (0, 1, 2)
KINDS = ("tied", "untied", "leviathan")
CORPORA = ("foldoc", "debian_books", "python_docs")
# name -> (d_model, n_layers); head_dim 32, n_heads = n_kv_heads = d_model / 32, d_ff = 3 d_model
SIZES = {"d128": (128, 2), "d192": (192, 3), "d256": (256, 4), "d384": (384, 6)}
HEAD_DIM = 32
STEPS = 64
BATCH = 16
SEQ_LEN = 128
EVAL_EVERY = 16
FINAL_EVAL_BATCHES = 12  # lev-study's validation / test evaluation (x 8 x 128 targets)
TEST_FRACTION = 0.05


def _piece(corpus: str) -> tuple[str, ...]:
  """One corpus's runs: seed 0 of every size (smallest first) and variant, then seed 1, 2."""
  return tuple(f"{kind}_{size}_{corpus}_s{s}" for s in SEEDS for size in SIZES
               for kind in KINDS)


PIECES = {corpus: _piece(corpus) for corpus in CORPORA}
RUNGS = tuple(run for corpus in CORPORA for run in PIECES[corpus])
assert len(RUNGS) == len(set(RUNGS)) == len(SEEDS) * len(SIZES) * len(KINDS) * len(CORPORA)


def _smoke():
  """experiments/smoke.py (beside this file): LEV's shape, the data and the lr."""
  return load_experiment(Path(__file__).with_name("smoke.py"))


def get_config(run: str = "leviathan_d128_foldoc_s0"):
  if run not in RUNGS:
    raise ValueError(f"experiments/scale_study.py: unknown run {run!r}; expected "
                     f"<kind>_<size>_<corpus>_s<seed> with kind in {', '.join(KINDS)}, size "
                     f"in {', '.join(SIZES)}, corpus in {', '.join(CORPORA)}, seed in {SEEDS}")
  kind, size, rest = run.split("_", 2)
  corpus, seed = rest.rsplit("_s", 1)
  c = _smoke().get_config(kind)
  c.name = f"scale_{run}"
  c.seed = c.data.seed = int(seed)
  c.model.vocab_size = VOCAB
  d_model, n_layers = SIZES[size]
  c.model.update(d_model=d_model, n_layers=n_layers, n_heads=d_model // HEAD_DIM,
                 n_kv_heads=d_model // HEAD_DIM, head_dim=HEAD_DIM, d_ff=3 * d_model)
  c.data.corpus = corpus
  set_study_budget(c, steps=STEPS, global_batch_size=BATCH, seq_len=SEQ_LEN,
                   eval_every=EVAL_EVERY, test_fraction=TEST_FRACTION)
  return c
