"""Write and submit an sbatch script that trains on a multi-node GPU or CPU cluster with SLURM.

  python launch/slurm.py --nodes=4 --gpus_per_node=8 --partition=gpu --time=24:00:00 \\
      --venv=/shared/lev_jax/.venv --workdir=/shared/runs/ladder_1.2b -- \\
      --config=experiments/ladder.py:leviathan_1.2b
  python launch/slurm.py --nodes=2 --gpus_per_node=0 --partition=cpu --workdir=runs/cpu -- \\
      --config=experiments/smoke.py:tied          # CPU nodes
  python launch/slurm.py ... --dry-run -- ...     # print the script; write and submit nothing

Before anything is written or submitted, the lev-train arguments go through lev-train's
own checks on this machine (`lev-train --preflight=gpu:NODESxGPUS ...`, see
launch/common.py): a bad config file, variant or field, or a mesh that does not fit
nodes x devices per node, is one line here, not a failed job in the queue. It runs in
--chdir with the --venv's Python when that exists here (else this Python);
--no-preflight skips it.

The script (printed by --dry-run; otherwise written to WORKDIR.sbatch, next to the workdir,
and submitted with `sbatch`; its log goes to WORKDIR.slurm-<jobid>.out):

- One task per node (`--ntasks-per-node=1`) that owns all the node's GPUs
  (`--gpus-per-node=N`): one JAX process per node.
- CPU nodes (`--gpus_per_node=0`): no GPU request, `JAX_PLATFORMS=cpu`, and the task gets
  `--cpus_per_task` CPUs, by default all of the node's: `#SBATCH --exclusive` and
  `srun --cpus-per-task=$SLURM_CPUS_ON_NODE` (SLURM's own count of the node's CPUs).
  One JAX CPU device per process unless --env sets
  XLA_FLAGS=--xla_force_host_platform_device_count=N.
- The coordinator is the first host of `$SLURM_JOB_NODELIST` (`scontrol show hostnames`)
  on port `SLURM_JOB_ID % 4096 + 61440` (JAX's own choice for SLURM; --port fixes it).
- `srun` runs the same lev-train on every node with explicit
  `--coordinator_address=$COORDINATOR --num_processes=$SLURM_NTASKS
  --process_id=$SLURM_PROCID` (with one task per node these equal $SLURM_NNODES and
  $SLURM_NODEID). Explicit flags rather than JAX's SLURM auto-detection: auto-detection
  restricts each process to the single GPU `$SLURM_LOCALID` (made for one task per GPU),
  so a one-task-per-node job would use 1 GPU of 8. lev_jax.distributed passes explicit
  settings with auto-detection off, so each process sees all of its node's GPUs.
- `#SBATCH --signal=TERM@<signal_s>`: SLURM sends SIGTERM to the job steps (lev-train)
  that many seconds before the time limit; lev-train saves a checkpoint and exits 143.
- With --requeue (the default): `#SBATCH --requeue`, `--open-mode=append`, and when srun
  returns 143 the script runs `scontrol requeue $SLURM_JOB_ID` (at most --max_requeues
  times, counted by `$SLURM_RESTART_COUNT`); the requeued job resumes from the latest
  checkpoint in --workdir. A preemption that SLURM requeues itself resumes the same way.
  SLURM starts a requeued job once its credential lifetime has passed (slurm.conf
  `AuthInfo=cred_expire`, default 120 s): expect that pause between the two runs.
- --workdir must be on a filesystem every node sees (all processes write checkpoints there).

What clusters differ in is passed through as given: --account, --qos, --mem (per node,
e.g. 200G; 0 = all of it), --exclusive, --constraint (e.g. 'a100&ib'), any other sbatch
option as a whole line (--sbatch_line='#SBATCH --reservation=big', repeatable), and
environment variables exported before `srun` (--env KEY=VALUE, repeatable). GPU clusters
usually want some of NCCL's and XLA's: NCCL_SOCKET_IFNAME / NCCL_IB_HCA (the network
interfaces NCCL may use; site-specific), NCCL_DEBUG=INFO or WARN (why a collective
hangs), NCCL_NET_GDR_LEVEL, and XLA_FLAGS (e.g. --xla_gpu_enable_latency_hiding_scheduler=true)
or XLA_PYTHON_CLIENT_MEM_FRACTION (the share of GPU memory JAX preallocates, 0.75 by
default). None is set here: the right values are the cluster's.

Source: sbatch(1) (--signal, --requeue, --open-mode, --gpus-per-node, --cpus-per-task,
--exclusive, --mem, --qos, --constraint, output environment variables
SLURM_JOB_NODELIST, SLURM_RESTART_COUNT, SLURM_CPUS_ON_NODE), srun(1) (SLURM_PROCID,
SLURM_NTASKS; srun does not inherit --cpus-per-task from sbatch since 22.05), scontrol(1)
(show hostnames, requeue), slurm.conf(5) (cred_expire); jax/_src/clusters/slurm_cluster.py
(jax 0.10.2); NCCL's environment variables: docs.nvidia.com/deeplearning/nccl/user-guide/
docs/env.html; JAX GPU memory: docs.jax.dev/en/latest/gpu_memory_allocation.html.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

if __package__ in (None, ""):  # run as `python launch/slurm.py`
  sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from launch.common import (LaunchError, add_preflight_flag, folder_problem,  # noqa: E402
                           parse, parser, preflight, reject_passthrough, run_main,
                           shell_join)

PROG = "launch/slurm.py"
PREEMPTED_EXIT = 143  # lev_jax.cli.train.PREEMPTED_EXIT: SIGTERM -> checkpoint -> exit 143
# sbatch --time formats: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S (sbatch(1), -t/--time).
_TIME = re.compile(r"^(?:(\d+)-(\d+)(?::(\d+)(?::(\d+))?)?|(\d+)(?::(\d+))?(?::(\d+))?)$")
_WORD = re.compile(r"^[A-Za-z0-9_.,+@-]+$")
_MEM = re.compile(r"^[0-9]+[KMGT]?$")  # sbatch --mem: size[units], units K, M, G, T
_CONSTRAINT = re.compile(r"^[A-Za-z0-9_.,+@&|*()\[\]:!-]+$")  # features and & | [ ] * ( )
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_DEVICE_COUNT = re.compile(r"--xla_force_host_platform_device_count=([0-9]+)")
# Set by the script itself: an --env of one of these would be overwritten or break it.
_RESERVED_ENV = ("COORDINATOR", "COORDINATOR_HOST", "JAX_PLATFORMS")


def time_limit_s(value: str) -> int:
  """Seconds in an sbatch --time value.

  Raises:
    LaunchError: not one of sbatch's formats.
  """
  m = _TIME.match(value)
  if not m:
    raise LaunchError(f"--time={value}: expected minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM "
                      "or D-HH:MM:SS (sbatch's formats), e.g. --time=24:00:00")
  d, dh, dm, ds, a, b, c = (int(x) if x else 0 for x in m.groups())
  if m.group(1) is not None:  # D-H[:M[:S]]
    return ((d * 24 + dh) * 60 + dm) * 60 + ds
  if m.group(7) is not None:  # H:M:S
    return (a * 60 + b) * 60 + c
  return a * 60 + b  # M or M:S


@dataclasses.dataclass(frozen=True)
class SlurmJob:
  nodes: int
  gpus_per_node: int
  partition: str | None
  time: str | None
  job_name: str
  account: str | None
  venv: str | None
  workdir: str
  chdir: str
  requeue: bool
  max_requeues: int
  signal_s: int
  port: int | None
  train_args: tuple[str, ...]
  cpus_per_task: int | None = None
  qos: str | None = None
  mem: str | None = None
  exclusive: bool = False
  constraint: str | None = None
  sbatch_lines: tuple[str, ...] = ()
  env: tuple[tuple[str, str], ...] = ()

  @property
  def cpu(self) -> bool:
    """CPU nodes (--gpus_per_node=0)."""
    return self.gpus_per_node == 0

  def devices_per_node(self) -> int:
    """JAX devices of one process: the GPUs, or on CPU nodes 1 unless --env XLA_FLAGS
    forces a host device count."""
    if not self.cpu:
      return self.gpus_per_node
    flags = dict(self.env).get("XLA_FLAGS", "")
    counts = _DEVICE_COUNT.findall(flags)
    return int(counts[-1]) if counts else 1

  @property
  def script_path(self) -> str:
    return self.workdir.rstrip("/") + ".sbatch"

  @property
  def log_path(self) -> str:
    return self.workdir.rstrip("/") + ".slurm-%j.out"

  def train_command(self) -> str:
    """What each task runs: $COORDINATOR, $SLURM_* expand inside the task."""
    return ('exec lev-train --coordinator_address="$COORDINATOR" '
            '--num_processes="$SLURM_NTASKS" --process_id="$SLURM_PROCID" '
            + shell_join([f"--workdir={self.workdir}", *self.train_args]))

  def _resources(self) -> tuple[list[str], list[str]]:
    """(#SBATCH options, srun options) for the GPUs / CPUs of each node's one task."""
    sb, run = [], ["--ntasks-per-node=1"]
    if not self.cpu:
      sb.append(f"--gpus-per-node={self.gpus_per_node}")
      run.append(f"--gpus-per-node={self.gpus_per_node}")
    if self.cpus_per_task:
      sb.append(f"--cpus-per-task={self.cpus_per_task}")
      run.append(f"--cpus-per-task={self.cpus_per_task}")
    elif self.cpu:  # the whole node, so that the task may use all of its CPUs
      run.append('--cpus-per-task="$SLURM_CPUS_ON_NODE"')
    if self.exclusive or (self.cpu and not self.cpus_per_task):
      sb.append("--exclusive")
    return sb, run

  def script(self) -> str:
    resources, srun_opts = self._resources()
    sb = [f"--job-name={self.job_name}", f"--nodes={self.nodes}", "--ntasks-per-node=1",
          *resources]
    sb += [f"--partition={self.partition}"] if self.partition else []
    sb += [f"--account={self.account}"] if self.account else []
    sb += [f"--qos={self.qos}"] if self.qos else []
    sb += [f"--mem={self.mem}"] if self.mem else []
    sb += [f"--constraint={self.constraint}"] if self.constraint else []
    sb += [f"--time={self.time}"] if self.time else []
    sb += [f"--signal=TERM@{self.signal_s}", f"--chdir={self.chdir}",
           f"--output={self.log_path}", "--open-mode=append"]
    sb += ["--requeue"] if self.requeue else ["--no-requeue"]
    port = str(self.port) if self.port else "$((SLURM_JOB_ID % 4096 + 61440))"
    what = (f"{self.nodes} CPU nodes" if self.cpu
            else f"{self.nodes} nodes x {self.gpus_per_node} GPUs")
    env = ([("JAX_PLATFORMS", "cpu")] if self.cpu else []) + list(self.env)
    lines = [
        "#!/bin/bash",
        f"# Generated by {PROG}: lev-train on {what},",
        "# one JAX process per node.",
        *(f"#SBATCH {o}" for o in sb),
        *self.sbatch_lines,
        "",
        *([f"source {shlex.quote(self.venv.rstrip('/') + '/bin/activate')}"] if self.venv else []),
        *(f"export {k}={shlex.quote(v)}" for k, v in env),
        "# Process 0 (first node of the allocation) hosts the jax.distributed coordinator.",
        'COORDINATOR_HOST=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        f"export COORDINATOR=\"$COORDINATOR_HOST:{port}\"",
        'echo "lev-train: job $SLURM_JOB_ID, restart ${SLURM_RESTART_COUNT:-0}, '
        '$SLURM_JOB_NUM_NODES nodes, coordinator $COORDINATOR" >&2',
        "",
        f"srun {' '.join(srun_opts)} bash -c {shlex.quote(self.train_command())}",
        "status=$?",
    ]
    if self.requeue:
      lines += [
          f"# lev-train exits {PREEMPTED_EXIT} after saving a checkpoint on SIGTERM (the "
          f"--signal above, or a preemption): requeue, and the next run resumes.",
          f'if [ "$status" -eq {PREEMPTED_EXIT} ]; then',
          f'  if [ "${{SLURM_RESTART_COUNT:-0}}" -lt {self.max_requeues} ]; then',
          '    echo "lev-train: checkpointed after SIGTERM; requeueing job $SLURM_JOB_ID" >&2',
          '    scontrol requeue "$SLURM_JOB_ID"',
          "  else",
          f'    echo "lev-train: not requeueing: {self.max_requeues} requeues used" >&2',
          "  fi",
          "fi",
      ]
    lines.append('exit "$status"')
    return "\n".join(lines) + "\n"


def build_job(args, train_args: Sequence[str], cwd: str | None = None) -> SlurmJob:
  """A validated SlurmJob from parsed flags.

  Raises:
    LaunchError: a missing or malformed flag, naming it and what was expected (a
      --workdir that is a file, a device, ... or lies under one: `folder_problem`).
  """
  if args.nodes is None:
    raise LaunchError("--nodes is required: the number of nodes, one JAX process each, "
                      "e.g. --nodes=4")
  if args.nodes < 1:
    raise LaunchError(f"--nodes={args.nodes}: expected at least 1")
  if args.gpus_per_node < 0:
    raise LaunchError(f"--gpus_per_node={args.gpus_per_node}: expected 0 (CPU nodes) or more")
  if args.cpus_per_task is not None and args.cpus_per_task < 1:
    raise LaunchError(f"--cpus_per_task={args.cpus_per_task}: expected at least 1")
  for flag in ("partition", "account", "qos", "job_name"):
    value = getattr(args, flag)
    if value is not None and not _WORD.match(value):
      raise LaunchError(f"--{flag}={value!r}: expected letters, digits and _.,+@- only")
  if args.time is not None:
    limit = time_limit_s(args.time)
    if args.signal_s >= limit:
      raise LaunchError(f"--signal_s={args.signal_s}: must be shorter than --time="
                        f"{args.time} ({limit} s)")
  if args.mem is not None and not _MEM.match(args.mem):
    raise LaunchError(f"--mem={args.mem}: expected a size per node such as 200G, 64000M or "
                      "0 (all of the node's memory); units K, M, G, T (sbatch's format)")
  if args.constraint is not None and not _CONSTRAINT.match(args.constraint):
    raise LaunchError(f"--constraint={args.constraint!r}: expected node features joined by "
                      "& | [ ] * ( ), e.g. 'a100&ib', without spaces")
  for line in args.sbatch_line:
    if ("\n" in line or "\r" in line
        or not _option_name(line)):  # an option's name: newcomer pass 17 (S32, S35)
      raise LaunchError(f"--sbatch_line={line!r}: expected one line starting with "
                        "'#SBATCH --' and an option's name, e.g. "
                        "--sbatch_line='#SBATCH --reservation=big'")
  env = []
  for item in args.env:
    name, eq, value = item.partition("=")
    if not eq or not _ENV_NAME.match(name):
      raise LaunchError(f"--env={item!r}: expected KEY=VALUE with KEY letters, digits and _ "
                        "(not starting with a digit), e.g. --env=NCCL_DEBUG=WARN")
    if name in _RESERVED_ENV:
      raise LaunchError(f"--env={item!r}: {name} is set by the script itself")
    if "\n" in value or "\r" in value:
      raise LaunchError(f"--env={name}=...: expected a one-line value")
    if name in dict(env):  # newcomer pass 14: both exported, the last won unsaid
      raise LaunchError(f"--env={item!r}: {name} is given twice ({name}={dict(env)[name]} "
                        "too); give it once")
    env.append((name, value))
  if args.signal_s < 1:
    raise LaunchError(f"--signal_s={args.signal_s}: expected a positive number of seconds")
  if args.max_requeues < 0:
    raise LaunchError(f"--max_requeues={args.max_requeues}: expected 0 or more")
  if args.port is not None and not 0 < args.port < 65536:
    raise LaunchError(f"--port={args.port}: expected a TCP port in 1..65535")
  if args.chdir is not None and not args.chdir.strip():  # newcomer pass 14: the cwd, unsaid
    raise LaunchError("--chdir is empty (an unset shell variable?); expected the folder "
                      "every node runs lev-train in (leave the flag out for this one)")
  if args.venv is not None and not args.venv.strip():  # newcomer pass 13: no venv at all
    raise LaunchError("--venv is empty (an unset shell variable?); expected the "
                      "virtualenv every node activates, e.g. --venv=/shared/lev_jax/.venv "
                      "(leave the flag out to activate none)")
  if not args.workdir:
    raise LaunchError("--workdir is required: a directory on a filesystem every node "
                      "sees, e.g. --workdir=/shared/runs/NAME")
  if "://" in args.workdir:
    raise LaunchError(f"--workdir={args.workdir}: expected a shared filesystem path "
                      "(the script and log are written next to it)")
  reject_passthrough(train_args, "--workdir", "give it to launch/slurm.py (before --)")
  for flag in ("--coordinator_address", "--num_processes", "--process_id"):
    reject_passthrough(train_args, flag, "launch/slurm.py sets it for every task")
  chdir = os.path.abspath(os.path.expanduser(args.chdir or cwd or os.getcwd()))
  workdir = os.path.join(chdir, os.path.expanduser(args.workdir))  # absolute stays as is
  problem = folder_problem("--workdir", args.workdir, workdir)  # the script goes next to it
  if problem:
    raise LaunchError(problem)
  job = SlurmJob(args.nodes, args.gpus_per_node, args.partition, args.time, args.job_name,
                  args.account, args.venv and os.path.expanduser(args.venv),  # quoted in the script
                  os.path.normpath(workdir), chdir, args.requeue,
                  args.max_requeues, args.signal_s, args.port, tuple(train_args),
                  cpus_per_task=args.cpus_per_task, qos=args.qos, mem=args.mem,
                  exclusive=args.exclusive, constraint=args.constraint,
                  sbatch_lines=tuple(args.sbatch_line), env=tuple(env))
  _check_sbatch_lines(job)
  return job


def _check_sbatch_lines(job: SlurmJob) -> None:
  """Refuses an --sbatch_line that sets an option the script already writes (newcomer
  pass 16, L27: a second --time silently replaced --time's, sbatch applying the last),
  under its own name, an abbreviation of it, or another option of the same setting
  (`_SAME_SETTING`: --gres and --gpus-per-node, --mem-per-cpu and --mem, ...).

  Raises:
    LaunchError: naming the line, the option and the flag that sets it.
  """
  own = {_option_name(line) for line in job.script().splitlines()
         if line.startswith("#SBATCH --") and line not in job.sbatch_lines}
  for line in job.sbatch_lines:
    option = _option_name(line)
    harm = next((why for name, why in _NEVER_IN_SCRIPT.items()
                 if option and len(option) >= 2 and name.startswith(option)), None)
    if harm:
      raise LaunchError(f"--sbatch_line={line!r}: not allowed in this launcher's "
                        f"script: {harm}")
    clash = (option if option in own else
             next((o for o in own if o.startswith(option)), None)  # an abbreviation
             or next((o for o in _SAME_SETTING.get(option, ()) if o in own), None))
    if clash:
      raise LaunchError(f"--sbatch_line={line!r}: the script sets --{clash} itself "
                        f"({_OWN_SBATCH_OPTIONS.get(clash, 'always')}); a second setting "
                        "would silently win: give it once, by that flag")


def _option_name(line: str) -> str | None:
  """"time" of "#SBATCH --time=1:00:00"; None for a line that is no such option."""
  match = re.match(r"#SBATCH --([^=\s]+)", line)
  return match.group(1) if match else None


# The #SBATCH options the script may write itself, and what sets each (an --sbatch_line
# repeating one it writes is refused: sbatch applies the last).
_OWN_SBATCH_OPTIONS = {
    "job-name": "--job_name", "nodes": "--nodes", "ntasks-per-node": "always 1",
    "gpus-per-node": "--gpus_per_node", "cpus-per-task": "--cpus_per_task",
    "exclusive": "--exclusive", "partition": "--partition", "account": "--account",
    "qos": "--qos", "mem": "--mem", "constraint": "--constraint", "time": "--time",
    "signal": "--signal_s", "chdir": "--chdir", "output": "next to --workdir",
    "open-mode": "always append", "requeue": "--requeue / --norequeue",
    "no-requeue": "--requeue / --norequeue"}
# sbatch options that would undo the script (newcomer pass 18, N14: --wrap passed).
_NEVER_IN_SCRIPT = {
    "wrap": "sbatch would run that command instead of the script's lev-train",
    "array": "every task of the array would train into the one --workdir at once; "
             "launch one job per run (lev-ladder and lev-study do)"}
# sbatch options that set what one of the script's own options sets.
_SAME_SETTING = {
    "requeue": ("no-requeue",), "no-requeue": ("requeue",),
    "gres": ("gpus-per-node",), "gpus": ("gpus-per-node",),
    "gpus-per-task": ("gpus-per-node",), "ntasks": ("ntasks-per-node",),
    "mem-per-cpu": ("mem",), "mem-per-gpu": ("mem",), "time-min": ("time",),
    "cpus-per-gpu": ("cpus-per-task",), "oversubscribe": ("exclusive",),
    "job_name": ("job-name",)}


def check_train_args(job: SlurmJob) -> str:
  """lev-train's own checks of job.train_args for nodes x devices per node (common.preflight),
  run in job.chdir with the --venv's Python when it exists here, else this one.

  Returns:
    lev-train's one-line summary.
  Raises:
    LaunchError: lev-train's one-line error; --chdir missing here.
  """
  if not os.path.isdir(job.chdir):
    raise LaunchError(f"--chdir={job.chdir}: not a directory on this machine; the "
                      "pre-flight check runs lev-train there (or pass --no-preflight)")
  python = sys.executable
  if job.venv:
    candidate = os.path.join(os.path.expanduser(job.venv), "bin", "python")
    python = candidate if os.path.exists(candidate) else python
  # the job's JAX_PLATFORMS: cpu nodes get cpu from the script; GPU nodes inherit this
  # shell's (sbatch exports the environment)
  return preflight(job.train_args, "cpu" if job.cpu else "gpu", job.nodes,
                   job.devices_per_node(), python=python, cwd=job.chdir,
                   jax_platforms="cpu" if job.cpu else os.environ.get("JAX_PLATFORMS"),
                   workdir=job.workdir)


def submit(job: SlurmJob) -> int:
  """Writes job.script() to job.script_path and runs `sbatch` on it; returns its status.

  Raises:
    LaunchError: sbatch is not on PATH.
  """
  if shutil.which("sbatch") is None:
    raise LaunchError("sbatch not found on PATH: run on a SLURM login node, or use "
                      "--dry-run to print the script")
  path = Path(job.script_path)
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(job.script())
  print(f"[slurm] wrote {path}; log: {job.log_path}", file=sys.stderr)
  return subprocess.run(["sbatch", str(path)]).returncode


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
  out = sys.stdout if out is None else out
  p = parser(PROG, __doc__)
  p.add_argument("--nodes", type=int, help="Nodes (one JAX process each).")
  p.add_argument("--gpus_per_node", type=int, default=8,
                 help="GPUs per node (default 8); 0: CPU nodes (JAX on CPU).")
  p.add_argument("--cpus_per_task", type=int, default=None,
                 help="CPUs of each node's task (default: SLURM's; on CPU nodes all of the "
                      "node's, with --exclusive).")
  p.add_argument("--partition", help="SLURM partition.")
  p.add_argument("--time", help="Time limit, e.g. 24:00:00 or 2-00:00:00.")
  p.add_argument("--job_name", default="lev-train", help="Job name (default lev-train).")
  p.add_argument("--account", help="SLURM account to charge.")
  p.add_argument("--qos", help="Quality of service (sbatch --qos).")
  p.add_argument("--mem", help="Memory per node, e.g. 200G; 0 = all (sbatch --mem).")
  p.add_argument("--exclusive", action="store_true", help="Whole nodes (sbatch --exclusive).")
  p.add_argument("--constraint", help="Node features, e.g. 'a100&ib' (sbatch --constraint).")
  p.add_argument("--sbatch_line", action="append", default=[],
                 help="One more '#SBATCH --option' line, as is (repeatable).")
  p.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                 help="Exported before srun on every node (repeatable), e.g. NCCL_DEBUG=WARN.")
  p.add_argument("--venv", help="Virtualenv to activate on every node (shared path).")
  p.add_argument("--workdir", help="lev-train --workdir on a shared filesystem.")
  p.add_argument("--chdir", help="Directory lev-train runs in (default: the current one).")
  p.add_argument("--requeue", action=argparse.BooleanOptionalAction,
                 default=True, help="Requeue after a SIGTERM checkpoint (default on).")
  p.add_argument("--max_requeues", type=int, default=20,
                 help="Requeues before giving up (default 20).")
  p.add_argument("--signal_s", type=int, default=120,
                 help="SIGTERM this many seconds before the time limit (default 120).")
  p.add_argument("--port", type=int, default=None,
                 help="Coordinator port (default SLURM_JOB_ID %% 4096 + 61440).")
  add_preflight_flag(p)

  def body() -> int:
    args, rest = parse(p, sys.argv[1:] if argv is None else argv)
    job = build_job(args, rest)
    if args.preflight:
      print(f"[slurm] {check_train_args(job)}", file=sys.stderr)
    if args.dry_run:
      out.write(job.script())
      print(f"[slurm] dry run: would write {job.script_path} and run: sbatch "
            f"{job.script_path}", file=sys.stderr)
      return 0
    return submit(job)
  return run_main(PROG, body)


if __name__ == "__main__":
  sys.exit(main())
