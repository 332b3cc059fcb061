"""lev_jax.portable: the XLA:CPU environment for CPU-independent float32 bits."""

import os
import platform
import subprocess
import sys

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
