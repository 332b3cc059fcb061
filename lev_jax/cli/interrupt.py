"""Ctrl-C in a command: one line, exit status 130, never a traceback, a crash or a
Ctrl-C lost.

While a command starts (importing jax and the rest takes seconds; nothing is written
yet), Ctrl-C prints `<prog>: interrupted (Ctrl-C) while starting; nothing was written`
and ends it at once (`install_startup_handler`, run when the package lev_jax.cli is
imported). A KeyboardInterrupt raised then could be lost: raised inside jax's garbage
collection callback, Python prints it as "Exception ignored" and goes on.

From its `run` on (`started`), Ctrl-C raises KeyboardInterrupt as Python's own handler
does, which the `run` turns into its one line and `exit_now`; a Ctrl-C that arrives in
a gc callback is raised again once the callback has returned.

`exit_now` runs the atexit functions, flushes stdout and stderr and calls os._exit,
skipping the interpreter's finalisation: jaxlib's XLA compile goes on in a native thread
when Ctrl-C interrupts its caller, and calls back into Python when it is done;
finalising the interpreter under it waits for it, then crashes (`Fatal Python error:
Segmentation fault`, exit status 139). The command's `finally` blocks and `with` exits
(the workdir lock, the checkpointer) have run by then.
Standard library only: this module loads before everything else a command needs.
"""

from __future__ import annotations

import atexit
import gc
import os
import signal
import sys
import threading
from pathlib import Path

# 128 + SIGINT: the shell's status for a command ended by Ctrl-C.
INTERRUPTED_EXIT = 130
# How long after a gc callback a Ctrl-C that arrived in it is raised again.
_RETRY_S = 0.05
_CLI_DIR = Path(__file__).resolve().parent


def exit_now(status: int = INTERRUPTED_EXIT):
  """Ends the process with `status`: atexit functions, a flush of stdout and stderr,
  then os._exit (no finalisation: see the module's docstring). A Ctrl-C meanwhile ends
  it at once (the default action of SIGINT)."""
  signal.signal(signal.SIGINT, signal.SIG_DFL)
  try:
    atexit._run_exitfuncs()  # pylint: disable=protected-access
  finally:
    for stream in (sys.stdout, sys.stderr):
      try:
        stream.flush()
      except (OSError, ValueError):  # closed, or its reader went away
        pass
    os._exit(status)


def prog_of(argv0: str) -> str:
  """The command's name from sys.argv[0]: a console script's (`.../bin/lev-train`), or
  `lev-` + the module's for `python -m lev_jax.cli.prepare_data` (lev-prepare-data);
  `lev` when neither."""
  path = Path(argv0)
  if path.name.startswith("lev-"):
    return path.name
  if path.suffix == ".py" and path.resolve().parent == _CLI_DIR:
    return "lev-" + path.stem.replace("_", "-")
  return "lev"


def _is_command(argv0: str) -> bool:
  """Whether this process runs a command: a console script, or `python -m
  lev_jax.cli.NAME` (sys.argv[0] is "-m" while its packages are imported)."""
  return argv0 == "-m" or prog_of(argv0) != "lev"


def _while_starting(signum, frame):
  del signum, frame
  os.write(2, f"{prog_of(sys.argv[0])}: interrupted (Ctrl-C) while starting; nothing was "
           "written\n".encode())
  exit_now(INTERRUPTED_EXIT)


def install_startup_handler() -> None:
  """Ctrl-C ends a starting command at once with one line (exit 130); in other programs
  (a test importing a command) and where SIGINT is ignored (nohup) nothing changes."""
  if (sys.argv and _is_command(sys.argv[0])
      and signal.getsignal(signal.SIGINT) is signal.default_int_handler
      and threading.current_thread() is threading.main_thread()):
    signal.signal(signal.SIGINT, _while_starting)


def _raise_interrupt(signum, frame):
  """KeyboardInterrupt for SIGINT, `Terminated` for SIGTERM; a signal that arrived in a
  gc callback is sent again once the callback has returned."""
  callbacks = {getattr(c, "__code__", None) for c in gc.callbacks}
  if frame is not None and frame.f_code in callbacks:  # raised here, it would be dropped
    threading.Timer(_RETRY_S, os.kill, (os.getpid(), signum)).start()
    return
  raise Terminated if signum == signal.SIGTERM else KeyboardInterrupt


# 128 + SIGTERM: the shell's status for a command ended by SIGTERM.
TERMINATED_EXIT = 143


class Terminated(KeyboardInterrupt):
  """SIGTERM, raised as an interrupt where a command asked (`terminate_as_interrupt`):
  the same `finally` blocks and `with` exits run (lev-train's workdir lock: a new
  folder it created is removed), then `common.run` prints its line and exits 143."""


def terminate_as_interrupt() -> None:
  """SIGTERM raises `Terminated` from here on (where its action is still the default, in
  the main thread): before lev-train's first step its default action ended the process
  at once, leaving a new workdir holding only the lock file and printing nothing."""
  if (threading.current_thread() is threading.main_thread()
      and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL):
    signal.signal(signal.SIGTERM, _raise_interrupt)


def started() -> None:
  """The command's `run` began: from here Ctrl-C raises KeyboardInterrupt (never lost in
  a gc callback), where the startup handler was installed."""
  if signal.getsignal(signal.SIGINT) is _while_starting:
    signal.signal(signal.SIGINT, _raise_interrupt)
