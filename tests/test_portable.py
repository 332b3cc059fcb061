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


_STEPS_PROGRAM = """
import hashlib, sys, numpy as np, jax
sys.path.insert(0, sys.argv[1])
from conftest import tiny_config
from lev_jax import train
config = tiny_config("lev")
config.train.seq_len, config.train.global_batch_size = 64, 8
part, state = train.create_train_state(config)
step = train.make_train_step(part, config)
rng = np.random.default_rng(0)
for _ in range(2):
  ids = rng.integers(0, 300, size=(8, 65)).astype(np.int32)
  state, metrics = step(state, {"inputs": ids[:, :-1], "targets": ids[:, 1:],
                                "weights": np.ones((8, 64), np.float32)})
digest = hashlib.sha256()
for leaf in jax.tree.leaves(state["params"]):
  digest.update(np.asarray(leaf).tobytes())
print(digest.hexdigest(), float(metrics["loss"]).hex(), float(metrics["grad_norm"]).hex())
"""


@pytest.mark.skipif(platform.machine() != "x86_64" or not shutil.which("qemu-x86_64"),
                    reason="needs an x86-64 host with qemu-user (apt-get install qemu-user)")
def test_same_bits_on_an_emulated_haswell():
  """Two Leviathan train steps here and on an emulated Intel Haswell (AVX2, no AVX-512,
  other caches; QEMU user mode) give the same parameters, loss and gradient norm bit
  for bit. benchmarks/cpu_portability.py does the same for the smoke models."""
  env = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}
  tests = str(Path(__file__).parent)
  run = lambda prefix: subprocess.run(
      [*prefix, sys.executable, "-c", _STEPS_PROGRAM, tests], env=env, capture_output=True,
      text=True, check=True).stdout.split()
  assert run([]) == run(["qemu-x86_64", "-cpu", "Haswell-v4"])


def test_importing_lev_jax_after_a_backend_started_warns():
  env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "NPROC")}
  prog = "import jax; jax.numpy.ones(1).block_until_ready(); import lev_jax"
  done = subprocess.run([sys.executable, "-W", "error::RuntimeWarning", "-c", prog],
                        env=env, capture_output=True, text=True, check=False)
  assert done.returncode != 0
  assert "lev_jax was imported after a JAX backend started" in done.stderr
