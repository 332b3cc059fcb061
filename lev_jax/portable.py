"""Float32 training whose bits do not depend on which x86-64 CPU runs it.

The default job, the smoke ladder and the seeded studies run on CPUs, and docs/results.md
quotes their figures to the printed digit. XLA:CPU (jax 0.10.2) makes three choices by
the machine it finds, and 300 steps amplify the last-bit differences they cause to ~2 %
of Leviathan's perplexity:

1. Elementwise code and reductions are compiled for the CPU's instruction set:
   transcendental functions (exp, log, tanh, rsqrt, ...) with instructions of that set
   when `--xla_cpu_enable_platform_dependent_math` is true (XLA's default; its help:
   "at the expense of consistent results across CPUs"), and reductions with vectors
   as wide as the set allows (AVX-512 sums a [16, 128] array in another order than
   AVX2). `configure_environment` sets that flag to false and, on x86-64,
   `--xla_cpu_max_isa=AVX2`, so that AVX-512 machines compile what AVX2 machines do.
2. A dot whose left operand is contracted over its major dimension (x^T dy: the weight
   gradient of every `x @ W`) runs in Eigen (DotThunk), whose summation order follows
   the CPU's cache sizes and the number of intra-op threads. Dots in the standard
   [M, K] x [K, N] layout run in YNNPACK (YnnFusionThunk), whose sums depend on
   neither. `lev_jax.dense.dense` computes every weight matmul of the model with a
   gradient whose dots are all in the standard layout.
3. With one intra-op thread some reductions take another order than with 2 or more
   (measured: 2, 3, 4, 8 and 16 threads agree, 1 does not). `configure_environment`
   sets NPROC=2 (XLA's thread-pool size) on a machine with one schedulable CPU.

Measured on a 2-core AMD EPYC (AVX-512) against the same program under QEMU user mode
as an Intel Haswell (AVX2, other caches): with 1-3 in place, the smoke models'
parameters, loss and gradient norm after each of the first 5 steps are the same bits,
as they are with 3, 8 and 16 threads and on one schedulable CPU
(`benchmarks/cpu_portability.py`). Without them, one train step's gradients (compared
array by array) differed in ~95 % of the entries of most weight gradients, and without
1 the logits too. The cost: none measured; the CPU train step got faster, since
YNNPACK's dots beat Eigen's (docs/results.md, "train-step time", benchmarks/step_time.py).

Not covered: CPUs without AVX2 and FMA (x86 before 2013, where other kernels run),
other architectures (ARM), other jax/jaxlib versions (BUILD.md pins them), bfloat16.
Everything off the CPU (GPU, TPU) is unchanged: `dense` is `jax.lax.dot_general` there.
This module imports no jax: `lev_jax/__init__.py` runs `configure_environment` before
any backend can start.

Set LEV_JAX_PORTABLE_CPU=0 (exactly "0") to leave XLA's flags and thread count as they
are; `dense` keeps its layout either way. A flag or NPROC you set yourself is kept, even
one that undoes the above. Importing lev_jax after JAX started a backend warns: the
flags can no longer apply.

Source: `XLA_FLAGS=--help` (jax 0.10.2) for the flag; the thunk names are those in the
optimized HLO (`jax.jit(f).lower(...).compile().as_text()`).
"""

from __future__ import annotations

import os
import platform
import sys
import warnings
from collections.abc import MutableMapping

ENV_SWITCH = "LEV_JAX_PORTABLE_CPU"
PORTABLE_MATH_FLAG = "--xla_cpu_enable_platform_dependent_math=false"
MAX_ISA_FLAG = "--xla_cpu_max_isa=AVX2"  # x86-64 only: the value names x86 sets


def configure_environment(environ: MutableMapping[str, str] | None = None,
                          schedulable_cpus: int | None = None,
                          machine: str | None = None) -> bool:
  """Sets the XLA:CPU flags and thread count above in `environ` (default os.environ).

  Must run before JAX's CPU backend starts (the first array or `jax.devices()`);
  importing lev_jax does it. A flag or NPROC the user set is kept as it is.

  Args:
    environ: the environment to change.
    schedulable_cpus: default `len(os.sched_getaffinity(0))`.
    machine: default `platform.machine()`; MAX_ISA_FLAG is set on x86_64 / AMD64 only.
  Returns:
    False when LEV_JAX_PORTABLE_CPU=0 switched it off (nothing changed), else True.
  """
  env = os.environ if environ is None else environ
  if env.get(ENV_SWITCH, "1") == "0":
    return False
  machine = platform.machine() if machine is None else machine
  wanted = [PORTABLE_MATH_FLAG] + ([MAX_ISA_FLAG] if machine in ("x86_64", "AMD64") else [])
  added = []
  for flag in wanted:
    flags = env.get("XLA_FLAGS", "")
    if flag.split("=")[0] not in flags:
      env["XLA_FLAGS"] = f"{flags} {flag}".strip()
      added.append(flag)
  if added and environ is None and _backend_started():
    warnings.warn(f"lev_jax was imported after a JAX backend started: {' '.join(added)} "
                  "cannot apply any more, so CPU results may differ between CPU types; "
                  "import lev_jax before the first JAX computation (lev_jax/portable.py)",
                  RuntimeWarning, stacklevel=3)
  if schedulable_cpus is None:
    schedulable_cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (
        os.cpu_count() or 1)
  if schedulable_cpus < 2 and "NPROC" not in env:
    env["NPROC"] = "2"
  return True


def _backend_started() -> bool:
  """Whether jax (if imported at all) has started a backend; imports nothing."""
  bridge = sys.modules.get("jax._src.xla_bridge")
  started = getattr(bridge, "backends_are_initialized", None)
  return bool(started and started())
