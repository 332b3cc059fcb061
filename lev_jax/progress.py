"""Log lines above tqdm progress bars, never glued to the end of a bar.

A tqdm bar is redrawn in place on stderr without a newline; a log line written by a
handler meanwhile starts where the bar ends (`smoke:  40%|####  | 120/300 [...]I1202 ...`).
`logs_above_bars()` routes the root logger's handlers (absl's, after
`logging.use_absl_handler()`) through `tqdm.external_write_mode`, which clears the bars,
lets the line be written, and redraws them below it: what tqdm's own
`tqdm.contrib.logging.logging_redirect_tqdm` does for plain StreamHandlers, which absl's
handler is not. Each handler keeps its level, filters and format. The bars themselves
are drawn only on a terminal (`tqdm(..., disable=None)`, as lev_jax.trainer's and
lev_jax.eval.downstream's are): into a file, every redraw would be kept.

  restore = logs_above_bars()
  try:
    ...  # the loop that updates a bar
  finally:
    restore()
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable

from tqdm import tqdm


class _AboveBars(logging.Handler):
  """Hands each record to `handlers` (level checked, as Logger.callHandlers does) with
  tqdm's bars on `file` cleared while they write."""

  def __init__(self, handlers: list[logging.Handler], file):
    super().__init__()
    self.handlers, self.file = handlers, file

  def handle(self, record: logging.LogRecord) -> bool:
    if not self.filter(record):  # filters added to this handler meanwhile
      return False
    with tqdm.external_write_mode(file=self.file):
      for handler in self.handlers:
        if record.levelno >= handler.level:
          handler.handle(record)
    return True

  def emit(self, record: logging.LogRecord) -> None:  # handle() does the work
    pass


def logs_above_bars(logger: logging.Logger | None = None, file=None) -> Callable[[], None]:
  """Routes `logger`'s handlers (default: the root logger's) through tqdm until the
  returned function is called, which puts them back.

  Args:
    logger: whose handlers to route; None: the root logger (absl's handler lives there).
    file: the stream the bars are drawn on; None: sys.stderr (tqdm's default).
  Returns:
    restore(): puts the original handlers back (idempotent).
  """
  logger = logger or logging.getLogger()
  original = list(logger.handlers)
  if not original:
    return lambda: None
  logger.handlers = [_AboveBars(original, sys.stderr if file is None else file)]

  def restore() -> None:
    logger.handlers = original
  return restore
