"""What the launchers share: `own flags -- passthrough args`, one-line errors, quoting.

A problem the user can fix (a bad or missing flag) is a `LaunchError`; `run_main` prints it
as `<prog>: error: <message>` on stderr and returns exit status 2, like lev-train's CLI
(lev_jax/cli/common.py), never a traceback.

Pre-flight (`preflight`): before the TPU and SLURM launchers write or submit anything,
they run `python -m lev_jax.cli.train --preflight=PLATFORM:PROCESSESxDEVICES <the
lev-train arguments>` here, on the user's machine: lev-train's own flag parsing, config
loading and validation and mesh / sharding / batch checks (lev_jax.train.check_job), in
a subprocess so that the launchers stay importable without JAX and lev-train's global
flags and `sys.exit`-based one-line errors stay lev-train's. A mistake ends the launcher
with lev-train's own line; nothing is written or submitted.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Callable, Sequence


class LaunchError(ValueError):
  """A user-fixable problem; the message names the flag and what was expected."""


def _kind(path: str) -> str:
  """What a path that exists but is not a folder is, in words."""
  import stat  # pylint: disable=import-outside-toplevel
  if os.path.islink(path) and not os.path.exists(path):
    return "a link to nothing"
  mode = os.stat(path).st_mode
  return ("a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "a pipe"
          if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode) else "a file")


def folder_problem(flag: str, given: str, path: str | None = None) -> str | None:
  """`FLAG=GIVEN: is a file (a device, ...), not a folder; expected ...` when the local
  `path` (default `given`; e.g. resolved against --chdir) or its nearest existing parent
  exists and is not a folder (newcomer pass 9: launch/slurm.py --workdir=/dev/null
  planned `sbatch /dev/null.sbatch`); None when a folder can be there."""
  path = os.path.abspath(path or given)
  expected = ("expected a folder for lev-train's outputs (a new one, or a run's to "
              "resume)")
  if os.path.lexists(path) and not os.path.isdir(path):
    return f"{flag}={given}: is {_kind(path)}, not a folder; {expected}"
  parent = os.path.dirname(path)
  while parent and not os.path.lexists(parent) and parent != os.path.dirname(parent):
    parent = os.path.dirname(parent)
  if os.path.lexists(parent) and not os.path.isdir(parent):
    return f"{flag}={given}: {parent} is {_kind(parent)}, not a folder; {expected}"
  return None


def split_passthrough(argv: Sequence[str]) -> tuple[list[str], list[str]]:
  """(launcher args, args after the first `--`); the second is [] without `--`."""
  argv = list(argv)
  if "--" in argv:
    i = argv.index("--")
    return argv[:i], argv[i + 1:]
  return argv, []


class _Parser(argparse.ArgumentParser):
  def error(self, message):  # argparse would print usage and exit; keep one line instead
    if (message.startswith("unrecognized arguments: ")
        and "--" not in getattr(self, "full_argv", ["--"])):  # newcomer pass 13
      message += (f": the arguments for the program go after --, e.g. {self.prog} "
                  f"[flags] -- {message.split(': ', 1)[1]}")
    raise LaunchError(message)


def parser(prog: str, description: str) -> argparse.ArgumentParser:
  p = _Parser(prog=prog, description=description, allow_abbrev=False,
              usage=f"{prog} [flags] [--dry-run] -- [arguments passed on]",
              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--dry-run", "--dry_run", dest="dry_run", action="store_true",
                 help="Print exactly what would run, and run nothing.")
  return p


def parse(p: argparse.ArgumentParser, argv: Sequence[str]) -> tuple[argparse.Namespace, list[str]]:
  """Parses the launcher's flags (before `--`); returns them and the passthrough args.

  Raises:
    LaunchError: an unknown flag or a bad value (argparse's message).
  """
  own, rest = split_passthrough(argv)
  p.full_argv = list(argv)  # whether `--` was given, for the error's hint
  args = p.parse_args(own)
  _check_given_twice(p, own)
  if not getattr(args, "command", False):  # after `--`: lev-train's arguments
    _check_own_flags_after_dashes(p, rest)
  return args, rest


# Flags of a launcher that lev-train has too (--preflight), or that the launcher names
# itself after `--` with its own advice (reject_passthrough); and help.
_SHARED_FLAGS = frozenset(("--preflight", "--workdir", "--num_processes", "--process_id",
                           "--coordinator_address", "--help", "-h"))


def _options(p: argparse.ArgumentParser) -> dict[str, argparse.Action]:
  return {o: a for a in p._actions for o in a.option_strings}  # pylint: disable=protected-access


def _check_own_flags_after_dashes(p: argparse.ArgumentParser, rest: Sequence[str]) -> None:
  """Raises LaunchError for one of the launcher's own flags after `--` (newcomer pass 15,
  K04-K10: the dry run printed them as lev-train's, and lev-train said "Unknown command
  line flag 'grace_s'. Did you mean: process_id ?")."""
  options = _options(p)
  for a in rest:
    name = a.split("=", 1)[0]
    if name in options and name not in _SHARED_FLAGS:
      raise LaunchError(f"{name} after --: a {p.prog} flag; put it before -- (the "
                        "arguments after -- go to the program it starts)")


def _check_given_twice(p: argparse.ArgumentParser, own: Sequence[str]) -> None:
  """Raises LaunchError for a flag (not a repeatable one such as --env) given twice with
  different values: argparse keeps the last without a word (newcomer pass 15, K13, K14:
  --nodes=2 --nodes=3 was refused for a mesh of 3)."""
  options, given = _options(p), {}
  i = 0
  while i < len(own):
    arg, i = own[i], i + 1
    name, eq, value = arg.partition("=")
    action = options.get(name)
    if action is None or isinstance(action, (argparse._AppendAction,  # pylint: disable=protected-access
                                             argparse._CountAction)):  # pylint: disable=protected-access
      continue
    if not eq:
      if action.nargs == 0:  # store_true / store_false
        value = "true"
      elif i < len(own):
        value, i = own[i], i + 1
    given.setdefault(action.dest, []).append((name, value))
  for values in given.values():
    if len({v for _, v in values}) > 1:
      shown = ", ".join(f"{n}={v}" for n, v in values)
      times = "twice" if len(values) == 2 else f"{len(values)} times"
      raise LaunchError(f"{values[0][0]} given {times} ({shown}); give it once")


def reject_passthrough(rest: Sequence[str], flag: str, hint: str) -> None:
  """Raises LaunchError if `flag` (e.g. --workdir) appears after `--`."""
  for a in rest:
    if a == flag or a.startswith(flag + "="):
      raise LaunchError(f"{flag} after --: {hint}")


def shell_join(argv: Sequence[str]) -> str:
  return shlex.join([str(a) for a in argv])


def run_main(prog: str, body: Callable[[], int]) -> int:
  """Runs a launcher's body; a LaunchError becomes one line on stderr and status 2."""
  try:
    return body()
  except LaunchError as e:
    print(f"{prog}: error: {e}", file=sys.stderr)
    return 2


TRAIN_MODULE = "lev_jax.cli.train"
_TRAIN_ERROR = "lev-train: error: "


def _run_check(argv: list[str], what: str, skip: str, cwd: str | None,
               timeout_s: float, jax_platforms: str | None = "cpu"
               ) -> subprocess.CompletedProcess:
  """Runs a lev_jax check command on this machine with JAX_PLATFORMS=`jax_platforms`
  (default cpu: no accelerator here; None: unset).

  Raises:
    LaunchError: argv[0] does not exist (with how to skip the check), or the command
      outlived timeout_s.
  """
  try:
    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
    if jax_platforms is not None:
      env["JAX_PLATFORMS"] = jax_platforms
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=timeout_s,
                          env=env, stdin=subprocess.DEVNULL)
  except FileNotFoundError:
    raise LaunchError(f"{what}: cannot run {argv[0]}: no such file; {skip}") from None
  except subprocess.TimeoutExpired:
    raise LaunchError(f"{what}: `{shell_join(argv)}` took over {timeout_s:g} s") from None


def preflight(train_args: Sequence[str], platform: str, processes: int, devices: int, *,
              python: str = sys.executable, cwd: str | None = None,
              timeout_s: float = 300.0, jax_platforms: str | None = None,
              workdir: str | None = None) -> str:
  """Runs lev-train's checks on `train_args` for a job of processes x devices.

  Args:
    train_args: the lev-train arguments (after `--`), relative paths as seen from `cwd`.
    platform: "cpu", "gpu" or "tpu" (how lev_jax lays out the DCN mesh axes).
    processes: JAX processes (nodes / TPU hosts).
    devices: devices per process.
    python: the Python that runs lev-train (it must import lev_jax).
    cwd: where lev-train will run (its config path is relative to it).
    timeout_s: seconds before the check is given up.
    jax_platforms: the JAX_PLATFORMS the job will run with (None: unset), which
      lev-train checks against `platform` (cli/train.jax_platforms_error); the check
      itself starts no backend.
    workdir: the job's --workdir when this machine sees it as the job will (a shared
      filesystem): lev-train then also refuses one that holds another run, as the
      job would at its start.
  Returns:
    lev-train's one-line summary ("lev-train: preflight ok: ...").
  Raises:
    LaunchError: lev-train's one-line error (a bad config, variant, field, mesh or
      batch), or `python` cannot run lev-train at all.
  """
  argv = [python, "-m", TRAIN_MODULE, f"--preflight={platform}:{processes}x{devices}",
          *([f"--workdir={workdir}"] if workdir else []), *train_args]
  proc = _run_check(argv, "pre-flight", "pass --no-preflight to skip the check", cwd,
                    timeout_s, jax_platforms)
  lines = [l for l in proc.stderr.splitlines() if l.strip()]
  if proc.returncode == 0:
    out = [l for l in proc.stdout.splitlines() if l.strip()]
    return out[-1] if out else "lev-train: preflight ok"
  mine = [l for l in lines if l.startswith(_TRAIN_ERROR)]
  if mine:
    raise LaunchError(f"the lev-train arguments after --: {mine[-1][len(_TRAIN_ERROR):]}")
  last = lines[-1] if lines else f"exit status {proc.returncode}"
  if "No module named" in last:
    raise LaunchError(f"pre-flight: {python} cannot run lev-train ({last}); run the launcher "
                      "with the Python (venv) that has lev_jax installed, or pass "
                      "--no-preflight")
  raise LaunchError(f"pre-flight: `{shell_join(argv)}` failed: {last}")


COMPILE_MODULE = "lev_jax.cli.compile"
_COMPILE_ERROR = "lev-compile: error: "


def compile_preflight(train_args: Sequence[str], topology: str, *,
                      python: str = sys.executable, cwd: str | None = None,
                      timeout_s: float = 3600.0) -> str:
  """Compiles the job's train and eval steps for the slice with lev-compile (XLA:TPU
  ahead of time on this machine, lev_jax/aot.py): a job that cannot fit is never queued.

  Args:
    train_args: the lev-train arguments; only --config and --config.* reach lev-compile.
    topology: the slice, e.g. "v5p-128" (an --accelerator_type).
    python, cwd, timeout_s: as `preflight`.
  Returns:
    One line, "lev-compile: ok: " and each step's per-chip total against HBM.
  Raises:
    LaunchError: lev-compile's one-line error (a step that does not fit, libtpu missing
      or mismatched), or `python` cannot run it.
  """
  config_args = [a for a in train_args if a.startswith("--config")]
  argv = [python, "-m", COMPILE_MODULE, f"--topology={topology}", *config_args]
  proc = _run_check(argv, "compile pre-flight", "leave out --compile to skip it", cwd,
                    timeout_s)
  if proc.returncode == 0:  # "lev-compile: ok: train step 20.33 GiB per chip of 95.0 GiB ..."
    steps = re.findall(r"^(\w+) step \(", proc.stdout, re.M)
    totals = re.findall(r"^\s+total\s+([\d.]+)\s+of ([\d.]+ GiB) HBM \((\d+)% used",
                        proc.stdout, re.M)
    return "lev-compile: ok: " + "; ".join(
        f"{step} step {gib} GiB per chip of {hbm} ({used}% used)"
        for step, (gib, hbm, used) in zip(steps, totals))
  mine = [l for l in proc.stderr.splitlines() if l.startswith(_COMPILE_ERROR)]
  if mine:
    raise LaunchError(f"compile pre-flight: {mine[-1][len(_COMPILE_ERROR):]}")
  lines = [l for l in proc.stderr.splitlines() if l.strip()]
  raise LaunchError(f"compile pre-flight: `{shell_join(argv)}` failed: "
                    f"{lines[-1] if lines else f'exit status {proc.returncode}'}")


def add_preflight_flag(p: argparse.ArgumentParser) -> None:
  p.add_argument("--preflight", action=argparse.BooleanOptionalAction, default=True,
                 help="Check the lev-train arguments with lev-train itself on this machine "
                      "before writing or submitting anything (default on; also with "
                      "--dry-run).")
