"""Shared fixtures: tiny configs that build in milliseconds."""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
# XLA:CPU spends seconds optimising each tiny test program; level 0 compiles ~3x faster
# and the tests' models are too small for the run time to matter.
os.environ.setdefault("XLA_FLAGS", "--xla_backend_optimization_level=0 "
                      "--xla_llvm_disable_expensive_passes=true")

import pytest

from lev_jax.config import base_config


def tiny_config(embedding="lev", **lev):
  """A 2-layer d_model=32 model over a 300-id vocab (padded to 384)."""
  c = base_config()
  c.name = f"tiny_{embedding}"
  c.model.embedding = embedding
  c.model.vocab_size = 300
  c.model.d_model = 32
  c.model.n_layers = 2
  c.model.n_heads = 4
  c.model.n_kv_heads = 2
  c.model.head_dim = 8
  c.model.d_ff = 64
  c.lev.d_seed = 8
  c.lev.n_heads = 2
  c.lev.n_knots = 6
  c.lev.rank = 4
  for k, v in lev.items():
    c.lev[k] = v
  c.train.seq_len = 16
  c.train.global_batch_size = 4
  c.train.steps = 10
  c.optim.warmup_steps = 2
  return c


@pytest.fixture
def make_config():
  return tiny_config


@pytest.fixture(scope="session")
def data_cache(tmp_path_factory):
  """One embedded-corpus + tokenizer cache shared by the tests that train."""
  return tmp_path_factory.mktemp("lev_jax_cache")
