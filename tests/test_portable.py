"""lev_jax.portable: the XLA:CPU environment for CPU-independent float32 bits."""

import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from lev_jax import portable


def test_sets_the_flag_and_keeps_the_users_flags():
  env = {"XLA_FLAGS": "--xla_cpu_use_fusion_emitters=false"}
  assert portable.configure_environment(env, schedulable_cpus=8, machine="x86_64")
  assert env["XLA_FLAGS"] == ("--xla_cpu_use_fusion_emitters=false "
                              "--xla_cpu_enable_platform_dependent_math=false "
                              "--xla_cpu_max_isa=AVX2")
  assert "NPROC" not in env  # two or more CPUs: XLA's own thread count
  before = dict(env)
  assert portable.configure_environment(env, schedulable_cpus=8, machine="x86_64")
  assert env == before  # idempotent


def test_no_x86_instruction_set_on_other_machines():
  env = {}
  portable.configure_environment(env, schedulable_cpus=4, machine="aarch64")
  assert env == {"XLA_FLAGS": portable.PORTABLE_MATH_FLAG}


def test_an_explicit_choice_wins():
  mine = "--xla_cpu_enable_platform_dependent_math=true --xla_cpu_max_isa=AVX512"
  env = {"XLA_FLAGS": mine, "NPROC": "1"}
  portable.configure_environment(env, schedulable_cpus=1, machine="x86_64")
  assert env == {"XLA_FLAGS": mine, "NPROC": "1"}


def test_one_cpu_gets_two_threads():
  env = {}
  portable.configure_environment(env, schedulable_cpus=1, machine="x86_64")
  assert env == {"XLA_FLAGS": f"{portable.PORTABLE_MATH_FLAG} {portable.MAX_ISA_FLAG}",
                 "NPROC": "2"}


def test_switched_off():
  env = {portable.ENV_SWITCH: "0"}
  assert not portable.configure_environment(env, schedulable_cpus=1)
  assert env == {portable.ENV_SWITCH: "0"}


def test_importing_lev_jax_sets_it_before_any_backend():
  env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "NPROC")}
  prog = ("import os, lev_jax, jax; jax.numpy.ones(1).block_until_ready(); "
          "print(os.environ['XLA_FLAGS'])")
  out = subprocess.run([sys.executable, "-c", prog], env=env, capture_output=True,
                       text=True, check=True).stdout
  expected = {portable.PORTABLE_MATH_FLAG}
  if platform.machine() in ("x86_64", "AMD64"):
    expected.add(portable.MAX_ISA_FLAG)
  assert set(out.split()) == expected


_GRADS_PROGRAM = """
import hashlib, sys, numpy as np, jax
sys.path.insert(0, sys.argv[1])
from flax import nnx
from conftest import tiny_config
from lev_jax import train
config = tiny_config("lev")
config.model.n_layers = 1
config.train.seq_len, config.train.global_batch_size = 64, 8
graphdef, params = nnx.split(train.create_model(config), nnx.Param)
ids = np.random.default_rng(0).integers(0, 300, size=(8, 65)).astype(np.int32)
batch = {"inputs": ids[:, :-1], "targets": ids[:, 1:], "weights": np.ones((8, 64), np.float32)}
loss_and_grads = jax.value_and_grad(lambda p: train._sum_loss(p, graphdef, batch),
                                    has_aux=True)
(loss, _), grads = jax.jit(loss_and_grads)(params)
digest = hashlib.sha256()
for leaf in jax.tree.leaves(grads):
  digest.update(np.asarray(leaf).tobytes())
print(digest.hexdigest(), float(loss).hex())
"""


@pytest.mark.skipif(platform.machine() != "x86_64" or not shutil.which("qemu-x86_64"),
                    reason="needs an x86-64 host with qemu-user (apt-get install qemu-user)")
def test_same_bits_on_an_emulated_haswell():
  """A Leviathan model's loss and gradients (every parameter's) here and on an emulated
  Intel Haswell (AVX2, no AVX-512, other caches; QEMU user mode) are the same bits (the
  optimizer's update is elementwise from there; the gradient is what differed:
  portable.py). One layer, one batch: under the emulator the import alone takes ~25 s.
  benchmarks/cpu_portability.py compares whole train steps of the smoke models."""
  env = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}
  tests = str(Path(__file__).parent)
  start = lambda prefix: subprocess.Popen(
      [*prefix, sys.executable, "-c", _GRADS_PROGRAM, tests], env=env,
      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  procs = [start([]), start(["qemu-x86_64", "-cpu", "Haswell-v4"])]  # side by side
  outs = [p.communicate(timeout=600) for p in procs]
  for p, (_, err) in zip(procs, outs):
    assert p.returncode == 0, err[-3000:]
  assert outs[0][0].split() == outs[1][0].split()


def test_importing_lev_jax_after_a_backend_started_warns():
  env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "NPROC")}
  prog = "import jax; jax.numpy.ones(1).block_until_ready(); import lev_jax"
  done = subprocess.run([sys.executable, "-W", "error::RuntimeWarning", "-c", prog],
                        env=env, capture_output=True, text=True, check=False)
  assert done.returncode != 0
  assert "lev_jax was imported after a JAX backend started" in done.stderr
