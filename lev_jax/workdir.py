"""The folders lev_jax writes, by name: every file and folder name lives here.

A run folder (`lev-train --workdir=WORKDIR`, default runs/<config.name>):

  WORKDIR/.lock              LOCK: the lock of the run writing it (lev_jax.lock; process 0)
  WORKDIR/checkpoints/       CHECKPOINTS: <step>/{state, data, config} and
                             <step>/checksums.json (lev_jax.checkpoint); steps it could
                             not restore go to checkpoints_quarantine/ beside it
  WORKDIR/tokenizer/         TOKENIZER: the tokenizer (data.tokenizer_files.save_tokenizer)
  WORKDIR/token_counts.npy   TOKEN_COUNTS: int64 [V] training-split count of each id
  WORKDIR/data_report.json   DATA_REPORT: the data read (source, documents, tokens,
                             skipped lines by reason)
  WORKDIR/metrics.jsonl      METRICS: one JSON object per log / eval step (lev_jax.metrics)
  WORKDIR/tensorboard/       TENSORBOARD: TensorBoard event files (lev_jax.metrics)
  WORKDIR/profile/           PROFILE: jax.profiler traces (config.train.profile_steps;
                             process 0), one folder per trace under PROFILE_TRACES
                             (plugins/profile/<time>/: <host>.xplane.pb for TensorBoard's
                             profile plugin and XProf, perfetto_trace.json.gz for
                             ui.perfetto.dev); `tensorboard --logdir WORKDIR` shows them
                             beside the scalars
  WORKDIR/eval.json          EVAL_JSON: the latest validation result
  WORKDIR/errors.log         ERRORS_LOG: written only when something failed: the details
                             (Orbax's own error reports, the traceback) of an error the
                             terminal shows in one line, e.g. a failed checkpoint save
                             (lev_jax.error_log)
  WORKDIR/lev_eval.json      LEV_EVAL_JSON: `lev-eval`'s result (its default --output)
  WORKDIR/study_eval.json    STUDY_EVAL_JSON: a study's evaluation of a finished run
                             (lev_jax.ladder.study.evaluate_run)

lev_jax.trainer writes checkpoints/ to errors.log (RUN_OUTPUTS; nothing before the
run's first step passed; profile/ only when train.profile_steps is on);
lev_jax.inference, lev_jax.ladder.runs and lev_jax.ladder.study read them.

An export folder (`lev-export --output=DIR`; lev_jax.inference.save), read by
`inference.load` like a run folder:

  DIR/params/                EXPORT_PARAMS: the parameters only (Orbax; lev_jax.checkpoint)
  DIR/config.json            EXPORT_CONFIG: the experiment config
  DIR/tokenizer/, DIR/token_counts.npy   as in a run folder
  DIR/export.json            EXPORT_JSON: what was exported; written last (complete)
  DIR/hf/                    HF: the Hugging Face LLaMA export (lev_jax.hf_export)
  PARENT/.DIR.errors.log     only when the parameters could not be written: Orbax's
                             reports (lev_jax.inference.save names it in its error)

A ladder or study root (`lev-ladder` / `lev-study --root=ROOT`):

  ROOT/<run>/                one run folder per rung or run
  ROOT/report/               REPORT: the report (default --report_dir; ROOT/report_PIECE
                             for one piece of a study, lev-study --study=FILE:PIECE), written by
                             lev_jax.ladder.report (ladder) or lev_jax.ladder.study_report (study):
    report.md                REPORT_MD: the Markdown report
    analysis.json            ANALYSIS_JSON: the analysis it was drawn from
    ladder.csv / study.csv   LADDER_CSV / STUDY_CSV: one row per rung / cell
    buckets.csv              BUCKETS_CSV: the study's per-bucket rows
    trend.csv, trend.png     TREND_CSV / TREND_PNG: a study over several backbone sizes:
                             the change per size and its fitted slope
    loss_vs_tokens.png, scaling_fit.png (ladder), freq_buckets.png: the figures
  ROOT/jax_cache/            JAX_CACHE: the compilation cache the study's runs share

Names are relative; join them to a folder (`epath.Path(workdir) / EVAL_JSON`). JSON
files are written whole through a temporary (`write_json_atomic`), as strict JSON: a
non-finite number is the text "nan", "inf" or "-inf" (as in metrics.jsonl; `loads_json`
reads it back), null a value not computed.
"""

from __future__ import annotations

import hashlib
import json
import math
import numbers
import os

DEFAULT_ROOT = "runs"  # lev-train's workdir without --workdir: runs/<config.name>

LOCK = ".lock"
CHECKPOINTS = "checkpoints"
TOKENIZER = "tokenizer"
TOKEN_COUNTS = "token_counts.npy"
DATA_REPORT = "data_report.json"
METRICS = "metrics.jsonl"
TENSORBOARD = "tensorboard"
PROFILE = "profile"
# Where jax.profiler puts each trace under its log folder, and TensorBoard's profile
# plugin looks for them: PROFILE_TRACES/<time>/ (a path: join it to a folder).
PROFILE_TRACES = "plugins/profile"
EVAL_JSON = "eval.json"
ERRORS_LOG = "errors.log"
LEV_EVAL_JSON = "lev_eval.json"
STUDY_EVAL_JSON = "study_eval.json"

# What lev-train writes into a run folder: name -> a folder (True) or a file (False).
# PROFILE only with train.profile_steps, ERRORS_LOG only when a save failed; no other
# command writes a file or folder of these names (lev-export's log is .NAME.errors.log
# beside its folder, ErrorLog's fallback lev_jax-<pid>-errors.log in the temporary one).
RUN_OUTPUTS = {CHECKPOINTS: True, TOKENIZER: True, TENSORBOARD: True, PROFILE: True,
               METRICS: False, EVAL_JSON: False, DATA_REPORT: False, TOKEN_COUNTS: False,
               ERRORS_LOG: False}

# A lev-prepare-data output folder (lev_jax/data/prepared.py): TFDS's dataset_info.json,
# written last, and lev-prepare-data's own prepare/ work folder with its run.json. It also
# holds tokenizer/ and token_counts.npy, as a run folder does: `is_prepared_data` tells
# them apart.
PREPARED_INFO = "dataset_info.json"
PREPARED_WORK = "prepare"
PREPARED_RUN_JSON = "run.json"

EXPORT_PARAMS = "params"
EXPORT_CONFIG = "config.json"
EXPORT_JSON = "export.json"
HF = "hf"

REPORT = "report"
JAX_CACHE = "jax_cache"
REPORT_MD = "report.md"
ANALYSIS_JSON = "analysis.json"
LADDER_CSV = "ladder.csv"
STUDY_CSV = "study.csv"
BUCKETS_CSV = "buckets.csv"
LOSS_VS_TOKENS_PNG = "loss_vs_tokens.png"
SCALING_FIT_PNG = "scaling_fit.png"
FREQ_BUCKETS_PNG = "freq_buckets.png"
TREND_CSV = "trend.csv"
TREND_PNG = "trend.png"
# Every file a lev-ladder or lev-study report folder can hold.
REPORT_FILES = (REPORT_MD, ANALYSIS_JSON, LADDER_CSV, STUDY_CSV, BUCKETS_CSV,
                LOSS_VS_TOKENS_PNG, SCALING_FIT_PNG, FREQ_BUCKETS_PNG, TREND_CSV, TREND_PNG)


class OutputWriteError(OSError):
  """A run's output (metrics.jsonl, tensorboard/, eval.json, data_report.json, ...)
  could not be written (e.g. the disk is full); the message names the file and the
  OSError (its errno is kept)."""


def first_non_utf8(text: str) -> int | None:
  """The index of the first character of `text` that is no UTF-8 text (a byte of a
  command-line argument or file name that is not UTF-8, which Python keeps as a lone
  surrogate, PEP 383: every later encode to UTF-8 refuses it); None when there is none."""
  try:
    text.encode("utf-8")
  except UnicodeEncodeError as e:
    return e.start
  return None


def default_workdir(name: str) -> str:
  """lev-train's run folder when no --workdir is given: 'runs/<name>'."""
  return f"{DEFAULT_ROOT}/{name}"


def finite_json(value):
  """`value` with every non-finite float (Python or NumPy) replaced by its text: "nan",
  "inf" or "-inf", as metrics.jsonl writes them; `None` stays null (a value not
  computed, e.g. an empty bucket). Strict JSON has no NaN: readers take the text back
  with float(). Containers are copied (dicts, lists, tuples -> lists); other values are
  returned as they are."""
  if isinstance(value, dict):
    return {k: finite_json(v) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return [finite_json(v) for v in value]
  if isinstance(value, numbers.Real) and not isinstance(value, numbers.Integral):
    v = float(value)  # Python and NumPy floats (NumPy registers them as numbers.Real)
    return v if math.isfinite(v) else str(v)
  return value


_NONFINITE = {"nan": float("nan"), "inf": float("inf"), "-inf": float("-inf")}


def loads_json(text: str):
  """`json.loads(text)` with the texts "nan", "inf" and "-inf" (`finite_json`'s) read
  back as floats, anywhere in the value.

  Raises:
    json.JSONDecodeError (a ValueError): not JSON.
  """
  def back(value):
    if isinstance(value, dict):
      return {k: back(v) for k, v in value.items()}
    if isinstance(value, list):
      return [back(v) for v in value]
    return _NONFINITE.get(value, value) if isinstance(value, str) else value
  return back(json.loads(text))


def file_sha256(path) -> str:
  """The sha256 hex digest of the file at `path` (local or `etils.epath` URL), read in
  4 MiB blocks.

  Raises:
    OSError: the file cannot be read.
  """
  from etils import epath  # pylint: disable=g-import-not-at-top  # a light module
  digest = hashlib.sha256()
  with epath.Path(path).open("rb") as f:
    for block in iter(lambda: f.read(1 << 22), b""):
      digest.update(block)
  return digest.hexdigest()


# Most bytes read from a small file a user names or lev_jax wrote (a lev_eval.json, an
# export's export.json and config.json, a prompts file): kilobytes each, so a device
# (/dev/zero), a pipe or a mistaken huge file is refused, never read whole.
SMALL_FILE_LIMIT = 16 << 20


def read_small(path, limit: int = SMALL_FILE_LIMIT) -> bytes:
  """The bytes of the file `path` (str or path-like, local or URL), at most `limit`.

  Raises:
    FileTooLargeError (a ValueError): it holds more than `limit` bytes (only `limit` + 1
      are read: /dev/zero too ends).
    OSError: it cannot be opened or read (e.g. a folder).
  """
  from etils import epath
  with epath.Path(path).open("rb") as f:
    data = f.read(limit + 1)
  if len(data) > limit:
    size = f"{limit >> 20} MiB" if limit >= 1 << 20 else f"{limit} bytes"
    raise FileTooLargeError(f"holds more than {size}")
  return data


def read_small_text(path, limit: int = SMALL_FILE_LIMIT) -> str:
  """The UTF-8 text of the file `path` (`read_small`).

  Raises:
    ValueError: more than `limit` bytes (FileTooLargeError), or not UTF-8; the message
      gives the reason without the file's name, e.g. "not UTF-8 text (byte 0xff at
      offset 0)".
    OSError: it cannot be opened or read.
  """
  data = read_small(path, limit)
  try:
    return data.decode("utf-8")
  except UnicodeDecodeError as e:
    raise ValueError(f"not UTF-8 text (byte 0x{data[e.start]:02x} at offset "
                     f"{e.start})") from None


class FileTooLargeError(ValueError):
  """`read_small`: a file longer than its limit; the message ("holds more than N MiB")
  names no file: the caller names it."""


def json_text(value, *, default=None, indent: int | None = 1) -> str:
  """Strict JSON of `value` (non-finite floats as text, `finite_json`).

  Raises:
    TypeError: a value json cannot write and `default` does not convert.
  """
  return json.dumps(finite_json(value), indent=indent, default=default, allow_nan=False)


def write_json_atomic(path, value, *, default=None) -> None:
  """Writes `value` as strict JSON (indent 1; `json_text`) to `path` through a temporary
  name (`data.files.write_bytes_atomic`): a reader never sees a partial file.

  Args:
    path: str or path-like (local or gs://).
    value: JSON-serialisable; `default` as in `json.dumps` for other values.
  Raises:
    OSError: the write or rename failed; `path` is as it was.
    TypeError / ValueError: `value` is not JSON-serialisable (nothing written).
  """
  from lev_jax.data.files import write_bytes_atomic  # imports grain: only when writing
  write_bytes_atomic(path, json_text(value, default=default).encode())


def is_prepared_data(folder) -> bool:
  """Whether the local folder `folder` (str or path) is a lev-prepare-data output,
  finished (PREPARED_INFO) or not (PREPARED_WORK/PREPARED_RUN_JSON)."""
  folder = os.fspath(folder)
  return (os.path.isfile(os.path.join(folder, PREPARED_INFO))
          or os.path.isfile(os.path.join(folder, PREPARED_WORK, PREPARED_RUN_JSON)))


def readable_rows(workdir) -> list[dict]:
  """The rows of WORKDIR/metrics.jsonl that are JSON objects with an integer "step", in
  file order (other lines are skipped: `truncate_metrics` handles them on resume); []
  when the file is absent or cannot be read."""
  from etils import epath  # pylint: disable=g-import-not-at-top  # a light module
  path = epath.Path(workdir) / METRICS
  try:
    text = path.read_text()
  except (OSError, UnicodeDecodeError):
    return []
  rows = []
  for line in text.splitlines():
    try:
      row = json.loads(line)
    except ValueError:
      continue
    if isinstance(row, dict) and isinstance(row.get("step"), int):
      rows.append(row)
  return rows


def _same_number(a, b) -> bool:
  """Two metric values (numbers, or non-finite ones as text) are the same float."""
  try:
    a, b = float(a), float(b)
  except (TypeError, ValueError):
    return False
  return (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=1e-9)


def eval_record_problem(result: dict, rows: list[dict]) -> str | None:
  """Why `result` (an eval.json: an `evaluate` result with its "step") is not an
  evaluation metrics.jsonl recorded at that step, or None when it is.

  `_eval_and_log` writes both from one result: eval/loss, eval/perplexity and every
  eval/perplexity_bucket_<lo>-<hi> row value equals the result's (JSON floats round-trip
  exactly). Any metrics.jsonl row of that step holding eval/loss may match (a
  re-evaluation appends one); a mismatch is described against the last. An eval.json
  edited by hand (newcomer pass 8: loss 0.0, perplexity 1.00 reported as the run's
  result) matches none.

  Args:
    result: the eval.json object.
    rows: metrics.jsonl's rows (`readable_rows`, or lev-ladder's own read).

  Returns:
    e.g. "its loss 0.0 differs from the step-8 evaluation in metrics.jsonl (6.79...)",
    "metrics.jsonl holds no evaluation at step 8", or None.
  """
  step = result.get("step")
  candidates = [row for row in rows if row.get("step") == step and "eval/loss" in row]
  if not candidates:
    return f"{METRICS} holds no evaluation at step {step}"
  problems = [_row_difference(result, row) for row in candidates]
  return None if None in problems else problems[-1]


def _row_difference(result: dict, row: dict) -> str | None:
  """The first of loss, perplexity and bucket perplexities in which `result` differs
  from the metrics.jsonl `row` of its step, as a phrase; None when none does."""
  step = result.get("step")
  pairs = [("loss", result.get("loss"), row["eval/loss"]),
           ("perplexity", result.get("perplexity"), row.get("eval/perplexity"))]
  for bucket in result.get("buckets") or []:
    if not isinstance(bucket, dict) or bucket.get("perplexity") is None:
      continue
    lo, _, hi = str(bucket.get("range", "")).strip("[)").partition(",")
    key = f"eval/perplexity_bucket_{lo}-{hi}"
    if key in row:
      pairs.append((f"bucket {bucket['range']} perplexity", bucket["perplexity"], row[key]))
  for what, mine, recorded in pairs:
    if not _same_number(mine, recorded):
      return (f"its {what} {mine} differs from the step-{step} evaluation in {METRICS} "
              f"({recorded})")
  return None
