"""What `lev-train` and `lev-params` share: flag parsing with one-line errors, quiet logs.

Errors a user can fix (a bad flag, config file, variant or value) end the program with
`<prog>: error: <one line>` on stderr and exit status 2, never a traceback.
"""

from __future__ import annotations

import logging as std_logging
import os
import sys

from absl import flags, logging


def fail(prog: str, message: str):
  print(f"{prog}: error: {message}", file=sys.stderr)
  sys.exit(2)


def first_line(error: BaseException) -> str:
  """The first non-blank line of an error's message (or its type's name)."""
  lines = [l.strip() for l in str(error).splitlines() if l.strip()]
  return lines[0] if lines else type(error).__name__


def _last_line(error: BaseException) -> str:
  lines = [l.strip() for l in str(error).splitlines() if l.strip()]
  return lines[-1] if lines else type(error).__name__


_HELP = ("--help", "-help", "-h", "--helpshort", "-?")


def flags_parser(prog: str, module: str | None = None):
  """An `app.run(flags_parser=...)` that turns flag errors into one line.

  ``--help`` prints the docstring of `module` (the command's own module, e.g.
  "lev_jax.prepare_data") and the flags it defines, then exits 0 (absl would print
  the console-script wrapper's empty docstring).
  """
  def parse(argv):
    if module is not None and any(a in _HELP for a in argv[1:]):
      print((sys.modules[module].__doc__ or prog).strip() + "\n")
      print(flags.FLAGS.module_help(module) or "")
      print("\nAny config field: --config.<section>.<field>=value. All flags: --helpfull")
      sys.exit(0)
    try:
      return flags.FLAGS(argv)
    except flags.Error as e:
      fail(prog, _last_line(e))
  return parse


def define_or_exit(prog: str, define) -> None:
  """Runs `define()` (flag definitions). ml_collections applies `--config.<field>=...`
  overrides while the config flag is defined, so an unknown field fails there: that
  becomes one line naming the field, not a traceback."""
  try:
    define()
  except (AttributeError, KeyError) as e:
    field = str(e).strip("\"'")
    given = [a.split("=", 1)[0] for a in sys.argv[1:] if a.startswith("--config.")
             and a.split("=", 1)[0].rsplit(".", 1)[-1] == field]
    fail(prog, f"{given[0] if given else field}: the config has no field {field!r} "
               "(see lev_jax/config.py and the experiment file for the names)")


def config_or_exit(prog: str):
  """flags.FLAGS.config, or one line naming the missing or broken config file."""
  try:
    config = flags.FLAGS.config
    config.get("name")  # a file that failed to load raises on first use
    return config
  except Exception as e:  # config_flags defers file errors until first access
    fail(prog, f"--config={flags.FLAGS['config'].serialize().split('=', 1)[-1]}: "
               f"{_last_line(e)}")


_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


class _OwnInfoOnly(std_logging.Filter):
  """Keep lev_jax's INFO lines and everyone's warnings; drop libraries' INFO chatter.

  "lev_jax's" = emitted by a file inside this package's directory (not merely a path
  containing "lev_jax": a checkout named lev_jax holds its .venv's libraries too)."""

  def filter(self, record: std_logging.LogRecord) -> bool:
    return (record.levelno >= std_logging.WARNING or
            os.path.abspath(record.pathname).startswith(_PACKAGE_DIR))


def quiet_library_logs():
  """Called at start-up: Orbax, JAX and grain INFO lines stay out of the terminal."""
  logging.use_absl_handler()
  logging.get_absl_handler().addFilter(_OwnInfoOnly())
