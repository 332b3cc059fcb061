"""A CPU-sized scaling ladder: tied and Leviathan at four sizes, about 15 minutes on 2 cores.

  lev-ladder --ladder=experiments/smoke_ladder.py --root=runs/smoke_ladder --run
  lev-train  --config=experiments/smoke_ladder.py:leviathan_m --workdir=runs/x   # one rung

The shape of experiments/ladder.py (200M-1.2B) shrunk to what a 2-core CPU trains in a
quarter of an hour for all eight rungs: the embedded data and SentencePiece vocabulary of
experiments/smoke.py (2,048 ids), seq_len 128, batch 16, 300 steps (614k tokens) per
rung as in experiments/smoke.py, an evaluation every 30 steps (ten points per
loss-vs-tokens curve) on 4 validation batches. Four sizes because the power-law fit L(N) = E + A N^-alpha needs at least four
tied points (lev_jax/ladder/scaling.py). d_model and depth grow with the size, up to
experiments/smoke.py's shape; LEV is experiments/smoke.py's (d_seed 32, 16 knots, rank
16) with 2 heads instead of 4 at every size, which halves its cost per step. At this
vocabulary the tied table is a large share of every tied model (2,048 x d_model), so the
totals are closer together than the backbones. Results at this scale test the pipeline,
not the paper's claims.
"""

from pathlib import Path

from lev_jax.experiments import load_experiment


def _smoke():
  """experiments/smoke.py (beside this file): the base every rung starts from."""
  return load_experiment(Path(__file__).with_name("smoke.py"))

# size: (d_model, n_layers, n_heads, head_dim, d_ff)
SHAPES = {
    "xs": (32, 1, 2, 16, 96),
    "s": (64, 1, 2, 32, 192),
    "m": (96, 2, 3, 32, 256),
    "l": (128, 2, 4, 32, 384),  # experiments/smoke.py's shape
}
EMBEDDINGS = {"tied": "tied", "leviathan": "lev"}
# The ladder, smallest first, each tied rung next to its Leviathan twin (lev-ladder
# trains them in this order).
RUNGS = tuple(f"{kind}_{size}" for size in SHAPES for kind in EMBEDDINGS)


def get_config(variant: str = "leviathan_m"):
  kind, _, size = variant.partition("_")
  if kind not in EMBEDDINGS or size not in SHAPES:
    raise ValueError(f"experiments/smoke_ladder.py: unknown variant {variant!r}; "
                     f"expected one of {', '.join(RUNGS)}")
  d, n_layers, n_heads, head_dim, d_ff = SHAPES[size]
  c = _smoke().get_config("tied" if kind == "tied" else "leviathan")  # data, vocab, lr
  c.name = f"smoke_ladder_{variant}"
  m = c.model
  m.d_model, m.n_layers, m.n_heads, m.n_kv_heads = d, n_layers, n_heads, n_heads
  m.head_dim, m.d_ff = head_dim, d_ff
  c.lev.n_heads = 2
  c.train.eval_every = 30
  c.train.checkpoint_every = 300
  c.train.keep_checkpoints = 1
  c.eval.batches = 4
  return c
