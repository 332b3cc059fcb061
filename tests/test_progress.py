"""lev_jax.progress: log lines are written above a tqdm bar, never glued to its end."""

import io
import logging

from tqdm import tqdm

from lev_jax import progress


def test_a_log_line_during_a_bar_starts_on_its_own_line():
  """Issue 26: a log line written while the bar was drawn started where the bar ended
  (`smoke:  50%|#####| 1/2 [...]I1202 ... eval at step 150`)."""
  stream = io.StringIO()
  logger = logging.getLogger("lev_jax_test_progress")
  logger.propagate = False
  handler = logging.StreamHandler(stream)
  handler.setLevel(logging.INFO)
  logger.handlers = [handler]
  logger.setLevel(logging.DEBUG)
  bar = tqdm(total=2, file=stream, desc="smoke", mininterval=0, ascii=True)
  restore = progress.logs_above_bars(logger, file=stream)
  try:
    bar.update(1)
    logger.info("eval at step 1")
    logger.debug("below the handler's level")
    bar.update(1)
  finally:
    restore()
    bar.close()
  assert logger.handlers == [handler]  # put back
  text = stream.getvalue()
  line = next(l for l in text.split("\n") if "eval at step 1" in l)
  assert line.split("\r")[-1] == "eval at step 1", repr(text)  # the bar was cleared first
  assert "below the handler's level" not in text
  assert "smoke:" in text.split("eval at step 1\n", 1)[1]  # the bar drawn again below it
