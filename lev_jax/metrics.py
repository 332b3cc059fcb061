"""Metric writers: WORKDIR/metrics.jsonl (one JSON object per line) and TensorBoard.

Metric names are namespaced and carry their units, as in MaxText:
  train/loss, train/perplexity, train/grad_norm, train/lr, train/tokens_seen,
  train/grad_norm/<group> (gradient norm before clipping) and train/update_ratio/<group>
  (rms(update) / rms(param)) for each parameter group the model has (lev,
  embedding_table, head, backbone: lev_jax.optimizer.param_group), train/z_loss (the
  mean z-loss term per target, with optim.z_loss > 0; train/loss is the cross-entropy),
  perf/tokens_per_s, perf/step_time_s, eval/loss, eval/perplexity,
  eval/perplexity_bucket_<lo>-<hi> (e.g. eval/perplexity_bucket_10-100); with
  train.profile_steps, perf/profile_step_time_s and perf/profile_steps (and
  perf/profile_includes_compile) in the row of the traced window's last step.
Only process 0 writes (jax.process_index() == 0). TensorBoard events via tensorboardX
(no TensorFlow needed); docs: https://tensorboardx.readthedocs.io.
"""

from __future__ import annotations

import contextlib
import json
import math
import time

import jax
from absl import logging
from etils import epath

from lev_jax.data.files import write_bytes_atomic
from lev_jax.workdir import METRICS, TENSORBOARD, OutputWriteError, finite_json


def summary_writer_class():
  """tensorboardX.SummaryWriter, imported without PyTorch.

  tensorboardX imports torch whenever it is installed (lm-eval installs it), only to
  accept torch.Tensor values: ~2.7 s of every lev-train start, for a writer given
  Python floats here. While tensorboardX is first imported, `import torch` fails (a
  None entry in sys.modules, Python's documented way to block an import), which
  tensorboardX catches (writer.py: `try: import torch ... except ImportError`); the
  entry is removed at once, so torch imports as usual afterwards. A torch already
  imported is used as it is.
  """
  import sys  # pylint: disable=import-outside-toplevel
  if "torch" in sys.modules or "tensorboardX" in sys.modules:
    from tensorboardX import SummaryWriter  # pylint: disable=import-outside-toplevel
    return SummaryWriter
  sys.modules["torch"] = None
  try:
    from tensorboardX import SummaryWriter  # pylint: disable=import-outside-toplevel
  finally:
    if sys.modules.get("torch", 0) is None:
      del sys.modules["torch"]
  return SummaryWriter


def _clean(v):
  """A metric as a JSON number, or a non-finite one as its text (workdir.finite_json)."""
  return finite_json(float(v))


class MetricWriter:
  """Appends {"step": s, "time": unix_s, **metrics} lines and TensorBoard scalars.

  Raises (every method):
    OutputWriteError: metrics.jsonl or tensorboard/ cannot be written (e.g. disk full),
      naming it and the step. A row cut short by the failure is dropped on resume
      (`truncate_metrics`); `close` after such a failure only releases the files.
  """

  def __init__(self, workdir):
    self.enabled = jax.process_index() == 0
    self.path = epath.Path(workdir) / METRICS
    self.tb_path = epath.Path(workdir) / TENSORBOARD
    self._tb = None
    self._failed = False
    if self.enabled:
      SummaryWriter = summary_writer_class()  # pylint: disable=invalid-name
      with self._writing(self.path, "opening it"):
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("a")
      with self._writing(self.tb_path, "opening it"):
        self._tb = SummaryWriter(str(self.tb_path))

  @contextlib.contextmanager
  def _writing(self, path, what: str):
    """OSError -> OutputWriteError naming `path` and `what` was being written."""
    try:
      yield
    except OSError as e:
      self._failed = True
      raise OutputWriteError(f"{path}: {what} failed ({e.strerror or e})") from e

  def write(self, step: int, metrics: dict):
    if not self.enabled:
      return
    row = {"step": int(step), "time": round(time.time(), 3)}
    row.update({k: _clean(v) for k, v in metrics.items()})
    with self._writing(self.path, f"writing the row of step {int(step)}"):
      self._file.write(json.dumps(row) + "\n")
      self._file.flush()
    with self._writing(self.tb_path, f"writing the scalars of step {int(step)}"):
      for k, v in metrics.items():
        if math.isfinite(float(v)):
          self._tb.add_scalar(k, float(v), int(step))
      self._tb.flush()

  def close(self):
    """Closes both files (both are tried); after a failed write, errors are not raised
    again (the first was reported)."""
    if not self.enabled:
      return
    failed = self._failed
    try:
      with self._writing(self.path, "closing it"):
        self._file.close()
    except OutputWriteError:
      if not failed:
        raise
    finally:
      try:
        with self._writing(self.tb_path, "closing it"):
          self._tb.close()
      except OutputWriteError:
        if not failed:
          raise


# Beside metrics.jsonl: the text of its lines that could not be read (truncate_metrics).
DAMAGED_SUFFIX = ".damaged"


def truncate_metrics(workdir, step: int) -> int:
  """Drops the rows of WORKDIR/metrics.jsonl past `step` (and unparsable lines, e.g. one
  cut by a kill mid-write), so that a resumed run's re-done steps appear once.

  An unparsable line is not lost: its text is appended to WORKDIR/metrics.jsonl.damaged
  (DAMAGED_SUFFIX) and a warning names the file and its line numbers.

  Returns:
    The number of rows dropped (0 when the file is absent).
  """
  path = epath.Path(workdir) / METRICS
  if not path.exists():
    return 0
  kept, damaged, dropped = [], [], 0
  for number, line in enumerate(path.read_text().splitlines(), 1):
    try:
      row_step = int(json.loads(line)["step"])
    except (ValueError, KeyError, TypeError):
      row_step = None
      damaged.append((number, line))
    if row_step is None or row_step > step:
      dropped += 1
    else:
      kept.append(line + "\n")
  if damaged:
    copy = epath.Path(workdir) / (METRICS + DAMAGED_SUFFIX)
    before = copy.read_text() if copy.exists() else ""
    write_bytes_atomic(copy, (before + "".join(l + "\n" for _, l in damaged)).encode())
    logging.warning("%s: dropped %d unreadable line(s) (line %s; e.g. one cut by a kill "
                    "mid-write); their text is kept in %s", path, len(damaged),
                    ", ".join(str(n) for n, _ in damaged), copy)
  if dropped:
    write_bytes_atomic(path, "".join(kept).encode())
  return dropped
