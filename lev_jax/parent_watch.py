"""Worker processes end with their parent: `exit_with_parent()`, called in a worker.

A multiprocessing pool's workers outlive a parent killed by SIGKILL (or any death that
skips the pool's clean-up): they finish their task and wait for the next one forever,
and lev-prepare-data's kept writing shards after the parent's folder lock was freed.
Each worker started by `multiprocessing` (any start method, Python >= 3.8) knows its
parent through `multiprocessing.parent_process()`, whose sentinel becomes ready when
the parent is gone; a daemon thread waits on it and ends the worker at once
(os._exit: no clean-up, like the kill its parent got; a partly written temporary file is
left to the next run, which removes it).

  ctx.Pool(n, initializer=exit_with_parent)   # or call it first in your initializer

Source: https://docs.python.org/3/library/multiprocessing.html#multiprocessing.parent_process
"""

from __future__ import annotations

import multiprocessing
import os
import threading

# The worker's exit status when its parent is gone.
PARENT_GONE_EXIT = 1


def exit_with_parent() -> bool:
  """In a multiprocessing child: ends this process as soon as its parent is gone.

  Returns:
    True when the watch started; False in a process multiprocessing did not start (a
    main process: nothing to watch).
  """
  parent = multiprocessing.parent_process()
  if parent is None:
    return False

  def watch():
    parent.join()  # waits on the parent's sentinel: ready once the parent has ended
    os._exit(PARENT_GONE_EXIT)
  threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()
  return True
