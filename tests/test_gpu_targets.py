"""gpu_targets: GPU names, the plugin and ptxas checks, the target specs, and tiny train
steps compiled for 1 and 2 H100s.

The compile tests need jax's CUDA plugin and ptxas (`pip install
'jax-cuda12-plugin==<jaxlib version>' 'jax-cuda12-pjrt==<jaxlib version>'
nvidia-cuda-nvcc-cu12`) and skip without the plugin; no GPU is touched.
"""

import importlib.metadata
import importlib.util
import re

import jax
import jaxlib
import pytest

from lev_jax import flops, gpu_targets, sharding, target, train
from lev_jax.gpu_targets import GpuTargetError

needs_cuda_plugin = pytest.mark.skipif(
    importlib.util.find_spec("jax_cuda12_plugin") is None,
    reason="jax's CUDA plugin is not installed (pip install "
           "'jax-cuda12-plugin==<jaxlib version>' 'jax-cuda12-pjrt==<jaxlib version>' "
           "nvidia-cuda-nvcc-cu12)")


def test_names_as_users_type_them():
  assert gpu_targets.get_target("H100").device_kind == "NVIDIA H100 80GB HBM3"
  assert gpu_targets.get_target(" h100-sxm ") is gpu_targets.get_target("h100")
  assert gpu_targets.get_target("h200").device_kind == "NVIDIA H200"


@pytest.mark.parametrize("name", ["a100", "h100-pcie", "", "v5p-8"])
def test_unknown_name_is_one_line_listing_the_known_ones(name):
  with pytest.raises(GpuTargetError, match=r"expected one of h100, h100-sxm, h200$") as e:
    gpu_targets.gpu_devices(name, 1)
  assert "\n" not in str(e.value)
  assert isinstance(e.value, ValueError)


@pytest.mark.parametrize("n,topology", [(1, "1x1x1"), (2, "1x1x2"), (8, "1x1x8"),
                                        (16, "2x1x8"), (64, "8x1x8")])
def test_topology_names(n, topology):
  assert gpu_targets.topology_name(n) == topology


@pytest.mark.parametrize("n,needle", [(0, "expected a positive number of GPUs"),
                                      (12, "expected a multiple of 8")])
def test_bad_gpu_counts_are_one_line(n, needle):
  with pytest.raises(GpuTargetError, match=needle) as e:
    gpu_targets.gpu_devices("h100", n)
  assert "\n" not in str(e.value)


def _fake_versions(monkeypatch, version):
  """importlib.metadata.version answering `version` (None: not installed) for the
  plugin's two distributions."""
  real = importlib.metadata.version

  def fake(dist):
    if dist in gpu_targets.PLUGIN_DISTS:
      if version is None:
        raise importlib.metadata.PackageNotFoundError(dist)
      return version
    return real(dist)

  monkeypatch.setattr(importlib.metadata, "version", fake)


def test_missing_plugin_gives_the_install_command(monkeypatch):
  _fake_versions(monkeypatch, None)
  v = re.escape(jaxlib.__version__)
  with pytest.raises(GpuTargetError, match=(
      rf"not installed \(jax-cuda12-plugin missing\): pip install "
      rf"'jax-cuda12-plugin=={v}' 'jax-cuda12-pjrt=={v}' nvidia-cuda-nvcc-cu12")) as e:
    gpu_targets.gpu_devices("h100", 1)
  assert "\n" not in str(e.value)


def test_mismatched_plugin_is_one_line(monkeypatch):
  _fake_versions(monkeypatch, "0.0.1")
  with pytest.raises(GpuTargetError, match=(
      rf"jax-cuda12-plugin 0\.0\.1 does not match jaxlib {re.escape(jaxlib.__version__)}"
      r".*: pip install 'jax-cuda12-plugin==")) as e:
    gpu_targets.gpu_devices("h100", 8)
  assert "\n" not in str(e.value)
  _fake_versions(monkeypatch, jaxlib.__version__ + ".post1")  # same release: accepted
  assert gpu_targets.check_cuda_plugin() == jaxlib.__version__ + ".post1"


@pytest.mark.parametrize("platforms", ["", "cuda", "cpu,gpu"])
def test_platforms_must_leave_cuda_out(monkeypatch, platforms):
  _fake_versions(monkeypatch, jaxlib.__version__)
  monkeypatch.setattr(gpu_targets, "_jax_platforms", lambda: platforms)
  with pytest.raises(GpuTargetError, match=r"set JAX_PLATFORMS=cpu before jax is imported"
                     ) as e:
    gpu_targets.gpu_devices("h200", 1)
  assert "\n" not in str(e.value)
  monkeypatch.setattr(gpu_targets, "_jax_platforms", lambda: "cpu,tpu")
  gpu_targets.check_platforms()


def test_no_ptxas_says_where_xla_looks(monkeypatch, tmp_path):
  monkeypatch.setattr(gpu_targets, "_cuda_roots", lambda: [str(tmp_path)])
  monkeypatch.setenv("PATH", str(tmp_path / "empty"))
  with pytest.raises(GpuTargetError, match=r"no ptxas found: .*nvidia-cuda-nvcc-cu12 "
                     r"wheel, /usr/local/cuda or PATH; pip install nvidia-cuda-nvcc-cu12"
                     ) as e:
    gpu_targets.find_ptxas()
  assert "\n" not in str(e.value)
  ptxas = tmp_path / "bin" / "ptxas"
  ptxas.parent.mkdir()
  ptxas.write_text("#!/bin/sh\n")
  ptxas.chmod(0o755)
  assert gpu_targets.find_ptxas() == str(ptxas)


def test_cuda_roots_follow_jax_and_xla(monkeypatch):
  monkeypatch.setenv("CUDA_ROOT", "/opt/cuda-x")
  monkeypatch.setenv("XLA_FLAGS", "--foo=1 --xla_gpu_cuda_data_dir=/opt/cuda-y")
  roots = gpu_targets._cuda_roots()
  assert roots[:2] == ["/opt/cuda-y", "/opt/cuda-x"] and roots[-1] == "/usr/local/cuda"


def _parse_textproto(text: str) -> dict:
  """A text-format protobuf message (scalars and nested messages) -> nested dict."""
  tokens = re.findall(r'"[^"]*"|[{}:]|[^\s{}:"]+', re.sub(r"#.*", "", text))
  pos = 0

  def message():
    nonlocal pos
    out = {}
    while pos < len(tokens) and tokens[pos] != "}":
      key = tokens[pos]
      assert key not in out, f"field {key} repeated"
      if tokens[pos + 1] == ":":
        raw = tokens[pos + 2]
        out[key] = raw[1:-1] if raw.startswith('"') else float(raw) if "." in raw else int(raw)
        pos += 3
      else:
        assert tokens[pos + 1] == "{", f"after {key}: {tokens[pos + 1]}"
        pos += 2
        out[key] = message()
        assert tokens[pos] == "}"
        pos += 1
    return out

  result = message()
  assert pos == len(tokens), f"unparsed: {tokens[pos:]}"
  return result


@pytest.mark.parametrize("name", sorted(gpu_targets.GPU_TARGETS))
def test_spec_text_parses_as_the_fields_we_expect(name):
  t = gpu_targets.get_target(name)
  spec = _parse_textproto(t.target_config)
  assert set(spec) == {"gpu_device_info", "platform_name", "dnn_version_info",
                       "runtime_version", "device_description_str"}
  info = spec["gpu_device_info"]
  assert spec["device_description_str"] == t.device_kind
  assert spec["platform_name"] == "CUDA"
  assert info["device_memory_size"] == t.hbm_bytes
  assert info["memory_bandwidth"] == t.hbm_bytes_per_s
  assert info["cuda_compute_capability"] == {"major": 9, "minor": 0}
  assert (info["core_count"], info["fpus_per_core"], info["threads_per_warp"]) == (132, 128, 32)
  assert info["shared_memory_per_block_optin"] < info["shared_memory_per_core"]
  assert spec["runtime_version"]["major"] == 12
  # the peak that MFU and the roofline use
  assert flops.peak_flops_per_device(t.device_kind) == pytest.approx(989.5e12)


def test_published_memory_and_bandwidth():
  h100, h200 = gpu_targets.get_target("h100"), gpu_targets.get_target("h200")
  assert (h100.hbm_bytes, h100.hbm_bytes_per_s) == (80 * 2 ** 30, 3.35e12)
  assert (h200.hbm_bytes, h200.hbm_bytes_per_s) == (141 * 2 ** 30, 4.8e12)


@needs_cuda_plugin
@pytest.mark.parametrize("n_gpus", [1, 2])
def test_tiny_train_step_compiles_for_h100s(make_config, n_gpus):
  config = make_config("lev")
  devices = gpu_targets.gpu_devices("h100", n_gpus)
  assert [d.device_kind for d in devices] == ["NVIDIA H100 80GB HBM3"] * n_gpus
  mesh = sharding.make_mesh(config.mesh, devices=devices)
  assert mesh.devices.size == n_gpus
  part = train.partition(config, mesh)
  state = train.abstract_state(part, config)
  # JAX's persistent cache cannot hold compile-only executables (as in lev_jax/aot.py)
  cache = jax.config.jax_enable_compilation_cache
  jax.config.update("jax_enable_compilation_cache", False)
  try:
    with target.compiling_for("gpu"):
      step = train.make_train_step(part, config)
      batch = train.abstract_batch(part, config, config.train.global_batch_size)
      compiled = step.lower(state, batch).compile()
  finally:
    jax.config.update("jax_enable_compilation_cache", cache)
  kinds = {d.device_kind for s in jax.tree.leaves(compiled.input_shardings)
           for d in s.device_set}
  assert kinds == {"NVIDIA H100 80GB HBM3"}  # compiled for the GPUs, not the host CPU
  mem = compiled.memory_analysis()
  assert mem.argument_size_in_bytes > 0 and mem.temp_size_in_bytes > 0
  assert mem.alias_size_in_bytes > 0  # the state is donated
  cost = gpu_targets.cost_analysis(compiled)
  assert cost["flops"] > 0 and cost["bytes accessed"] > 0
  assert "optimal_seconds" not in cost
