"""lev_jax.error_log: libraries' own error reports go to a file, not the terminal."""

import asyncio
import logging
import os
import sys
import threading
import types

import orbax.checkpoint as ocp

from lev_jax import error_log
from lev_jax.error_log import ErrorLog


def _unraisable(error):
  return types.SimpleNamespace(exc_type=type(error), exc_value=error, err_msg=None,
                               exc_traceback=error.__traceback__, object=None)


def _closed_loop_error():
  """What tensorstore's callbacks meet after Orbax's event loop closed: asyncio's
  RuntimeError, its traceback inside asyncio alone."""
  loop = asyncio.new_event_loop()
  loop.close()
  try:
    loop.call_soon_threadsafe(print)
  except RuntimeError as e:
    return e.with_traceback(e.__traceback__.tb_next)  # without this test's frame


def test_library_callbacks_and_threads_go_to_the_file_and_others_pass(tmp_path,
                                                                      monkeypatch):
  """Issue 26.14: tensorstore's callbacks on Orbax's closed event loop printed up to 82
  tracebacks through sys.unraisablehook."""
  monkeypatch.setattr(error_log, "_LATE_UNTIL", 0.0)  # no earlier test's failed write
  seen = []
  monkeypatch.setattr(sys, "unraisablehook", lambda u: seen.append(u.exc_value))
  monkeypatch.setattr(threading, "excepthook", lambda a: seen.append(a.exc_value))
  mine = ValueError("not a library's")
  with ErrorLog(tmp_path / "errors.log", ("orbax",)) as log:
    sys.unraisablehook(_unraisable(_closed_loop_error()))
    sys.unraisablehook(_unraisable(mine))  # no traceback in a library: passed on
    thread = threading.Thread(target=ocp.step.step_from_checkpoint_name, args=("x",),
                              name="orbax-save")
    thread.start()
    thread.join()
    logging.getLogger("absl").error("mine")  # not from a library file: passes
  assert seen == [mine] and log.added == 2
  late = _closed_loop_error()
  sys.unraisablehook(_unraisable(late))  # closed, no error reported: passed on
  assert seen == [mine, late] and log.added == 2
  text = (tmp_path / "errors.log").read_text()
  assert "RuntimeError: Event loop is closed" in text
  assert "exception in thread orbax-save" in text
  assert "ValueError: Unrecognized name format: x." in text and "mine" not in text


def test_a_file_that_cannot_be_written_falls_back_to_the_temporary_folder(tmp_path,
                                                                          monkeypatch):
  monkeypatch.setattr(error_log, "_LATE_UNTIL", 0.0)  # no later test's reports here
  missing = tmp_path / "gone" / "errors.log"  # its folder does not exist: ENOENT
  with ErrorLog(missing, ("orbax",)) as log:
    log.add("an Orbax report")
    where = log.report(OSError(28, "No space left on device"))
  path = where.split(" (")[0]
  assert where == f"{path} ({missing} could not be written)"
  assert os.path.dirname(path) != str(tmp_path / "gone")
  text = open(path).read()
  os.unlink(path)
  assert "an Orbax report" in text and "OSError: [Errno 28] No space left on device" in text


def test_reports_arriving_after_a_reported_error_join_its_file(tmp_path, monkeypatch):
  monkeypatch.setattr(error_log, "_LATE_UNTIL", 0.0)
  """tensorstore's callbacks can fire after the failed write raised and its log closed;
  after LATE_SECONDS they pass on."""
  seen = []
  monkeypatch.setattr(sys, "unraisablehook", lambda u: seen.append(u.exc_value))
  with ErrorLog(tmp_path / "errors.log", ("orbax",)) as log:
    where = log.report(OSError(28, "No space left on device"))
  sys.unraisablehook(_unraisable(_closed_loop_error()))
  assert seen == [] and where == str(tmp_path / "errors.log")
  text = (tmp_path / "errors.log").read_text()
  assert text.index("No space left") < text.index("RuntimeError: Event loop is closed")
  with ErrorLog(tmp_path / "next.log", ("orbax",)):  # the next write takes them
    sys.unraisablehook(_unraisable(_closed_loop_error()))
  assert "Event loop is closed" in (tmp_path / "next.log").read_text()
  monkeypatch.setattr(error_log, "_LATE_UNTIL", 0.0)  # the time has passed
  sys.unraisablehook(_unraisable(_closed_loop_error()))
  assert len(seen) == 1
