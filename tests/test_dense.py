"""lev_jax.dense: the weight matmul, its CPU gradient and the dots XLA:CPU runs."""

import os
import re
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lev_jax.dense import dense

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("x_shape,w_shape,n_in", [((3, 5, 8), (8, 6), 1),
                                                  ((3, 5, 8), (8, 2, 4), 1),
                                                  ((4, 2, 4), (2, 4, 7), 2)])
def test_value_and_gradients_match_dot_general(x_shape, w_shape, n_in):
  kx, kw, kc = jax.random.split(jax.random.key(0), 3)
  x = jax.random.normal(kx, x_shape)
  w = jax.random.normal(kw, w_shape)
  dims = ((tuple(range(len(x_shape) - n_in, len(x_shape))), tuple(range(n_in))), ((), ()))
  ref = lambda x, w: jax.lax.dot_general(x, w, dims)
  out_shape = x_shape[:len(x_shape) - n_in] + w_shape[n_in:]
  cot = jax.random.normal(kc, out_shape)
  loss = lambda f: lambda x, w: jnp.sum(f(x, w) * cot)
  np.testing.assert_allclose(dense(x, w, n_in), ref(x, w), rtol=1e-5, atol=1e-5)
  for got, want in zip(jax.grad(loss(lambda x, w: dense(x, w, n_in)), (0, 1))(x, w),
                       jax.grad(loss(ref), (0, 1))(x, w)):
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_bfloat16_inputs_float32_result_and_gradient_dtypes():
  x = jnp.ones((2, 3, 4), jnp.bfloat16)
  w = jnp.ones((4, 5), jnp.bfloat16)
  assert dense(x, w, preferred_element_type=jnp.float32).dtype == jnp.float32
  gx, gw = jax.grad(lambda x, w: dense(x, w, preferred_element_type=jnp.float32).sum(),
                    (0, 1))(x, w)
  assert (gx.dtype, gw.dtype) == (jnp.bfloat16, jnp.bfloat16)
  assert float(gw[0, 0]) == 6.0


def test_mismatched_dims_name_both_shapes():
  with pytest.raises(ValueError, match=r"last 1 dims \(4,\) must equal w's first 1 dims \(3,\)"):
    dense(jnp.ones((2, 4)), jnp.ones((3, 5)))


_HLO_PROGRAM = """
import re, sys, numpy as np, jax
from lev_jax import train
from lev_jax.experiments import experiments_dir, load_experiment

for variant in sys.argv[1:]:
  config = load_experiment(experiments_dir() / "smoke.py").get_config(variant)
  part = train.partition(config)
  params = train.abstract_state(part, config)["params"]  # shapes only: nothing to run
  b, l = config.train.global_batch_size, config.train.seq_len
  ids = np.zeros((b, l + 1), np.int32)
  batch = {"inputs": ids[:, :-1], "targets": ids[:, 1:], "weights": np.ones((b, l), np.float32)}
  grad = jax.jit(jax.grad(lambda p: train._sum_loss(p, part.graphdef, batch)[0]))
  print(f"=== {variant}")
  print(grad.lower(params).compile().as_text())
"""
# One pytest-xdist worker runs this file (--dist loadgroup): its module fixture (the
# default-flags HLO of both smoke gradients) is built once, not once per worker.
pytestmark = pytest.mark.xdist_group("ynnpack")
VARIANTS = ("tied", "leviathan")  # leviathan has untied's head


# XLA flags of LLVM's code generation alone, which runs after the HLO passes: the
# optimized HLO read here is the same text with them as with XLA's defaults (checked for
# both variants with jax 0.10), and the compile takes ~35 % less CPU time (conftest).
CODEGEN_ONLY_FLAGS = ("--xla_backend_optimization_level=0 "
                      "--xla_llvm_disable_expensive_passes=true "
                      "--xla_cpu_parallel_codegen_split_count=1")


@pytest.fixture(scope="module")
def default_flags_hlo():
  """{variant: the optimized HLO of its smoke gradient}, XLA's default HLO passes (as
  lev-train runs: conftest's --xla_cpu_use_fusion_emitters=false changes them), both
  from one subprocess."""
  env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "NPROC")}
  env["XLA_FLAGS"] = CODEGEN_ONLY_FLAGS
  env["PYTHONPATH"] = str(REPO)
  out = subprocess.run([sys.executable, "-c", _HLO_PROGRAM, *VARIANTS], env=env,
                       capture_output=True, text=True, check=True, cwd=REPO).stdout
  parts = re.split(r"^=== (\w+)\n", out, flags=re.M)[1:]
  return dict(zip(parts[::2], parts[1::2]))


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_train_step_dot_runs_in_ynnpack(variant, default_flags_hlo):
  """XLA:CPU runs a dot outside a YNNPACK fusion in Eigen, whose sums follow the CPU's
  caches and threads (lev_jax/portable.py). Compiled with XLA's default HLO passes, as
  lev-train runs: no computation but a fused one may hold a dot. (Before lev_jax.dense,
  8 weight-gradient dots of the Leviathan step were outside.)"""
  hlo = default_flags_hlo[variant]
  computations = re.split(r"\n(?=\S)", hlo)
  ynn = [c for c in computations if '"__ynn_fusion"' in c]
  assert ynn, "no YNNPACK fusion: has XLA:CPU changed? see lev_jax/portable.py"
  outside = [line.strip()[:160] for c in computations
             if c.startswith("ENTRY") or not c.startswith("%fused")
             for line in c.splitlines() if " dot(" in line]
  assert not outside, outside
