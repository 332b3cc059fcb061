"""TPU slices and NVIDIA GPUs by the names users type, and their compile-only devices.

Topology names are the ones users type: `v5p-128` (v4 / v5p count TensorCores, two per
chip: 64 chips), `v5e-256` / `v5litepod-256` / `v6e-16` (chips), or an explicit shape
`v5p:4x4x4`, `v6e:4x4`; several slices with `num_slices` (the config's DCN mesh axes
must span them). Chip facts (HBM per chip, HBM bandwidth) are Google's published
figures: cloud.google.com/tpu/docs/v4, /v5e, /v5p, /v6e ("system architecture").

NVIDIA GPUs (`h100-8`, `h200-16`) go through lev_jax/gpu_targets.py (jax's CUDA plugin
with a target description, no GPU); XLA:GPU does not refuse a program larger than the
GPU's memory, so the fit is the total against HBM there.

`topology_devices` asks libtpu (or jax's CUDA plugin) for compile-only devices: no chip
is touched. `check_libtpu` / `check_compiler` check that the compiler package matches
the installed jax first. Used by lev_jax/aot.py (`lev-compile`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.metadata
import math
import os
import re

import jax

from lev_jax import gpu_targets

GiB = 2 ** 30


class AotError(ValueError):
  """A topology, libtpu or mesh problem the user can fix; the message is one line."""


@dataclasses.dataclass(frozen=True)
class Chip:
  """One TPU generation: how jax names it and what one chip holds."""
  generation: str          # "v5p"
  device_kind: str         # jax `device.device_kind` of its compile-only devices
  hbm_bytes: int           # HBM per chip
  hbm_bytes_per_s: float   # HBM bandwidth per chip
  cores_in_name: int       # the "-N" of its accelerator type counts N / cores_in_name chips
  dims: int                # 3 for a 3-D torus (v4, v5p), 2 for v5e / v6e


# Sources: cloud.google.com/tpu/docs/{v4,v5e,v5p,v6e}, "System architecture" tables.
CHIPS = {
    "v4": Chip("v4", "TPU v4", 32 * GiB, 1228e9, 2, 3),
    "v5e": Chip("v5e", "TPU v5 lite", 16 * GiB, 819e9, 1, 2),
    "v5p": Chip("v5p", "TPU v5", 95 * GiB, 2765e9, 2, 3),
    "v6e": Chip("v6e", "TPU v6 lite", 32 * GiB, 1640e9, 1, 2),
}
_ALIASES = {"v5litepod": "v5e", "v5lite": "v5e", "v6litepod": "v6e"}


def device_memory_bytes(device) -> int | None:
  """Memory of one accelerator, bytes: the published HBM of a TPU chip (CHIPS) or an
  NVIDIA GPU (lev_jax/gpu_targets.py) by its `device_kind` (compile-only devices
  included), else what the runtime reports (`memory_stats()["bytes_limit"]`); None for
  a CPU or a device that reports nothing."""
  if device.platform == "cpu":
    return None
  for chip in (*CHIPS.values(), *gpu_targets.GPU_TARGETS.values()):
    if device.device_kind == chip.device_kind:
      return chip.hbm_bytes
  try:
    stats = device.memory_stats() or {}
  except Exception:  # pylint: disable=broad-except
    # compile-only and some plugin devices have no runtime to ask
    return None
  return int(stats["bytes_limit"]) if stats.get("bytes_limit") else None


@dataclasses.dataclass(frozen=True)
class Topology:
  """A named TPU slice (or several identical slices), or a number of NVIDIA GPUs."""
  name: str                # as the user typed it
  chip: Chip               # for a GPU: a gpu_targets.GpuTarget (the same fields used)
  shape: tuple[int, ...]   # chips per torus axis of one slice; (n,) GPUs
  num_slices: int = 1
  platform: str = "tpu"    # "tpu" or "gpu"

  @property
  def chips(self) -> int:
    return math.prod(self.shape) * self.num_slices

  @property
  def jax_name(self) -> str:
    return (f"{self.chip.generation}:{'x'.join(map(str, self.shape))}"
            if self.platform == "tpu" else f"{self.chip.name}-{self.shape[0]}")


def default_shape(chips: int, dims: int) -> tuple[int, ...]:
  """The slice shape Cloud TPU uses for `chips` chips: a 3-D torus grows 2x1x1, 2x2x1,
  then doubles the last of its smallest axes (v5p-8 = 2x2x1, v5p-32 = 2x2x4, v5p-128 =
  4x4x4); a 2-D one doubles the last of its smallest axes (v5e-8 = 2x4, v5e-256 =
  16x16).

  Raises:
    AotError: chips not a power of two.
  """
  if chips < 1 or chips & (chips - 1):
    raise AotError(f"{chips} chips: expected a power of two (or give the shape, e.g. "
                   "v5p:4x4x8)")
  shape = [1] * dims
  while math.prod(shape) < chips:
    if dims == 3 and math.prod(shape) < 4:  # a 3-D slice grows 2x1x1, 2x2x1 first
      shape[shape.index(1)] *= 2
      continue
    smallest = min(shape)
    shape[max(k for k, s in enumerate(shape) if s == smallest)] *= 2
  return tuple(shape)


_NAME = re.compile(r"^(?P<gen>[a-z0-9]+)(?:-(?P<count>\d+)|:(?P<shape>\d+(?:x\d+)+))$")


_GPU_NAME = re.compile(r"^(?P<kind>h100(?:-sxm)?|h200)(?:-(?P<count>\d+))?$")


def parse_topology(name: str, num_slices: int = 1) -> Topology:
  """`v5p-128`, `v5litepod-16`, `v6e:4x4`, ... -> Topology; `h100-8`, `h200-16`, `h100`
  (NVIDIA GPUs, lev_jax/gpu_targets.py; one when no count) -> a GPU Topology.

  Raises:
    AotError: an unknown generation, a malformed name, a count below 1, a core count
      that is not a whole number of chips, a shape with the wrong number of axes, num_slices < 1.
  """
  expected = ("expected GENERATION-COUNT (v5p-128, v5e-256, v5litepod-16, v6e-16, "
              "v4-32) or "
              "GENERATION:SHAPE (v5p:4x4x4, v6e:4x4), with GENERATION one of "
              + ", ".join(sorted(CHIPS)) + "; or GPU-COUNT (h100-8, h200-16), with GPU "
              "one of " + ", ".join(sorted(gpu_targets.GPU_TARGETS)))
  g = _GPU_NAME.match(name.strip().lower())
  if g:
    if num_slices != 1:
      raise AotError(f"num_slices = {num_slices}: TPU slices only; for GPUs give the "
                     "count, e.g. h100-16 (two hosts of 8)")
    count = int(g["count"] or 1)
    if count < 1:
      raise AotError(f"topology {name!r}: {count} GPUs; expected a positive number, "
                     "e.g. h100-8")
    return Topology(name, gpu_targets.get_target(g["kind"]), (count,), platform="gpu")
  m = _NAME.match(name.strip().lower())
  if not m:
    raise AotError(f"topology {name!r}: {expected}")
  gen = _ALIASES.get(m["gen"], m["gen"])
  if gen not in CHIPS:
    raise AotError(f"topology {name!r}: unknown TPU generation {m['gen']!r}; {expected}")
  chip = CHIPS[gen]
  if num_slices < 1:
    raise AotError(f"num_slices = {num_slices}: expected >= 1")
  if m["count"] is not None:
    count = int(m["count"])
    if count < 1:
      raise AotError(f"topology {name!r}: {count} TensorCores; expected a positive "
                     f"number, e.g. {gen}-{8 * chip.cores_in_name}")
    if count % chip.cores_in_name:
      raise AotError(f"topology {name!r}: {gen}-N counts TensorCores ({chip.cores_in_name} "
                     f"per chip); expected a multiple of {chip.cores_in_name}")
    shape = default_shape(count // chip.cores_in_name, chip.dims)
  else:
    shape = tuple(int(s) for s in m["shape"].split("x"))
    if len(shape) != chip.dims or min(shape) < 1:
      raise AotError(f"topology {name!r}: a {gen} slice shape has {chip.dims} positive "
                     f"axes, e.g. {'x'.join(['2'] * chip.dims)}")
  _check_whole_hosts(name, chip, shape)
  return Topology(name, chip, shape, num_slices)


# libtpu lays out a compile-only slice in hosts of 2x2(x1) chips (its default
# chips_per_host_bounds): the first two axes of the shape must be multiples of these.
HOST_BOUNDS = (2, 2)


def _check_whole_hosts(name: str, chip: Chip, shape: tuple[int, ...]) -> None:
  """Refuses a slice shape libtpu cannot make of whole hosts (`v5e:3x3`, `v5e-2`),
  before libtpu is loaded (its own words, "not divisible by chips_per_host_bounds",
  read like a broken install).

  Raises:
    AotError: naming the shape and the shapes allowed.
  """
  if all(s % b == 0 for s, b in zip(shape, HOST_BOUNDS)):
    return
  host = "x".join(map(str, HOST_BOUNDS + (1,) * (chip.dims - 2)))
  form = "AxB" if chip.dims == 2 else "AxBxC"
  examples = (f"{chip.generation}:{host}, {chip.generation}:"
              + ("4x8" if chip.dims == 2 else "4x4x4") + f", {chip.generation}-"
              + str(math.prod(HOST_BOUNDS) * chip.cores_in_name))
  raise AotError(f"topology {name!r}: shape {'x'.join(map(str, shape))} is not made of "
                 f"whole {host} hosts; a compile-only {chip.generation} slice is "
                 f"{form} with A and B multiples of 2 (e.g. {examples})")


def _required_libtpu() -> str | None:
  """The libtpu version specifier that this jax's `tpu` extra pins, e.g. '==0.0.42.*'."""
  for req in importlib.metadata.requires("jax") or ():
    m = re.match(r"^libtpu\s*([^;]+);.*extra\s*==\s*['\"]tpu['\"]", req)
    if m:
      return m.group(1).strip()
  return None


def check_libtpu() -> str:
  """The installed libtpu version, checked against jax's `tpu` extra pin.

  Raises:
    AotError: libtpu not installed, or a version jax[tpu] would not install.
  """
  from packaging.specifiers import SpecifierSet  # pylint: disable=g-import-not-at-top
  wanted = _required_libtpu()
  hint = (f"pip install -e '.[tpu-aot]' (libtpu{wanted or ''}, the version "
          f"jax[tpu]=={jax.__version__} installs)")
  try:
    version = importlib.metadata.version("libtpu")
  except importlib.metadata.PackageNotFoundError:
    raise AotError(f"libtpu is not installed: {hint}") from None
  if wanted and version not in SpecifierSet(wanted):
    raise AotError(f"libtpu {version} does not match jax {jax.__version__}, which "
                   f"expects libtpu{wanted}: {hint}")
  return version


@contextlib.contextmanager
def _quiet_libtpu_env(topology: Topology):
  """libtpu, loaded off a TPU VM, looks for the VM's metadata and prints warnings that
  it found none; naming the accelerator and a local worker keeps it silent. Its log
  lines stay in its log files (/tmp/tpu_logs), off the terminal (TPU_STDERR_LOG_LEVEL
  3: FATAL only), among them XLA:TPU's "Very slow compile?" banner of a compile past 2
  minutes: lev-compile reports each compile's time itself, and a failed compile
  raises with XLA's message. Set only where unset, and only while the compile-only
  topology is made (libtpu reads them when it loads)."""
  chips_per_name = topology.chip.cores_in_name * math.prod(topology.shape)
  env = {"TPU_ACCELERATOR_TYPE": f"{topology.chip.generation}-{chips_per_name}",
         "TPU_WORKER_HOSTNAMES": "localhost", "TPU_SKIP_MDS_QUERY": "1",
         "TPU_STDERR_LOG_LEVEL": "3",
         # No chip is opened, so several compiling processes (pytest-xdist workers, a
         # lev-compile next to a training job) need not take libtpu's one-process lock.
         "ALLOW_MULTIPLE_LIBTPU_LOAD": "1"}
  added = {k: v for k, v in env.items() if k not in os.environ}
  os.environ.update(added)
  try:
    yield
  finally:
    for k in added:
      os.environ.pop(k, None)


def check_compiler(topology: Topology) -> str:
  """The compiler package for the topology's platform, checked: "libtpu X" or
  "jax-cuda12-plugin X".

  Raises:
    AotError: it is missing or does not match the installed jax.
  """
  if topology.platform == "tpu":
    return f"libtpu {check_libtpu()}"
  from lev_jax import gpu_targets  # pylint: disable=g-import-not-at-top
  return f"jax-cuda12-plugin {gpu_targets.check_cuda_plugin()}"


def topology_devices(topology: Topology) -> list:
  """The slice's compile-only jax devices (no chip is touched).

  Raises:
    AotError: libtpu (or the CUDA plugin) missing, mismatched, or failing to load or to
      make the topology.
  """
  if topology.platform == "gpu":
    return gpu_targets.gpu_devices(topology.chip.name, topology.chips)
  version = check_libtpu()
  from jax.experimental import topologies  # pylint: disable=g-import-not-at-top
  kwargs = {"num_slices": topology.num_slices} if topology.num_slices > 1 else {}
  if topology.chip.generation == "v4":
    kwargs["chip_config_name"] = "megacore"  # one jax device per chip, as on a v4 VM
  try:
    with _quiet_libtpu_env(topology):
      devices = list(topologies.get_topology_desc(topology.jax_name, "tpu", **kwargs).devices)
  except Exception as e:  # libtpu's errors are JaxRuntimeError / RuntimeError text
    raise AotError(f"topology {topology.name} (shape {topology.jax_name}, "
                   f"x{topology.num_slices} slices): not a slice libtpu {version} can lay "
                   f"out: {first_line(e)}") from e
  if len(devices) != topology.chips:
    raise AotError(f"topology {topology.name}: libtpu {version} made {len(devices)} devices, "
                   f"expected {topology.chips} chips")
  return devices


def first_line(e: BaseException) -> str:
  lines = [l.strip() for l in str(e).splitlines() if l.strip()]
  return lines[0] if lines else type(e).__name__
