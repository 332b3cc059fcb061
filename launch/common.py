"""What the launchers share: `own flags -- passthrough args`, one-line errors, quoting.

A problem the user can fix (a bad or missing flag) is a `LaunchError`; `run_main` prints it
as `<prog>: error: <message>` on stderr and returns exit status 2, like lev-train's CLI
(lev_jax/cli/common.py), never a traceback.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Callable, Sequence


class LaunchError(ValueError):
  """A user-fixable problem; the message names the flag and what was expected."""


def split_passthrough(argv: Sequence[str]) -> tuple[list[str], list[str]]:
  """(launcher args, args after the first `--`); the second is [] without `--`."""
  argv = list(argv)
  if "--" in argv:
    i = argv.index("--")
    return argv[:i], argv[i + 1:]
  return argv, []


class _Parser(argparse.ArgumentParser):
  def error(self, message):  # argparse would print usage and exit; keep one line instead
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
  return p.parse_args(own), rest


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
