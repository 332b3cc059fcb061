"""Smoke experiments: tied vs untied vs Leviathan on the embedded data, CPU-sized.

  lev-train --config=experiments/smoke.py:leviathan   (also :tied, :untied)

Each variant trains in a few minutes on a 2-core CPU. The three share everything but
model.embedding; LEV is scaled down with the model (d_seed 32, 4 heads, rank 16) so its
cost stays in proportion to a d_model=128 backbone.
"""

from lev_jax.config import base_config

VARIANTS = {"tied": "tied", "untied": "untied", "leviathan": "lev"}


def get_config(variant: str = "leviathan"):
  if variant not in VARIANTS:
    raise ValueError(f"experiments/smoke.py: unknown variant {variant!r}; "
                     f"expected one of {', '.join(VARIANTS)}")
  c = base_config()
  c.name = f"smoke_{variant}"
  c.model.embedding = VARIANTS[variant]
  c.model.vocab_size = 2048
  c.model.d_model = 128
  c.model.n_layers = 2
  c.model.n_heads = 4
  c.model.n_kv_heads = 4
  c.model.head_dim = 32
  c.model.d_ff = 384
  c.lev.d_seed = 32
  c.lev.n_heads = 4
  c.lev.n_knots = 16
  c.lev.rank = 16
  c.train.steps = 300
  c.train.seq_len = 128
  c.train.global_batch_size = 16
  c.train.log_every = 10
  c.train.eval_every = 100
  c.train.checkpoint_every = 100
  c.optim.lr = 3e-3
  c.optim.warmup_steps = 30
  return c
