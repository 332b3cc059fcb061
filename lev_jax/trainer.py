"""The training loop: data -> jitted steps -> metrics, evaluation and checkpoints.

`train_and_evaluate(config, workdir)` resumes from WORKDIR/checkpoints when a
checkpoint exists, so re-running the same command continues the run. A finished run
(its latest checkpoint at or past train.steps, evaluated in eval.json) is only read:
re-run with the same config it returns `Finished` and writes nothing; with a config that
differs in a field that decides results, it is refused naming them (`finished_run`);
a larger train.steps extends it, with a warning. A resume under settings that differ
from the checkpoint's logs one warning naming them (Checkpointer.restore).
Outputs:
  WORKDIR/metrics.jsonl     one JSON object per log / eval step
  WORKDIR/tensorboard/      TensorBoard event files
  WORKDIR/eval.json         the latest validation result (with frequency buckets, and
                            "data": what was evaluated, N of the split's M tokens)
  WORKDIR/data_report.json  the data: source, documents, tokens, skipped lines by reason
                            (jsonl_stream: counted so far, rewritten at each checkpoint)
  WORKDIR/tokenizer/        the tokenizer (save_tokenizer), for inference and export
  WORKDIR/token_counts.npy  int64 [V] training-split count of each id (frequency buckets)
  WORKDIR/checkpoints/<step>/{state,data,config,progress}
  WORKDIR/profile/          jax.profiler traces of train.profile_steps (when set; _Profile)
(the names: lev_jax.workdir).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import os
import shutil
import signal
import tempfile
import time

import jax
import ml_collections
import numpy as np
from jax.experimental import multihost_utils
from etils import epath
from tqdm import tqdm

from lev_jax import data as data_lib
from lev_jax.checkpoint import (Checkpointer, CheckpointMismatchError, CheckpointReader,
                                extended_lineage, new_run_id, new_start_id,
                                resume_history)
from lev_jax.checkpoint_checks import (CheckpointCorruptError, CheckpointRenamedError,
                                       config_differences, misnamed_step, not_a_step,
                                       result_fields, run_record_missing, run_shape_problem,
                                       shape_record, verify_manifest)
from lev_jax.config import ConfigError, check_platform, validate
from lev_jax.data.files import npy_bytes, write_bytes_atomic
from lev_jax.data.tokenizer_files import TOKENIZER_JSON, save_tokenizer
from lev_jax.eval.evaluate import coverage, evaluate
from lev_jax.flops import (lev_plan_line, mfu, tokens_per_s_per_device,
                           train_flops_per_step)
from lev_jax import attention, loss as loss_lib, progress, sharding, target, topology
from lev_jax import lock as workdir_lock
from lev_jax import remat as remat_lib
from lev_jax.metrics import MetricWriter, truncate_metrics
from lev_jax.optimizer import schedule_count
from lev_jax.train import abstract_state, init_state, make_eval_step, make_train_step, partition
from lev_jax.workdir import (CHECKPOINTS, DATA_REPORT, ERRORS_LOG, EVAL_JSON, LOCK,
                             METRICS, PROFILE, PROFILE_TRACES, RUN_OUTPUTS, TOKEN_COUNTS,
                             TOKENIZER, OutputWriteError, eval_record_problem,
                             is_prepared_data, loads_json, read_small_text,
                             readable_rows, write_json_atomic)


def _sentence(text: str) -> str:
  """`text` ended as a sentence: a full stop added unless it ends with ".", "?" or "!"
  (newcomer pass 19: "...(put back its own)?. Nothing was changed")."""
  return text if text.rstrip().endswith((".", "?", "!")) else f"{text}."


@contextlib.contextmanager
def _writing(path):
  """An OSError while writing the run output `path` (e.g. disk full) -> OutputWriteError
  naming it, in one line."""
  try:
    yield
  except OutputWriteError:
    raise
  except OSError as e:
    raise OutputWriteError(f"{path}: writing it failed ({e.strerror or e})") from e


class _StopSignals:
  """SIGTERM (a TPU/SLURM preemption notice) and SIGINT (Ctrl-C) -> a final checkpoint
  of the step reached and a clean exit; a Ctrl-C after either aborts at once.

  `install` replaces the handlers (main thread only; elsewhere it does nothing; an
  ignored SIGINT stays ignored) and `uninstall` puts the previous ones back. The first
  signal only sets `requested`, and its exit status is the run's (143 for SIGTERM, 130
  for SIGINT: 128 + its number); the loop checks it after each step. A SIGINT after
  the first signal writes one line, releases the workdir lock (lock.release_held: a new
  workdir holding only its lock is removed) and ends the process with os._exit and the
  first signal's status, as kill -9 would end it: the checkpoints already complete are
  untouched and a partial one stays an Orbax temporary, never restored and removed when
  the next run opens the folder (lev_jax.checkpoint). Other repeats (a second SIGTERM, a
  SIGTERM after Ctrl-C) change nothing. Python runs the handlers between bytecodes, so
  inside a long compiled call (an XLA compile) they wait for its end, and runs a handler
  once for signals that arrived meanwhile; each arrival is counted all the same, from
  the bytes the C-level handler writes to a wakeup pipe (signal.set_wakeup_fd): two
  Ctrl-C 20 ms apart are two. The C-level handler may run on another thread (the kernel
  delivers a process's signal to any thread: XLA's, a test's) and writes its byte after
  it flags the signal, so a handler call can come before its own byte: each call is also
  an arrival of its signal (CPython calls a handler only for a signal flagged since its
  last call), and a signal's arrivals are the larger of its bytes read and its calls,
  never more than the signals sent.
  """

  SIGNALS = (signal.SIGTERM, signal.SIGINT)

  def __init__(self):
    self.requested = None  # the first signal's name ("SIGTERM" / "SIGINT"), else None
    self._previous = {}
    self._pipe = None  # (read, write) fds of the wakeup pipe while installed
    self._previous_wakeup = -1
    # Per signal number: wakeup-pipe bytes read, handler calls, arrivals acted on.
    self._bytes = dict.fromkeys(self.SIGNALS, 0)
    self._calls = dict.fromkeys(self.SIGNALS, 0)
    self._counted = dict.fromkeys(self.SIGNALS, 0)

  def install(self):
    try:
      for sig in self.SIGNALS:
        if sig == signal.SIGINT and signal.getsignal(sig) == signal.SIG_IGN:
          continue  # started ignoring Ctrl-C (`cmd &` in a script, nohup): as Python does
        self._previous[sig] = signal.signal(sig, self._handle)
    except ValueError:  # not the main thread
      return
    read, write = os.pipe()
    os.set_blocking(read, False)
    os.set_blocking(write, False)
    self._previous_wakeup = signal.set_wakeup_fd(write, warn_on_full_buffer=False)
    self._pipe = (read, write)

  def uninstall(self):
    for sig, handler in self._previous.items():
      signal.signal(sig, handler)
    self._previous = {}
    if self._pipe is not None:
      signal.set_wakeup_fd(self._previous_wakeup)
      for fd in self._pipe:
        os.close(fd)
      self._pipe = None

  def _arrived(self, signum: int) -> list[int]:
    """Our signals delivered since the last handler call and not yet acted on, in order
    of arrival (a byte each in the wakeup pipe), then `signum` when this call is an
    arrival whose byte has not been written yet; without the pipe, `signum` alone."""
    if self._pipe is None:
      return [signum]
    got = b""
    with contextlib.suppress(BlockingIOError):
      while chunk := os.read(self._pipe[0], 512):
        got += chunk
    new = [n for n in got if n in self.SIGNALS and self._count(n, "_bytes")]
    if signum in self._calls and self._count(signum, "_calls"):
      new.append(signum)
    return new

  def _count(self, sig: int, evidence: str) -> bool:
    """One more arrival of `sig` seen by `evidence` (bytes read / handler calls); True
    when that makes it an arrival not acted on yet (each evidence alone undercounts)."""
    seen = getattr(self, evidence)
    seen[sig] += 1
    if seen[sig] <= self._counted[sig]:
      return False  # an arrival the other evidence already counted
    self._counted[sig] += 1
    return True

  def _handle(self, signum, frame):
    del frame
    for sig in self._arrived(signum):
      self._one(sig)

  def _one(self, signum: int) -> None:
    if signum == signal.SIGINT and self.requested is not None:
      first = signal.Signals[self.requested]
      after = "again" if first == signal.SIGINT else f"after {first.name}"
      os.write(2, f"\nCtrl-C {after}: aborted at once, no checkpoint of this step; "
               "earlier complete checkpoints are kept, if there are any (a partial one is "
               "removed when the run is restarted; with none, the re-run starts at step "
               "0)\n".encode())
      workdir_lock.release_held()  # a new workdir holding only its lock is not kept
      os._exit(128 + first)  # the first signal's status: 130, or 143 after SIGTERM
    if signum == signal.SIGINT:
      os.write(2, b"\nCtrl-C: saving a checkpoint of the current step, then stopping "
               b"(Ctrl-C again aborts at once)\n")
    self.requested = self.requested or signal.Signals(signum).name

  def agreed(self) -> str | None:
    """The signal's name when any process got one, else None; every process must stop
    at the same step, so with several processes the flag is combined across hosts (one
    tiny allgather; SIGTERM wins when both arrived)."""
    if jax.process_count() == 1:
      return self.requested
    code = {None: 0, "SIGINT": 1, "SIGTERM": 2}
    got = int(np.max(multihost_utils.process_allgather(np.int32(code[self.requested]))))
    return {v: k for k, v in code.items()}[got]


def _eval_and_log(eval_step, params, bundle, config, step, writer, workdir) -> dict:
  result = evaluate(eval_step, params, bundle.eval_batches(), bundle.token_counts_V,
                    config.eval.freq_bucket_edges)
  result["step"] = step
  result["data"] = bundle.eval_data()  # split, files, sha256, N of M tokens
  logging.info("eval at step %d: loss %.4f, perplexity %.2f; %s", step, result["loss"],
               result["perplexity"], coverage(result["data"]))
  scalars = {"eval/loss": result["loss"], "eval/perplexity": result["perplexity"]}
  for b in result["buckets"]:
    if b["perplexity"] is not None:
      lo, hi = b["range"].strip("[)").split(",")
      scalars[f"eval/perplexity_bucket_{lo}-{hi}"] = b["perplexity"]
  writer.write(step, scalars)
  if jax.process_index() == 0:
    with _writing(epath.Path(workdir) / EVAL_JSON):
      write_json_atomic(epath.Path(workdir) / EVAL_JSON, result)
  return result


def _write_data_report(workdir: epath.Path, bundle, step: int,
                       config: ml_collections.ConfigDict, ckpt: Checkpointer) -> None:
  """WORKDIR/data_report.json (process 0, atomic): `DataBundle.current_report`; for
  jsonl_stream with ``counted_at_step``, as its counts grow while the stream is read;
  the model's shape (checkpoint_checks.shape_record, "model_shape"), the run's id
  ("run", as every checkpoint's progress item holds it: checkpoint.new_run_id) and the
  lineage of this start ("lineage": checkpoint.new_start_id of each start), by which
  the loaders tell a step of another run, or of another copy of this one, copied into
  checkpoints/."""
  if jax.process_index() != 0:
    return
  report = bundle.current_report()
  if "counted" in report:
    report["counted_at_step"] = step
  report["model_shape"] = shape_record(config)
  report["run"] = ckpt.run_id
  report["lineage"] = list(ckpt.lineage)
  with _writing(workdir / DATA_REPORT):
    write_json_atomic(workdir / DATA_REPORT, report, default=str)


def _check_gcs_support(config: ml_collections.ConfigDict, workdir) -> None:
  """gs:// paths need gcsfs (etils.epath's backend) and google-cloud-storage (TensorBoard).

  Raises:
    ConfigError: naming the field with a gs:// path when those packages are missing.
  """
  paths = {"--workdir": [str(workdir)], "data.train_files": list(config.data.train_files),
           "data.validation_files": list(config.data.validation_files),
           "data.tiktoken_file": [config.data.tiktoken_file],
           "data.sentencepiece_file": [config.data.sentencepiece_file],
           "data.prepared_dir": [config.data.prepared_dir]}
  for field, values in paths.items():
    if any(str(v).startswith("gs://") for v in values):
      try:
        import gcsfs  # noqa: F401
        import google.cloud.storage  # noqa: F401
      except ImportError as e:
        raise ConfigError(
            f"{field} is on gs:// but Google Cloud Storage support is not installed "
            f"({e.name} missing): pip install -e '.[gcs]'") from e


@dataclasses.dataclass
class Stopped:
  """`train_and_evaluate`'s result for a run that stopped before train.steps after
  saving a checkpoint at `step`; reason: "SIGTERM" (preempted: lev-train exits 143 so
  a scheduler requeues it), "SIGINT" (Ctrl-C: exits 130) or "stop_at_step"."""
  step: int
  reason: str


@dataclasses.dataclass
class Finished:
  """`train_and_evaluate`'s result for a run that had already finished: `result` is its
  evaluation at `step` as eval.json holds it; nothing was trained, evaluated or
  written."""
  step: int
  result: dict


class DivergenceError(RuntimeError):
  """The loss or gradient became non-finite (train.nan_policy); no checkpoint was
  written after the first such step."""


def _check_output_kinds(workdir: epath.Path, profile: bool = False) -> list[epath.Path]:
  """The outputs present in `workdir` (workdir.RUN_OUTPUTS; profile/ only with `profile`),
  once the workdir is a folder and each of them of its kind (file vs folder); reads only.

  Raises:
    ConfigError: one has the wrong kind, named with what was expected.
  """
  if workdir.exists() and not workdir.is_dir():
    raise ConfigError(f"--workdir={workdir}: is a file; expected a folder")
  present = []
  outputs = {n: is_dir for n, is_dir in RUN_OUTPUTS.items() if n != PROFILE or profile}
  for name, want_dir in outputs.items():
    p = workdir / name
    if p.exists() and p.is_dir() != want_dir:
      raise ConfigError(f"{p}: is a {'file' if want_dir else 'folder'}; expected a "
                        f"{'folder' if want_dir else 'file'} (move it aside)")
    if p.exists():
      present.append(p)
  return present


def _check_tokenizer_entries(workdir: epath.Path) -> None:
  """Refuses a tokenizer/ holding a folder (save_tokenizer replaces the files it holds).

  Raises:
    ConfigError: naming it.
  """
  if (workdir / TOKENIZER).is_dir():
    for p in (workdir / TOKENIZER).iterdir():
      if p.is_dir():
        raise ConfigError(f"{p}: is a folder; expected a file of the tokenizer (move it "
                          "aside)")


def _check_step_names(workdir: epath.Path) -> None:
  """Refuses a checkpoints/ holding a complete step under another name than its step's
  (checkpoint_checks.misnamed_step): the run would train over it, blind to it; or a
  file or an empty folder named like a step (checkpoint_checks.not_a_step).

  Raises:
    ConfigError: naming the folder (and the step its manifest records).
  """
  problem = not_a_step(workdir / CHECKPOINTS) or misnamed_step(workdir / CHECKPOINTS)
  if problem:
    raise ConfigError(f"{_sentence(problem)} Nothing was changed")


def _check_workdir(workdir: epath.Path, profile: bool = False) -> None:
  """Refuses a workdir that cannot hold a run, before anything is read or written.
  (checkpoints/'s step names and tokenizer/'s entries were checked by `finished_run`,
  which runs first.)

  Raises:
    ConfigError: the workdir or one of its outputs (workdir.RUN_OUTPUTS; profile/ only
      with `profile`) has the wrong kind (file vs folder), or the workdir, an output
      folder or metrics.jsonl (appended to) is not writable.
  """
  present = _check_output_kinds(workdir, profile)
  if "://" in str(workdir):
    return
  probe = workdir if workdir.exists() else next(
      (p for p in workdir.parents if p.exists()), None)
  if probe is not None and not os.access(probe, os.W_OK | os.X_OK):
    raise ConfigError(f"--workdir={workdir}: {probe} is not writable")
  for p in present:
    if ((p.is_dir() and not os.access(p, os.W_OK | os.X_OK)) or
        (p.name == METRICS and not os.access(p, os.W_OK))):
      raise ConfigError(f"{p}: is not writable")


def _recorded_fingerprint(workdir: epath.Path) -> tuple[str, str] | None:
  """(fingerprint, where) of the tokenizer a run in `workdir` trained with:
  data_report.json's "tokenizer_fingerprint" (written at the run's start), else
  tokenizer/tokenizer.json's; None when neither is readable."""
  for path, key in ((workdir / DATA_REPORT, "tokenizer_fingerprint"),
                    (workdir / TOKENIZER / TOKENIZER_JSON, "fingerprint")):
    try:
      value = loads_json(read_small_text(path)).get(key)
    except (OSError, ValueError, AttributeError):
      continue
    if isinstance(value, str) and value:
      return value, str(path)
  return None


def _check_resumed_tokenizer(workdir: epath.Path, tokenizer) -> None:
  """A resumed run's data gives the tokenizer it trained with (newcomer pass 9: after
  data.prepared_dir was prepared again with other files, a resume trained on under a
  new vocabulary and replaced the run's tokenizer/).

  Raises:
    ConfigError: the run has checkpoints and the fingerprint it recorded
      (`_recorded_fingerprint`) differs from `tokenizer`'s; nothing was changed.
  """
  checkpoints = workdir / CHECKPOINTS
  if not (checkpoints.is_dir() and any(p.name.isdigit() for p in checkpoints.iterdir())):
    return
  recorded = _recorded_fingerprint(workdir)
  if recorded is None or recorded[0] == tokenizer.fingerprint:
    return
  raise ConfigError(
      f"--workdir={workdir}: this run trained with tokenizer {recorded[0][:16]} "
      f"({recorded[1]}), but config.data now gives tokenizer {tokenizer.fingerprint[:16]}: "
      "the data or its tokenizer changed since (e.g. data.prepared_dir prepared again), "
      "and resuming would mix two vocabularies. Nothing was changed: restore the run's "
      "data, or train in a new --workdir")


def check_run_folder(workdir: epath.Path) -> None:
  """Refuses an existing folder that is not a run to train in, reading only its names
  (after `_check_workdir`: an output of the wrong kind is named there).

  A run folder holds checkpoints/ (created before any other output, so a run killed
  before its first save has it, empty); an empty folder (or one holding only a lock)
  is a new run's.

  Raises:
    ConfigError: the folder holds a run's outputs (metrics.jsonl, eval.json, ...) but no
      checkpoints/ to resume from (training would replace them), or entries of its own
      (not a run's; a few are named).
  """
  if not workdir.is_dir() or (workdir / CHECKPOINTS).is_dir():
    return
  if is_prepared_data(workdir):  # it holds tokenizer/ and token_counts.npy too
    raise ConfigError(
        f"--workdir={workdir}: is prepared data (lev-prepare-data's output), not a run's "
        "folder; expected a new or empty folder, or a run's own to resume. Nothing was "
        "changed: use another --workdir (and give this folder as data.prepared_dir)")
  names = sorted(p.name for p in workdir.iterdir() if p.name != LOCK)
  outputs = [n for n in names if n in RUN_OUTPUTS and n != ERRORS_LOG]
  if outputs:
    raise ConfigError(
        f"--workdir={workdir}: holds a run's outputs ({', '.join(outputs[:4])}) but no "
        f"{CHECKPOINTS}/ to resume from; training would replace them. Nothing was "
        "changed: move them aside, or use another --workdir")
  foreign = [n for n in names if n != ERRORS_LOG]
  if foreign:
    more = f" and {len(foreign) - 3} more" if len(foreign) > 3 else ""
    raise ConfigError(
        f"--workdir={workdir}: is a folder of other files ({', '.join(foreign[:3])}{more}), "
        "not a run's; expected a new or empty folder, or a run's own to resume. Nothing "
        "was changed: use another --workdir")


def _check_finished_step(step_dir: epath.Path, step: int, checksums: bool = True) -> None:
  """Checks a finished run's last checkpoint as a restore would: its manifest parses and
  lists files, each present with its recorded size and sha256 (verify_manifest; a
  newcomer's flipped bytes of the same size were "already finished" while lev-eval
  refused the step). It reads the checkpoint once (seconds per GB); with
  `checksums=False` only the manifest's step and the files' sizes (no file is read).

  Raises:
    CheckpointCorruptError: one line naming the step, the damaged file and what to do.
  """
  try:
    verify_manifest(step_dir, checksums=checksums)
  except CheckpointRenamedError:
    raise  # its own line says what to do; the step is not damaged
  except CheckpointCorruptError as e:
    raise CheckpointCorruptError(
        f"{e}. The run finished at step {step} but that checkpoint is damaged; nothing was "
        "changed: re-run with --restore_fallback to train again from the latest intact "
        "step, or evaluate an earlier step (lev-eval --step=N)") from None


def _check_state_fits(part) -> None:
  """Refuses a model whose parameters and optimizer state alone exceed the memory of
  the mesh's devices together (accelerators: their HBM, topology.device_memory_bytes;
  CPU devices: this host's RAM, which they share), before anything is compiled or
  written: such a model would otherwise compile for minutes before the first step's
  memory check. Devices that report no memory are not checked here.

  Raises:
    ConfigError: naming the state's size, the memory and what to change.
  """
  devices = list(part.mesh.devices.flat)
  if all(d.platform == "cpu" for d in devices):
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    where = f"this host's {total / 2**30:,.1f} GiB of memory ({len(devices)} CPU device(s))"
  else:
    sizes = [topology.device_memory_bytes(d) for d in devices]
    if None in sizes:
      return
    total = sum(sizes)
    where = f"the {total / 2**30:,.1f} GiB of this job's {len(devices)} devices together"
  if part.state_bytes > total:
    raise ConfigError(
        f"config.model: the parameters and optimizer state alone need "
        f"{part.state_bytes / 2**30:,.1f} GiB, more than {where}; expected a smaller model "
        "(lev-params counts its parameters) or more devices")


def finished_run(config: ml_collections.ConfigDict, workdir,
                 restore_fallback: bool = False, warn: bool = True) -> Finished | None:
  """A finished run in `workdir`, read without writing anything (no lock needed).

  `warn=False` reads silently: for the second read under the run's lock
  (train_and_evaluate's, after lev-train's own read before the lock has logged them),
  the warnings about an extension or an unreadable eval.json.

  Finished: its latest checkpoint is at or past config.train.steps. Its stored config
  (that step's) is compared with `config` field by field (checkpoint_checks.
  result_fields: every field but the RUN_ONLY_FIELDS, such as train.log_every), the
  comparison a resume makes of the model shape.

  Returns:
    `Finished(step, eval.json)` when the configs agree and eval.json is that step's;
    None when the run is not finished, or finished but not evaluated (killed during its
    final evaluation: training completes it), or the latest step's config cannot be
    read (the restore then says why), or its latest checkpoint is damaged and
    `restore_fallback` is set (training resumes from the latest intact one).
  Raises:
    CheckpointMismatchError: finished with another config, in one line naming every
      differing field (e.g. train.steps 20 vs 4, eval.batches); or stopped short of its
      own train.steps at a step this config's train.steps does not pass (an unfinished
      run: its checkpoints and train.steps named, and how to resume it); nothing was
      changed.
    CheckpointCorruptError: finished, but a file of its latest checkpoint is missing or
      of another size or sha256 than its manifest records, or the manifest is unreadable (without
      `restore_fallback`); the step and file are named.
    ConfigError: a gs:// workdir without Google Cloud Storage support, or the workdir or
      one of its outputs of the wrong kind (file vs folder: `_check_output_kinds`).
  """
  _check_gcs_support(config, workdir)
  workdir = epath.Path(workdir).expanduser()
  if "://" not in str(workdir):
    workdir = workdir.absolute()  # Orbax needs absolute paths; `runs/x` is relative
  _check_output_kinds(workdir)  # newcomer pass 11: eval.json a folder was a traceback
  _check_tokenizer_entries(workdir)  # pass 14: before an extension is announced
  _check_step_names(workdir)
  checkpoints = workdir / CHECKPOINTS
  if not checkpoints.is_dir():
    return None
  with CheckpointReader(checkpoints) as reader:  # never writes, cleans or deletes
    steps = reader.all_steps()
    if not steps:
      return None
    step = steps[-1]
    try:
      saved = reader.saved_config(step)
    except Exception:  # pylint: disable=broad-except  # deleted or damaged: the restore
      saved = None  # names it (any Orbax error type)
    try:
      progress = reader.saved_progress(step)
    except Exception:  # pylint: disable=broad-except  # the restore names a damaged item
      progress = None
    if saved is not None:  # newcomer pass 14: lev-eval refused such a folder, lev-train
      problem = run_shape_problem(workdir, saved,  # advised "the run's own config"
                                  f"checkpoint {checkpoints / str(step)}", progress)
      if problem:
        raise CheckpointMismatchError(f"{_sentence(problem)} Nothing was changed")
      missing = run_record_missing(workdir)  # newcomer pass 15 (Q29): lev-eval warned
      if missing and warn:
        logging.warning("%s", missing)
    if step < config.train.steps:
      if warn and saved is not None:
        _warn_if_extending(saved, step, config, workdir)
      return None
    if saved is None:
      return None
    history = resume_history(progress or {})
  try:  # newcomer pass 11: a renamed, foreign or edited step was blamed on the settings
    _check_finished_step(checkpoints / str(step), step, checksums=False)
  except CheckpointCorruptError:
    if restore_fallback:  # the restore skips and quarantines it
      return None
    raise
  diffs = config_differences(saved, config, result_fields(config), stored_only=True)
  unfinished = _unfinished_line(workdir, step, saved, config.train.steps, diffs)
  if unfinished:
    raise CheckpointMismatchError(unfinished)
  if diffs or step > config.train.steps:
    resumed = "".join(f" (it was resumed at step {h['step']} with {'; '.join(h['changes'])})"
                      for h in history)  # newcomer pass 13: its record shows the last
    raise CheckpointMismatchError(
        f"{workdir} holds a run finished at step {step} with other settings: "
        f"{'; '.join(diffs or [f'train.steps: checkpoint {step}, this run {config.train.steps}'])}"
        f"{resumed}. "
        "Nothing was changed: use a new --workdir, or the run's own config (lev-eval "
        "evaluates it under other data or eval settings, into its own file)")
  finished = _finished_eval(workdir / EVAL_JSON, step, warn)
  if finished is None:
    return None
  try:
    _check_finished_step(checkpoints / str(step), step)
  except CheckpointCorruptError:
    if restore_fallback:  # the restore skips and quarantines it
      return None
    raise
  return Finished(step, finished)


def _unfinished_line(workdir, step: int, saved: dict, steps: int, diffs) -> str | None:
  """The one line when the run in `workdir` stopped (interrupted, --stop_at_step) at its
  latest checkpoint `step`, short of its stored train.steps, and this run's train.steps
  (`steps`) is at or below `step`: it is not finished, and resuming it needs its own
  train.steps. `diffs`: config_differences' lines (its train.steps line is reworded
  here). None for a run that reached its own train.steps (or one whose is unreadable)."""
  stored = (saved.get("train") or {}).get("steps") if isinstance(saved, dict) else None
  if not isinstance(stored, int) or step >= stored:
    return None
  others = [d for d in diffs if not d.startswith("train.steps:")]
  also = f" (other settings differ too: {'; '.join(others)})" if others else ""
  return (f"{workdir} holds an unfinished run: checkpoints up to step {step}, trained "
          f"toward train.steps = {stored}; this run's train.steps = {steps} is not past "
          f"step {step}{also}. Nothing was changed: re-run with the run's own config "
          f"(--config.train.steps={stored}) to resume it (--stop_at_step=N stops it "
          f"earlier with a checkpoint), evaluate step {step} with lev-eval "
          f"--checkpoint={workdir} --step={step}, or use a new --workdir")


def _warn_if_extending(saved: dict, step: int, config, workdir: epath.Path) -> None:
  """Logs one warning when the run's latest `step` (its stored config `saved`) is its
  finished end (its stored train.steps, evaluated into eval.json) and config.train.steps
  is larger: training goes on (as in MaxText and Levanter, train.steps is the total),
  eval.json will hold the new end's evaluation; the earlier one stays in metrics.jsonl."""
  if _finished_eval(workdir / EVAL_JSON, step, warn=False) is None:
    return
  stored_steps = saved.get("train", {}).get("steps") if isinstance(saved, dict) else None
  if stored_steps == step:
    logging.warning(
        "%s: extending the run finished at step %d to train.steps = %d (the learning-rate "
        "schedule now spans %d steps); its step-%d evaluation stays in %s, %s will hold "
        "step %d's", workdir, step, config.train.steps, config.train.steps, step, METRICS,
        EVAL_JSON, config.train.steps)


def _finished_eval(path: epath.Path, step: int, warn: bool = True) -> dict | None:
  """eval.json's result when it is readable, for `step`, and the evaluation metrics.jsonl
  recorded at that step (`workdir.eval_record_problem`); else None (re-evaluate). An
  unreadable, edited or missing one is logged when `warn` (newcomer pass 16, J03, J12: a
  deleted one, or one of another step, was evaluated again without a word)."""
  again = f"evaluating step {step} again (its row is appended to {METRICS})"
  if not path.exists():
    if warn:
      logging.warning("%s is missing (deleted, or the run stopped before writing it); %s",
                      path, again)
    return None
  try:
    finished = loads_json(path.read_text())
  except ValueError as e:
    if warn:
      logging.warning("%s is unreadable (%s); evaluating again", path, e)
    return None
  if not (isinstance(finished, dict) and finished.get("step") == step):
    if warn:
      logging.warning("%s records %s, not the run's final step %d (edited, or another "
                      "run's?); %s", path,
                      f"step {finished.get('step')!r}" if isinstance(finished, dict)
                      else "no JSON object", step, again)
    return None
  problem = eval_record_problem(finished, readable_rows(path.parent))
  if problem:  # newcomer pass 8: an edited perplexity was quoted as the run's result
    if warn:
      logging.warning("%s: %s: one of the two was edited; evaluating step %d again (its "
                      "row is appended to %s)", path, problem, step, METRICS)
    return None
  return finished


class _Health:
  """The NaN guard's host side: the per-step `nonfinite` flags of the steps since the
  last check, fetched together with the metrics (or before a checkpoint), so it adds
  no host sync per step.

  `skipped` counts the non-finite steps of the whole run, resumes included: it starts
  at step - (the optimizer's update count), the steps whose updates were not applied
  (both are in the checkpoint).

  Raises (check):
    DivergenceError: train.nan_policy = "stop" and a step was non-finite, or
      "skip_step" and more than train.max_skipped_steps steps were.
  """

  def __init__(self, config, outputs, state):
    self.policy, self.limit = config.train.nan_policy, config.train.max_skipped_steps
    self.outputs, self.pending = outputs, []
    self.skipped = int(state["step"]) - int(schedule_count(state["opt_state"]))

  def add(self, step: int, metrics: dict):
    self.pending.append((step, {k: metrics[k] for k in
                                ("nonfinite", "loss", "grad_norm", "update_norm")}))

  def check(self, upto: int | None = None) -> None:
    """Counts the pending steps (those <= upto; all by default); raises as the class
    docstring says."""
    error = self.count(upto)
    if error is not None:
      raise error

  def count(self, upto: int | None = None) -> DivergenceError | None:
    """As `check`, but returns the DivergenceError instead of raising it (the caller
    first writes the metrics row of the step that diverged)."""
    if not self.pending:
      return None
    if upto is None:
      upto = self.pending[-1][0]
    now = [p for p in self.pending if p[0] <= upto]
    self.pending = [p for p in self.pending if p[0] > upto]
    for step, m in jax.device_get(now):
      if not m["nonfinite"]:
        continue
      values = {"loss": float(m["loss"]), "gradient": float(m["grad_norm"]),
                "update": float(m["update_norm"])}
      bad = ", ".join(k for k, v in values.items() if not math.isfinite(v))
      what = (f"step {step}: loss {values['loss']:.6g}, gradient norm "
              f"{values['gradient']:.6g}, update norm {values['update']:.6g} (not finite: "
              f"{bad}); params and optimizer state were kept from the step before")
      self.skipped += 1
      if self.policy == "skip_step" and self.skipped <= self.limit:
        logging.warning("%s (train.nan_policy=skip_step: %d of at most %d skipped)", what,
                        self.skipped, self.limit)
        continue
      self.pending = []
      latest = self.outputs.checkpointer().latest_step()
      saved = ("no checkpoint has been written" if latest is None else
               f"no checkpoint was written after it; the latest is step {latest}")
      if self.policy == "stop":
        reason, advice = "train.nan_policy=stop", "Lower optim.lr, or set train.nan_policy=skip_step"
      else:
        reason = f"more than train.max_skipped_steps={self.limit} steps skipped in this run"
        advice = "Lower optim.lr, or raise train.max_skipped_steps"
      return DivergenceError(f"{what}; stopped ({reason}). {saved[0].upper()}{saved[1:]}. "
                             f"{advice}")
    return None


class _Profile:
  """train.profile_steps = (first, count): a jax.profiler trace of the train steps
  first + 1 .. first + count (as metrics.jsonl numbers them), on process 0 only.

  The trace goes to a local temporary folder and is copied when it stops to
  WORKDIR/profile/plugins/profile/<time>/ (workdir.PROFILE, PROFILE_TRACES:
  <host>.xplane.pb for TensorBoard's profile plugin and XProf, perfetto_trace.json.gz
  for ui.perfetto.dev; docs: https://docs.jax.dev/en/latest/profiling.html), so a gs://
  workdir works and nothing reaches the workdir when the run fails before its first
  step passed; one log line names the folder. Python calls are not traced (the Python
  tracer made a tiny CPU step ~1M events, 20 MB, and slowed it). Each step is a
  StepTraceAnnotation ("train", step number): XProf's step boundaries (on CPU they span
  only the host's dispatch; XLA:CPU's ops are in the trace viewer's host threads).

  The window is timed with block_until_ready at both ends, without the evaluations and
  checkpoint saves inside it (`paused`): `stop` returns perf/profile_step_time_s
  (seconds per step) and perf/profile_steps (how many), and
  perf/profile_includes_compile when the window opens at this process's first step.
  A run resumed inside the window traces the steps left; one resumed at or past its
  end traces nothing. Off (count 0, or not process 0): every method returns at once
  and jax.profiler is never started.
  """

  def __init__(self, config, workdir: epath.Path, resumed: int):
    first, count = (int(v) for v in (tuple(config.train.profile_steps) or (0, 0)))
    self.begin, self.end, self.resumed = max(first, resumed), first + count, resumed
    self.on = count > 0 and resumed < self.end and jax.process_index() == 0
    self.workdir = workdir
    self._local = None  # the temporary folder of the trace in progress
    self._t0 = self._paused_s = 0.0

  @property
  def tracing(self) -> bool:
    return self._local is not None

  def start(self, step: int, state) -> float:
    """Starts the trace when `step` (steps done) opens the window; returns the seconds
    it took (0.0 otherwise), for the caller to leave out of perf/step_time_s."""
    if not self.on or self.tracing or step != self.begin:
      return 0.0
    jax.block_until_ready(state)  # the steps before the window are not in its time
    t = time.perf_counter()
    self._local = tempfile.mkdtemp(prefix="lev_jax_profile_")
    options = jax.profiler.ProfileOptions()
    options.python_tracer_level = 0  # every Python call: ~1M events per tiny CPU step
    jax.profiler.start_trace(self._local, create_perfetto_trace=True,
                             profiler_options=options)
    self._t0, self._paused_s = time.perf_counter(), 0.0
    return self._t0 - t

  def marker(self, step: int):
    """While tracing, a StepTraceAnnotation of train step `step` (the step boundaries
    XProf's overview and step-time graph read); else a context that does nothing."""
    if not self.tracing:
      return contextlib.nullcontext()
    return jax.profiler.StepTraceAnnotation("train", step_num=step)

  @contextlib.contextmanager
  def paused(self, state):
    """Leaves the block's time (an evaluation, a checkpoint save) out of the window's."""
    if not self.tracing:
      yield
      return
    jax.block_until_ready(state)
    t = time.perf_counter()
    try:
      yield
    finally:
      self._paused_s += time.perf_counter() - t

  def stop(self, step: int, state) -> tuple[dict, float]:
    """Ends the trace after `step`, copies it into the workdir and logs its folder.

    Returns:
      (the perf/ scalars of the window, the seconds spent stopping and copying).
    """
    jax.block_until_ready(state)
    t1 = time.perf_counter()
    n = step - self.begin
    local, self._local = epath.Path(self._local), None
    try:
      jax.profiler.stop_trace()
      (trace,) = (local / PROFILE_TRACES).iterdir()  # <time>/: one trace per folder
      root = self.workdir / PROFILE / PROFILE_TRACES
      dest, i = root / trace.name, 1
      while dest.exists():  # a resumed run's trace within the same second
        dest, i = root / f"{trace.name}_{i}", i + 1
      dest.mkdir(parents=True)
      for f in trace.iterdir():
        with f.open("rb") as src, (dest / f.name).open("wb") as dst:
          shutil.copyfileobj(src, dst)
    finally:
      shutil.rmtree(local, ignore_errors=True)
    per_step = (t1 - self._t0 - self._paused_s) / n
    logging.info("profile of steps %d-%d (%.4g s per step): %s (tensorboard --logdir %s, "
                 "Profile tab; or perfetto_trace.json.gz in ui.perfetto.dev)",
                 self.begin + 1, step, per_step, dest, self.workdir)
    scalars = {"perf/profile_step_time_s": per_step, "perf/profile_steps": n}
    if self.begin == self.resumed:
      scalars["perf/profile_includes_compile"] = 1.0
    return scalars, time.perf_counter() - t1

  def discard(self) -> None:
    """Stops a trace left running by an error; nothing is written to the workdir."""
    if not self.tracing:
      return
    local, self._local = self._local, None
    try:
      jax.profiler.stop_trace()
    except RuntimeError as e:  # the error being raised matters more
      logging.warning("stopping the profiler: %s", e)
    finally:
      shutil.rmtree(local, ignore_errors=True)
    logging.warning("the profile of steps from %d was discarded: the run stopped with an "
                    "error inside its window", self.begin + 1)


def train_and_evaluate(config: ml_collections.ConfigDict, workdir,
                       stop_at_step: int | None = None,
                       restore_fallback: bool = False,
                       finished_checked: bool = False) -> dict | Stopped:
  """Trains config.train.steps optimizer steps (resuming if possible); returns final eval.

  Every check (config, workdir kinds and permissions, a finished run's config, data,
  tokenizer, validation size, mesh, checkpoint shapes and checksums, then this run's
  first step: its batch, its compile under the mesh, its memory) runs before the first
  write into the workdir; a new workdir is created only then (`_Outputs`). A finished
  run is never written to (`finished_run`).

  Args:
    config: a validated-on-entry experiment config.
    workdir: outputs and checkpoints (local or gs://).
    stop_at_step: for time-sliced jobs: stop after this step with a checkpoint (the
      schedule still spans train.steps); a run resumed at or past it trains nothing
      and returns `Stopped(resumed step, "stop_at_step")`.
    restore_fallback: resume from the latest intact checkpoint when the latest one is
      corrupt, unreadable or holds NaN / infinite values (a warning names it; it is
      moved to checkpoints_quarantine/), from step 0 when none is; without it, that is an
      error.
    finished_checked: the caller has already read `finished_run` for this config and
      workdir and got None, with its warnings (lev-train does, before taking the run's
      lock); the run is read again here, under the lock (another job may have finished
      it in between), without repeating them.

  Returns:
    The final evaluation (as eval.json), `Stopped` when the run stopped early, or
    `Finished` when it had already finished (nothing written).

  Raises:
    ConfigError, data_lib.DataError, CheckpointMismatchError, CheckpointWriteError,
    DivergenceError: with a message naming the field, file, checkpoint or step at fault;
    CheckpointMismatchError also for a finished run and a config that differs from its
    own (`finished_run`).
    OutputWriteError: an output (metrics.jsonl, eval.json, ...) could not be written
      (disk full): naming it and the intact checkpoints, after the pending save ended.
  """
  validate(config)
  _check_gcs_support(config, workdir)
  workdir = epath.Path(workdir).expanduser()
  if "://" not in str(workdir):
    workdir = workdir.absolute()  # Orbax needs absolute paths; `runs/x` is relative
  finished = finished_run(config, workdir, restore_fallback,  # also on a read-only copy
                          warn=not finished_checked)
  if finished is not None:
    logging.info("the run already finished at step %d; its evaluation is %s",
                 finished.step, workdir / EVAL_JSON)
    return finished
  t = config.train
  check_platform(config, target.platform())  # before anything is written
  _check_workdir(workdir, profile=bool(t.profile_steps) and t.profile_steps[1] > 0)
  check_run_folder(workdir)
  bundle = data_lib.load(config)  # checks that tokenizer and model.vocab_size agree
  _check_resumed_tokenizer(workdir, bundle.tokenizer)
  bundle.eval_data()  # DataError now, not after training, if validation is too small
  part = partition(config)
  _check_state_fits(part)
  logging.info("mesh %s over %d devices in %d processes", dict(part.mesh.shape),
               jax.device_count(), jax.process_count())
  kernel, why = attention.resolve(config, target.platform())
  logging.info("attention %s (%s)", kernel, why)
  logging.info("loss %s (%s)", *loss_lib.resolve(config, part.mesh))
  if config.model.remat == "auto":
    logging.info("model.remat %s (%s)", *remat_lib.resolve(
        config, part.mesh.devices.size,
        topology.device_memory_bytes(part.mesh.devices.flat[0]), kernel))
  if config.model.embedding == "lev":
    logging.info("%s", lev_plan_line(config))
  global_stream = config.data.host_batches == "global"
  if global_stream:  # every process: the same global batches; each feeds its rows
    train_iter = iter(bundle.train_dataset(t.global_batch_size))
    feed = lambda b: sharding.full_to_global(b, part.batch_sharding)
  else:  # each process: its documents, its rows
    n_proc = jax.process_count()
    train_iter = iter(bundle.train_dataset(t.global_batch_size // n_proc,
                                           jax.process_index(), n_proc))
    feed = lambda b: sharding.to_global(b, part.batch_sharding)
  try:
    return _run(config, workdir, bundle, part, train_iter, feed, stop_at_step,
                restore_fallback, global_stream)
  finally:
    _close(train_iter)


class _Outputs:
  """What a run writes into its workdir, each opened only once every check has passed.

  A resume opens the Checkpointer at once (a read; Orbax removes the temporaries a kill
  left); a new run creates the workdir and its checkpoints folder only in `start`. The
  first step of this process is the last check (its batch, its compile under the mesh,
  its memory); `start` follows it and writes data_report.json, tokenizer/ and
  token_counts.npy and drops metrics.jsonl rows past the resumed step; `writer` opens
  metrics.jsonl and tensorboard/ after that.
  """

  def __init__(self, config, workdir: epath.Path, bundle, portable_data: bool):
    self.config, self.workdir, self.bundle = config, workdir, bundle
    self.portable_data = portable_data
    self.ckpt = None
    self._writer = None
    self.started = False

  def checkpointer(self) -> Checkpointer:
    if self.ckpt is None:
      self.workdir.mkdir(parents=True, exist_ok=True)
      self.ckpt = Checkpointer(self.workdir / CHECKPOINTS,
                               keep=self.config.train.keep_checkpoints,
                               portable_data=self.portable_data)
    return self.ckpt

  def start(self, resumed_step: int, step: int) -> None:
    """Every check passed: the workdir is written from here on (once)."""
    if self.started:
      return
    ckpt = self.checkpointer()
    if ckpt.run_id is None:  # a new run: its id from here on (a resume keeps its own)
      ckpt.run_id = new_run_id(ckpt.directory, self.config)
    ckpt.lineage = extended_lineage(ckpt.lineage, new_start_id(
        ckpt.directory, ckpt.run_id, resumed_step, self.config))
    _write_data_report(self.workdir, self.bundle, step,  # documents, tokens, skipped lines
                       self.config, ckpt)
    if jax.process_index() == 0:  # the tokenizer, the token counts
      with _writing(self.workdir / TOKENIZER):
        save_tokenizer(self.bundle.tokenizer, self.workdir / TOKENIZER,
                       self.config.model.vocab_multiple)
      with _writing(self.workdir / TOKEN_COUNTS):
        write_bytes_atomic(self.workdir / TOKEN_COUNTS,
                           npy_bytes(self.bundle.token_counts_V))
      with _writing(self.workdir / METRICS):  # re-done steps must not appear twice
        truncate_metrics(self.workdir, resumed_step)
    self.started = True

  def writer(self) -> MetricWriter:
    if self._writer is None:
      self._writer = MetricWriter(self.workdir)
    return self._writer

  def close(self):
    """Waits for a pending save (also when training failed), closes the writers."""
    try:
      if self.ckpt is not None:
        self.ckpt.close()
    finally:
      if self._writer is not None:
        self._writer.close()


def _run(config, workdir, bundle, part, train_iter, feed, stop_at_step, restore_fallback,
         global_stream):
  outputs = _Outputs(config, workdir, bundle, portable_data=global_stream)
  try:
    return _run_outputs(config, workdir, bundle, part, train_iter, feed, stop_at_step,
                        restore_fallback, outputs)
  except OutputWriteError as e:  # the pending save is complete (or failed) by now
    steps = outputs.ckpt.all_steps() if outputs.ckpt is not None else []
    then = f"re-run to resume from step {steps[-1]}" if steps else "re-run"
    raise OutputWriteError(f"{e}; the run stopped and its checkpoints {steps} are intact: "
                           f"free space (or make it writable), then {then}") from e


def _run_outputs(config, workdir, bundle, part, train_iter, feed, stop_at_step,
                 restore_fallback, outputs):
  t = config.train
  stop = _StopSignals()  # installed by _loop; kept until the last save is complete
  try:
    ckpt = outputs.checkpointer() if (workdir / CHECKPOINTS).is_dir() else None
    tokens_seen = 0  # a running count: resumes may change the batch size or seq_len
    if ckpt is not None and ckpt.latest_step() is not None:  # restored into its shardings
      latest, state = ckpt.restore_latest(abstract_state(part, config), train_iter, config,
                                          fallback=restore_fallback)
      if state is not None:
        logging.info("resumed from step %d", latest)
        tokens_seen = ckpt.tokens_seen(latest)
    else:
      state = None
    if state is None:  # a new run, or --restore_fallback found no restorable step
      state = init_state(part, config)
    step = int(state["step"])
    if step > t.steps:  # finished_run could not read that step's config: never evaluate it
      raise CheckpointMismatchError(
          f"checkpoint {workdir / CHECKPOINTS / str(step)} is past train.steps = "
          f"{t.steps}: the run finished with other settings. Nothing was changed: use a "
          "new --workdir, or the run's own config")
    return _loop(config, workdir, bundle, part, train_iter, feed, stop_at_step, outputs,
                 state, stop, tokens_seen)
  finally:
    try:
      outputs.close()
    finally:
      stop.uninstall()


def _loop(config, workdir, bundle, part, train_iter, feed, stop_at_step, outputs, state,
          stop, tokens_resumed: int):
  t = config.train
  step = resumed = int(state["step"])
  train_step = make_train_step(part, config)
  eval_step = make_eval_step(part, config)
  health = _Health(config, outputs, state)
  tokens_per_step = t.global_batch_size * t.seq_len
  tokens_seen = lambda s: tokens_resumed + (s - resumed) * tokens_per_step  # at step s
  flops_per_step = train_flops_per_step(config)["total"]
  n_devices, device_kind = jax.device_count(), jax.devices()[0].device_kind
  stop.install()  # before: Ctrl-C is KeyboardInterrupt (nothing to save yet)
  # Drawn by process 0 on a terminal only: into a file or pipe (disable=None: tqdm's
  # test of isatty) a redrawn bar would be copied around every log line.
  bar = tqdm(total=t.steps, initial=step, desc=config.name, unit="step",
             disable=None if jax.process_index() == 0 else True)
  # The step-time window: from window_start, when step window_step was complete (or the
  # loop began), to the flush of step s, which waits for step s: s - window_step steps.
  window_start, window_step, compiled = time.perf_counter(), step, False
  pending = None  # (step, device metrics) fetched after the next step is dispatched
  profile = _Profile(config, workdir, resumed)
  profiled = {}  # step -> the profile's perf/ scalars, written in that step's train row

  def flush(pending):
    nonlocal window_start, window_step, compiled
    s, m = pending
    diverged = health.count(upto=s)  # the row of step s counts steps <= s, and is written
    m = {k: float(v) for k, v in jax.device_get(m).items()}
    now = time.perf_counter()
    step_time = (now - window_start) / max(s - window_step, 1)
    scalars = {"train/loss": m["loss"], "train/perplexity": math.exp(min(m["loss"], 50.0)),
               "train/grad_norm": m["grad_norm"], "train/lr": m["lr"],
               "train/tokens_seen": tokens_seen(s),
               "train/skipped_steps": health.skipped,
               "perf/step_time_s": step_time, "perf/tokens_per_s": tokens_per_step / step_time,
               "perf/tokens_per_s_per_device": tokens_per_s_per_device(
                   tokens_per_step, step_time, n_devices),
               "perf/model_tflops_per_s_per_device":
                   flops_per_step / step_time / n_devices / 1e12}
    # Per parameter group (lev_jax.optimizer.param_group): train/grad_norm/<group>,
    # train/update_ratio/<group>; only the groups the model has.
    scalars.update({f"train/{k}": v for k, v in m.items()
                    if k.startswith(("grad_norm/", "update_ratio/")) or k == "z_loss"})
    utilisation = mfu(flops_per_step, step_time, n_devices, device_kind)
    if utilisation is not None:  # unknown device (e.g. CPU): omitted, not faked
      scalars["perf/mfu"] = utilisation
    if not compiled:
      scalars["perf/includes_compile"] = 1.0
    compiled = True
    scalars.update(profiled.pop(s, {}))
    outputs.writer().write(s, scalars)
    bar.set_postfix(loss=f"{m['loss']:.3f}", tok_s=f"{tokens_per_step / step_time:,.0f}")
    window_start, window_step = now, s
    if diverged is not None:
      raise diverged

  def end_profile():
    """The trace's perf/ scalars go into this step's train row, or a row of their own."""
    nonlocal window_start
    scalars, seconds = profile.stop(step, state)
    window_start += seconds  # stopping and copying the trace is not a step's time
    if pending is not None and pending[0] == step:
      profiled[step] = scalars
    else:
      outputs.writer().write(step, scalars)

  logs_restored = progress.logs_above_bars()  # a log line never ends up glued to the bar
  try:
    stopped = None
    if stop_at_step is not None and step >= stop_at_step and step < t.steps:
      logging.warning("resumed at step %d, at or past --stop_at_step=%d: nothing to train",
                      step, stop_at_step)
      return Stopped(step, "stop_at_step")
    while step < t.steps:
      window_start += profile.start(step, state)  # train.profile_steps opens here
      with profile.marker(step + 1):
        batch = feed(next(train_iter))
        state, metrics = train_step(state, batch)
      step += 1
      if not outputs.started:  # this run's first step was the last check: write from here
        jax.block_until_ready(metrics)  # an execution error (memory) too, not only compile
        outputs.start(resumed, step)
      health.add(step, metrics)
      bar.update(1)
      if pending is not None:
        flush(pending)
        pending = None
      if step % t.log_every == 0 or step == t.steps:
        pending = (step, metrics)
      if profile.tracing and step == profile.end:
        end_profile()
      if step % t.eval_every == 0 and step != t.steps:
        if pending is not None:
          flush(pending)
          pending = None
        health.check()
        with profile.paused(state):
          _eval_and_log(eval_step, state["params"], bundle, config, step, outputs.writer(),
                        workdir)
        window_start, window_step = time.perf_counter(), step
      signalled = stop.agreed()
      stopping = signalled or step == stop_at_step
      if stopping and profile.tracing:  # the steps traced so far; a resume traces the rest
        end_profile()
      if step % t.checkpoint_every == 0 or step == t.steps or stopping:
        if pending is not None:  # its row first (a save syncs anyway)
          flush(pending)
          pending = None
        health.check()  # never a checkpoint after a non-finite step
        with profile.paused(state):
          outputs.checkpointer().save(step, state, train_iter, config, tokens_seen(step),
                                      bundle.tokenizer.fingerprint)
        if bundle.report.get("source") == "jsonl_stream":  # counts grow as it is read
          _write_data_report(workdir, bundle, step, config, outputs.checkpointer())
      if stopping:
        stopped = Stopped(step, signalled or "stop_at_step")
        logging.warning("stopping at step %d (%s) after saving a checkpoint", step,
                        stopped.reason)
        break
    if pending is not None:
      flush(pending)
    health.check()
    if stopped is not None:
      return stopped
    outputs.start(resumed, step)  # no step ran (restored at train.steps or past it)
    return _eval_and_log(eval_step, state["params"], bundle, config, step, outputs.writer(),
                         workdir)
  finally:
    profile.discard()  # an error inside the window: its trace is not kept
    logs_restored()
    bar.close()


def _close(iterator) -> None:
  """Stops the data iterator's worker processes (data.worker_processes > 0)."""
  close = getattr(iterator, "close", None)
  if close is not None:
    close()
