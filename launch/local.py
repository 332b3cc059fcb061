"""Run N processes of lev-train (or any module or command) on this machine, on CPU.

  python launch/local.py --num_processes=2 --devices_per_process=4 -- \\
      --config=experiments/smoke.py:tied --workdir=runs/mp_tied
  python launch/local.py --num_processes=2 --devices_per_process=2 --command -- \\
      python -c 'import jax, lev_jax.distributed as d; d.initialize(); print(jax.device_count())'
  python launch/local.py --num_processes=2 --dry-run -- --config=experiments/smoke.py:tied

Each process gets `JAX_PLATFORMS=cpu`,
`XLA_FLAGS=--xla_force_host_platform_device_count=<devices_per_process>` (added to any
XLA_FLAGS already set) and `LEV_JAX_COORDINATOR=127.0.0.1:<port>`,
`LEV_JAX_NUM_PROCESSES=N`, `LEV_JAX_PROCESS_ID=k`, which `lev_jax.distributed.initialize()`
reads. So N processes x D devices behave like an N-host cluster: the same code path as a
TPU pod or a SLURM job, on one machine. The port is a free one unless --port is given.

Output lines of process k are printed as `[pk] line` (a progress bar's carriage-return
updates show only once its line ends). The launcher waits for all processes. When one
fails, the others get SIGTERM and, after --grace_s seconds, SIGKILL; the launcher's status
is the first failure's (a signal death reads as 128 + signal), else 0. A SIGTERM to the
launcher is forwarded to every process (lev-train then checkpoints and exits 143).
`--dry-run` prints one shell command per process, with its environment, and runs nothing.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TextIO

if __package__ in (None, ""):  # run as `python launch/local.py`
  sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from launch.common import (LaunchError, parse, parser, reject_passthrough, run_main,  # noqa: E402
                           shell_join)

PROG = "launch/local.py"
DEFAULT_MODULE = "lev_jax.cli.train"
MAX_PROCESSES_PER_CORE = 4  # a typo (100000 for 10) is refused before anything starts
MAX_SIMULATED_DEVICES = 4096
_DEVICE_FLAG = "--xla_force_host_platform_device_count"


def free_port() -> int:
  """A TCP port on 127.0.0.1 that was free a moment ago (the OS picks it)."""
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _xla_flags(existing: str, devices: int) -> str:
  kept = [f for f in existing.split() if not f.startswith(_DEVICE_FLAG)]
  return " ".join([f"{_DEVICE_FLAG}={devices}", *kept])


def process_commands(argv: Sequence[str], num_processes: int, devices_per_process: int,
                     port: int, *, module: str = DEFAULT_MODULE, command: bool = False,
                     python: str = sys.executable,
                     environ: Mapping[str, str] | None = None) -> list[tuple[dict, list[str]]]:
  """[(environment additions, argv)] for processes 0..N-1.

  Raises:
    LaunchError: N or D below 1, a port outside 1..65535, --command without a command.
  """
  if num_processes < 1:
    raise LaunchError(f"--num_processes={num_processes}: expected at least 1")
  most = max(MAX_PROCESSES_PER_CORE * (os.cpu_count() or 1), 8)
  if num_processes > most:  # newcomer pass 13: 100,000 JAX processes on 2 cores, unsaid
    raise LaunchError(f"--num_processes={num_processes}: expected at most {most} on this "
                      f"machine ({os.cpu_count()} cores; every process starts here: "
                      "for many hosts use launch/slurm.py or launch/tpu.py)")
  if devices_per_process < 1:
    raise LaunchError(f"--devices_per_process={devices_per_process}: expected at least 1")
  if num_processes * devices_per_process > MAX_SIMULATED_DEVICES:  # newcomer pass 14
    raise LaunchError(f"--devices_per_process={devices_per_process}: {num_processes} x "
                      f"{devices_per_process} simulated CPU devices; expected at most "
                      f"{MAX_SIMULATED_DEVICES} in all (a TPU pod's 4,096 chips)")
  if not command and not module.strip():  # newcomer pass 14: "No module named " at run
    raise LaunchError("--module is empty (an unset shell variable?); expected a Python "
                      f"module, e.g. --module={DEFAULT_MODULE} (the default)")
  if not 0 < port < 65536:
    raise LaunchError(f"--port={port}: expected a TCP port in 1..65535")
  if command and not argv:
    raise LaunchError("--command needs the command after --, e.g. -- python -c 'print(1)'")
  if not command:  # newcomer pass 14 (K05): lev-train then asked for the other two
    for flag in ("--coordinator_address", "--num_processes", "--process_id"):
      reject_passthrough(argv, flag, "launch/local.py sets it for every process "
                         "(--num_processes, --port before --)")
  environ = os.environ if environ is None else environ
  program = list(argv) if command else [python, "-m", module, *argv]
  out = []
  for k in range(num_processes):
    env = {
        "JAX_PLATFORMS": "cpu",
        "XLA_FLAGS": _xla_flags(environ.get("XLA_FLAGS", ""), devices_per_process),
        "LEV_JAX_COORDINATOR": f"127.0.0.1:{port}",
        "LEV_JAX_NUM_PROCESSES": str(num_processes),
        "LEV_JAX_PROCESS_ID": str(k),
        "PYTHONUNBUFFERED": "1",
    }
    out.append((env, program))
  return out


def format_command(env: Mapping[str, str], argv: Sequence[str]) -> str:
  """One copy-pasteable shell line: `env K=V ... program args`."""
  return shell_join(["env", *(f"{k}={v}" for k, v in env.items()), *argv])


def _exit_status(returncode: int) -> int:
  return 128 - returncode if returncode < 0 else returncode  # -15 (SIGTERM) -> 143


def _pump(k: int, stream, out: TextIO, lock: threading.Lock) -> None:
  """Copies a child's output to `out`, each line prefixed with [pk]."""
  for raw in iter(stream.readline, b""):
    line = raw.rstrip(b"\n").split(b"\r")
    text = next((s for s in reversed(line) if s.strip()), b"").decode(errors="replace")
    with lock:
      out.write(f"[p{k}] {text}\n")
      out.flush()
  stream.close()


def _stop(procs: Sequence[subprocess.Popen], grace_s: float) -> None:
  """SIGTERM to the running processes, then SIGKILL after grace_s."""
  for p in procs:
    if p.poll() is None:
      p.send_signal(signal.SIGTERM)
  deadline = time.monotonic() + grace_s
  for p in procs:
    try:
      p.wait(timeout=max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
      p.kill()
      p.wait()


def run_processes(commands: Sequence[tuple[dict, list[str]]], *, grace_s: float = 10.0,
                  out: TextIO | None = None, cwd: str | None = None) -> int:
  """Starts every command, streams prefixed output, returns the combined exit status."""
  out = sys.stdout if out is None else out
  log = sys.stderr if out is sys.stdout else out
  lock = threading.Lock()
  procs, pumps = [], []
  for k, (env, argv) in enumerate(commands):
    try:
      p = subprocess.Popen(argv, env={**os.environ, **env}, cwd=cwd, stdin=subprocess.DEVNULL,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    except OSError as e:
      _stop(procs, grace_s)
      raise LaunchError(f"cannot start process {k}: {argv[0]}: {e.strerror}") from None
    procs.append(p)
    t = threading.Thread(target=_pump, args=(k, p.stdout, out, lock), daemon=True)
    t.start()
    pumps.append(t)

  # A SIGTERM to the launcher goes to every process, which then get all the time they
  # need (lev-train saves a checkpoint and exits 143); no SIGKILL in that case.
  terminating = threading.Event()

  def forward_sigterm(*_):
    terminating.set()
    for p in procs:
      if p.poll() is None:
        p.send_signal(signal.SIGTERM)

  forward = threading.current_thread() is threading.main_thread()
  if forward:
    previous = signal.signal(signal.SIGTERM, forward_sigterm)
  status = 0
  try:
    while [p.poll() for p in procs].count(None):  # polls every process (sets returncode)
      failed = [(k, p.returncode) for k, p in enumerate(procs)
                if p.returncode not in (None, 0)]
      if failed and not terminating.is_set():
        k, rc = failed[0]
        status = _exit_status(rc)
        with lock:
          log.write(f"[local] process {k} exited with status {status}; stopping the others\n")
        _stop(procs, grace_s)
        break
      time.sleep(0.05)
  except KeyboardInterrupt:
    _stop(procs, grace_s)
    status = 130
  finally:
    if forward:
      signal.signal(signal.SIGTERM, previous)
  for t in pumps:
    t.join(timeout=5)
  if status == 0:  # all ended on their own: the first non-zero status, in process order
    status = next((_exit_status(p.returncode) for p in procs if p.returncode), 0)
  return status


def launch_local(argv: Sequence[str], num_processes: int, devices_per_process: int = 1, *,
                 port: int | None = None, module: str = DEFAULT_MODULE, command: bool = False,
                 dry_run: bool = False, grace_s: float = 10.0, out: TextIO | None = None,
                 python: str = sys.executable, cwd: str | None = None) -> int:
  """Runs (or with dry_run prints) N processes; returns their combined exit status.

  `argv` are lev-train's arguments (or, with command=True, the whole command).

  Raises:
    LaunchError: bad counts or port, --command without a command, a program that
      cannot be started.
  """
  out = sys.stdout if out is None else out
  commands = process_commands(argv, num_processes, devices_per_process,
                              free_port() if port is None else port,
                              module=module, command=command, python=python)
  if dry_run:
    for env, cmd in commands:
      out.write(format_command(env, cmd) + "\n")
    return 0
  return run_processes(commands, grace_s=grace_s, out=out, cwd=cwd)


def main(argv: Sequence[str] | None = None) -> int:
  p = parser(PROG, __doc__)
  p.add_argument("--num_processes", type=int, default=2, help="Processes to start (default 2).")
  p.add_argument("--devices_per_process", type=int, default=1,
                 help="CPU devices each process sees (default 1).")
  p.add_argument("--port", type=int, default=None,
                 help="Coordinator port on 127.0.0.1 (default: a free port).")
  what = p.add_mutually_exclusive_group()
  what.add_argument("--module", default=DEFAULT_MODULE,
                    help="Python module to run with `python -m` (default lev_jax.cli.train).")
  what.add_argument("--command", action="store_true",
                    help="The arguments after -- are a whole command to run as is.")
  p.add_argument("--grace_s", type=float, default=10.0,
                 help="Seconds between SIGTERM and SIGKILL when stopping processes.")

  def body() -> int:
    args, rest = parse(p, sys.argv[1:] if argv is None else argv)
    if not (args.grace_s >= 0 and args.grace_s != float("inf")):  # newcomer pass 14
      raise LaunchError(f"--grace_s={args.grace_s}: expected seconds >= 0")
    return launch_local(rest, args.num_processes, args.devices_per_process, port=args.port,
                        module=args.module, command=args.command, dry_run=args.dry_run,
                        grace_s=args.grace_s)
  return run_main(PROG, body)


if __name__ == "__main__":
  sys.exit(main())
