"""The platform a program is traced for: the default backend, or the target of an
ahead-of-time compilation.

Some code paths depend on the platform they will run on: `dense` (CPU-portable
gradients), LEV's fused core (windows materialised on CPU, recomputed from the spline
input elsewhere) and the Pallas kernels (interpreted on CPU, Mosaic on TPU, Triton on
GPU). They ask `platform()`, which is `jax.default_backend()` unless `compiling_for` is
active: `lev-compile` (lev_jax/aot.py) traces on a CPU host for a TPU slice, and the
program it compiles must be the one the TPU would run. `unrolled_loops` traces LEV's
and the chunked loss's loops unrolled, for the cost model's estimate only.
"""

from __future__ import annotations

import contextlib

import jax

PLATFORMS = ("cpu", "gpu", "tpu")
_TARGETS: list[str] = []
_UNROLLED: list[bool] = []


def platform() -> str:
  """"cpu", "gpu" or "tpu": the platform the current trace is for."""
  if _TARGETS:
    return _TARGETS[-1]
  backend = jax.default_backend()
  return "gpu" if backend in ("cuda", "rocm") else backend


@contextlib.contextmanager
def compiling_for(target: str):
  """Within this context, `platform()` is `target` ("cpu", "gpu" or "tpu").

  Raises:
    ValueError: an unknown target.
  """
  if target not in PLATFORMS:
    raise ValueError(f"target platform {target!r}: expected one of {PLATFORMS}")
  _TARGETS.append(target)
  try:
    yield
  finally:
    _TARGETS.pop()


def loops_unrolled() -> bool:
  """True inside `unrolled_loops`: LEV's loops (its chunks, the fused core's coordinate
  groups and backward scan) and the chunked loss's are traced unrolled."""
  return bool(_UNROLLED)


@contextlib.contextmanager
def unrolled_loops():
  """Traces LEV's and the chunked loss's loops unrolled: the same computation, loop-free. XLA's cost models
  count a loop's body once, so lev-compile estimates a step's time from programs traced
  this way (lev_jax/aot.py); nothing that runs uses it."""
  _UNROLLED.append(True)
  try:
    yield
  finally:
    _UNROLLED.pop()
