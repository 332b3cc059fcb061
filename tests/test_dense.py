"""lev_jax.dense: the weight matmul, its CPU gradient and the dots XLA:CPU runs."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lev_jax.dense import dense


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


# One pytest-xdist worker runs this file (--dist loadgroup): its module fixture (the
# default-flags HLO of both smoke gradients) is built once, not once per worker.
pytestmark = pytest.mark.xdist_group("ynnpack")
VARIANTS = ("tied", "leviathan")  # leviathan has untied's head
# Of the tests' XLA flags (conftest), only --xla_cpu_use_fusion_emitters=false changes the
# optimized HLO; set back to XLA's default for these compiles, the HLO is the text of a
# process with XLA's default flags (the others act on LLVM's code generation, after the
# HLO passes: the same text for both variants with jax 0.10.2, source lines aside), with
# no second python process to start.
DEFAULT_HLO_PASSES = {"xla_cpu_use_fusion_emitters": True}


@pytest.fixture(scope="module")
def default_flags_hlo():
  """{variant: the optimized HLO of its smoke gradient}, XLA's default HLO passes (as
  lev-train runs)."""
  from lev_jax import train  # noqa: PLC0415
  from lev_jax.experiments import experiments_dir, load_experiment  # noqa: PLC0415
  hlo = {}
  for variant in VARIANTS:
    config = load_experiment(experiments_dir() / "smoke.py").get_config(variant)
    part = train.partition(config)
    params = train.abstract_state(part, config)["params"]  # shapes only: nothing to run
    b, l = config.train.global_batch_size, config.train.seq_len
    ids = np.zeros((b, l + 1), np.int32)
    batch = {"inputs": ids[:, :-1], "targets": ids[:, 1:],
             "weights": np.ones((b, l), np.float32)}
    grad = jax.jit(jax.grad(lambda p: train._sum_loss(p, part.graphdef, batch)[0]))  # noqa: SLF001
    hlo[variant] = grad.lower(params).compile(compiler_options=DEFAULT_HLO_PASSES).as_text()
  return hlo


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
