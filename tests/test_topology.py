"""topology: TPU slice and GPU names as users type them, and the libtpu check."""

import importlib.metadata

import jax
import pytest

from lev_jax import topology as topo_lib
from lev_jax.topology import AotError, parse_topology


@pytest.mark.parametrize("name,chips,shape,generation", [
    ("v5p-128", 64, (4, 4, 4), "v5p"),
    ("v5p-8", 4, (2, 2, 1), "v5p"),
    ("v5p-32", 16, (2, 2, 4), "v5p"),
    ("v4-32", 16, (2, 2, 4), "v4"),
    ("v5e-256", 256, (16, 16), "v5e"),
    ("v5litepod-16", 16, (4, 4), "v5e"),
    ("v5e-8", 8, (2, 4), "v5e"),
    ("v6e:4x4", 16, (4, 4), "v6e"),
    ("V5P:2x2x1", 4, (2, 2, 1), "v5p"),
])
def test_topology_names_as_users_type_them(name, chips, shape, generation):
  t = parse_topology(name)
  assert (t.chips, t.shape, t.chip.generation) == (chips, shape, generation)
  assert t.jax_name == f"{generation}:{'x'.join(map(str, shape))}"


@pytest.mark.parametrize("name,kind,gpus", [("h100-8", "NVIDIA H100 80GB HBM3", 8),
                                             ("H200-16", "NVIDIA H200", 16),
                                             ("h100", "NVIDIA H100 80GB HBM3", 1)])
def test_gpu_names_are_gpu_topologies(name, kind, gpus):
  t = parse_topology(name)
  assert (t.platform, t.chips, t.chip.device_kind) == ("gpu", gpus, kind)
  with pytest.raises(AotError, match="TPU slices only"):
    parse_topology(name, num_slices=2)


def test_several_slices_multiply_the_chips():
  t = parse_topology("v5p-128", num_slices=2)
  assert t.chips == 128 and t.num_slices == 2


@pytest.mark.parametrize("name,needle", [
    ("v7x-8", "unknown TPU generation 'v7x'"),
    ("v5p-7", "expected a multiple of 2"),
    # issue 26: "expected a multiple of 1" for 0; only TPU forms listed for a100-8
    ("v5e-0", "v5e-0': 0 TensorCores; expected a positive number, e.g. v5e-8"),
    ("h100-0", "0 GPUs; expected a positive number, e.g. h100-8"),
    ("a100-8", r"unknown TPU generation 'a100'; .*; or GPU-COUNT \(h100-8, h200-16\), "
     "with GPU one of h100, h100-sxm, h200"),
    ("v5e-12", "12 chips: expected a power of two"),
    ("v5p:4x4", "a v5p slice shape has 3 positive axes"),
    # libtpu's compile-only slices are whole 2x2 hosts: refused before libtpu is loaded
    ("v5e:3x3", r"shape 3x3 is not made of whole 2x2 hosts; a compile-only v5e slice is "
     r"AxB with A and B multiples of 2 \(e.g. v5e:2x2, v5e:4x8, v5e-4\)"),
    ("v5p-4", "shape 2x1x1 is not made of whole 2x2x1 hosts"),
    ("tpu", "expected GENERATION-COUNT"),
    ("", "expected GENERATION-COUNT"),
])
def test_bad_topology_names_are_one_line(name, needle):
  with pytest.raises(AotError, match=needle) as e:
    parse_topology(name)
  assert "\n" not in str(e.value)


def test_libtpu_missing_or_mismatched_is_one_line(monkeypatch):
  real = importlib.metadata.version

  def missing(dist):
    if dist == "libtpu":
      raise importlib.metadata.PackageNotFoundError(dist)
    return real(dist)

  monkeypatch.setattr(importlib.metadata, "version", missing)
  with pytest.raises(AotError, match=r"libtpu is not installed: pip install -e "
                     r"'\.\[tpu-aot\]'"):
    topo_lib.check_libtpu()
  monkeypatch.setattr(importlib.metadata, "version",
                      lambda d: "0.0.1" if d == "libtpu" else real(d))
  wanted = topo_lib._required_libtpu()
  assert wanted, "jax's metadata names no libtpu for its tpu extra"
  with pytest.raises(AotError, match=rf"libtpu 0\.0\.1 does not match jax "
                     rf"{jax.__version__}, which expects libtpu"):
    topo_lib.check_libtpu()


def test_libtpu_logs_stay_off_the_terminal_while_the_topology_is_made(monkeypatch):
  """Issue 26: XLA:TPU's "Very slow compile?" banner (LOG(ERROR) inside libtpu) reached
  the terminal; libtpu's log lines go to its log files (TPU_STDERR_LOG_LEVEL 3), unless
  the user set the variable."""
  import os
  topology = parse_topology("v5p:2x2x1")
  monkeypatch.delenv("TPU_STDERR_LOG_LEVEL", raising=False)
  with topo_lib._quiet_libtpu_env(topology):
    assert os.environ["TPU_STDERR_LOG_LEVEL"] == "3"
  assert "TPU_STDERR_LOG_LEVEL" not in os.environ
  monkeypatch.setenv("TPU_STDERR_LOG_LEVEL", "0")
  with topo_lib._quiet_libtpu_env(topology):
    assert os.environ["TPU_STDERR_LOG_LEVEL"] == "0"
