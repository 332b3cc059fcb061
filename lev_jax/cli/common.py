"""What the `lev-*` commands share: flag parsing with one-line errors, Ctrl-C as one
line, quiet logs.

Errors a user can fix (a bad flag, config file, variant or value) end the program with
`<prog>: error: <one line>` on stderr and exit status 2, never a traceback. Ctrl-C
ends it with `<prog>: interrupted (Ctrl-C) ...` and exit status 130 (`run`; while it
starts, and how it exits: lev_jax.cli.interrupt). Every flag naming a file or folder is
defined with `define_path`, which refuses an empty value.
"""

from __future__ import annotations

import contextlib
import difflib
import json
import logging as std_logging
import os
import re
import shlex
import stat
import sys
import textwrap
from collections.abc import Callable

import ml_collections
from absl import app, flags, logging
from ml_collections import config_flags

from lev_jax.cli import interrupt
from lev_jax.config import (ATTENTION_IMPLS, DTYPES, EMBEDDINGS, LOGITS_DTYPES, LOSS_IMPLS,
                            REMAT_CHOICES)
from lev_jax.experiments import file_problem
from lev_jax.workdir import (CHECKPOINTS, EXPORT_CONFIG, EXPORT_JSON, EXPORT_PARAMS, HF,
                             LADDER_CSV, LOCK, REPORT_FILES, RUN_OUTPUTS, STUDY_CSV,
                             TOKEN_COUNTS, TOKENIZER, first_non_utf8, is_prepared_data)

# The flags `define_path` defines belong to the command calling it (its --help lists
# them), not to this module.
flags.disclaim_key_flags()

INTERRUPTED_EXIT = interrupt.INTERRUPTED_EXIT  # 130: 128 + SIGINT, as a shell reports Ctrl-C
# 128 + SIGPIPE: the shell's status for a command whose reader went away (`| head`).
CLOSED_PIPE_EXIT = 141


def shown(text: str) -> str:
  """`text` with the bytes of a non-UTF-8 file name (which Python holds as lone
  surrogates, \\udcff) shown as the user typed them: \\xff."""
  try:
    return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
  except UnicodeEncodeError:  # a surrogate no file name gives: shown escaped as it is
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def fail(prog: str, message: str):
  """Ends the program: `<prog>: error: <message>` on stderr (file names' non-UTF-8 bytes
  as \\xNN), exit status 2."""
  print(f"{prog}: error: {shown(message)}", file=sys.stderr)
  sys.exit(2)


def fail_unexpected(prog: str, args: list[str], fv: flags.FlagValues | None = None):
  """Ends the program for positional `args` the command does not take: `unexpected
  arguments: ...`, and for a MaxText- or Hydra-style `NAME=VALUE` (newcomer pass 19, A36:
  `lev-train steps=100`; pass 20: `+train.steps=100`, `temperature=0.5`) the flag it
  likely means: the command's own (`--temperature=0.5`, or the one another tool's name
  means), else a config field of a command with a config (`--config.train.steps=100`),
  a value outside a fixed-choice field's list not copied in. fv: the command's flags
  (default absl's flags.FLAGS)."""
  fv = flags.FLAGS if fv is None else fv
  hint = ""
  pair = next((m for m in (re.match(r"^\+{0,2}(?:config\.)?([A-Za-z_][\w.-]*)=(.*)$", a)
                           for a in args) if m), None)
  if pair:
    name, value = pair.group(1).replace("-", "_"), pair.group(2)
    own = (name if name in fv and name != "config" else
           next((ours for ours in (_OWN_FLAG_HABITS.get(name),
                                   _FOLDER_HABITS.get(name, (None,))[0])
                 if ours and ours in fv), None))
    path = None
    if own and own != name and name in _OWN_FLAG_NOTES:  # not a rename: say what it is
      fail(prog, f"unexpected arguments: {' '.join(args)} (flags start with --; "
           f"{_OWN_FLAG_NOTES[name]})")
    if own:
      path = own
    elif "config" in fv:
      from lev_jax.config import base_config  # pylint: disable=import-outside-toplevel
      config, leaf = base_config(), name.rsplit(".", 1)[-1]
      fields = [p for p, _ in _habit_field(config, leaf) + _config_fields(config, leaf)]
      if not _is_training_config(fv):  # lev-eval (newcomer pass 21, M16, M26)
        fields = [p for p in fields if not _evaluation_ignores(p)]
      exact = f"config.{name}"
      path = exact if exact in fields else (fields[0] if fields else None)
    hint = " (flags start with --)"
    if path:
      flag, note = _suggestion(path, value, name)
      hint = f" (flags start with --: did you mean {flag}{', ' + note if note else ''}?)"
  fail(prog, f"unexpected arguments: {' '.join(args)}{hint}")


class _PathParser(flags.ArgumentParser):
  """A path flag's parser: `~` and `~user` expanded (os.path.expanduser), so every command
  reads `--output='~/x'` (quoted, or from a script) as the shell would have; newcomer pass
  11 found lev-ladder writing a folder named `~` in the current one, and lev-export
  writing under $HOME, then failing on the literal path."""

  def parse(self, argument):
    return os.path.expanduser(argument) if isinstance(argument, str) else argument

  def flag_type(self) -> str:
    return "string"


def define_path(name: str, default: str | None, help: str, *, what: str,
                fv: flags.FlagValues = flags.FLAGS) -> None:
  """Defines a string flag naming a file or folder, which may be left out but not empty;
  a leading `~` is expanded (`_PathParser`).

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
  flags.DEFINE(_PathParser(), name, default, help, flag_values=fv,
               serializer=flags.ArgumentSerializer())
  fv[name].lev_what = what  # for `--NAME: required: WHAT` (flags_parser)
  flags.register_validator(name, lambda value: value is None or bool(value.strip()),
                           message=empty_message(name, what), flag_values=fv)
  flags.register_validator(name, lambda value: value is None or not_utf8_error("", value) is None,
                           message=f"--{name} is not UTF-8 text (a byte that is not UTF-8, which "
                           "Orbax, TensorStore and ArrayRecord cannot write in a path); "
                           f"expected {what}, named in UTF-8", flag_values=fv)


def not_utf8_error(label: str, text: str) -> str | None:
  """`<label> is not valid UTF-8 (character N); expected UTF-8 text` when `text` holds
  a byte that is not UTF-8 (Python keeps such command-line bytes as lone surrogates,
  PEP 383, which every later encode to UTF-8 refuses with a traceback); else None."""
  index = first_non_utf8(text)
  if index is not None:
    return f"{label} is not valid UTF-8 (character {index + 1}); expected UTF-8 text"
  return None


def empty_message(name: str, what: str) -> str:
  """The one line for a path flag given empty: `--NAME is empty (...); expected WHAT`."""
  return f"--{name} is empty (an unset shell variable?); expected {what}"


def output_path_error(name: str, output: str, error: OSError) -> str | None:
  """`NAME=OUTPUT: cannot write in PARENT (reason); ...` for an OSError on the output
  path OUTPUT (given as flag or config field NAME, e.g. "--output"), inside it, or on a
  hidden file beside it (its lock file, a temporary folder): internal names are not the
  user's to know. None for another path, or a remote OUTPUT."""
  if not error.filename or "://" in output:
    return None
  out = os.path.abspath(os.path.expanduser(output))
  parent, base = os.path.split(out)
  path = os.path.abspath(os.fsdecode(error.filename))
  beside = os.path.dirname(path) == parent and os.path.basename(path).startswith(f".{base}")
  if not (path == out or path.startswith(out + os.sep) or beside):
    return None
  if beside and os.path.isdir(path) and path.endswith(".lock"):  # newcomer pass 13
    return (f"{name}={output}: {path}: is a folder; expected the lock file kept beside "
            f"{out} while it is written: remove that folder (or move it aside) and re-run")
  return (f"{name}={output}: cannot write in {parent} ({error.strerror or error}); "
          "expected a folder you can write to")


def _kind(path: str) -> str:
  """What the existing path `path` is, as a phrase: "a character device", "a pipe", ..."""
  mode = os.stat(path).st_mode
  for test, what in ((stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                     (stat.S_ISFIFO, "a pipe"), (stat.S_ISSOCK, "a socket"),
                     (stat.S_ISDIR, "a folder")):
    if test(mode):
      return what
  return "not a regular file"


def output_file_error(label: str, path: str) -> str | None:
  """The one line when the local file `path` (shown as `label`, e.g. "--output=r.json"),
  which a command writes through a temporary beside it and a rename, cannot be written
  there: inside lev-prepare-data's output (only it writes there); a dangling symbolic
  link (the rename would replace the link, not write where it points); something other
  than a regular file or a folder (a device such as /dev/full, a pipe, a socket: never
  read, never replaced); or an existing folder in which no file can be created (probed
  by creating and removing the write's own temporary name, .NAME.tmp-<pid>: the
  permission bits do not tell for root, a read-only mount or /proc). A folder at
  `path`, or a missing parent folder, is the caller's to name. None when it can be
  written, or for a remote URL (left to the write)."""
  if "://" in path:
    return None
  local = os.path.abspath(os.path.expanduser(path))
  prepared = _enclosing(os.path.dirname(local), _prepared_folder)
  if prepared:  # newcomer pass 8: lev-eval wrote its result into prepared data
    return _is_inside_line(label.split("=", 1)[0], path, prepared)
  if os.path.islink(local) and not os.path.exists(local):
    return (f"{label}: is a symbolic link to {os.readlink(local)}, which does not exist; "
            "expected a new path or a regular file")
  if os.path.exists(local) and not (os.path.isfile(local) or os.path.isdir(local)):
    return (f"{label}: is {_kind(local)}, not a regular file; expected a new path or a "
            "regular file")
  folder, name = os.path.split(local)
  if not os.path.isdir(folder):
    return None
  probe = os.path.join(folder, f".{name}.tmp-{os.getpid()}")  # write_bytes_atomic's
  try:
    os.close(os.open(probe, os.O_WRONLY | os.O_CREAT, 0o600))
    os.unlink(probe)
  except OSError as e:
    return (f"{label}: cannot create a file in {folder} ({e.strerror or e}); expected a "
            "folder you can write to")
  return None


# What lev-export writes in its folder (EXPORT_JSON marks one): only lev-export writes these.
EXPORT_OUTPUTS = (EXPORT_PARAMS, EXPORT_CONFIG, EXPORT_JSON, TOKENIZER, TOKEN_COUNTS, HF)


def _holds_run_outputs(folder: str, besides: str) -> bool:
  """Whether `folder` holds a run's lock or one of its outputs (RUN_OUTPUTS) other than
  `besides`: a folder named checkpoints with nothing of a run beside it is not a run's."""
  return any(os.path.exists(os.path.join(folder, n))
             for n in (LOCK, *RUN_OUTPUTS) if n != besides)


def _owner(path: str) -> str | None:
  """What owns the absolute path `path` (existing or not), as a phrase, e.g. "a run's
  saved checkpoints (...)"; None when it is not an export's (an EXPORT_OUTPUTS name
  beside EXPORT_JSON; an export also holds tokenizer/ and token_counts.npy) or a run's
  (a RUN_OUTPUTS name in a run's folder)."""
  parent, name = os.path.split(path)
  if name in EXPORT_OUTPUTS and os.path.isfile(os.path.join(parent, EXPORT_JSON)):
    if name == EXPORT_PARAMS:
      return "an export's parameters (only lev-export writes there)"
    kind = "folder" if name in (TOKENIZER, HF) else "file"
    return f"an export's own {kind} (only lev-export writes it)"
  if name in RUN_OUTPUTS and _holds_run_outputs(parent, besides=name):
    if name == CHECKPOINTS:
      return "a run's saved checkpoints (only that run's lev-train writes there)"
    kind = "folder" if RUN_OUTPUTS[name] else "file"
    return f"a run's own {kind} (only that run's lev-train writes it)"
  return None


def _enclosing(path: str, test: Callable[[str], str | None]) -> tuple[str, str] | None:
  """(the folder, test's phrase) for the nearest of `path` (local, real path taken) and
  its ancestors on which `test` returns a phrase; None when none does."""
  folder = os.path.realpath(os.path.expanduser(path))
  while True:
    what = test(folder)
    if what:
      return folder, what
    parent = os.path.dirname(folder)
    if parent == folder:
      return None
    folder = parent


def _is_inside_line(flag: str, path: str, found: tuple[str, str]) -> str:
  """`FLAG=PATH: is [inside] FOLDER, WHAT; expected ...` (FOLDER relative when PATH is)."""
  folder, what = found
  given = os.path.expanduser(path)
  shown = folder if os.path.isabs(given) else os.path.relpath(folder)
  if folder == os.path.realpath(given):
    return f"{flag}={path}: is {shown}, {what}; expected another path"
  return f"{flag}={path}: is inside {shown}, {what}; expected a path outside it"


def checkpoint_tree_error(flag: str, path: str) -> str | None:
  """The one line when the local path `path` (of flag `flag`, e.g. "--output"), a file
  or folder a command is about to write, is a file or folder a run or an export owns, or
  inside one: a RUN_OUTPUTS name in a run's folder (its checkpoints/ with its step
  folders, metrics.jsonl, eval.json, token_counts.npy, tokenizer/, tensorboard/, ...;
  a run's folder holds its lock or another of its outputs) or an EXPORT_OUTPUTS name
  beside an export's EXPORT_JSON (its params/, config.json, ...). Only lev-train and
  lev-export write there; a file added to a finished step is not in its checksums.json,
  a replaced metrics.jsonl or token_counts.npy breaks the run's evaluation. Other files
  in a run's folder (lev-eval's default lev_eval.json) are not refused, nor is a user's
  own folder named checkpoints (e.g. ~/checkpoints/run1), nor a remote URL. Symbolic
  links are followed (os.path.realpath).

  Returns:
    e.g. "--output=runs/x/checkpoints/300/e.json: is inside runs/x/checkpoints, a run's
    saved checkpoints (only that run's lev-train writes there); expected a path
    outside it".
  """
  if "://" in path:
    return None
  found = _enclosing(path, _owner)
  return found and _is_inside_line(flag, path, found)


def _export_folder(folder: str) -> str | None:
  if os.path.isfile(os.path.join(folder, EXPORT_JSON)):
    return "an export (only lev-export writes there)"
  return None


def export_folder_error(flag: str, path: str) -> str | None:
  """The one line when the local folder `path` (of flag `flag`, e.g. "--workdir") is an
  export (a folder holding EXPORT_JSON) or inside one: a run's checkpoints written there
  would mix with the export's files. None elsewhere, or for a remote URL."""
  if "://" in path:
    return None
  found = _enclosing(path, _export_folder)
  return found and _is_inside_line(flag, path, found)


def _run_folder(folder: str) -> str | None:
  """The phrase for a training run's folder: two or more of its lock and RUN_OUTPUTS (a
  lone .lock is not enough: pytest's numbered folders hold one too); or for a
  lev-prepare-data output, which holds a run's tokenizer/ and token_counts.npy too."""
  if is_prepared_data(folder):
    return "lev-prepare-data's output (prepared data; only lev-prepare-data writes there)"
  if sum(os.path.exists(os.path.join(folder, n)) for n in (LOCK, *RUN_OUTPUTS)) >= 2:
    return "a training run's folder (only its lev-train writes there)"
  return None


def within_owned_folder_error(flag: str, path: str, own: str | None = None) -> str | None:
  """The one line when the local path `path` (of flag `flag`, e.g. "--output"), a new
  folder or file a command writes, lies inside a training run's folder, an export or
  lev-prepare-data's output (its parent folder is one, or inside one: `_run_folder`,
  `_export_folder`): only their own command writes there, and a later --overwrite of
  the outer one deletes what was put inside (newcomer pass 8: an export nested in an
  export was removed without a word). `path` itself being one is the caller's to
  judge; `own` (a local folder: the run or export a command reads, e.g. lev-eval's
  --checkpoint) is allowed. None elsewhere, or for a remote URL."""
  if "://" in path:
    return None
  parent = os.path.dirname(os.path.realpath(os.path.expanduser(path)))
  found = _enclosing(parent, lambda folder: _export_folder(folder) or _run_folder(folder))
  if found and own and "://" not in own and found[0] == os.path.realpath(
      os.path.expanduser(own)):
    return None
  return found and _is_inside_line(flag, path, found)


def _prepared_folder(folder: str) -> str | None:
  return _run_folder(folder) if is_prepared_data(folder) else None


def run_folder_error(flag: str, path: str) -> str | None:
  """The one line when the local folder `path` (of flag `flag`, e.g. "--root") is a
  training run's folder or an export, or inside one (a folder holding two or more of the
  run's lock and its outputs, RUN_OUTPUTS; one holding EXPORT_JSON, named as an export
  though it holds a run's tokenizer/ and token_counts.npy too): a root holds one run
  folder per rung and a report/, never a run's or an export's own files. None
  elsewhere, or for a remote URL."""
  if "://" in path:
    return None
  found = _enclosing(path, lambda folder: _export_folder(folder) or _run_folder(folder))
  return found and _is_inside_line(flag, path, found)


# The table a report folder's writer leaves in it: the file names the command.
REPORT_TABLES = {LADDER_CSV: "lev-ladder", STUDY_CSV: "lev-study"}


def report_owner_error(flag: str, path: str, table: str,
                       source: str | None = None) -> str | None:
  """The one line when the local report folder `path` (of flag `flag`, e.g.
  "--report_dir") is not a report folder of the command writing `table` (LADDER_CSV or
  STUDY_CSV, REPORT_TABLES): a training run's folder or an export, or inside one
  (`run_folder_error`); a folder holding another command's report (that report's
  report.md and analysis.json would be replaced, its other files left: two reports
  mixed); a non-empty folder without `table` (the user's own files; hidden files aside);
  with `source` (the ladder or study file, as given, ":PIECE" included), a report whose
  analysis.json records another one (newcomer pass 10: another ladder's "0 of 4
  finished" replaced a root's report; compared by file name and piece, since the
  recorded path is as it was typed). None when it is missing, empty, or holds this
  command's own report."""
  if "://" in path:
    return None
  owned = run_folder_error(flag, path)
  if owned:
    return owned
  folder = os.path.expanduser(path)
  for other, prog in REPORT_TABLES.items():
    if other != table and os.path.exists(os.path.join(folder, other)):
      return (f"{flag}={path}: holds a {prog} report ({other}); expected an empty folder "
              f"or this command's own report folder (give another --report_dir)")
  if not os.path.isdir(folder):
    return None
  from lev_jax.ladder.reporting import report_files_error  # pylint: disable=import-outside-toplevel
  wrong_kind = report_files_error(folder, REPORT_FILES)
  if wrong_kind:
    return f"{flag}={path}: {wrong_kind}"
  if os.path.exists(os.path.join(folder, table)):
    recorded = _report_source(folder)
    if source and recorded and _source_key(recorded) != _source_key(source):
      return (f"{flag}={path}: holds the report of {recorded}, not of {source}; give "
              "another --report_dir (or move that report aside)")
    return None
  names = sorted(n for n in os.listdir(folder) if not n.startswith("."))
  if names:
    return (f"{flag}={path}: holds files that are not a {REPORT_TABLES[table]} report "
            f"(e.g. {names[0]}; no {table}); expected an empty folder or an earlier "
            f"{REPORT_TABLES[table]} report folder (give another --report_dir)")
  return None


def _report_source(folder: str) -> str | None:
  """The ladder or study file a report folder's analysis.json records, or None."""
  try:
    with open(os.path.join(folder, "analysis.json"), encoding="utf-8") as f:
      data = json.load(f)
  except (OSError, ValueError):
    return None
  value = (data.get("ladder") or data.get("study")) if isinstance(data, dict) else None
  return value if isinstance(value, str) else None


def _source_key(source: str) -> tuple[str, str]:
  """(file name, piece) of "PATH[:PIECE]"."""
  file, _, piece = source.partition(".py:")
  file = file if not piece else file + ".py"
  return os.path.basename(file), piece


def dangling_link_error(flag: str, path: str) -> str | None:
  """The one line when the local folder `path` (of flag `flag`, e.g. "--workdir"), or a
  missing folder on its way, is a symbolic link to nothing: creating it would fail with
  a bare "File exists". None otherwise, or for a remote URL.

  Returns:
    e.g. "--workdir=runs/x: is a dangling symbolic link to /gone/x; expected a folder
    (create the folder it points to, or remove the link)".
  """
  if "://" in path:
    return None
  given = os.path.abspath(os.path.expanduser(path))
  folder = given
  while not os.path.exists(folder):
    if os.path.islink(folder):
      where = "is" if folder == given else f"{folder}, a folder on its way, is"
      return (f"{flag}={path}: {where} a dangling symbolic link to {os.readlink(folder)}; "
              "expected a folder (create the folder it points to, or remove the link)")
    parent = os.path.dirname(folder)
    if parent == folder:
      return None
    folder = parent
  return None


def folder_output_error(flag: str, path: str) -> str | None:
  """The one line when the local folder `path` (of flag `flag`, e.g. "--report_dir") can
  be neither used nor created: a file is there, it is in a saved checkpoint
  (`checkpoint_tree_error`), it or a folder on its way is a dangling symbolic link
  (`dangling_link_error`), or its nearest existing ancestor is not a folder this
  process can write. None when it can be written, or for a remote URL (left to the
  write). Checked before the long work whose result goes there."""
  if "://" in path:
    return None
  inside = checkpoint_tree_error(flag, path) or dangling_link_error(flag, path)
  if inside:
    return inside
  folder = os.path.abspath(os.path.expanduser(path))
  if os.path.exists(folder) and not os.path.isdir(folder):
    return f"{flag}={path}: is a file; expected a folder"
  ancestor = folder
  while not os.path.exists(ancestor):
    ancestor = os.path.dirname(ancestor)
  if not os.path.isdir(ancestor) or not os.access(ancestor, os.W_OK | os.X_OK):
    return (f"{flag}={path}: cannot write in {ancestor}; expected a folder you can "
            "write to")
  return None


def created_folder_error(flag: str, path: str) -> str | None:
  """Creates the local folder `path` (of flag `flag`, e.g. "--root") where a command is
  about to write into it; the one line when it cannot be (a folder the permission bits
  do not forbid but the filesystem refuses, such as one under /proc) or is in a saved
  checkpoint (`checkpoint_tree_error`, nothing created then). None once it exists, or
  for a remote URL (left to the write)."""
  if "://" in path:
    return None
  inside = checkpoint_tree_error(flag, path) or dangling_link_error(flag, path)
  if inside:
    return inside
  try:
    os.makedirs(os.path.expanduser(path), exist_ok=True)
  except OSError as e:
    return (f"{flag}={path}: cannot be created ({e.strerror or e}); expected a folder "
            "you can write to")
  return None


# absl's prefix of a validator's message, "flag --NAME=VALUE: ", when the message itself
# starts with --NAME (define_path's: VALUE is blank, or not UTF-8 and shown escaped).
_REPEATED_FLAG = re.compile(r"^flag (--[\w.]+)=.*?: (?=\1 )", re.S)


INTERRUPTED = "interrupted (Ctrl-C)"  # the cause `run` names, by signal
TERMINATED = "terminated (SIGTERM)"


def run(prog: str, main, module: str,
        interrupted: str | Callable[[str], str] = "{cause}; stopped") -> None:
  """`app.run(main)` with `flags_parser(prog, module)`, ending a Ctrl-C in one line.

  A KeyboardInterrupt that reaches here (Python's default SIGINT handler raises it)
  prints `<prog>: <interrupted>` on stderr and exits with INTERRUPTED_EXIT (130) (an
  `interrupt.Terminated`, SIGTERM: "terminated (SIGTERM)" and 143), never
  a traceback; `finally` blocks and `with` exits (locks, temporary files) ran on the
  way out, then the atexit functions; the process ends without the interpreter's
  finalisation, which an XLA compile left running by the Ctrl-C would crash
  (interrupt.exit_now). Commands that save work on Ctrl-C (lev-train) handle SIGINT
  themselves.
  Output into a pipe whose reader has gone (`lev-eval --help | head`) ends the command
  quietly with CLOSED_PIPE_EXIT (141, as a shell reports a command killed by SIGPIPE),
  never a BrokenPipeError traceback (`ending_closed_pipe_quietly`).

  Args:
    prog: the command's name, e.g. "lev-eval".
    main: absl's main(argv).
    module: the command's module (for --help), e.g. "lev_jax.cli.eval".
    interrupted: the line, e.g. what was kept, with "{cause}" where the cause goes
      (INTERRUPTED or TERMINATED); or a function of the cause returning it, called
      after the signal (when what was kept depends on how far it got).
  """
  interrupt.started()
  try:
    with ending_closed_pipe_quietly():
      app.run(main, flags_parser=flags_parser(prog, module))
  except KeyboardInterrupt as e:
    terminated = isinstance(e, interrupt.Terminated)  # interrupt.terminate_as_interrupt
    cause = TERMINATED if terminated else INTERRUPTED
    line = interrupted(cause) if callable(interrupted) else interrupted.format(cause=cause)
    print(f"{prog}: {line}", file=sys.stderr)
    interrupt.exit_now(interrupt.TERMINATED_EXIT if terminated else INTERRUPTED_EXIT)


@contextlib.contextmanager
def ending_closed_pipe_quietly():
  """Ends the program with CLOSED_PIPE_EXIT, printing nothing, when stdout's reader has
  gone (BrokenPipeError, e.g. `lev-train --help | head -1`).

  stdout is flushed on the way out (a normal end or sys.exit), so that an error of
  buffered output surfaces here; then it is pointed at os.devnull, so that Python's
  own flush at exit cannot raise it again (the recipe of Python's `signal` docs).
  """
  try:
    try:
      yield
    finally:
      sys.stdout.flush()
  except BrokenPipeError:
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    sys.exit(CLOSED_PIPE_EXIT)


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
  docstring's example commands give it, else one its parser accepts) and its help; a
  boolean flag that is on by default is listed as `--noNAME`, its help after
  "Turns off (default on): ".
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
    if isinstance(flag, flags.BooleanFlag) and flag.default:  # listed as --noNAME
      text = f"Turns off (default on): {text}"
    lines += help_row(_flag_example(flag, examples), text)
  return "\n".join(lines)


def flags_parser(prog: str, module: str | None = None, fv: flags.FlagValues = flags.FLAGS):
  """An `app.run(flags_parser=...)` that turns flag errors into one line.

  ``--help`` prints `command_help(prog, module)` (the command's own module, e.g.
  "lev_jax.cli.prepare_data") and exits 0 (absl would print the console-script wrapper's
  empty docstring and every flag of every module). An unknown `--config.<field>` and a
  config file that does not load (`--config=FILE` is read here) end as in
  `define_or_exit`; an empty path flag (`define_path`) as `--NAME is empty ...`; an
  override naming a section or given no value as `override_value_error` words it.
  `fv`: the FlagValues parsed (tests pass a fresh one).
  """
  def parse(argv):
    if module is not None and any(a in _HELP for a in argv[1:]):
      print(command_help(prog, module, fv))
      sys.exit(0)
    argv = config_first(argv)
    if "config" in fv and isinstance(fv["config"].parser,
                                     config_flags.config_flags.ConfigFileFlagParser):
      given = _config_given(argv)
      if given == "":  # newcomer pass 13: ml_collections' traceback
        fail(prog, empty_message("config", _CONFIG_EXAMPLE))
      if (given or "").startswith(":"):  # newcomer pass 14: `--config=$FILE:tied`
        fail(prog, f"--config={given}: the file part is empty (an unset shell "
             f"variable?); expected {_CONFIG_EXAMPLE}")
      unreadable = _not_a_config_file(_config_file(argv))  # before ml_collections reads
      if unreadable:  # it: /dev/zero would be read until memory runs out
        fail(prog, unreadable)
    elif ("config" in fv and _is_config_flag(fv["config"])
          and _config_given(argv) is not None):  # a config dict: lev-eval's overrides
      fail(prog, f"--config={_config_given(argv)}: {prog} takes no config file: it uses "
           "the checkpoint's own config; change its fields with "
           "--config.<section>.<field>=VALUE (e.g. --config.eval.batches=4)")
    try:
      rest = fv(argv)
    except SystemExit as e:  # newcomer pass 10: get_config called sys.exit(0): exit 0
      fail(prog, f"--config={_config_file(argv) or '?'}: get_config called sys.exit("
           f"{e.code!r}) instead of returning a config; expected it to return an "
           "ml_collections.ConfigDict")
    except flags.Error as e:  # absl ends it with the config file's own "ValueError: ..."
      line = re.sub(r"^[A-Z]\w*(Error|Exception): ", "", _last_line(e))
      fail(prog, _get_config_raised(e, argv) or override_value_error(argv, fv)
           or _bad_override_value(e, fv)
           or _override_without_config(e, fv) or _folder_habit(e, fv)
           or _own_flag_habit(e, fv) or _launcher_flag(e, fv)
           or _config_field_hint(e, fv)
           or _required_flag(e, fv) or _REPEATED_FLAG.sub("", line))
    except Exception as e:  # raised by ml_collections while it loads --config=FILE
      _fail_on_config_error(prog, e, argv)
    problem = override_value_error(argv, fv)  # a text field takes the next flag silently
    if problem:
      fail(prog, problem)
    for line in flags_given_twice(argv, fv):
      logging.warning("%s", line)
    return rest
  return parse


def _times(n: int) -> str:
  return "twice" if n == 2 else f"{n} times"


def flags_given_twice(argv, fv: flags.FlagValues) -> list[str]:
  """`--checkpoint given twice (/a, /b); using the last, /b` for each flag of `fv`
  (config overrides included) that argv, before `--`, sets more than once to different
  values: absl keeps the last without a word (newcomer pass 14, P01-P03: an edited
  command line, or a wrapper adding a flag). Flags that take a list (absl's multi
  flags) and `--config=FILE` (refused by `config_given_twice`) are left out."""
  args = list(argv[1:])
  args = args[:args.index("--")] if "--" in args else args
  if any(a.lstrip("-").startswith("flagfile") for a in args):  # its flags in place
    try:  # (newcomer pass 15, F11: a flag in --flagfile and again on the command line)
      args = fv.read_flags_from_files(args, force_gnu=False)
    except (flags.Error, OSError):  # absl names an unreadable flag file itself
      pass
  given: dict[str, list[str]] = {}
  i = 0
  while i < len(args):
    arg, i = args[i], i + 1
    if not arg.startswith("-") or arg in ("-", "--"):
      continue
    name, eq, value = arg.lstrip("-").partition("=")
    if not eq:
      if name in fv and isinstance(fv[name], flags.BooleanFlag):
        value = "true"
      elif name.startswith("no") and name[2:] in fv and isinstance(fv[name[2:]],
                                                                   flags.BooleanFlag):
        name, value = name[2:], "false"
      elif name in fv and i < len(args):  # `--name value`
        value, i = args[i], i + 1
      else:
        continue
    if name not in fv or name == "config" or isinstance(fv[name], flags.MultiFlag):
      continue
    given.setdefault(name, []).append(value)
  return [f"--{name} given {_times(len(values))} ({', '.join(values)}); using the last, "
          f"{values[-1]}" for name, values in given.items() if len(set(values)) > 1]


# absl's words for a config file whose get_config raised (ml_collections config_flags).
_PARSING_CONFIG = "Error whilst parsing config file"
_TRACEBACK_LINE = re.compile(r'File "(.+)", line (\d+)')


def _get_config_raised(error: flags.Error, argv) -> str | None:
  """`FILE:LINE: get_config raised ValueError: boom` when `error` is absl reporting that
  the config file's get_config raised (its message ends with that traceback's text;
  newcomer pass 9: the line was only "boom"); None for another error."""
  path = _config_file(argv)
  text = str(error)
  if not path or _PARSING_CONFIG not in text:
    return None
  own = re.sub(r"^[A-Z]\w*(Error|Exception): ", "", _last_line(error))
  if os.path.basename(path) in own:  # the file's own words name it (an unknown variant)
    return own
  real = os.path.realpath(os.path.expanduser(path))
  line = None
  for m in _TRACEBACK_LINE.finditer(text):
    if os.path.realpath(m.group(1)) == real:
      line = m.group(2)
  where = f"{path}:{line}" if line else f"--config={path}"
  return f"{where}: get_config raised {_last_line(error)}"


def config_given_twice(argv) -> str | None:
  """`--config given twice (A, B); give one` when argv (before `--`) holds more than one
  `--config=FILE` (absl keeps the last without a word: newcomer pass 14), else None."""
  given = _config_values(argv)
  if len(given) < 2:
    return None
  return f"--config given {len(given)} times ({', '.join(given)}); give one"


def config_first(argv: list[str]) -> list[str]:
  """argv with every `--config=FILE` (or `--config FILE`) moved to the front.

  ml_collections applies `--config.<field>` overrides to the file's config, and refuses
  one given before the file ("Found --config.train.steps=3 in argv before a value for
  --config was specified"); the order of the other flags does not matter, so the file
  goes first and `--config.train.steps=3 --config=FILE` means what it says. A leading
  `~` of FILE is expanded, as in every path flag (`_PathParser`; newcomer pass 12:
  `--config='~/x.py:tied'` was read as a file named `~`). Arguments after `--` stay
  where they are.
  """
  args = list(argv[1:])
  end = args.index("--") if "--" in args else len(args)
  files, rest, i = [], [], 0
  while i < end:
    if args[i].startswith(("--config=", "-config=")):
      name, _, value = args[i].partition("=")
      files.append(f"{name}={_expand_config_file(value)}")
    elif args[i] in ("--config", "-config") and i + 1 < end:
      files += [args[i], _expand_config_file(args[i + 1])]
      i += 1
    else:
      rest.append(args[i])
    i += 1
  return [*argv[:1], *files, *rest, *args[end:]]


def _expand_config_file(value: str) -> str:
  """`FILE[:VARIANT]` with a leading `~` of FILE expanded (os.path.expanduser)."""
  return os.path.expanduser(value) if value.startswith("~") else value


# absl's message for a value that a flag's (or an override's) parser refused:
# "flag --config.x.y=V: ..." / "flag --restore_fallback=maybe: ('Non-boolean ...', ...)"
_BAD_OVERRIDE = re.compile(r"^flag --([\w.]+)=(.*?): ", re.S)
# absl's message for a flag marked required (flags.mark_flags_as_required) left out.
_REQUIRED = re.compile(r"Flag --([\w.]+) must have a value other than None")
_EXPECTED = ((flags.BooleanParser, "true or false"), (flags.IntegerParser, "an integer"),
             (flags.FloatParser, "a number"))


def _section_example(section) -> str:
  """`FIELD=VALUE` for the first field of `section` holding a plain value (its current
  value), else `FIELD=VALUE`."""
  for key, value in section.items():
    if isinstance(value, (bool, int, float, str)) and value != "":
      text = str(value).lower() if isinstance(value, bool) else str(value)
      return f"{key}={shlex.quote(text)}"
  return "FIELD=VALUE"


def _is_number(arg: str) -> bool:
  try:
    float(arg)
    return True
  except ValueError:
    return False


def _config_node(fv: flags.FlagValues, path: str):
  """The node at dotted `path` ("config.train") of fv.config, None where there is none
  (or the config did not load)."""
  try:
    node = fv["config"].value
    for part in path.split(".")[1:]:
      node = node[part]
    return node
  except Exception:  # pylint: disable=broad-except
    return None


def override_value_error(argv, fv: flags.FlagValues) -> str | None:
  """One line for the first `--config.<path>` in argv that names a whole section
  (`--config.train=5`, `--config.train`) or that is given no value: last in argv, or
  followed by a flag, which absl takes as its value (`--config.train.steps --workdir=X`
  sets steps to "--workdir=X", and a text field keeps it silently); a boolean field
  needs no value. Each line gives an example; None when every override is well formed.

  Args:
    argv: the command line, argv[0] the program.
    fv: the FlagValues parsed (ml_collections registers a flag per override).
  """
  args = argv[1:]
  for i, arg in enumerate(args[:args.index("--") if "--" in args else len(args)]):
    name, eq, value = arg.partition("=")
    path = name.lstrip("-")
    if not name.startswith(("--config.", "-config.")) or path not in fv:
      continue
    section = _config_node(fv, path)
    if isinstance(section, (ml_collections.ConfigDict, dict)):
      return (f"{name}{eq}{value}: {path} is a section, not a field: give one of its "
              f"fields a value, e.g. {name}.{_section_example(section)}")
    nxt = args[i + 1] if i + 1 < len(args) else None
    a_flag = nxt is not None and nxt.startswith("-") and not _is_number(nxt)
    if eq or fv[path].boolean or (nxt is not None and not a_flag):
      continue
    took = f" (absl took the next flag, {nxt}, as its value)" if nxt else ""
    default = fv[path].default  # the config file's value (.value: the one absl took)
    example = "VALUE" if default in (None, "") else shlex.quote(str(default))
    return f"{name} has no value{took}; expected {name}=VALUE, e.g. {name}={example}"
  return None


def _bad_override_value(error: flags.Error, fv: flags.FlagValues) -> str | None:
  """`--config.train.steps=abc: expected an integer (config.train.steps is 300)` for a
  value the field's parser refused (ml_collections' own words name neither the type nor
  the field's value), `--restore_fallback=maybe: expected true or false` for a command's
  own flag (absl's words are a Python tuple); None for another error."""
  m = _BAD_OVERRIDE.match(str(error))
  if not m or m.group(1) not in fv:
    return None
  flag = fv[m.group(1)]
  expected = next((text for kind, text in _EXPECTED if isinstance(flag.parser, kind)), None)
  if expected is None:
    return None
  try:  # a value of the right type refused by a bound: absl's own words name the bound
    getattr(flag.parser, "convert", flag.parser.parse)(m.group(2))
    return None
  except (ValueError, TypeError):
    pass
  if not m.group(1).startswith("config."):
    return f"--{m.group(1)}={m.group(2)}: expected {expected}"
  return f"--{m.group(1)}={m.group(2)}: expected {expected} ({m.group(1)} is {flag.value!r})"


def _required_flag(error: flags.Error, fv: flags.FlagValues) -> str | None:
  """`--root: required: the folder holding ...` for a required flag left out (absl:
  "flag --root=None: Flag --root must have a value other than None."); the flag's
  `define_path` WHAT, else its help; None for another error."""
  m = _REQUIRED.search(str(error))
  if not m or m.group(1) not in fv:
    return None
  flag = fv[m.group(1)]
  return f"--{flag.name}: required: {getattr(flag, 'lev_what', None) or flag.help}"


def _override_without_config(error: flags.Error, fv: flags.FlagValues) -> str | None:
  """`--config.data.seed: ... needs --config=FILE` for an override given to a command
  whose config has no default (lev-prepare-data) when --config was left out, or `...
  takes no config overrides` for a command without a config (lev-sample): absl knows
  no such flag then ("Unknown command line flag 'config.data.seed'")."""
  if not (isinstance(error, flags.UnrecognizedFlagError)
          and error.flagname.startswith("config.")):
    return None
  if "config" not in fv:  # lev-sample, lev-export (newcomer pass 21, M07, M09)
    leaf = error.flagname.rsplit(".", 1)[-1]
    if leaf in fv:
      why = f"its own flag is --{leaf}"
    elif "train_flags" in fv:  # lev-ladder, lev-study
      why = f"pass it to the runs in --train_flags='--{error.flagname}=...'"
    elif "checkpoint" in fv:
      why = "it uses the checkpoint's own config"
    else:
      return None
    return f"--{error.flagname}: this command takes no config overrides; {why}"
  if not (_is_config_flag(fv["config"]) and fv["config"].default is None
          and not fv["config"].present):
    return None
  return (f"--{error.flagname}: an override needs the config it changes: give "
          "--config=FILE:VARIANT too, e.g. --config=experiments/ladder.py:tied_1.2b")


def _config_fields(config, leaf: str, prefix: str = "config") -> list[tuple[str, object]]:
  """(dotted path, value) of every field named `leaf` in `config`, depth first."""
  found = []
  for key, value in config.items():
    if isinstance(value, (ml_collections.ConfigDict, dict)):
      found += _config_fields(value, leaf, f"{prefix}.{key}")
    elif key == leaf:
      found.append((f"{prefix}.{key}", value))
  return found


def _command_config(fv: flags.FlagValues):
  """The command's config (its --config flag's value), else the base config (every
  experiment has its fields); None for a command without a config flag."""
  if "config" not in fv or not _is_config_flag(fv["config"]):
    return None
  try:
    config = fv["config"].value
    if isinstance(config, ml_collections.ConfigDict):
      return config
  except Exception:  # pylint: disable=broad-except  # a file that does not load
    pass
  from lev_jax.config import base_config  # pylint: disable=import-outside-toplevel
  return base_config()


# Flags other codebases train with (nanoGPT, Hugging Face, MaxText, Levanter) and the
# config field each means here; named first by `_config_field_hint` (newcomer pass 13:
# --batch_size was pointed at eval.batch_size, --max_iters at nothing).
_HABITS = {
    "batch_size": "train.global_batch_size", "max_iters": "train.steps",
    "max_steps": "train.steps", "num_steps": "train.steps", "total_steps": "train.steps",
    "train_steps": "train.steps", "num_train_steps": "train.steps",
    "learning_rate": "optim.lr", "warmup_iters": "optim.warmup_steps",
    "num_warmup_steps": "optim.warmup_steps", "block_size": "train.seq_len",
    "seq_length": "train.seq_len", "max_seq_length": "train.seq_len",
    "max_target_length": "train.seq_len", "context_length": "train.seq_len",
    "eval_iters": "eval.batches",
    # MaxText's eval_steps is a count of batches, Hugging Face's an interval (nc19 A20)
    "eval_steps": ("eval.batches", "train.eval_every"),
    "steps_per_eval": "train.eval_every", "max_length": "train.seq_len",  # nc19 A24, A10
    "ici_data_parallelism": "mesh.data", "ici_fsdp_parallelism": "mesh.fsdp",  # MaxText
    "ici_tensor_parallelism": "mesh.tensor", "dcn_data_parallelism": "mesh.dcn_data",
    "dcn_fsdp_parallelism": "mesh.dcn_fsdp", "bf16": "model.dtype", "fp16": "model.dtype",
    # Hugging Face's and MaxText's shape names (newcomer pass 20, N01, N02)
    "num_key_value_heads": "model.n_kv_heads", "num_kv_heads": "model.n_kv_heads",
    "intermediate_size": "model.d_ff", "mlp_dim": "model.d_ff", "ffn_dim": "model.d_ff",
    # an absolute learning rate elsewhere, a ratio here: the value is not copied
    "min_lr": "optim.min_lr_ratio", "lr_min": "optim.min_lr_ratio",  # nc21 N05, M04, M22
    "final_lr": "optim.min_lr_ratio", "min_learning_rate": "optim.min_lr_ratio",  # nc22
    "eval_interval": "train.eval_every", "log_interval": "train.log_every",
    "save_interval": "train.checkpoint_every", "checkpoint_period": "train.checkpoint_every",
    "gradient_accumulation_steps": "train.grad_accum_steps",
    "grad_clip": "optim.clip_norm", "max_grad_norm": "optim.clip_norm",
    "per_device_train_batch_size": "train.global_batch_size",  # x devices: per step here
    "per_device_batch_size": "train.global_batch_size",
    "remat_policy": "model.remat", "gradient_checkpointing": "model.remat",
    "activation_checkpointing": "model.remat", "remat": "model.remat",  # nc18 F06, F07
    "save_steps": "train.checkpoint_every", "logging_steps": "train.log_every",  # F04, F05
    "train_batch_size": "train.global_batch_size", "eval_batch_size": "eval.batch_size",
    "per_device_eval_batch_size": "eval.batch_size",
    "n_layer": "model.n_layers", "num_layers": "model.n_layers",
    "num_hidden_layers": "model.n_layers", "n_head": "model.n_heads",
    "num_attention_heads": "model.n_heads", "n_embd": "model.d_model",
    "hidden_size": "model.d_model", "emb_dim": "model.d_model",
}


# Flags other codebases name a run's folder, its resume or its config file with, the
# flag of ours they mean, and what to say (newcomer pass 14: --out_dir was pointed at
# absl's --log_dir; pass 16, G35: --config_path at config.optim.warmup_steps).
_FOLDER_HABITS = {
    "out_dir": ("workdir", "the run's folder is --workdir=DIR"),
    "output_dir": ("workdir", "the run's folder is --workdir=DIR"),
    "resume_from_checkpoint": ("workdir", "lev-train resumes from --workdir's latest "
                               "checkpoint by itself (give the run's --workdir)"),
    "init_from": ("workdir", "lev-train resumes from --workdir's latest checkpoint by "
                  "itself (a new --workdir starts from scratch)"),
    # MaxText's run folder (newcomer pass 19, A34, A35)
    "base_output_directory": ("workdir", "the run's folder is --workdir=DIR"),
    "run_name": ("workdir", "the run's folder is --workdir=DIR (its name is the run's)"),
    # lev-compile's slice (A65-A67)
    **{name: ("topology", "the slice is --topology=NAME (e.g. --topology=v5p-128 or "
              "v5p:2x2x1)") for name in ("accelerator_type", "compile_topology",
                                         "tpu_type")},
    **{name: ("config", "the config is --config=FILE:VARIANT (e.g. "
              "--config=experiments/smoke.py:leviathan)")
       for name in ("config_path", "config_file", "config_name", "gin_file")},
}


# Flags of other tools (OpenAI / vLLM / Hugging Face generate, the launchers) and this
# command's flag of that meaning (newcomer pass 14, H06: lev-sample --max_tokens=4).
_OWN_FLAG_HABITS = {
    "max_tokens": "max_new_tokens", "max_length": "max_new_tokens",
    "num_tokens": "max_new_tokens", "temp": "temperature", "ckpt": "checkpoint",
    "checkpoint_dir": "checkpoint", "model_path": "checkpoint", "model": "checkpoint",
    "prompts": "prompt", "model_name_or_path": "checkpoint",
    "do_sample": "temperature", "greedy": "temperature",
    "tasks": "checkpoint",  # lev-eval --tasks (its --checkpoint: a command of runs)
}
# What to add when the meant flag is not a rename (newcomer pass 18, F10; 19, A58, A79).
_OWN_FLAG_NOTES = {
    "do_sample": "sampling is --temperature > 0; 0, the default, is greedy",
    "greedy": "greedy decoding is --temperature=0, the default",
    "tasks": "downstream tasks are lev-lm-eval's (lev-lm-eval --model_args "
             "checkpoint=DIR --tasks=NAME,...)"}


def _own_flag_habit(error: flags.Error, fv: flags.FlagValues) -> str | None:
  """`unknown flag --max_tokens (did you mean --max_new_tokens?)` when another tool's
  name for one of this command's flags (`_OWN_FLAG_HABITS`) was given; else None."""
  if not isinstance(error, flags.UnrecognizedFlagError):
    return None
  name = error.flagname.replace("-", "_")  # --max-tokens (newcomer pass 19, A68-A70)
  ours = _OWN_FLAG_HABITS.get(name)
  if not ours or ours not in fv or name in fv:  # lev-lm-eval has --tasks itself
    return None
  note = _OWN_FLAG_NOTES.get(name)
  return (f"unknown flag --{error.flagname}: {note}" if note
          else f"unknown flag --{error.flagname} (did you mean --{ours}?)")


# The launchers' own flags (launch/slurm.py, launch/tpu.py, launch/local.py), which
# lev-ladder passes on in --launcher_flags (newcomer pass 14, C13: --venv= given to
# lev-ladder was absl's bare line).
_LAUNCHER_FLAGS = frozenset((
    "accelerator_type", "account", "chdir", "constraint", "cpus_per_task",
    "devices_per_process", "env", "exclusive", "gpus_per_node", "grace_s", "job_name",
    "max_requeues", "max_restarts", "mem", "module", "network", "nodes", "num_processes",
    "partition", "poll_s", "port", "preemptible", "project", "qos", "queued", "repo",
    "requeue", "reserved", "runtime_version", "sbatch_line", "service_account",
    "signal_s", "spot", "subnetwork", "time", "venv", "zone"))


def _launcher_flag(error: flags.Error, fv: flags.FlagValues) -> str | None:
  """`unknown flag --venv: a launcher's flag; pass it in --launcher_flags` for a command
  that passes flags on to a launcher (lev-ladder); None otherwise."""
  if (not isinstance(error, flags.UnrecognizedFlagError) or "launcher_flags" not in fv
      or error.flagname not in _LAUNCHER_FLAGS):
    return None
  given = str(error.flagvalue or "")
  given = given if "=" in given else f"--{error.flagname}=..."
  return (f"unknown flag --{error.flagname}: a launcher's flag; pass it in "
          f"--launcher_flags={shlex.quote(given)} (with --launcher=slurm, tpu or local)")


def _folder_habit(error: flags.Error, fv: flags.FlagValues) -> str | None:
  """`unknown flag --out_dir: the run's folder is --workdir=DIR` for a command with the
  flag it means (`_FOLDER_HABITS`: --workdir, --config); None otherwise."""
  if not isinstance(error, flags.UnrecognizedFlagError):
    return None
  ours, hint = _FOLDER_HABITS.get(error.flagname.replace("-", "_"), (None, None))
  return f"unknown flag --{error.flagname}: {hint}" if ours and ours in fv else None


def _is_training_config(fv: flags.FlagValues) -> bool:
  """Whether the command's --config is a training's config file (lev-train, lev-compile,
  ...), not lev-eval's overrides of a checkpoint's own config."""
  return "config" in fv and isinstance(fv["config"].parser,
                                       config_flags.config_flags.ConfigFileFlagParser)


def _evaluation_ignores(path: str) -> bool:
  """Whether lev-eval refuses an override of `path` ("config.SECTION.FIELD"): a field
  only training reads (lev_jax/eval/checkpoint_eval.py `training_only`)."""
  from lev_jax.eval.checkpoint_eval import training_only  # pylint: disable=import-outside-toplevel
  return training_only(path[len("config."):])


# The fields whose values are a fixed list: a hint never proposes another value.
_CHOICES = {"config.model.remat": REMAT_CHOICES, "config.model.attention": ATTENTION_IMPLS,
            "config.model.dtype": DTYPES, "config.train.loss_impl": LOSS_IMPLS,
            "config.model.embedding": EMBEDDINGS, "config.model.logits_dtype": LOGITS_DTYPES}


def _suggestion(path: str, value: str, given: str) -> tuple[str, str]:
  """(`--PATH=VALUE`, a note or "") to suggest for `value` given as `given` (another
  codebase's name, or a positional NAME=VALUE), never copying in what cannot be right:
  a value outside a fixed-choice field's list (`_CHOICES`: VALUE and the choices; pass 19,
  A39, A90) or an absolute rate for optim.min_lr_ratio (RATIO; passes 21-22)."""
  if path == "config.optim.min_lr_ratio" and not given.endswith("min_lr_ratio"):
    return f"--{path}=RATIO", "the final learning rate / optim.lr"
  allowed = _CHOICES.get(path)
  if allowed and value not in allowed:
    return f"--{path}=VALUE", f"one of {', '.join(allowed)}"
  return f"--{path}={shlex.quote(value)}", ""


def _bool_misfit(current, value: str | None) -> bool:
  """Whether `value` cannot set a bool field (newcomer pass 18, F06: --remat=full was
  offered as --config.lev.remat=full)."""
  return (isinstance(current, bool) and value is not None
          and value.lower() not in ("true", "false", "1", "0", "yes", "no"))


def _habit_field(config, name: str) -> list[tuple[str, object]]:
  """[("config.SECTION.FIELD", its value)] for a flag of another codebase (`_HABITS`)
  whose fields this config has, in `_HABITS`'s order; [] otherwise."""
  paths = _HABITS.get(name, ())
  found = []
  for path in (paths,) if isinstance(paths, str) else paths:
    node = config
    for part in path.split("."):
      if not isinstance(node, (ml_collections.ConfigDict, dict)) or part not in node:
        break
      node = node[part]
    else:
      found.append((f"config.{path}", node))
  return found


def _config_field_hint(error: flags.Error, fv: flags.FlagValues) -> str | None:
  """For an unknown `--NAME[=VALUE]` where NAME is a config field's name (`--steps=3`)
  or another codebase's name for one (`--max_iters=3`, `_HABITS`): `unknown flag
  --steps; to set the config field, pass --config.train.steps=3` (each field of that
  name listed, the habit's first); None otherwise (absl's own message stands)."""
  if not isinstance(error, flags.UnrecognizedFlagError):
    return None
  config = _command_config(fv)
  if config is None:
    return None
  name, given = error.flagname, str(error.flagvalue or "")
  value = given.split("=", 1)[1] if "=" in given else None
  dashed = name.replace("-", "_")  # --save-steps (newcomer pass 19, A68-A70)
  # Levanter's dotted form (--trainer.num_train_steps): its last part (pass 16, G34).
  base = (dashed.rsplit(".", 1)[-1] if "." in dashed and not dashed.startswith("config.")
          else dashed)
  # A training's config file (lev-train, lev-compile, ...); lev-eval's overrides take
  # the eval section's fields only (pass 16, G41: --eval_steps).
  training = _is_training_config(fv)
  habit = [f for f in _habit_field(config, base)
           if training or f[0].startswith("config.eval.")]
  fields = habit + [f for f in _config_fields(config, base) if f[0] not in dict(habit)
                    and not _bool_misfit(f[1], value)]
  if not training:  # lev-eval: never a field it refuses (newcomer pass 21, F15, M32)
    fields = [f for f in fields if not _evaluation_ignores(f[0])]
  off = False
  if not fields and base.startswith("no") and value is None and training:  # --noremat
    # a switch off: false for a bool field, "none" for a policy (model.remat; pass 17,
    # C11: --noremat was pointed at lev.remat alone)
    fields = sorted(((path, v) for path, v in _config_fields(config, base[2:])
                     if isinstance(v, bool) or v == "none" or path == "config.model.remat"),
                    key=lambda f: isinstance(f[1], bool))  # a policy's "none" first
    off = True
  if not fields:
    return None
  def example(path, current):
    if off:
      return "false" if isinstance(current, bool) else "none"
    if path == "config.model.remat":
      # a switch given for the policy (pass 17, C13; pass 18, F06; bare, pass 19, A06,
      # A12): on is full, off none
      return {"true": "full", "1": "full", "false": "none", "0": "none"}.get(
          (value or "true").lower(), value)
    if path == "config.model.dtype" and base in ("bf16", "fp16") and value is None:
      return {"bf16": "bfloat16", "fp16": "float16"}[base]  # pass 19, A83, A85
    if value is not None:
      return value
    return "true" if isinstance(current, bool) else "VALUE"
  def option(path, current):
    flag, note = _suggestion(path, example(path, current), base)
    return f"{flag} ({note})" if note else flag
  options = [option(path, current) for path, current in fields]
  # The command's own flags that absl found close (lev-eval --steps: --step).
  close = re.search(r"Did you mean: (.*) \?$", str(error))
  own = [f"--{f.strip()}" for f in (close.group(1).split(",") if close else [])
         if not f.strip().startswith("config.")]
  head = f"unknown flag --{name}" + (f" (did you mean {' or '.join(own)}?)" if own else "")
  if base.startswith("per_device_"):  # HF counts a batch per device, lev_jax per step
    options[0] += " (the batch of a step over all devices: per device x devices)"
  if len(options) == 1:
    return f"{head}; to set the config field, pass {options[0]}"
  return f"{head}; to set a config field, pass one of {', '.join(options)}"


def define_or_exit(prog: str, define) -> None:
  """Runs `define()` (flag definitions), ending a user's error in one line.

  ml_collections applies `--config.<field>=...` overrides while the config flag is
  defined (or, with `--config=FILE`, while the flags are parsed), so an unknown field
  fails there: that becomes `--config.train.stepz: the config has no field 'stepz'
  (did you mean 'steps'?)`. A config file with a Python error becomes its file and
  line. Anything else is a bug and keeps its traceback. `--config=FILE` is moved before
  the overrides first (`config_first`).
  """
  twice = config_given_twice(sys.argv)  # before ml_collections keeps the last
  if twice:
    fail(prog, twice)
  sys.argv[:] = config_first(sys.argv)  # ml_collections reads sys.argv when defining
  try:
    define()
  except Exception as e:
    _fail_on_config_error(prog, e, sys.argv)


def override_fields(argv) -> list[tuple[str, str]]:
  """(flag as given, dotted field) of each `--config.<field>` (or `--noconfig.<field>`)
  in argv, in order."""
  found = []
  for arg in argv[1:]:
    name = arg.split("=", 1)[0]
    for prefix in ("--config.", "-config.", "--noconfig.", "-noconfig."):
      if name.startswith(prefix):
        found.append((name, name[len(prefix):]))
  return found


def unknown_override(config, argv, evaluation: bool = False) -> str | None:
  """The one-line error for the first `--config.<path>` in argv naming no field of
  `config` (the closest existing name suggested, from difflib), or None.

  Args:
    config: the ml_collections.ConfigDict the overrides apply to.
    argv: the command line, argv[0] the program.
    evaluation: the command evaluates a checkpoint (EVALUATION_COMMANDS): a field of
      that name elsewhere is named only if the evaluation reads it.
  Returns:
    e.g. "--config.train.stepz: the config has no field 'stepz' (did you mean
    'steps'?)"; None when every override names a field.
  """
  for given, field in override_fields(argv):
    parts = field.split(".")
    node = config
    for i, part in enumerate(parts):
      where = ".".join(["config", *parts[:i]])
      if not isinstance(node, (ml_collections.ConfigDict, dict)):
        elsewhere = [path for path, _ in _config_fields(config, parts[-1])]
        hint = f" (did you mean --{elsewhere[0]}?)" if len(elsewhere) == 1 else ""
        return (f"{given}: {where} = {node!r} is a value, not a section: it has no field "
                f"{part!r}{hint}")
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
      # a field of that name in another section, or another codebase's name for one
      # (newcomer pass 19, A71: --config.train.save_steps; A73: --config.train.remat)
      meant = []
      if kind == "field" and i == len(parts) - 1:
        meant = ([p for p, _ in _habit_field(config, part)]
                 or [p for p, _ in _config_fields(config, part)])
        if evaluation:  # lev-eval: never a field it refuses (pass 22, N70, N72, V03)
          meant = [p for p in meant if not _evaluation_ignores(p)]
      close = difflib.get_close_matches(part, choices, n=1)
      if meant:
        hint = f"did you mean --{meant[0]}?"
      else:
        hint = f"did you mean {close[0]!r}?" if close else f"{listing}: {', '.join(choices)}"
      return f"{given}: the config has no {kind} {part!r} ({hint})"
  return None


_NOTHING = object()


def _overridden_object(error: BaseException):
  """What ml_collections was applying the overrides to when `error` was raised: the
  `config` local of its config_flags frames (`_NOTHING` if there is none; a get_config
  returning None gives None)."""
  tb = error.__traceback__
  found = _NOTHING
  while tb is not None:
    frame = tb.tb_frame
    if (frame.f_globals.get("__name__", "").startswith("ml_collections.config_flags")
        and "config" in frame.f_locals):
      found = frame.f_locals["config"]
      if found is not None:
        return found
    tb = tb.tb_next
  return found


def _config_being_overridden(error: BaseException):
  """The ConfigDict ml_collections was applying the overrides to when `error` was
  raised (None if there is none, or it is not a ConfigDict)."""
  config = _overridden_object(error)
  return config if isinstance(config, ml_collections.ConfigDict) else None


def _not_a_config_dict_line(given: str, value) -> str:
  """`--config=GIVEN: get_config returned an int; expected an ml_collections.ConfigDict
  ...` for a get_config whose result `value` is not a ConfigDict."""
  from lev_jax.config import type_phrase  # pylint: disable=import-outside-toplevel
  what = type_phrase(value)
  if _frozen(value):
    what += ", which no override or command can change"
  return (f"--config={given}: get_config returned {what}; expected an "
          "ml_collections.ConfigDict (e.g. config.base_config() with fields changed, as "
          "experiments/smoke.py builds them)")


def _overrides_on_a_non_config(error: BaseException, argv) -> str | None:
  """`_not_a_config_dict_line` when `error` is ml_collections failing to apply an
  override to a get_config result that is not a ConfigDict (newcomer pass 8: an int
  with --config.train.steps=3 was "Attribute <class 'int'>.train does not exist")."""
  value = _overridden_object(error)
  path = _config_file(argv)
  if value is _NOTHING or not path or (isinstance(value, ml_collections.ConfigDict)
                                       and not _frozen(value)):
    return None
  return _not_a_config_dict_line(path, value)


def _frozen(config) -> bool:
  """A FrozenConfigDict: no override can change it, and lev_jax's commands set fields."""
  return isinstance(config, ml_collections.FrozenConfigDict)


_CONFIG_EXAMPLE = "a Python config file and variant, e.g. experiments/smoke.py:leviathan"


def _config_values(argv) -> list[str]:
  """The values of every `--config=FILE[:variant]` (or `--config FILE`) in argv before
  `--`, in order, as given ("" for `--config=`)."""
  args = list(argv[1:])
  args = args[:args.index("--")] if "--" in args else args
  values = []
  for i, arg in enumerate(args):
    if arg.startswith(("--config=", "-config=")):
      values.append(arg.split("=", 1)[1])
    elif arg in ("--config", "-config") and i + 1 < len(args):
      values.append(args[i + 1])
  return values


def _config_given(argv) -> str | None:
  """The value of the last `--config=FILE[:variant]` (or `--config FILE`) in argv, as
  given ("" for `--config=`), else None."""
  values = _config_values(argv)
  return values[-1] if values else None


def _config_file(argv) -> str | None:
  """The FILE of the last `--config=FILE[:variant]` in argv, else None."""
  path = _config_given(argv)
  return path.split(":", 1)[0] if path else None


def config_file_error(error: BaseException, argv) -> str | None:
  """`FILE:LINE: ...` for an error raised while loading the config file, else None.

  A SyntaxError (in the file or a module it imports) names its own file and line;
  one without a file (Python refuses a source holding NUL bytes before parsing it)
  names the `--config` file; any other error names the deepest line of the `--config`
  file in its traceback.
  """
  if isinstance(error, SyntaxError) and error.filename:
    return (f"{error.filename}:{error.lineno}: {error.msg} (a Python syntax error in "
            "the config file)")
  path = _config_file(argv)
  if not path:
    return None
  if isinstance(error, SyntaxError):
    return f"--config={path}: not Python source ({first_line(error)})"
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
  """`--config=PATH: no such file (...)` when PATH is not a regular file (`is a folder`,
  `is a character device, not a regular file`, ...: experiments.file_problem); None
  when it is one, or no path was given."""
  if not path or os.path.isfile(os.path.expanduser(path)):
    return None
  return (f"--config={path}: {file_problem(path)} (expected a Python config file and "
          "variant, e.g. experiments/smoke.py:leviathan)")


def _not_a_python_file(path: str | None) -> str | None:
  """`--config=README.md: not a Python file (...)` for a config file without the .py
  suffix (its load failed: a markdown file's "Python syntax error" says nothing useful);
  None for a .py file, or no path."""
  if not path or path.endswith(".py") or not os.path.isfile(os.path.expanduser(path)):
    return None
  return (f"--config={path}: not a Python file (expected a .py config file defining "
          "get_config(variant), e.g. experiments/smoke.py:leviathan)")


def _no_get_config(error: BaseException, argv) -> str | None:
  """`--config=FILE: defines no get_config(...)` when `error` is ml_collections failing
  to find that function in the config file (an AttributeError on the file's module)."""
  path = _config_file(argv)
  module_file = getattr(getattr(error, "obj", None), "__file__", None)
  if not (isinstance(error, AttributeError) and getattr(error, "name", None) == "get_config"
          and path and module_file
          and os.path.realpath(module_file) == os.path.realpath(os.path.expanduser(path))):
    return None
  return (f"--config={path}: defines no get_config(variant) function (expected an "
          "experiment file whose get_config returns the ConfigDict, e.g. "
          "experiments/smoke.py:leviathan)")


# ml_collections' words for an override whose path is not Python (config_path.split).
_UNPARSED_PATH = re.compile(r"^Could not parse '(.*)': ", re.S)


def malformed_override(error: BaseException, argv) -> str | None:
  """`--config.train.class: not a valid field path (...)` when ml_collections could not
  parse an override's dotted path (a Python keyword, an empty name: `--config.=3`,
  `--config.train..steps=3`); None for another error."""
  m = _UNPARSED_PATH.match(str(error)) if isinstance(error, ValueError) else None
  if not m:
    return None
  given = next((g for g, field in override_fields(argv) if field == m.group(1)),
               f"--config.{m.group(1)}")
  return (f"{given}: not a valid field path (expected --config.<section>.<field>=VALUE, "
          "each name a field of the config, e.g. --config.train.steps=50)")


# The commands whose --config.<field> overrides change a checkpoint's config for an
# evaluation: their hints never name a field only training reads.
EVALUATION_COMMANDS = ("lev-eval",)


def _fail_on_config_error(prog: str, error: Exception, argv) -> None:
  """Ends with one line for an unknown or malformed `--config.<field>` or a config file
  that does not load; re-raises anything else (a bug deserves its traceback)."""
  message = (_not_a_python_file(_config_file(argv)) or config_file_error(error, argv)
             or _no_get_config(error, argv) or malformed_override(error, argv)
             or _overrides_on_a_non_config(error, argv)
             or _not_a_config_file(_config_file(argv)))
  # ml_collections raises AttributeError / KeyError for an unknown field, and TypeError
  # for a path through a text field (newcomer pass 12: --config.data.tokenizer.x=...).
  if (message is None and isinstance(error, (AttributeError, LookupError, TypeError))
      and override_fields(argv)):
    config = _config_being_overridden(error)
    message = (unknown_override(config, argv, evaluation=prog in EVALUATION_COMMANDS)
               if config is not None else None)
    if message is None and isinstance(error, TypeError):
      raise error  # every override names a field: not the user's path
    if message is None:  # the config could not be walked: the error's own words
      message = f"{override_fields(argv)[-1][0]}: {first_line(error)}"
  if message is None:
    raise error
  fail(prog, message)


def config_or_exit(prog: str, fv: flags.FlagValues = flags.FLAGS):
  """fv.config, or one line naming the missing or broken config file (one whose
  get_config returned something else than an ml_collections.ConfigDict included)."""
  try:
    config = fv.config
    # A file that failed to load raises on first use (config_flags' _ErrorConfig); a
    # get_config result without .get (newcomer pass 8: an int, "'int' object has no
    # attribute 'get'") is named below.
    getter = getattr(config, "get", None)
    if getter is not None:
      getter("name")
  except Exception as e:  # config_flags defers file errors until first access
    given = fv["config"].serialize().split("=", 1)[-1]
    if not given.strip():  # --config= is a path flag too (define_path)
      fail(prog, empty_message("config", _CONFIG_EXAMPLE))
    path = given.split(":", 1)[0]
    fail(prog, _not_a_config_file(path) or _not_a_python_file(path) or
         f"--config={given}: {_last_line(e)}")
  if not isinstance(config, ml_collections.ConfigDict) or _frozen(config):
    fail(prog, _not_a_config_dict_line(fv["config"].serialize().split("=", 1)[-1], config))
  return config


_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


class _OwnInfoOnly(std_logging.Filter):
  """Keep lev_jax's INFO lines and everyone's warnings; drop libraries' INFO chatter.

  "lev_jax's" = emitted by a file inside this package's directory (not merely a path
  containing "lev_jax": a checkout named lev_jax holds its .venv's libraries too)."""

  def filter(self, record: std_logging.LogRecord) -> bool:
    return (record.levelno >= std_logging.WARNING or
            os.path.abspath(record.pathname).startswith(_PACKAGE_DIR))


def quiet_library_logs():
  """Called at start-up: Orbax, JAX and grain INFO lines stay out of the terminal, and
  so does libtpu's start-up chatter on a machine without TPU chips
  (`skip_tpu_backend_without_chips`)."""
  logging.use_absl_handler()
  logging.get_absl_handler().addFilter(_OwnInfoOnly())
  skip_tpu_backend_without_chips()


# jax's own advice after a backend's failure: the one line gives its own.
_JAX_HINT = re.compile(r"\s*\((set JAX_PLATFORMS|you may need to uninstall)[^()]*\)\.?$")


_UNKNOWN_BACKEND = re.compile(r"is not in the list of known backends: \[([^\]]*)\]")


def backend_error() -> str | None:
  """Starts jax's backends; the one line when they cannot start, else None.

  JAX_PLATFORMS naming a platform this machine lacks (tpu off a TPU VM, cuda or gpu
  without a GPU, a misspelt name) makes jax raise on its first use of a device: a
  RuntimeError or JaxRuntimeError ("Unable to initialize backend 'tpu': ..."), or, for
  cuda without a visible NVIDIA GPU, a bare AssertionError (jax 0.10.2's
  xla_bridge.backends() skips cuda then, starts nothing, and asserts it has a default
  backend). Call it where a command first needs devices, after its flag checks and after
  jax.distributed.initialize (which must come before any backend starts).

  Returns:
    e.g. "JAX_PLATFORMS=cuda: jax cannot start that backend here (no NVIDIA GPU is
    visible); expected a platform this machine has, e.g. JAX_PLATFORMS=cpu, or leave it
    unset for jax to choose".
  """
  import jax  # pylint: disable=import-outside-toplevel
  try:
    jax.devices()
    return None
  except Exception as e:  # pylint: disable=broad-except  # any failure to start one
    reason = _JAX_HINT.sub("", first_line(e)).rstrip(".") if str(e).strip() else None
  platforms = os.environ.get("JAX_PLATFORMS") or jax.config.jax_platforms
  known = _UNKNOWN_BACKEND.search(reason or "")
  if known and set((platforms or "").split(",")) & {"gpu", "cuda", "rocm"}:
    # "gpu" tries cuda, then rocm: jax names the last ('rocm') even where cuda was meant
    reason = (f"no GPU backend is installed: jax has {known.group(1).replace(chr(39), '')}; "
              "for NVIDIA GPUs install jax[cuda12] as BUILD.md says")
  if not reason:
    asked = (platforms or "").replace("gpu", "cuda").split(",")
    reason = ("no NVIDIA GPU is visible" if "cuda" in asked
              else "jax started none of its backends")
  if not platforms:
    return (f"jax cannot start its backends here ({reason}); expected JAX_PLATFORMS naming "
            "a platform this machine has, e.g. JAX_PLATFORMS=cpu")
  return (f"JAX_PLATFORMS={platforms}: jax cannot start that backend here ({reason}); "
          "expected a platform this machine has, e.g. JAX_PLATFORMS=cpu, or leave it unset "
          "for jax to choose")


# Where the XLA flag names found known are remembered, per jaxlib version (a user's
# cache, beside lev_jax's tokenizers): each set of flags costs one check per machine.
XLA_FLAGS_CACHE = "~/.cache/lev_jax/xla_flags_known"


def xla_flags_error() -> str | None:
  """The one line when XLA_FLAGS holds a flag this jaxlib's XLA does not know; None when
  every flag is known or XLA_FLAGS is unset.

  XLA reads XLA_FLAGS when its first backend starts and aborts the process on an unknown
  flag (`F... Unknown flag in XLA_FLAGS: --x`, exit 1), which a command that starts no
  backend (lev-train --preflight) would never see. So a child process starts jax's CPU
  backend under the same flags (~1 s) and its abort line is returned; flag names found
  known are remembered in XLA_FLAGS_CACHE-<jaxlib version> (best effort), so a known
  set costs nothing, and lev_jax's own flags (lev_jax/portable.py) are never checked.
  Every XLA flag (GPU and TPU ones included) is registered in every jaxlib build, so
  this is right for a GPU job checked on a CPU host. Source:
  xla/debug_options_flags.cc, parse_flags_from_env.cc.
  """
  from lev_jax import portable  # pylint: disable=import-outside-toplevel
  own = {portable.PORTABLE_MATH_FLAG, portable.MAX_ISA_FLAG}
  flags_ = [f for f in os.environ.get("XLA_FLAGS", "").split() if f not in own]
  names = {f.split("=", 1)[0] for f in flags_}
  if not names:
    return None
  try:
    from jaxlib import version as jaxlib_version  # pylint: disable=import-outside-toplevel
    cache = os.path.expanduser(f"{XLA_FLAGS_CACHE}-{jaxlib_version.__version__}")
  except ImportError:
    cache = None
  known = set()
  if cache and os.path.isfile(cache):
    with open(cache, encoding="utf-8", errors="replace") as f:
      known = set(f.read().split())
  if names <= known:
    return None
  import subprocess  # pylint: disable=import-outside-toplevel
  env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": " ".join(flags_),
         "LEV_JAX_PORTABLE_CPU": "0"}
  child = subprocess.run([sys.executable, "-c", "import jax; jax.devices('cpu')"], env=env,
                         capture_output=True, text=True, errors="replace", check=False)
  unknown = re.search(r"Unknown flags? in XLA_FLAGS: ?(.*)", child.stderr)
  if unknown:
    return (f"XLA_FLAGS holds {unknown.group(1).strip()}, a flag this jaxlib's XLA does not "
            "know: XLA would abort the job when it starts; expected XLA's own flags "
            "(XLA_FLAGS=--help lists them)")
  if child.returncode == 0 and cache:
    try:
      os.makedirs(os.path.dirname(cache), exist_ok=True)
      with open(cache, "a", encoding="utf-8") as f:
        f.write("".join(f"{n}\n" for n in sorted(names - known)))
    except OSError:
      pass  # a read-only home: checked again next time
  return None


def backend_or_exit(prog: str) -> None:
  """Ends the program with `<prog>: error: <line>` (exit 2) when XLA_FLAGS holds a flag
  XLA does not know (`xla_flags_error`: XLA would abort the process) or jax's backends
  cannot start (`backend_error`); returns once they have."""
  problem = xla_flags_error() or backend_error()
  if problem:
    fail(prog, problem)


def skip_tpu_backend_without_chips() -> bool:
  """Makes jax's TPU backend fail at once, without loading libtpu, when JAX_PLATFORMS
  leaves the choice to jax and no TPU chip is attached; returns whether it did.

  With libtpu installed (`.[tpu-aot]`, for lev-compile) jax tries that backend on every
  machine; off a TPU VM it fails (quietly, in jax) after libtpu printed lines about TPU
  metadata and worker hostnames that it could not find (before its logging starts:
  TPU_MIN_LOG_LEVEL and TPU_STDERR_LOG_LEVEL do not silence them). Without a chip it
  has nothing to run on, so the run is the same: jax skips CUDA without a GPU the same
  way. The platform stays registered (lowering rules and lev-compile's compile-only TPU
  topologies need it). Kept as it is when JAX_PLATFORMS (jax_platforms) is set,
  JAX_FORCE_TPU_INIT asks for it, or the backends already started. Uses jax's own chip
  probe (`hardware_utils`, PCI ids) and backend registry (`xla_bridge`), private
  modules: a jax without them is left as it is.
  """
  import jax  # pylint: disable=import-outside-toplevel
  try:
    from jax._src import hardware_utils, xla_bridge  # pylint: disable=import-outside-toplevel
    registration = xla_bridge._backend_factories.get("tpu")  # pylint: disable=protected-access
    if (registration is None or jax.config.jax_platforms
        or "JAX_FORCE_TPU_INIT" in os.environ or xla_bridge.backends_are_initialized()
        or hardware_utils.num_available_tpu_chips_and_device_id()[0] > 0):
      return False
    registration.factory = _no_tpu_chip
    registration.fail_quietly = True
    return True
  except (ImportError, AttributeError, TypeError):  # another jax: leave it as it is
    return False


def _no_tpu_chip():
  raise RuntimeError("no TPU chip is attached (libtpu not loaded)")
