"""Multi-process start-up: when and how to call `jax.distributed.initialize`.

`initialize()` must run before anything touches a JAX backend (`jax.devices()`, the first
array, ...). It resolves the coordinator, process count and process id from the first of
these sources that applies, and nothing else:

1. Explicit arguments (`initialize(addr, n, i)`, or the `--coordinator_address`,
   `--num_processes`, `--process_id` flags through `initialize_from_flags()`): all three
   together. Used by `launch/slurm.py` (one process per node) and by hand on any cluster.
2. The environment variables `LEV_JAX_COORDINATOR` (`host:port`), `LEV_JAX_NUM_PROCESSES`
   and `LEV_JAX_PROCESS_ID`: all three together. Set by `launch/local.py` (N CPU processes
   on one machine) and usable by any launcher that can set per-process environment.
3. JAX's own cluster auto-detection, when it finds a cluster of more than one process
   (jax/_src/clusters in jax 0.10.2, probed in this order, the first present wins):
   Open MPI / `mpirun` (`OMPI_MCA_orte_hnp_uri`, size `OMPI_COMM_WORLD_SIZE`); SLURM
   inside `srun` (`SLURM_JOB_ID`, `SLURM_STEP_NODELIST`, `SLURM_NTASKS`, `SLURM_PROCID`,
   `SLURM_LOCALID` all set; size `SLURM_NTASKS`); GKE TPU pods (`TPU_WORKER_HOSTNAMES` or
   `TPU_PROCESS_ADDRESSES` on a Cloud TPU VM); Cloud TPU VM pod slices and multislice
   (GCE metadata `agent-worker-number` / `worker-network-endpoints`, `MEGASCALE_*`; this
   is what `launch/tpu.py` relies on: every worker runs the same command); Kubernetes
   with the `kubernetes` package (`KUBERNETES_SERVICE_HOST`). Then
   `jax.distributed.initialize()` is called with no arguments and JAX fills them in.
   mpi4py is opt-in in JAX and is never picked here.
4. Otherwise (one process: a laptop, a single TPU VM host, a one-task SLURM job) nothing
   is called; JAX runs single-process as usual. So are explicit settings (1, 2) of one
   process (`launch/slurm.py --nodes=1`): a coordinator for a single process adds nothing
   but a gRPC service whose registration can time out on a loaded host (seen on a 2-core
   CI machine: XLA's `... tried to connect with a different incarnation`, then a crash).

Explicit settings (1, 2) are passed with `cluster_detection_method="deactivate"`. Without
it JAX still runs its auto-detection to fill `local_device_ids`, and inside `srun` that
pins each process to the single GPU `SLURM_LOCALID` — wrong for one process per node with
8 GPUs (jax/_src/clusters/cluster.py, `auto_detect_unset_distributed_params`). With it,
each process sees all of its local devices.

A second call is a no-op (so is a call after JAX was initialized elsewhere).

Source: jax.distributed.initialize docstring and jax/_src/clusters/*.py (jax 0.10.2);
https://docs.jax.dev/en/latest/multi_process.html
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping

from absl import flags, logging

ENV_COORDINATOR = "LEV_JAX_COORDINATOR"
ENV_NUM_PROCESSES = "LEV_JAX_NUM_PROCESSES"
ENV_PROCESS_ID = "LEV_JAX_PROCESS_ID"

_FIELDS = ("coordinator_address", "num_processes", "process_id")
_ARG_NAMES = {f: f for f in _FIELDS}
_FLAG_NAMES = {f: f"--{f}" for f in _FIELDS}
_ENV_NAMES = dict(zip(_FIELDS, (ENV_COORDINATOR, ENV_NUM_PROCESSES, ENV_PROCESS_ID)))

_initialized = False  # set once this module has decided (called JAX or chosen not to)


@dataclasses.dataclass(frozen=True)
class Plan:
  """What `initialize` will do: `source` is arguments | environment | auto | single."""
  source: str
  coordinator_address: str | None = None
  num_processes: int | None = None
  process_id: int | None = None
  cluster: str | None = None  # JAX cluster class name when source == "auto"


def _int(value, name: str, minimum: int) -> int:
  try:
    number = int(value)
    if isinstance(value, float) and value != number:
      raise ValueError
  except (TypeError, ValueError):
    raise ValueError(f"{name} = {value!r}: expected an integer >= {minimum}") from None
  if number < minimum:
    raise ValueError(f"{name} = {value!r}: expected an integer >= {minimum}")
  return number


def _explicit(values: Mapping[str, object], names: Mapping[str, str], source: str) -> Plan | None:
  """A Plan from three settings that must be given together; None if none is given.

  Raises:
    ValueError: one or two of the three are missing (naming them), or a value is bad.
  """
  given = {f: values[f] for f in _FIELDS if values[f] not in (None, "")}
  if not given:
    return None
  missing = [names[f] for f in _FIELDS if f not in given]
  if missing:
    have = ", ".join(names[f] for f in given)
    raise ValueError(f"{' and '.join(missing)} missing: {have} given, but a multi-process "
                     f"run needs {', '.join(names[f] for f in _FIELDS)} together")
  address = str(given["coordinator_address"])
  host, sep, port = address.rpartition(":")
  if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
    raise ValueError(f"{names['coordinator_address']} = {address!r}: expected host:port, "
                     "e.g. 10.0.0.1:1234")
  num = _int(given["num_processes"], names["num_processes"], 1)
  pid = _int(given["process_id"], names["process_id"], 0)
  if pid >= num:
    raise ValueError(f"{names['process_id']} = {pid}: expected 0 <= process id < "
                     f"{names['num_processes']} = {num}")
  return Plan(source, address, num, pid)


def detect_cluster() -> tuple[str, int] | None:
  """(cluster name, process count) when JAX's auto-detection sees a cluster, else None.

  Mirrors `ClusterEnv.auto_detect_unset_distributed_params` (jax/_src/clusters/cluster.py,
  jax 0.10.2): the first registered, non-opt-in cluster whose `is_env_present()` is true.
  On a Cloud TPU VM this queries the GCE metadata server (what JAX itself does).
  """
  from jax._src import clusters  # private: the only way to ask without initializing

  for env in clusters.ClusterEnv._cluster_types:
    if not env.opt_in_only_method and env.is_env_present():
      return env.__name__, int(env.get_process_count())
  return None


def plan(coordinator_address: str | None = None, num_processes: int | None = None,
         process_id: int | None = None, *, environ: Mapping[str, str] | None = None,
         names: Mapping[str, str] = _ARG_NAMES) -> Plan:
  """Resolves the sources in the module docstring's order, without initializing anything.

  Raises:
    ValueError: incomplete or invalid explicit settings or LEV_JAX_* variables (the
      message names the missing or bad ones).
  """
  environ = os.environ if environ is None else environ
  args = dict(zip(_FIELDS, (coordinator_address, num_processes, process_id)))
  if (p := _explicit(args, names, "arguments")) is not None:
    return p
  env = {f: environ.get(_ENV_NAMES[f]) for f in _FIELDS}
  if (p := _explicit(env, _ENV_NAMES, "environment")) is not None:
    return p
  found = detect_cluster()
  if found is not None and found[1] > 1:
    return Plan("auto", num_processes=found[1], cluster=found[0])
  return Plan("single")


def _run(p: Plan) -> None:
  global _initialized
  import jax

  if _initialized or jax.distributed.is_initialized():
    logging.info("jax.distributed already initialized; ignoring this call")
    return
  if p.source in ("arguments", "environment") and p.num_processes == 1:
    logging.info("one process (%s from %s): jax.distributed is not started",
                 p.coordinator_address, p.source)
  elif p.source in ("arguments", "environment"):
    logging.info("jax.distributed.initialize(%s, num_processes=%d, process_id=%d) from %s",
                 p.coordinator_address, p.num_processes, p.process_id, p.source)
    jax.distributed.initialize(coordinator_address=p.coordinator_address,
                               num_processes=p.num_processes, process_id=p.process_id,
                               cluster_detection_method="deactivate")
  elif p.source == "auto":
    logging.info("jax.distributed.initialize(): %s cluster of %d processes detected",
                 p.cluster, p.num_processes)
    jax.distributed.initialize()
  _initialized = True


def initialize(coordinator_address: str | None = None, num_processes: int | None = None,
               process_id: int | None = None) -> None:
  """Starts JAX's multi-process runtime when this is one process of several.

  See the module docstring for the sources, their order and the environments they cover.
  Call before any JAX computation; a second call does nothing.

  Raises:
    ValueError: one or two of the three arguments (or of the LEV_JAX_* variables) given
      without the others, naming the missing ones; a malformed address, count or id.
    RuntimeError: from jax.distributed.initialize, e.g. when a JAX backend was already
      initialized before this call in a multi-process run.
  """
  if _initialized:
    return
  _run(plan(coordinator_address, num_processes, process_id))


def is_primary() -> bool:
  """True in the process that writes shared outputs: `jax.process_index() == 0`."""
  import jax

  return jax.process_index() == 0


def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
  """Defines --coordinator_address, --num_processes, --process_id (default None).

  Safe to call twice (already defined flags are kept).
  """
  if "coordinator_address" not in flag_values:
    flags.DEFINE_string("coordinator_address", None,
                        "host:port of process 0's coordinator for a multi-process run "
                        "(with --num_processes and --process_id).", flag_values=flag_values)
  if "num_processes" not in flag_values:
    flags.DEFINE_integer("num_processes", None, "Number of processes in the run.",
                         lower_bound=1, flag_values=flag_values)
  if "process_id" not in flag_values:
    flags.DEFINE_integer("process_id", None, "This process's id, 0 .. num_processes-1.",
                         lower_bound=0, flag_values=flag_values)


def initialize_from_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
  """`initialize` from the flags of `define_flags`; errors name the flags (--process_id).

  Raises:
    ValueError: as `initialize`, naming --coordinator_address / --num_processes /
      --process_id.
  """
  if _initialized:
    return
  values = {f: flag_values[f].value for f in _FIELDS}
  _run(plan(**values, names=_FLAG_NAMES))
