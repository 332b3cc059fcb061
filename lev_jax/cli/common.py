"""What the `lev-*` commands share: flag parsing with one-line errors, Ctrl-C as one
line, quiet logs.

Errors a user can fix (a bad flag, config file, variant or value) end the program with
`<prog>: error: <one line>` on stderr and exit status 2, never a traceback. Ctrl-C
ends it with `<prog>: interrupted (Ctrl-C) ...` and exit status 130 (`run`). Every flag
naming a file or folder is defined with `define_path`, which refuses an empty value.
"""

from __future__ import annotations

import difflib
import logging as std_logging
import os
import re
import shlex
import sys
import textwrap

import ml_collections
from absl import app, flags, logging
from ml_collections import config_flags

# The flags `define_path` defines belong to the command calling it (its --help lists
# them), not to this module.
flags.disclaim_key_flags()

# 128 + SIGINT: the shell's status for a command ended by Ctrl-C.
INTERRUPTED_EXIT = 130


def fail(prog: str, message: str):
  print(f"{prog}: error: {message}", file=sys.stderr)
  sys.exit(2)


def define_path(name: str, default: str | None, help: str, *, what: str,
                fv: flags.FlagValues = flags.FLAGS) -> None:
  """Defines a string flag naming a file or folder, which may be left out but not empty.

  `--NAME=` (e.g. `--workdir=$UNSET`) would otherwise mean the default (or, where a
  command joins it to a folder, the current directory): it is refused when the flags
  are parsed, which `flags_parser` ends with the one line
  `<prog>: error: --NAME is empty (an unset shell variable?); expected WHAT`.
  A value of only spaces counts as empty.

  Args:
    name, default, help: as flags.DEFINE_string's.
    what: what the value must name, for the message, e.g. "the run's folder".
    fv: the FlagValues to define it on (tests pass a fresh one).
  """
  flags.DEFINE_string(name, default, help, flag_values=fv)
  flags.register_validator(name, lambda value: value is None or bool(value.strip()),
                           message=empty_message(name, what), flag_values=fv)


def empty_message(name: str, what: str) -> str:
  """The one line for a path flag given empty: `--NAME is empty (...); expected WHAT`."""
  return f"--{name} is empty (an unset shell variable?); expected {what}"


# absl's prefix of a validator's message, "flag --NAME=VALUE: ", when the message itself
# starts with --NAME (define_path's, whose VALUE is blank).
_REPEATED_FLAG = re.compile(r"^flag (--[\w.]+)=\s*: (?=\1 )")


def run(prog: str, main, module: str,
        interrupted: str = "interrupted (Ctrl-C); stopped") -> None:
  """`app.run(main)` with `flags_parser(prog, module)`, ending a Ctrl-C in one line.

  A KeyboardInterrupt that reaches here (Python's default SIGINT handler raises it)
  prints `<prog>: <interrupted>` on stderr and exits with INTERRUPTED_EXIT (130), never
  a traceback; `finally` blocks and `with` exits (locks, temporary files) ran on the
  way out. Commands that save work on Ctrl-C (lev-train) handle SIGINT themselves.

  Args:
    prog: the command's name, e.g. "lev-eval".
    main: absl's main(argv).
    module: the command's module (for --help), e.g. "lev_jax.cli.eval".
    interrupted: the rest of the line, e.g. what was kept.
  """
  try:
    app.run(main, flags_parser=flags_parser(prog, module))
  except KeyboardInterrupt:
    print(f"{prog}: {interrupted}", file=sys.stderr)
    sys.exit(INTERRUPTED_EXIT)


def first_line(error: BaseException) -> str:
  """The first non-blank line of an error's message (or its type's name)."""
  lines = [l.strip() for l in str(error).splitlines() if l.strip()]
  return lines[0] if lines else type(error).__name__


def _last_line(error: BaseException) -> str:
  lines = [l.strip() for l in str(error).splitlines() if l.strip()]
  return lines[-1] if lines else type(error).__name__


_HELP = ("--help", "-help", "-h", "--helpshort", "-?")
_HELP_WIDTH = 88
# Characters whose example values a shell would not pass through as written.
_SHELL_SPECIAL = set("$`\\")
# What absl appends to a multi flag's help.
_MULTI_SUFFIX = re.compile(r";\s*repeat this option to specify a list of values$")


def _doc_examples(doc: str, prog: str) -> dict[str, str | None]:
  """{flag name: its value in the docstring's first example that gives it (None: bare)}.

  Example commands are docstring lines starting with `prog` (or `` `prog ``), with the
  lines after them that start with `--` or `[--` (or follow a trailing backslash); they
  are split as a shell would (shlex). A value a shell would change ($, backquotes, backslashes) or an
  ellipsis is skipped.
  """
  found: dict[str, str | None] = {}
  in_example = False
  for line in doc.replace("\\\n", " ").splitlines():
    text = line.strip()
    in_example = (text.lstrip("`").startswith(prog + " ") or
                  (in_example and text.startswith(("--", "[--"))))
    if not in_example:
      continue
    try:
      tokens = shlex.split(text, comments=True)
    except ValueError:  # an unbalanced quote: not an example a user could paste
      continue
    for token in tokens:
      token = token.strip("[]`")
      if not token.startswith("--"):
        continue
      name, eq, value = token[2:].partition("=")
      value = " ".join(value.split())  # a quoted value continued on the next line
      if eq and (_SHELL_SPECIAL & set(value) or "..." in value):
        continue
      found.setdefault(name, value if eq else None)
  return found


def _is_config_flag(flag) -> bool:
  """True for an ml_collections config flag (it accepts --config.<field>=... overrides)."""
  return type(flag).__module__.startswith("ml_collections.config_flags")


def _flag_example(flag, examples: dict[str, str | None]) -> str:
  """`--name=VALUE` for `flag`: the docstring's example, else a value the flag parses."""
  if isinstance(flag, flags.BooleanFlag):
    return f"--{flag.name}" if not flag.default else f"--no{flag.name}"
  value = examples.get(flag.name)
  if value is not None and not _is_config_flag(flag):  # parsing a config runs its file
    try:
      flag.parser.parse(value)
    except (ValueError, TypeError):
      value = None
  if value is None:
    choices = getattr(flag.parser, "enum_values", None)
    if choices:
      value = next((c for c in choices if c != flag.default), choices[0])
    elif flag.default not in (None, "", []) and not _is_config_flag(flag):
      value = flag.default_as_str.strip("'") if flag.default_as_str else str(flag.default)
    elif isinstance(flag.parser, flags.IntegerParser):
      value = str(max(1, flag.parser.lower_bound or 1))
    elif isinstance(flag.parser, flags.FloatParser):
      value = "1.0"
    else:
      value = flag.name.upper()
  return f"--{flag.name}={shlex.quote(value)}"


def help_row(example: str, text: str) -> list[str]:
  """One flag of a `--help` listing: `example` (e.g. "--step=200"), then `text` in an
  aligned column (on the next line when the example is wider), wrapped at 88."""
  column = 36
  wrap = dict(width=_HELP_WIDTH, subsequent_indent=" " * column, break_on_hyphens=False)
  if len(example) + 4 <= column:
    return (textwrap.wrap(text, initial_indent=f"  {example:<{column - 4}}  ", **wrap)
            or [f"  {example}"])
  return [f"  {example}"] + textwrap.wrap(text, initial_indent=" " * column, **wrap)


def command_help(prog: str, module: str, fv: flags.FlagValues = flags.FLAGS) -> str:
  """The `--help` text of a command: its module docstring, then the flags it accepts.

  Each flag `module` defines is one row: an example (`--name=VALUE`: the value the
  docstring's example commands give it, else one its parser accepts) and its help.
  `--config.<section>.<field>=value` is listed only when the command has a config flag
  (ml_collections), with the docstring's first such override as its example; the
  config's contents are never dumped.

  Args:
    prog: the command's name, e.g. "lev-export" (its example lines start with it).
    module: the module defining the command's flags, e.g. "lev_jax.cli.export".
    fv: the FlagValues holding them.
  Returns:
    The text, without a trailing newline.
  """
  doc = (sys.modules[module].__doc__ or prog).strip()
  examples = _doc_examples(doc, prog)
  lines = [doc, "", "Flags:"]
  for flag in sorted(fv.get_key_flags_for_module(module), key=lambda f: f.name):
    text = _MULTI_SUFFIX.sub("", flag.help)  # enum flags' help already starts <a|b|c>:
    if _is_config_flag(flag):
      override = next((f"--{n}={shlex.quote(v)}" for n, v in examples.items()
                       if n.startswith("config.") and v is not None),
                      "--config.train.steps=50")
      if isinstance(flag.parser, config_flags.config_flags.ConfigFileFlagParser):
        lines += help_row(_flag_example(flag, examples), text)
        text = "Overrides one field of that config (--config.<section>.<field>=value)."
      lines += help_row(override, text)
      continue
    lines += help_row(_flag_example(flag, examples), text)
  return "\n".join(lines)


def flags_parser(prog: str, module: str | None = None, fv: flags.FlagValues = flags.FLAGS):
  """An `app.run(flags_parser=...)` that turns flag errors into one line.

  ``--help`` prints `command_help(prog, module)` (the command's own module, e.g.
  "lev_jax.cli.prepare_data") and exits 0 (absl would print the console-script wrapper's
  empty docstring and every flag of every module). An unknown `--config.<field>` and a
  config file that does not load (`--config=FILE` is read here) end as in
  `define_or_exit`; an empty path flag (`define_path`) as `--NAME is empty ...`.
  `fv`: the FlagValues parsed (tests pass a fresh one).
  """
  def parse(argv):
    if module is not None and any(a in _HELP for a in argv[1:]):
      print(command_help(prog, module, fv))
      sys.exit(0)
    try:
      return fv(argv)
    except flags.Error as e:  # absl ends it with the config file's own "ValueError: ..."
      line = re.sub(r"^[A-Z]\w*(Error|Exception): ", "", _last_line(e))
      fail(prog, _REPEATED_FLAG.sub("", line))
    except Exception as e:  # raised by ml_collections while it loads --config=FILE
      _fail_on_config_error(prog, e, argv)
  return parse


def define_or_exit(prog: str, define) -> None:
  """Runs `define()` (flag definitions), ending a user's error in one line.

  ml_collections applies `--config.<field>=...` overrides while the config flag is
  defined (or, with `--config=FILE`, while the flags are parsed), so an unknown field
  fails there: that becomes `--config.train.stepz: the config has no field 'stepz'
  (did you mean 'steps'?)`. A config file with a Python error becomes its file and
  line. Anything else is a bug and keeps its traceback.
  """
  try:
    define()
  except Exception as e:
    _fail_on_config_error(prog, e, sys.argv)


def _overrides(argv) -> list[tuple[str, str]]:
  """(flag as given, dotted field) of each `--config.<field>` (or `--noconfig.<field>`)
  in argv, in order."""
  found = []
  for arg in argv[1:]:
    name = arg.split("=", 1)[0]
    for prefix in ("--config.", "-config.", "--noconfig.", "-noconfig."):
      if name.startswith(prefix):
        found.append((name, name[len(prefix):]))
  return found


def unknown_override(config, argv) -> str | None:
  """The one-line error for the first `--config.<path>` in argv naming no field of
  `config` (the closest existing name suggested, from difflib), or None.

  Args:
    config: the ml_collections.ConfigDict the overrides apply to.
    argv: the command line, argv[0] the program.
  Returns:
    e.g. "--config.train.stepz: the config has no field 'stepz' (did you mean
    'steps'?)"; None when every override names a field.
  """
  for given, field in _overrides(argv):
    parts = field.split(".")
    node = config
    for i, part in enumerate(parts):
      where = ".".join(["config", *parts[:i]])
      if not isinstance(node, (ml_collections.ConfigDict, dict)):
        return (f"{given}: {where} = {node!r} is a value, not a section: it has no field "
                f"{part!r}")
      keys = list(node.keys())
      if part in keys:
        node = node[part]
        continue
      if i == 0 and len(parts) > 1:
        kind, choices = "section", [k for k in keys
                                    if isinstance(node[k], (ml_collections.ConfigDict, dict))]
        listing = "the config's sections"
      else:
        kind, choices = "field", keys
        listing = f"{where}'s fields" if i else "the config's fields"
      close = difflib.get_close_matches(part, choices, n=1)
      hint = f"did you mean {close[0]!r}?" if close else f"{listing}: {', '.join(choices)}"
      return f"{given}: the config has no {kind} {part!r} ({hint})"
  return None


def _config_being_overridden(error: BaseException):
  """The ConfigDict ml_collections was applying the overrides to when `error` was
  raised: the `config` local of its config_flags frames (None if there is none)."""
  tb = error.__traceback__
  while tb is not None:
    frame = tb.tb_frame
    if frame.f_globals.get("__name__", "").startswith("ml_collections.config_flags"):
      config = frame.f_locals.get("config")
      if isinstance(config, ml_collections.ConfigDict):
        return config
    tb = tb.tb_next
  return None


def _config_file(argv) -> str | None:
  """The FILE of the last `--config=FILE[:variant]` in argv, else None."""
  path = None
  for i, arg in enumerate(argv[1:], 1):
    if arg.startswith(("--config=", "-config=")):
      path = arg.split("=", 1)[1]
    elif arg in ("--config", "-config") and i + 1 < len(argv):
      path = argv[i + 1]
  return path.split(":", 1)[0] if path else None


def config_file_error(error: BaseException, argv) -> str | None:
  """`FILE:LINE: ...` for an error raised while loading the config file, else None.

  A SyntaxError (in the file or a module it imports) names its own file and line;
  any other error names the deepest line of the `--config` file in its traceback.
  """
  if isinstance(error, SyntaxError) and error.filename:
    return (f"{error.filename}:{error.lineno}: {error.msg} (a Python syntax error in "
            "the config file)")
  path = _config_file(argv)
  if not path:
    return None
  real = os.path.realpath(os.path.expanduser(path))
  line = None
  tb = error.__traceback__
  while tb is not None:
    if os.path.realpath(tb.tb_frame.f_code.co_filename) == real:
      line = tb.tb_lineno
    tb = tb.tb_next
  if line is None:
    return None
  return f"{path}:{line}: {type(error).__name__}: {first_line(error)}"


def _not_a_config_file(path: str | None) -> str | None:
  """`--config=PATH: no such file (...)` (or `is a folder`) when PATH is not a file;
  None when it is one, or no path was given."""
  if not path or os.path.isfile(os.path.expanduser(path)):
    return None
  what = "is a folder" if os.path.isdir(os.path.expanduser(path)) else "no such file"
  return (f"--config={path}: {what} (expected a Python config file and variant, "
          "e.g. experiments/smoke.py:leviathan)")


def _fail_on_config_error(prog: str, error: Exception, argv) -> None:
  """Ends with one line for an unknown `--config.<field>` or a config file that does not
  load; re-raises anything else (a bug deserves its traceback)."""
  message = config_file_error(error, argv) or _not_a_config_file(_config_file(argv))
  if message is None and isinstance(error, (AttributeError, LookupError)) and _overrides(argv):
    config = _config_being_overridden(error)
    message = unknown_override(config, argv) if config is not None else None
    if message is None:  # the config could not be walked: the error's own words
      message = f"{_overrides(argv)[-1][0]}: {first_line(error)}"
  if message is None:
    raise error
  fail(prog, message)


def config_or_exit(prog: str):
  """flags.FLAGS.config, or one line naming the missing or broken config file."""
  try:
    config = flags.FLAGS.config
    config.get("name")  # a file that failed to load raises on first use
    return config
  except Exception as e:  # config_flags defers file errors until first access
    given = flags.FLAGS["config"].serialize().split("=", 1)[-1]
    if not given.strip():  # --config= is a path flag too (define_path)
      fail(prog, empty_message("config", "a Python config file and variant, e.g. "
                               "experiments/smoke.py:leviathan"))
    fail(prog, _not_a_config_file(given.split(":", 1)[0]) or
         f"--config={given}: {_last_line(e)}")


_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


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
