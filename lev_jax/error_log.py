"""Libraries' own error reports go to a log file, not the terminal.

When an Orbax save fails (disk full, a file size limit, a rename that finds nothing),
Orbax logs the error with its traceback from every thread that saw it, and
tensorstore's write callbacks, finding their event loop closed, print more through
sys.unraisablehook: 3 to 84 tracebacks before lev_jax's own one-line error. While an
`ErrorLog` is open, those reports are written to its file instead, and the one-line
error names that file (`report`):

  with ErrorLog(workdir / ERRORS_LOG, ("orbax", "tensorstore")) as log:
    ...
    raise CheckpointWriteError(f"...; details in {log.report(error)}")

Diverted, from the named libraries only (everything else goes where it went before):
  log records at ERROR and above of the "absl" and "asyncio" loggers emitted by one of
    their files, or carrying a traceback through them (asyncio's "Task exception was
    never retrieved");
  sys.unraisablehook events whose traceback lies in their files or asyncio's (the
    callbacks of their asyncio event loops);
  threading.excepthook calls for threads whose traceback passes through their files.
They go to the innermost open ErrorLog; with none open, to the last one that reported
an error, for LATE_SECONDS after its report (the failed write's stragglers, which
tensorstore delivers after the error was raised, join its file), else where they went
before. The hooks and filters are installed
on the first open and stay (they pass everything on when no ErrorLog takes it).

The file is appended to, each report as it comes; when it cannot be written (the disk
that failed the save is often full), the reports wait in memory and `report` writes them
with the error to a file in the temporary folder (tempfile.gettempdir()) instead.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import sys
import tempfile
import threading
import time
import traceback

from etils import epath

# At most this many reports are kept in memory for a file that cannot be written.
MAX_PENDING = 1000


def _package_dir(name: str) -> str | None:
  spec = importlib.util.find_spec(name)
  locations = list(spec.submodule_search_locations or []) if spec else []
  return os.path.join(os.path.abspath(locations[0]), "") if locations else None


def _in(path: str, dirs: tuple[str, ...]) -> bool:
  return os.path.abspath(path).startswith(dirs)


def _frames(tb) -> list[str]:
  return [frame.f_code.co_filename for frame, _ in traceback.walk_tb(tb)]


# How long after its `report` an ErrorLog still takes the libraries' reports once closed
# (tensorstore's callbacks on the failed write's closed event loop, asyncio's
# never-retrieved tasks: milliseconds to seconds after the error was raised).
LATE_SECONDS = 60.0

_OPEN: list = []  # the open ErrorLogs, innermost last
_LATE = None  # the last ErrorLog that reported an error: takes reports after it closed
_LATE_UNTIL = 0.0  # time.monotonic() until which it does
_PREVIOUS: dict = {}  # the hooks ours replaced
_LOGGERS = ("absl", "asyncio")


def _target():
  if _OPEN:
    return _OPEN[-1]
  return _LATE if time.monotonic() < _LATE_UNTIL else None


class _Divert(logging.Filter):
  """Drops (into the target log) the libraries' records at ERROR and above."""

  def filter(self, record: logging.LogRecord) -> bool:
    log = _target()
    if log is None or record.levelno < logging.ERROR or not (
        _in(record.pathname, log.dirs) or
        (record.exc_info and any(_in(f, log.dirs) for f in _frames(record.exc_info[2])))):
      return True
    log.add(log.formatter.format(record))
    return False


_FILTER = _Divert()


def _unraisable(u) -> None:
  log = _target()
  frames = _frames(u.exc_traceback)
  if log is None or not frames or not all(_in(f, log.callback_dirs) for f in frames):
    return _PREVIOUS["unraisable"](u)
  log.add(f"{_now()} unraisable exception ({u.err_msg or 'in a callback'}, object "
          f"{u.object!r}):\n" + _format(u.exc_type, u.exc_value, u.exc_traceback))


def _thread_exception(args) -> None:
  log = _target()
  if log is None or not any(_in(f, log.dirs) for f in _frames(args.exc_traceback)):
    return _PREVIOUS["thread"](args)
  name = args.thread.name if args.thread is not None else "?"
  log.add(f"{_now()} exception in thread {name}:\n"
          + _format(args.exc_type, args.exc_value, args.exc_traceback))


def _install() -> None:
  """Puts the hooks and filters in place (again, if someone replaced a hook since)."""
  if sys.unraisablehook is not _unraisable:
    _PREVIOUS["unraisable"], sys.unraisablehook = sys.unraisablehook, _unraisable
  if threading.excepthook is not _thread_exception:
    _PREVIOUS["thread"], threading.excepthook = threading.excepthook, _thread_exception
  for name in _LOGGERS:
    logger = logging.getLogger(name)
    if _FILTER not in logger.filters:
      logger.addFilter(_FILTER)


class ErrorLog:
  """Diverts the error reports of `libraries` to `path` while open (see the module).

  Args:
    path: the log file (local path; a URL is written through etils.epath).
    libraries: the top-level packages whose reports are diverted, e.g. ("orbax",).
  """

  def __init__(self, path, libraries: tuple[str, ...]):
    self.path = epath.Path(path)
    self.dirs = tuple(d for d in map(_package_dir, libraries) if d)
    self.callback_dirs = self.dirs + tuple(d for d in [_package_dir("asyncio")] if d)
    self.formatter = logging.Formatter(
        "%(asctime)s %(levelname)s %(pathname)s:%(lineno)d [%(threadName)s] %(message)s")
    self._lock = threading.Lock()
    self._pending: list[str] = []
    self._dropped = 0
    self._where = self.path  # the temporary folder's file once `path` failed in `report`
    self.added = 0  # reports diverted

  def __enter__(self) -> ErrorLog:
    self.open()
    return self

  def __exit__(self, *exc) -> None:
    self.close()

  def open(self) -> None:
    """Starts diverting to this log (see the module)."""
    _install()
    if self not in _OPEN:
      _OPEN.append(self)

  def close(self) -> None:
    """Stops diverting to this log (but see `report`: late reports of its error)."""
    if self in _OPEN:
      _OPEN.remove(self)

  def add(self, text: str) -> None:
    """Appends one report (its text, a traceback included) to the file, or keeps it
    for `report` when the file cannot be written."""
    with self._lock:
      self.added += 1
      if len(self._pending) < MAX_PENDING:
        self._pending.append(text.rstrip("\n") + "\n")
      else:
        self._dropped += 1
      self._write(self._where)

  def report(self, error: BaseException) -> str:
    """Writes `error` (its traceback and causes) after the reports so far; returns the
    file holding them: `path`, or one in the temporary folder when `path` cannot be
    written, or a phrase saying neither could be (never raises). Later reports of
    the libraries come here too, also after `close`, for LATE_SECONDS (unless
    another log is open or reports)."""
    global _LATE, _LATE_UNTIL
    _LATE, _LATE_UNTIL = self, time.monotonic() + LATE_SECONDS
    with self._lock:
      self._pending.append(f"{_now()} lev_jax: the error its one-line message reports:\n"
                           + "".join(traceback.format_exception(error)))
      if self._write(self.path):
        return str(self.path)
      fallback = epath.Path(tempfile.gettempdir()) / f"lev_jax-{os.getpid()}-{self.path.name}"
      try:
        with fallback.open("a") as f:
          f.write(f"# {self.path} could not be written; its reports:\n")
      except OSError as e:
        return f"{self.path} (could not be written either: {e.strerror or e})"
      if self._write(fallback):
        self._where = fallback
        return f"{fallback} ({self.path} could not be written)"
      return f"{self.path} (could not be written)"

  def _write(self, path: epath.Path) -> bool:
    """Appends the pending reports to `path` (the lock is held); False on an OSError."""
    if not self._pending:
      return True
    text = "".join(self._pending)
    if self._dropped:
      text += f"({self._dropped} more reports were dropped: over {MAX_PENDING})\n"
    try:
      with path.open("a") as f:
        f.write(text + "\n")
    except Exception:  # OSError, or a remote filesystem's own: a hook must not raise
      return False
    self._pending, self._dropped = [], 0
    return True


def _now() -> str:
  return time.strftime("%Y-%m-%d %H:%M:%S")


def _format(exc_type, value, tb) -> str:
  return "".join(traceback.format_exception(exc_type, value, tb))
