"""Compile-only NVIDIA GPU devices, for ahead-of-time compilation on a host without one.

With jax's CUDA plugin installed, `jax.experimental.topologies.get_topology_desc(
platform="cuda", topology=..., target_config=...)` gives compile-only devices of a GPU
described by `target_config`, a text-format `xla.GpuTargetConfigProto` (XLA's
`xla/stream_executor/device_description.proto`): a Mesh over them and abstract, sharded
arguments compile with XLA:GPU as `lev_jax.aot` does for a TPU slice, and the compiled
program's `memory_analysis()` reads back (its FLOPs and bytes: `cost_analysis` below).
No GPU or NVIDIA driver is needed; the host needs:

  pip install 'jax-cuda12-plugin==V' 'jax-cuda12-pjrt==V' nvidia-cuda-nvcc-cu12 \
      nvidia-cuda-runtime-cu12          # V: the installed jaxlib's version

  jax-cuda12-plugin, jax-cuda12-pjrt  the plugin (XLA:GPU); its version must be jaxlib's,
                     or jax ignores it.
  nvidia-cuda-nvcc-cu12  `ptxas` and `libdevice`: XLA:GPU compiles PTX to machine code with
                     ptxas. jax points XLA at $CUDA_ROOT, else at this wheel; XLA then also
                     tries /usr/local/cuda and `ptxas` on PATH (a CUDA toolkit).
  nvidia-cuda-runtime-cu12  optional: without libcudart.so.12 the plugin's modules print
                     "Could not find cuda drivers on your machine, GPU will not be used"
                     four times (at `import jax` and at the first backend call); with it
                     they print nothing.

and JAX_PLATFORMS=cpu set before jax is imported (`gpu_devices` refuses to run without
it): jax then never creates a CUDA client, so a GPU of this host is neither opened nor
given memory, and the plugin skips its check of local CUDA / cuDNN libraries, which
fails on a host without them.

The target specs are ours, written from NVIDIA's published figures (the source is named
beside each number). They describe the board, not one machine: clocks, memory and the
cuDNN / CUDA versions of a real host differ a little, XLA cannot autotune without the
chip, and nothing here runs, so the compiler's figures are estimates.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import importlib.util
import os
import re
import shutil

import jax

GiB = 2 ** 30
KiB = 2 ** 10
MiB = 2 ** 20
GPUS_PER_HOST = 8  # an HGX H100 / H200 board: 8 GPUs joined by NVLink in one host


class GpuTargetError(ValueError):
  """An unknown GPU or count, a missing or mismatched CUDA plugin, JAX_PLATFORMS letting
  jax open a GPU, or no ptxas; the message is one line."""


@dataclasses.dataclass(frozen=True)
class GpuTarget:
  """One GPU board: how jax names it, what it holds, and the spec XLA:GPU compiles for.

  Has the `device_kind`, `hbm_bytes` and `hbm_bytes_per_s` of `lev_jax.aot.Chip`, so a
  StepReport / roofline can use either.
  """
  name: str                # the canonical name, e.g. "h100-sxm"
  device_kind: str         # jax `device.device_kind` of the real card (flops.py's peaks)
  hbm_bytes: int           # HBM per GPU, as NVIDIA publishes it
  hbm_bytes_per_s: float   # HBM bandwidth per GPU
  target_config: str       # text-format xla.GpuTargetConfigProto for get_topology_desc


# Limits of a Hopper (compute capability 9.0) SM and thread block. Source: NVIDIA CUDA C++
# Programming Guide, "Compute Capabilities", table "Technical Specifications per Compute
# Capability", column 9.0.
_CC90 = dict(
    threads_per_block_limit=1024,        # "Maximum number of threads per block"
    threads_per_warp=32,                 # "Warp size"
    shared_memory_per_block=48 * KiB,    # static shared memory per block (more: opt-in)
    shared_memory_per_core=228 * KiB,    # "Maximum amount of shared memory per SM"
    threads_per_core_limit=2048,         # "Maximum number of resident threads per SM"
    block_dim_limit_x=2 ** 31 - 1,       # "Maximum x-dimension of a grid of thread blocks"
    block_dim_limit_y=65535,             # "Maximum y- or z-dimension of a grid ..."
    block_dim_limit_z=65535,
    shared_memory_per_block_optin=227 * KiB,  # "Maximum amount of shared memory per
                                              # thread block" (opt-in)
    registers_per_core_limit=64 * KiB,   # "Number of 32-bit registers per SM": 64 K
    registers_per_block_limit=64 * KiB,  # "Maximum number of 32-bit registers per block"
    thread_dim_limit_x=1024,             # "Maximum x- or y-dimension of a block"
    thread_dim_limit_y=1024,
    thread_dim_limit_z=64,               # "Maximum z-dimension of a block"
)

# The GH100 die as configured on the SXM5 board, shared by H100 SXM and H200 (the H200
# datasheet: "based on the NVIDIA Hopper architecture", the same SXM form factor and
# peaks as H100 SXM). Source: NVIDIA H100 Tensor Core GPU Architecture whitepaper
# (2022), H100 SXM5 column.
_GH100_SXM5 = dict(
    core_count=132,       # "132 SMs" (H100 SXM5)
    fpus_per_core=128,    # "128 FP32 CUDA Cores per SM"
    l2_cache_size=50 * MiB,  # "50 MB L2 cache"
    # The clock at which NVIDIA's peaks are quoted: dense bf16 989.4 TFLOP/s (whitepaper;
    # datasheet: 1,979 with sparsity) / (132 SMs x 4,096 dense bf16 FLOP per clock per
    # SM, i.e. 4 Tensor Cores x 512 FMA) = 1.83 GHz.
    clock_rate_ghz=1.83,
)

# The CUDA runtime and cuDNN that jax-cuda12-plugin 0.10.2 was built against
# (`jax_cuda12_plugin._versions.cuda_runtime_build_version()` = 12090,
# `cudnn_build_version()` = 90800); its wheel requires nvidia-cudnn-cu12 >= 9.8.
_CUDA_RUNTIME = (12, 9)
_CUDNN = (9, 8, 0)


def _target_config(device_kind: str, hbm_bytes: int, hbm_bytes_per_s: float) -> str:
  """A text-format xla.GpuTargetConfigProto for a GH100 SXM5 board.

  Only fields that jaxlib 0.10.2's XLA parses (newer XLA adds more, e.g.
  collective_memory_granularity, which this XLA rejects).
  """
  info = dict(_CC90, **_GH100_SXM5, memory_bandwidth=int(hbm_bytes_per_s),
              device_memory_size=int(hbm_bytes))
  lines = ["gpu_device_info {"]
  lines += [f"  {k}: {v}" for k, v in info.items()]
  lines += ["  cuda_compute_capability {", "    major: 9", "    minor: 0", "  }", "}",
            'platform_name: "CUDA"',
            f"dnn_version_info {{ major: {_CUDNN[0]} minor: {_CUDNN[1]} patch: {_CUDNN[2]} }}",
            f"runtime_version {{ major: {_CUDA_RUNTIME[0]} minor: {_CUDA_RUNTIME[1]} }}",
            f'device_description_str: "{device_kind}"']
  return "\n".join(lines) + "\n"


def _target(name, device_kind, hbm_bytes, hbm_bytes_per_s) -> GpuTarget:
  return GpuTarget(name, device_kind, hbm_bytes, hbm_bytes_per_s,
                   _target_config(device_kind, hbm_bytes, hbm_bytes_per_s))


# device_kind: what jax reports for the real card (the CUDA device name); both match
# lev_jax/flops.py's _DEVICE_KINDS, so peak_flops_per_device finds the bf16 peak.
H100_SXM = _target(
    "h100-sxm", "NVIDIA H100 80GB HBM3",
    80 * GiB,   # H100 datasheet, SXM: "GPU memory 80GB" (5 HBM3 stacks of 16 GiB)
    3.35e12)    # H100 datasheet, SXM: "GPU memory bandwidth 3.35TB/s"
H200_SXM = _target(
    "h200", "NVIDIA H200",
    # H200 datasheet: "GPU memory 141GB". Binary GB, as for H100's 80GB: a real H200
    # reports 143,771 MiB (140.4 GiB) of device memory, more than 141e9 bytes (131 GiB).
    141 * GiB,
    4.8e12)     # H200 datasheet, SXM: "GPU memory bandwidth 4.8TB/s"

GPU_TARGETS = {"h100": H100_SXM, "h100-sxm": H100_SXM, "h200": H200_SXM}


def get_target(name: str) -> GpuTarget:
  """"h100", "H100-SXM", "h200" -> GpuTarget.

  Raises:
    GpuTargetError: an unknown name (the message lists the known ones).
  """
  key = name.strip().lower()
  if key not in GPU_TARGETS:
    raise GpuTargetError(f"GPU {name!r}: expected one of {', '.join(GPU_TARGETS)}")
  return GPU_TARGETS[key]


PLUGIN_DISTS = ("jax-cuda12-plugin", "jax-cuda12-pjrt")


def install_hint() -> str:
  """The pip command that installs what compiling for a GPU needs, for this jaxlib."""
  v = _jaxlib_version()
  return (f"pip install 'jax-cuda12-plugin=={v}' 'jax-cuda12-pjrt=={v}' "
          "nvidia-cuda-nvcc-cu12 nvidia-cuda-runtime-cu12")


def _jaxlib_version() -> str:
  import jaxlib  # pylint: disable=g-import-not-at-top
  return jaxlib.__version__


def _release(v: str) -> tuple[int, ...]:
  """The dotted release of a PEP 440 version: '0.10.2.dev1+x' -> (0, 10, 2)."""
  m = re.match(r"\d+(?:\.\d+)*", v)
  return tuple(int(p) for p in m[0].split(".")) if m else ()


def check_cuda_plugin() -> str:
  """The installed jax-cuda12-plugin version, checked against jaxlib's.

  jax loads the plugin only when its release equals jaxlib's (jaxlib/plugin_support.py);
  jax-cuda12-pjrt (the XLA:GPU library) is not checked by jax, so it is checked here.

  Raises:
    GpuTargetError: either package missing, or a version other than jaxlib's.
  """
  wanted = _jaxlib_version()
  versions = {}
  for dist in PLUGIN_DISTS:
    try:
      versions[dist] = importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
      raise GpuTargetError(f"the CUDA plugin for compiling for a GPU is not installed "
                           f"({dist} missing): {install_hint()}") from None
  for dist, version in versions.items():
    if _release(version) != _release(wanted):
      raise GpuTargetError(f"{dist} {version} does not match jaxlib {wanted} (jax "
                           f"{jax.__version__}), so jax will not use it: {install_hint()}")
  return versions["jax-cuda12-plugin"]


def _jax_platforms() -> str:
  return jax.config.jax_platforms or ""


def check_platforms() -> None:
  """Requires jax's platforms (JAX_PLATFORMS) to leave CUDA out.

  Then jax never opens a GPU of this host, and the plugin skips its check of the local
  CUDA / cuDNN libraries (jax_plugins/xla_cuda12: `initialize`), which fails on a host
  without them ("Unable to load cuDNN") and leaves the plugin unregistered.

  Raises:
    GpuTargetError: JAX_PLATFORMS unset, or naming cuda / gpu.
  """
  platforms = [p.strip() for p in _jax_platforms().split(",") if p.strip()]
  if not platforms or {"cuda", "gpu"} & set(platforms):
    raise GpuTargetError(f"JAX_PLATFORMS={','.join(platforms) or '(unset)'}: set "
                         "JAX_PLATFORMS=cpu before jax is imported, so that compiling for "
                         "a GPU opens none and the CUDA plugin loads without local CUDA")


def _cuda_roots() -> list[str]:
  """The CUDA folders XLA:GPU searches for bin/ptxas and nvvm/libdevice, in order:
  --xla_gpu_cuda_data_dir, which jax sets to $CUDA_ROOT or else to the
  nvidia-cuda-nvcc-cu12 wheel (jax/_src/lib: cuda_path; jax/_src/compiler.py), then
  /usr/local/cuda. (XLA also tries `ptxas` on PATH: see find_ptxas.)"""
  roots = []
  m = re.search(r"--xla_gpu_cuda_data_dir=(\S+)", os.environ.get("XLA_FLAGS", ""))
  if m:
    roots.append(m[1])
  if os.environ.get("CUDA_ROOT"):
    roots.append(os.environ["CUDA_ROOT"])
  try:
    spec = importlib.util.find_spec("nvidia.cuda_nvcc")
  except ModuleNotFoundError:  # no `nvidia` namespace package at all
    spec = None
  if spec is not None:
    roots.extend(spec.submodule_search_locations or ())
  roots.append("/usr/local/cuda")
  return roots


def find_ptxas() -> str:
  """The ptxas XLA:GPU will find: under one of `_cuda_roots()`, else on PATH.

  Raises:
    GpuTargetError: none found (install the nvcc wheel or a CUDA toolkit).
  """
  for root in _cuda_roots():
    path = os.path.join(root, "bin", "ptxas")
    if os.access(path, os.X_OK):
      return path
  path = shutil.which("ptxas")
  if path:
    return path
  raise GpuTargetError(
      "no ptxas found: XLA:GPU compiles PTX with ptxas from $CUDA_ROOT, the "
      "nvidia-cuda-nvcc-cu12 wheel, /usr/local/cuda or PATH; pip install "
      "nvidia-cuda-nvcc-cu12 (or install a CUDA 12 toolkit, or set CUDA_ROOT)")


def topology_name(n_gpus: int) -> str:
  """The plugin's topology string for `n_gpus` HGX GPUs.

  The CUDA plugin reads "<partitions>x<hosts per partition>x<GPUs per host>", a
  partition being a set of GPUs joined by NVLink. An HGX H100 / H200 host is one
  partition of 8 GPUs, and hosts are joined by the network: n <= 8 -> "1x1xn" (one host);
  n = 8k -> "kx1x8" (k hosts; their devices get process_index 0..k-1).

  Raises:
    GpuTargetError: n_gpus < 1, or above 8 and not a multiple of 8.
  """
  if not isinstance(n_gpus, int) or n_gpus < 1:
    raise GpuTargetError(f"n_gpus = {n_gpus!r}: expected a positive number of GPUs")
  if n_gpus <= GPUS_PER_HOST:
    return f"1x1x{n_gpus}"
  if n_gpus % GPUS_PER_HOST:
    raise GpuTargetError(f"n_gpus = {n_gpus}: above one host ({GPUS_PER_HOST} GPUs), "
                         f"expected a multiple of {GPUS_PER_HOST}")
  return f"{n_gpus // GPUS_PER_HOST}x1x{GPUS_PER_HOST}"


def gpu_devices(name: str, n_gpus: int) -> list:
  """Compile-only jax devices for `n_gpus` GPUs of kind `name` (no GPU is touched).

  Args:
    name: a key of GPU_TARGETS ("h100", "h100-sxm", "h200"), any case.
    n_gpus: GPUs in the job: 1-8 on one host, or a multiple of 8 over hosts of 8
      (see topology_name).
  Returns:
    n_gpus devices with the target's device_kind, for
    `sharding.make_mesh(config.mesh, devices=...)`; programs lowered over them compile
    with XLA:GPU. Set JAX_PLATFORMS=cpu before importing jax (see the module docstring).
  Raises:
    GpuTargetError: an unknown name or GPU count, the CUDA plugin missing or not
      matching jaxlib, JAX_PLATFORMS not leaving CUDA out, no ptxas, or the plugin
      refusing the topology (one line each).
  """
  target = get_target(name)
  topology = topology_name(n_gpus)
  version = check_cuda_plugin()
  check_platforms()
  find_ptxas()
  from jax.experimental import topologies  # pylint: disable=g-import-not-at-top
  try:
    devices = list(topologies.get_topology_desc(
        platform="cuda", topology=topology, target_config=target.target_config).devices)
  except Exception as e:  # JaxRuntimeError / NotImplementedError text from the plugin
    raise GpuTargetError(f"jax-cuda12-plugin {version} could not make {n_gpus} x "
                         f"{target.name} (topology {topology}): {_first_line(e)}") from e
  if len(devices) != n_gpus:
    raise GpuTargetError(f"jax-cuda12-plugin {version} made {len(devices)} devices for "
                         f"topology {topology}, expected {n_gpus}")
  return devices


def cost_analysis(compiled) -> dict:
  """The compiler's cost figures for one GPU of a program compiled for gpu_devices.

  XLA:GPU's compile-only executables implement no cost analysis (jax 0.10.2:
  `compiled.cost_analysis()` is None, the PJRT call answers "UNIMPLEMENTED:
  GetCostAnalysis is not supported"), and XLA:GPU has no `optimal_seconds` cost model to
  give. This runs XLA's generic HloCostAnalysis over the GPU-optimized module instead,
  through the host's CPU client, as jax itself does for lowered modules
  (jax/_src/interpreters/pxla.py). Keys: "flops", "transcendentals", "bytes accessed"
  (and per-operand ones). Like XLA:TPU's figures, a loop body (scan_layers) is counted
  once. Uses jax's private `_jax.hlo_module_cost_analysis`.

  Returns:
    The compiler's own dict when it has one, else the HloCostAnalysis dict; {} when
    neither is available.
  """
  cost = compiled.cost_analysis()
  if isinstance(cost, (list, tuple)):  # older jax: one dict per module
    cost = cost[0] if cost else None
  if cost:
    return dict(cost)
  try:
    from jax._src import xla_bridge  # pylint: disable=g-import-not-at-top
    from jax._src.lib import _jax  # pylint: disable=g-import-not-at-top
    modules = compiled.runtime_executable().hlo_modules()
    return dict(_jax.hlo_module_cost_analysis(xla_bridge.get_backend("cpu"), modules[0]))
  except (ImportError, AttributeError, IndexError, RuntimeError):  # other jax internals
    return {}


def _first_line(e: BaseException) -> str:
  lines = [l.strip() for l in str(e).splitlines() if l.strip()]
  return lines[0] if lines else type(e).__name__
