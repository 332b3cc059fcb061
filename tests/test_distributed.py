"""lev_jax.distributed: which source initialize() uses, with jax.distributed.initialize mocked."""

import jax
import pytest
from absl import flags

from lev_jax import distributed

# Variables that JAX's cluster auto-detection or our LEV_JAX_* source look at.
_ENV = ("LEV_JAX_COORDINATOR", "LEV_JAX_NUM_PROCESSES", "LEV_JAX_PROCESS_ID",
        "SLURM_JOB_ID", "SLURM_STEP_NODELIST", "SLURM_NTASKS", "SLURM_PROCID", "SLURM_LOCALID",
        "OMPI_MCA_orte_hnp_uri", "KUBERNETES_SERVICE_HOST", "TPU_WORKER_HOSTNAMES",
        "TPU_PROCESS_ADDRESSES", "JAX_COORDINATOR_ADDRESS")


@pytest.fixture
def calls(monkeypatch):
  """Records jax.distributed.initialize calls; a clean environment; a fresh module state."""
  recorded = []
  monkeypatch.setattr(jax.distributed, "initialize", lambda *a, **k: recorded.append((a, k)))
  monkeypatch.setattr(jax.distributed, "is_initialized", lambda: False)
  monkeypatch.setattr(distributed, "_initialized", False)
  for name in _ENV:
    monkeypatch.delenv(name, raising=False)
  return recorded


def _explicit(addr, n, i):
  return ((), dict(coordinator_address=addr, num_processes=n, process_id=i,
                   cluster_detection_method="deactivate"))


def test_single_process_calls_nothing(calls):
  distributed.initialize()
  assert calls == []
  assert distributed.plan().source == "single"


def test_explicit_arguments_are_passed_with_auto_detection_off(calls):
  distributed.initialize("10.0.0.1:1234", 4, 2)
  assert calls == [_explicit("10.0.0.1:1234", 4, 2)]


def test_explicit_arguments_win_over_environment(calls, monkeypatch):
  monkeypatch.setenv("LEV_JAX_COORDINATOR", "127.0.0.1:9")
  monkeypatch.setenv("LEV_JAX_NUM_PROCESSES", "8")
  monkeypatch.setenv("LEV_JAX_PROCESS_ID", "7")
  distributed.initialize(coordinator_address="h:1", num_processes=2, process_id=0)
  assert calls == [_explicit("h:1", 2, 0)]


@pytest.mark.parametrize("args,missing", [
    (("h:1", 2, None), "process_id missing"),
    (("h:1", None, 0), "num_processes missing"),
    ((None, 2, 1), "coordinator_address missing"),
    (("h:1", None, None), "num_processes and process_id missing"),
])
def test_incomplete_arguments_name_the_missing_one(calls, args, missing):
  with pytest.raises(ValueError, match=missing):
    distributed.initialize(*args)
  assert calls == []


@pytest.mark.parametrize("args,message", [
    (("h:1", 2, 2), r"process_id = 2: expected 0 <= process id < num_processes = 2"),
    (("h:1", 0, 0), r"num_processes = 0: expected an integer >= 1"),
    (("nohost", 2, 0), r"coordinator_address = 'nohost': expected host:port"),
    (("h:99999", 2, 0), r"expected host:port"),
])
def test_bad_values_are_named(calls, args, message):
  with pytest.raises(ValueError, match=message):
    distributed.initialize(*args)


def test_environment_variables(calls, monkeypatch):
  monkeypatch.setenv("LEV_JAX_COORDINATOR", "127.0.0.1:5000")
  monkeypatch.setenv("LEV_JAX_NUM_PROCESSES", "2")
  monkeypatch.setenv("LEV_JAX_PROCESS_ID", "1")
  distributed.initialize()
  assert calls == [_explicit("127.0.0.1:5000", 2, 1)]


def test_incomplete_environment_names_the_missing_variable(calls, monkeypatch):
  monkeypatch.setenv("LEV_JAX_COORDINATOR", "127.0.0.1:5000")
  monkeypatch.setenv("LEV_JAX_NUM_PROCESSES", "2")
  with pytest.raises(ValueError, match="LEV_JAX_PROCESS_ID missing"):
    distributed.initialize()
  monkeypatch.setenv("LEV_JAX_PROCESS_ID", "one")
  with pytest.raises(ValueError, match="LEV_JAX_PROCESS_ID = 'one': expected an integer"):
    distributed.initialize()
  assert calls == []


def _slurm(monkeypatch, ntasks):  # what srun sets in each task (jax slurm_cluster.py)
  for k, v in dict(SLURM_JOB_ID="4242", SLURM_STEP_NODELIST="node[001-004]",
                   SLURM_NTASKS=str(ntasks), SLURM_PROCID="0", SLURM_LOCALID="0").items():
    monkeypatch.setenv(k, v)


def test_jax_auto_detection_for_a_multi_task_slurm_step(calls, monkeypatch):
  _slurm(monkeypatch, 4)
  assert distributed.detect_cluster() == ("SlurmCluster", 4)
  distributed.initialize()
  assert calls == [((), {})]  # no arguments: JAX fills them in


def test_one_task_slurm_job_is_single_process(calls, monkeypatch):
  _slurm(monkeypatch, 1)
  distributed.initialize()
  assert calls == []


def test_auto_detection_of_other_clusters(calls, monkeypatch):
  monkeypatch.setattr(distributed, "detect_cluster", lambda: ("GceTpuCluster", 16))
  distributed.initialize()
  assert calls == [((), {})]


@pytest.mark.parametrize("source", ["arguments", "environment", "flags"])
def test_explicit_settings_of_one_process_start_no_coordinator(calls, monkeypatch, source):
  if source == "arguments":
    distributed.initialize("h:1", 1, 0)
  elif source == "environment":
    monkeypatch.setenv("LEV_JAX_COORDINATOR", "h:1")
    monkeypatch.setenv("LEV_JAX_NUM_PROCESSES", "1")
    monkeypatch.setenv("LEV_JAX_PROCESS_ID", "0")
    distributed.initialize()
  else:
    fv = flags.FlagValues()
    distributed.define_flags(fv)
    fv(["prog", "--coordinator_address=node0:1234", "--num_processes=1", "--process_id=0"])
    distributed.initialize_from_flags(fv)
  assert calls == []
  distributed.initialize("h:1", 2, 0)  # decided once: a later call does nothing
  assert calls == []


def test_second_call_is_a_no_op(calls):
  distributed.initialize("h:1", 2, 0)
  distributed.initialize("h:1", 2, 0)
  distributed.initialize()
  assert len(calls) == 1


def test_no_op_when_jax_was_initialized_elsewhere(calls, monkeypatch):
  monkeypatch.setattr(jax.distributed, "is_initialized", lambda: True)
  distributed.initialize("h:1", 2, 0)
  assert calls == []


def test_flags(calls):
  fv = flags.FlagValues()
  distributed.define_flags(fv)
  distributed.define_flags(fv)  # twice is fine
  fv(["prog", "--coordinator_address=node0:1234", "--num_processes=2", "--process_id=1"])
  distributed.initialize_from_flags(fv)
  assert calls == [_explicit("node0:1234", 2, 1)]


def test_flags_errors_name_the_flag(calls):
  fv = flags.FlagValues()
  distributed.define_flags(fv)
  fv(["prog", "--coordinator_address=node0:1234", "--num_processes=2"])
  with pytest.raises(ValueError, match="--process_id missing"):
    distributed.initialize_from_flags(fv)
  fv = flags.FlagValues()
  distributed.define_flags(fv)
  fv(["prog"])
  distributed.initialize_from_flags(fv)  # no flags, no cluster: single process
  assert calls == []


def test_is_primary(monkeypatch):
  monkeypatch.setattr(jax, "process_index", lambda: 0)
  assert distributed.is_primary()
  monkeypatch.setattr(jax, "process_index", lambda: 3)
  assert not distributed.is_primary()
