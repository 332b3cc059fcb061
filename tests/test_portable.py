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


def _digest(loss, grads) -> list[str]:
  """The loss and every gradient as bytes, hashed (_RUN_PROGRAM ends with the same)."""
  import hashlib  # pylint: disable=import-outside-toplevel
  import numpy as np  # pylint: disable=import-outside-toplevel
  digest = hashlib.sha256()
  for leaf in grads:
    digest.update(np.asarray(leaf).tobytes())
  return [digest.hexdigest(), float(loss).hex()]


def _export_here(folder: Path) -> list[str]:
  """Here (in this process: its XLA flags are lev_jax's, set when conftest imported it):
  the gradient of one batch, exported (jax.export: the traced StableHLO, which XLA
  compiles for the CPU that runs it) with the parameters into `folder`, then run; its
  _digest."""
  # pylint: disable=import-outside-toplevel
  import jax
  import numpy as np
  from flax import nnx
  from conftest import tiny_config
  from lev_jax import train
  # pylint: enable=import-outside-toplevel
  config = tiny_config("lev")
  config.model.n_layers = 1
  config.train.seq_len, config.train.global_batch_size = 16, 2
  graphdef, params = nnx.split(train.create_model(config), nnx.Param)
  leaves, treedef = jax.tree.flatten(params)
  leaves = [np.asarray(leaf) for leaf in leaves]
  ids = np.random.default_rng(0).integers(0, 300, size=(2, 17)).astype(np.int32)
  batch = {"inputs": ids[:, :-1], "targets": ids[:, 1:],
           "weights": np.ones((2, 16), np.float32)}

  def loss_and_grads(leaves):
    grad_fn = jax.value_and_grad(lambda p: train._sum_loss(p, graphdef, batch), has_aux=True)
    (loss, _), grads = grad_fn(jax.tree.unflatten(treedef, leaves))
    return loss, jax.tree.leaves(grads)

  exported = jax.export.export(jax.jit(loss_and_grads))(leaves)
  (folder / "step.bin").write_bytes(exported.serialize())
  np.savez(folder / "params.npz", *leaves)
  return _digest(*exported.call(leaves))


# On the emulated CPU: jax alone (no flax, no model code: under the emulator every
# import costs ~20x), lev_jax's portable XLA:CPU flags, the same program and parameters;
# it ends without the interpreter's finalisation (os._exit: ~1.5 CPU-s emulated).
_RUN_PROGRAM = """
import hashlib, os, sys, numpy as np
import lev_jax  # portable.py's flags, before jax starts a backend
import jax
with open(sys.argv[1] + "/step.bin", "rb") as f:
  exported = jax.export.deserialize(bytearray(f.read()))
saved = np.load(sys.argv[1] + "/params.npz")
loss, grads = exported.call([saved[f"arr_{i}"] for i in range(len(saved.files))])
digest = hashlib.sha256()
for leaf in grads:
  digest.update(np.asarray(leaf).tobytes())
print(digest.hexdigest(), float(loss).hex(), flush=True)
os._exit(0)
"""


@pytest.mark.skipif(platform.machine() != "x86_64" or not shutil.which("qemu-x86_64"),
                    reason="needs an x86-64 host with qemu-user (apt-get install qemu-user)")
def test_same_bits_on_an_emulated_haswell(tmp_path):
  """A Leviathan model's loss and gradients (every parameter's) here and on an emulated
  Intel Haswell (AVX2, no AVX-512, other caches; QEMU user mode) are the same bits (the
  optimizer's update is elementwise from there; the gradient is what differed:
  portable.py). One layer, one batch of 2 x 16 tokens; the emulated process compiles
  and runs the program traced here (jax.export), so it imports jax alone: the full
  import took ~40 s of its ~80 under the emulator. Running the step is emulated too (8 x
  64 tokens: 13 s of it): 2 x 16 tokens still differ in their bits here and there
  without portable.py's flags (LEV_JAX_PORTABLE_CPU=0: other gradient digests, checked),
  and cut the emulated process from ~51 to ~34 CPU-s. The side here runs in this
  process (a subprocess cost ~7 CPU-s, mostly its imports). benchmarks/cpu_portability.py
  compares whole train steps of the smoke models, each machine tracing its own."""
  here = _export_here(tmp_path)
  env = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}
  emulated = subprocess.run(
      ["qemu-x86_64", "-cpu", "Haswell-v4", sys.executable, "-c", _RUN_PROGRAM, str(tmp_path)],
      env=env, capture_output=True, text=True, timeout=600)
  assert emulated.returncode == 0, emulated.stderr[-3000:]
  assert len(here) == 2 and here == emulated.stdout.split()


def test_importing_lev_jax_after_a_backend_started_warns():
  env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "NPROC")}
  prog = "import jax; jax.numpy.ones(1).block_until_ready(); import lev_jax"
  done = subprocess.run([sys.executable, "-W", "error::RuntimeWarning", "-c", prog],
                        env=env, capture_output=True, text=True, check=False)
  assert done.returncode != 0
  assert "lev_jax was imported after a JAX backend started" in done.stderr
