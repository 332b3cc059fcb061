"""lev_jax/cli/interrupt.py: Ctrl-C while a command starts, in a gc callback, and during
an XLA compile: one line, exit status 130, no traceback, no crash, never lost.

Each case is a small script named like a console script (`lev-probe`), run as a child
that sends itself SIGINT at the moment under test.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ctrl_c_not_ignored

REPO = Path(__file__).resolve().parent.parent

START = """import os, signal, time
import lev_jax.cli
os.kill(os.getpid(), signal.SIGINT)
time.sleep(3)
print("went on")
"""

# A Ctrl-C that arrives inside a gc callback (jax registers one): Python drops an
# exception raised there ("Exception ignored in ...").
IN_GC = """import gc, os, signal, sys, time
import lev_jax.cli
from lev_jax.cli import interrupt
if sys.argv[1] == "started":
  interrupt.started()
def callback(phase, info):
  os.kill(os.getpid(), signal.SIGINT)
  for _ in range(10000): pass
gc.callbacks.append(callback)
try:
  gc.collect()
  time.sleep(3)
except KeyboardInterrupt:
  gc.callbacks.remove(callback)
  print("raised", flush=True)
  os._exit(130)
print("went on")
"""

# Ctrl-C while XLA compiles (jaxlib goes on compiling in a native thread): the exit must
# not wait for the compile and crash in the interpreter's finalisation.
IN_COMPILE = """import os, subprocess
import lev_jax.cli
from lev_jax.cli import common
import jax, jax.numpy as jnp

def main(argv):
  def f(x):
    for i in range(120):
      x = jnp.sin(x @ x.T + i) * jnp.cos(x)
    return x
  lowered = jax.jit(f).lower(jnp.ones((32, 32)))
  subprocess.Popen(["sh", "-c", f"sleep 0.5; kill -INT {os.getpid()}"])  # needs no GIL
  lowered.compile()
  print("compiled before the Ctrl-C")

# What was kept is said after the Ctrl-C (lev-train: whether a checkpoint exists yet).
common.run("lev-probe", main, "lev_jax.cli.params",
           interrupted=lambda cause: f"{cause}; stopped")
"""


def probe(tmp_path, code, *args, timeout=60):
  script = tmp_path / "lev-probe"
  script.write_text(code)
  # Neither conftest's compilation cache nor its fast-compile XLA_FLAGS: IN_COMPILE needs
  # a compile seconds long (it is not waited for).
  env = {k: v for k, v in os.environ.items()
         if not k.startswith(("JAX_COMPILATION_CACHE", "JAX_PERSISTENT_CACHE", "XLA_FLAGS"))}
  with ctrl_c_not_ignored():
    return subprocess.run([sys.executable, str(script), *args], capture_output=True,
                          text=True, timeout=timeout, cwd=REPO, env=env)


def test_ctrl_c_while_starting_is_one_line_and_exit_130(tmp_path):
  proc = probe(tmp_path, START)
  assert (proc.returncode, proc.stdout) == (130, ""), proc.stderr[-3000:]
  assert proc.stderr.splitlines() == [
      "lev-probe: interrupted (Ctrl-C) while starting; nothing was written"]


@pytest.mark.parametrize("phase,stdout", [("starting", ""), ("started", "raised\n")])
def test_ctrl_c_in_a_gc_callback_is_not_lost(tmp_path, phase, stdout):
  proc = probe(tmp_path, IN_GC, phase)
  assert (proc.returncode, proc.stdout) == (130, stdout), proc.stderr[-3000:]
  assert "Traceback" not in proc.stderr, proc.stderr[-3000:]


def test_ctrl_c_during_a_compile_exits_130_without_a_crash(tmp_path):
  proc = probe(tmp_path, IN_COMPILE)
  assert (proc.returncode, proc.stdout) == (130, ""), proc.stderr[-3000:]
  assert proc.stderr.splitlines()[-1:] == ["lev-probe: interrupted (Ctrl-C); stopped"], (
      proc.stderr[-3000:])
  assert "Fatal Python error" not in proc.stderr



def test_prog_is_the_console_script_or_the_command_module():
  from lev_jax.cli import interrupt
  cli = Path(interrupt.__file__).parent
  assert interrupt.prog_of("/venv/bin/lev-train") == "lev-train"
  assert interrupt.prog_of(str(cli / "prepare_data.py")) == "lev-prepare-data"
  assert interrupt.prog_of("/usr/bin/pytest") == "lev"
