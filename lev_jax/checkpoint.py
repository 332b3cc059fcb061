"""Every Orbax read and write of lev_jax: the train checkpoints and the exported params.

`Checkpointer` (training) is one CheckpointManager for the train state, the data
iterator and the config; `CheckpointReader` reads the same folder for inference
(parameters only, never writing); `write_params` / `read_params` are an export's
parameters-only folder.

Each checkpoint step holds four items:
  state     params, optimizer state, step, rng (StandardSave: OCDBT/zarr arrays)
  data      the grain iterator position (grain.checkpoint.CheckpointSave)
  config    the experiment config as JSON
  progress  {"tokens_seen": int, "tokenizer_fingerprint": str}: training tokens up to
            the step, summed over every resume (under any batch size or seq_len); a step
            saved before it existed counts step * its config's batch * seq_len
            (`tokens_seen`); the fingerprint of the tokenizer the run trains with (a
            second record beside data_report.json, inside the verified step; absent in
            steps saved before it was recorded); and "resumed_with_changes" when the
            run was resumed with other settings than its checkpoint's (`resume_history`);
            "run": the run's id (`new_run_id`, kept by every resume; also in
            data_report.json), by which a loader tells a step copied in from another run
            of the same model shape (newcomer pass 14); "lineage": the ids of the
            starts of lev-train that led to the step (`new_start_id`, one per start
            that trains, also in data_report.json), by which a loader tells a step of
            another copy of the same run, extended apart (newcomer pass 15, Q11)

Orbax writes each step into a temporary directory and renames it only when every item
is complete, so a run killed at any moment (kill -9) leaves the earlier checkpoints
intact and the restart resumes from the last complete one; temporaries left by a kill
are removed when the next Checkpointer opens the folder (Orbax's
cleanup_tmp_directories). Source: orbax-checkpoint docs, "CheckpointManager" and
"Async checkpointing".

Each step's `<step>/checksums.json` (sha256 and size of every file of its items;
MANIFEST) is part of the step's commit: process 0 writes it from Orbax's
post-finalization callback, once every item is complete in the step's temporary folder
and before Orbax renames that folder into place, so no complete step lacks one (a kill
before the rename leaves a temporary, removed at the next open). A restore recomputes
the checksums first: a flipped bit is CheckpointCorruptError naming the file, never a
silent restore; a restored state with a non-finite value is refused the same way. A
step without a manifest (written by an older lev_jax) restores with a warning. The
manifest, the stored-config checks (SHAPE_FIELDS, ITERATOR_FIELDS, DATA_FIELDS) and the
quarantine of unrestorable steps need no Orbax: lev_jax/checkpoint_checks.py.

A save that fails is one CheckpointWriteError line (the earlier steps intact); Orbax's
own reports of it (tracebacks logged from its threads, tensorstore's callbacks) go to
WORKDIR/errors.log (lev_jax.error_log), which that line names, not to the terminal.

Only this module knows Orbax's on-disk layout: `latest_config_file` names the file a
step's config item is stored in, for readers without Orbax (lev_jax.ladder.runs).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import re
from typing import Any

import grain
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import orbax.checkpoint as ocp
from etils import epath

from lev_jax.checkpoint_checks import (DATA_FIELDS, MANIFEST,
                                       CheckpointCorruptError, CheckpointMismatchError,
                                       config_differences, quarantine, result_fields,
                                       resume_flags, resume_mismatch, verify_manifest,
                                       write_manifest)
from lev_jax.error_log import ErrorLog
from lev_jax.workdir import ERRORS_LOG


# Orbax's commit records at a step's top level: written or updated as the step is
# committed, after the manifest (which leaves them out). Source: orbax.checkpoint
# _src/path/atomicity.py (AtomicRenameTemporaryPath.finalize), 0.12.
ORBAX_COMMIT_FILES = ("_CHECKPOINT_METADATA", "commit_success.txt")
ORBAX_TMP_SUFFIX = ".orbax-checkpoint-tmp"  # <step>.orbax-checkpoint-tmp[-...]: uncommitted


def error_line(error: BaseException, limit: int = 160) -> str:
  """An error's first line cut to about `limit` characters (Orbax and tensorstore errors
  carry kilobytes: tensorstore's spec is left out), keeping its last part, the reason:
  tensorstore's `...: Failed to write 31566 bytes to file 8: File too large
  [os_error_code='27']` ends with the OS error."""
  line = (str(error).strip().splitlines() or [type(error).__name__])[0]
  line = re.sub(r"\s*\[tensorstore_spec=.*", "", line)
  if len(line) <= limit:
    return line
  reason = line.rsplit(": ", 1)[-1]
  if len(reason) <= limit // 2:
    return line[:limit - len(reason)] + "...: " + reason
  return line[:limit] + "..."


class CheckpointWriteError(OSError):
  """A checkpoint could not be written (e.g. the disk is full, a read-only mount); the
  earlier checkpoints are untouched and its temporary folder was removed (or is named,
  when it cannot be: the next run removes it). The one-line message ends with the file
  holding the details (Orbax's own error reports and the traceback)."""


class DataIteratorHandler(grain.checkpoint.CheckpointHandler):
  """grain's iterator handler, restorable under another process count when portable.

  grain writes one `process_<i>-of-<n>.json` per process. With data.host_batches =
  "global" every process iterates the same global stream, so all n files are equal and
  any process may resume from process 0's file: a 2-process checkpoint restores in 1
  process and vice versa. With "documents" each process has its own stream and the
  process count must match (else CheckpointMismatchError naming both counts).
  """

  def __init__(self, portable: bool):
    self.portable = portable

  def restore(self, directory, item=None, args=None):
    directory = epath.Path(directory)
    want = f"process_{jax.process_index()}-of-{jax.process_count()}.json"
    if (directory / want).exists():
      return super().restore(directory, item=item, args=args)
    found = sorted(p.name for p in directory.glob("process_*-of-*.json"))
    if not found:
      raise CheckpointMismatchError(f"{directory}: no data-iterator state in the checkpoint")
    if not self.portable:
      raise CheckpointMismatchError(
          f"{directory}: the data position was saved by {found[0].split('-of-')[1][:-5]} "
          f"processes with data.host_batches='documents'; this run has "
          f"{jax.process_count()}. Resume with the same process count.")
    item = item or args.item
    item.set_state(json.loads((directory / found[0]).read_text()))
    return item


@ocp.args.register_with_handler(DataIteratorHandler, for_save=True)
@dataclasses.dataclass
class DataSave(ocp.args.CheckpointArgs):
  item: Any  # a grain DatasetIterator


@ocp.args.register_with_handler(DataIteratorHandler, for_restore=True)
@dataclasses.dataclass
class DataRestore(ocp.args.CheckpointArgs):
  item: Any  # a grain DatasetIterator, positioned in place


def _name(keypath) -> str:
  return jax.tree_util.keystr(keypath, simple=True, separator="/")


def nonfinite_leaves(tree) -> list[str]:
  """The names ("opt_state/0/mu/...") of the floating-point leaves of `tree` holding a
  NaN or infinity, in tree order; [] when every value is finite. One jitted reduction
  (global arrays of any sharding, every process gets the same answer)."""
  named = [(_name(p), x) for p, x in jax.tree_util.tree_flatten_with_path(tree)[0]
           if hasattr(x, "dtype") and jnp.issubdtype(x.dtype, jnp.inexact)]
  if not named:
    return []
  mesh = getattr(named[0][1].sharding, "mesh", None) if isinstance(named[0][1], jax.Array) \
      else None
  out = None if mesh is None else jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  bad = jax.jit(lambda xs: jnp.stack([~jnp.isfinite(x).all() for x in xs]),
                out_shardings=out)([x for _, x in named])
  return [name for (name, _), b in zip(named, np.asarray(jax.device_get(bad))) if b]


def _read_config(manager: ocp.CheckpointManager, step: int) -> dict:
  """The config item of `step` (Orbax's JsonCheckpointHandler; tuples read back as
  lists); Orbax / tensorstore errors of any type for a missing or damaged item."""
  return manager.restore(step, args=ocp.args.Composite(config=ocp.args.JsonRestore()))["config"]


def _folder_digest(directory, *parts: str) -> str:
  """16 hex digits of the sha256 of `directory`'s absolute path (a URL as given) and
  `parts`, one per line: `new_run_id` and `new_start_id`."""
  where = str(directory)
  if "://" not in where:
    where = os.path.abspath(where)
  return hashlib.sha256("\n".join([where, *parts]).encode()).hexdigest()[:16]


def new_run_id(directory, config: ml_collections.ConfigDict) -> str:
  """The id of a run that starts from scratch in `directory` (its checkpoints folder)
  under `config`: 16 hex digits of the sha256 of the folder's absolute path and the
  config's JSON. The same in every process of a multi-process run (no draw, no
  exchange); a resume keeps the id its checkpoint holds (`Checkpointer.run_id`)."""
  return _folder_digest(directory, config.to_json(sort_keys=True))


def new_start_id(directory, run_id: str, resumed_step: int,
                 config: ml_collections.ConfigDict) -> str:
  """The id of one start of lev-train in `directory` (its checkpoints folder): 16 hex
  digits of the sha256 of the folder's absolute path, the run's id, the step it resumed
  from (0: a new run) and the config's JSON. The same in every process; the same again
  when a start is repeated unchanged (a restart after a kill before the next save),
  which then trains the same steps; another for a copy of the run extended in another
  folder or under other settings."""
  return _folder_digest(directory, run_id, str(resumed_step), config.to_json(sort_keys=True))


def extended_lineage(lineage: list[str], start_id: str) -> list[str]:
  """The lineage of the steps a start trains: the restored step's `lineage` and this
  start's id (once: a repeated start adds nothing)."""
  return list(lineage) if lineage and lineage[-1] == start_id else [*lineage, start_id]


def _progress(step: int, config: ml_collections.ConfigDict, tokens_seen: int | None,
              tokenizer_fingerprint: str | None, resumed: list | None = None,
              run_id: str | None = None, lineage: list[str] | None = None) -> dict:
  """A step's progress item (module docstring)."""
  progress = {"tokens_seen": int(step * config.train.global_batch_size * config.train.seq_len
                                 if tokens_seen is None else tokens_seen)}
  if run_id is not None:
    progress["run"] = run_id
  if lineage:
    progress["lineage"] = list(lineage)
  if tokenizer_fingerprint is not None:
    progress["tokenizer_fingerprint"] = tokenizer_fingerprint
  if resumed:
    progress["resumed_with_changes"] = list(resumed)
  return progress


def resume_history(progress: dict) -> list[dict]:
  """A progress item's "resumed_with_changes": [{"step": S, "changes": ["optim.lr:
  checkpoint 0.003, this run 0.01", ...]}, ...], each resume of the run with settings
  that differ from its checkpoint's (a new learning rate is a researcher's choice, and
  the run's stored config then holds only the last: newcomer pass 13); [] when none."""
  history = progress.get("resumed_with_changes") if isinstance(progress, dict) else None
  return [h for h in history if isinstance(h, dict) and isinstance(h.get("step"), int)
          and isinstance(h.get("changes"), list)] if isinstance(history, list) else []


class Checkpointer:
  """Saves and restores (state, data iterator, config) under WORKDIR/checkpoints.

  Args:
    directory: where step folders go (local path or gs://).
    keep: how many recent checkpoints to keep (older ones are deleted only after a
      newer one is complete).
    async_save: write in a background thread after the device-to-host copy (else
      `save` returns once the step is committed).
    portable_data: the data iterator state is the same in every process
      (data.host_batches = "global"), so it restores under any process count.
    error_log: where Orbax's own error reports (its logged tracebacks) go while the
      Checkpointer is open, instead of the terminal (lev_jax.error_log); default
      ERRORS_LOG beside `directory` (WORKDIR/errors.log; process i > 0 of a multi-host
      run: errors.process_<i>.log). A failed save's one-line error names it.
  """

  def __init__(self, directory, *, keep: int, async_save: bool = True,
               portable_data: bool = True, error_log=None):
    self.directory = epath.Path(directory)
    self.async_save = async_save
    if error_log is None:
      i = jax.process_index()
      error_log = self.directory.parent / (
          ERRORS_LOG if i == 0 else ERRORS_LOG.replace(".log", f".process_{i}.log"))
    self.errors = ErrorLog(error_log, ("orbax", "tensorstore"))
    self.errors.open()
    self._failed = False
    # Always Orbax's async checkpointer: only it runs the post-finalization callback
    # that writes the manifest inside the commit; a synchronous save waits for it.
    options = ocp.CheckpointManagerOptions(
        max_to_keep=keep, enable_async_checkpointing=True, create=True,
        cleanup_tmp_directories=True,
        async_options=ocp.AsyncOptions(post_finalization_callback=self._sign))
    self.manager = ocp.CheckpointManager(self.directory, options=options, item_handlers={
        "state": ocp.StandardCheckpointHandler(),
        "data": DataIteratorHandler(portable_data),
        "config": ocp.JsonCheckpointHandler(),
        "progress": ocp.JsonCheckpointHandler()})
    self._saving: int | None = None  # the step being saved, until `wait` sees it end
    self._latest: int | None = None  # the step this run restored or last saved
    self._resumed: list[dict] = []  # resume_history, saved with every step
    self.run_id: str | None = None  # the restored step's "run" (else `new_run_id`)
    self.lineage: list[str] = []  # the restored step's "lineage"; lev-train extends it

  def latest_step(self) -> int | None:
    return self.manager.latest_step()

  def all_steps(self) -> list[int]:
    return sorted(self.manager.all_steps())

  def save(self, step: int, state, data_iterator, config: ml_collections.ConfigDict,
           tokens_seen: int | None = None, tokenizer_fingerprint: str | None = None) -> bool:
    """Starts saving `step`; returns at once when async (call `wait` before exit).

    Args:
      tokens_seen: training tokens up to `step` over the whole run (default: step *
        config's train.global_batch_size * train.seq_len, a run never resumed under
        other ones).
      tokenizer_fingerprint: the run's tokenizer (Tokenizer.fingerprint), recorded in
        the progress item (the loaders check the run's tokenizer/ against it).
    Raises:
      CheckpointWriteError: this or the previous (async) save failed, e.g. disk full.
    """
    self.wait()  # the previous save is complete (Orbax would wait here too)
    self._check_latest()
    if self.run_id is None:  # a new run (or one restored from a step without an id)
      self.run_id = new_run_id(self.directory, config)
    self._saving = step
    try:
      saved = self.manager.save(step, force=True, args=ocp.args.Composite(
          state=ocp.args.StandardSave(state),
          data=DataSave(data_iterator),
          config=ocp.args.JsonSave(config.to_dict()),
          progress=ocp.args.JsonSave(_progress(step, config, tokens_seen,
                                               tokenizer_fingerprint, self._resumed,
                                               self.run_id, self.lineage))))
    except Exception as e:  # Orbax / tensorstore / OSError: any type
      self._saving = None
      self._write_failed(step, e)
    if not self.async_save:
      self.wait()
    return saved

  def _check_latest(self) -> None:
    """One warning when the step this run restored or last saved is gone from disk
    (`rm -rf checkpoints/N` during the run: lev_jax and Orbax only delete older steps)."""
    step, self._latest = self._latest, None
    if step is None or (self.directory / str(step)).exists():
      self._latest = step
      return
    self.manager.reload()  # Orbax's list of steps still holds it
    logging.warning("checkpoint %s was removed during the run (not by lev_jax); the "
                    "checkpoints on disk are now %s", self.directory / str(step),
                    self.all_steps())

  def _sign(self) -> None:
    """Orbax's post-finalization callback (its save thread, process 0 only, after every
    process wrote its part): every item of the step is complete in its temporary folder,
    which Orbax renames next, so the manifest is committed with the step. An error here
    fails the save (raised by `wait`)."""
    step = self._saving
    tmps = sorted(self.directory.glob(f"{step}{ORBAX_TMP_SUFFIX}*"))
    # A commit-file backend (gs://) writes the step in place: no temporary folder.
    write_manifest(tmps[-1] if tmps else self.directory / str(step), skip=ORBAX_COMMIT_FILES)

  def _write_failed(self, step: int, error: BaseException):
    """Removes the step's temporary folder, then raises CheckpointWriteError naming the
    intact steps; a temporary that cannot be removed (e.g. a read-only mount: EROFS)
    is named instead of raising its own error."""
    left = []
    for tmp in self.directory.glob(f"{step}{ORBAX_TMP_SUFFIX}*"):
      try:
        tmp.rmtree(missing_ok=True) if tmp.is_dir() else tmp.unlink(missing_ok=True)
      except OSError as e:  # the save's error is the one to report
        left.append(f"{tmp} ({error_line(e)})")
    try:
      steps = self.all_steps()
    except Exception:  # an unreadable folder: any Orbax / OS error type
      steps = "saved before"
    cleanup = (f"its temporary folder could not be removed: {', '.join(left)}; the next "
               "run on this workdir removes it" if left else "its temporary folder was removed")
    self._failed = True
    raise CheckpointWriteError(
        f"checkpoint {self.directory / str(step)} could not be written ({error_line(error)}); "
        f"the checkpoints {steps} are intact; {cleanup}; details in "
        f"{self.errors.report(error)}") from error

  def saved_config(self, step: int) -> dict:
    """The config stored with `step`.

    Raises:
      CheckpointMismatchError: the step's config item is missing or unreadable.
    """
    try:
      return _read_config(self.manager, step)
    except Exception as e:  # a deleted or damaged config item: any Orbax error type
      raise CheckpointMismatchError(
          f"checkpoint {self.directory / str(step)}: its config cannot be read "
          f"({error_line(e)}); the step is incomplete or damaged: re-run with "
          "--restore_fallback to resume from the latest intact step (this one is moved to "
          f"{self.directory.name}_quarantine/), or move the folder aside") from e

  def _progress_item(self, step: int) -> dict | None:
    """`step`'s progress item; None for a step saved without one (an older lev_jax).

    Raises:
      CheckpointMismatchError: the item cannot be read (a damaged step).
    """
    if not (self.directory / str(step) / "progress").exists():
      return None
    try:
      return self.manager.restore(step, args=ocp.args.Composite(
          progress=ocp.args.JsonRestore()))["progress"]
    except Exception as e:  # a damaged item: any Orbax / JSON error type
      raise CheckpointMismatchError(
          f"checkpoint {self.directory / str(step)}: its progress item cannot be read "
          f"({error_line(e)}); the step is incomplete or damaged") from e

  def tokens_seen(self, step: int) -> int:
    """The training tokens up to `step` as saved with it (its progress item); for a step
    saved without one (an older lev_jax), step * its config's batch * seq_len.

    Raises:
      CheckpointMismatchError: neither can be read.
    """
    progress = self._progress_item(step)
    if progress is not None:
      try:
        return int(progress["tokens_seen"])
      except (KeyError, TypeError, ValueError) as e:
        raise CheckpointMismatchError(
            f"checkpoint {self.directory / str(step)}: its progress item cannot be read "
            f"({error_line(e)}); the step is incomplete or damaged") from e
    train = self.saved_config(step)["train"]
    return step * train["global_batch_size"] * train["seq_len"]

  def restore_latest(self, abstract_state, data_iterator, config: ml_collections.ConfigDict,
                     fallback: bool = False):
    """Restores the latest step (see `restore`); returns (step, state).

    With `fallback`, a step that is corrupt, unreadable or holds non-finite values is
    skipped (a warning names it and why) for the next older one; once one restores, the
    skipped steps are moved, not deleted, to <directory>_quarantine/<step> so the run can
    save those steps again. When none restores, all are moved there and the result is
    (None, None): the run starts again from step 0 (the data iterator back at its
    start). Without it, the first error is raised.

    Raises:
      CheckpointMismatchError: as `restore` (with fallback, only its errors that are
        not skipped).
    """
    steps = sorted(self.manager.all_steps(), reverse=True)
    start = data_iterator.get_state()
    errors, skipped = [], []
    for step in steps:
      try:
        state = self.restore(step, abstract_state, data_iterator, config)
      except CheckpointMismatchError as e:
        if not fallback or not isinstance(e, CheckpointCorruptError) and (
            "cannot be read" not in str(e)):
          raise
        reason = str(e).splitlines()[0].split(". Nothing was changed")[0]  # no advice
        logging.warning("skipping %s (--restore_fallback): %s", step, reason)
        errors.append(f"{step}: {reason}")
        skipped.append(step)
        continue
      self._quarantine(skipped)
      self._latest = step
      return step, state
    logging.warning("no checkpoint can be restored (--restore_fallback): starting again "
                    "from step 0; %s", "; ".join(errors))
    self._quarantine(skipped)
    data_iterator.set_state(start)
    return None, None

  def _quarantine(self, steps: list[int]) -> None:
    if steps and jax.process_index() == 0:
      quarantine(self.directory, steps)
      self.manager.reload()

  def restore(self, step: int, abstract_state, data_iterator,
              config: ml_collections.ConfigDict):
    """Restores `step` into the shapes of `abstract_state`; sets the iterator's position.

    Raises:
      CheckpointCorruptError: a file differs from the step's checksum manifest, or a
        restored value is NaN or infinite (add --restore_fallback to lev-train to resume
        from the latest intact step).
      CheckpointMismatchError: the checkpoint's model shape differs from `config`'s
        (every differing field is named), so does a field that shapes the data
        iterator's state (ITERATOR_FIELDS: data.worker_processes; named with the flag to
        resume with), the saved data position does not fit this run's pipeline while
        its data settings (DATA_FIELDS) differ (named the same way, not blamed on the
        step), an array's stored shape differs, or the step cannot be read.
    """
    where = f"checkpoint {self.directory / str(step)}"
    try:
      verified = verify_manifest(self.directory / str(step))
    except CheckpointCorruptError as e:
      raise CheckpointCorruptError(
          f"{e}. Nothing was changed; re-run with --restore_fallback to resume from the "
          "latest intact step, or move that folder aside") from None
    if not verified:
      logging.warning("%s has no checksum manifest (%s); restoring it unverified",
                      where, MANIFEST)
    saved = self.saved_config(step)
    mismatch = resume_mismatch(saved, config, where)
    if mismatch:
      raise CheckpointMismatchError(mismatch)
    data_diffs = config_differences(saved, config, DATA_FIELDS)
    try:
      restored = self._read(step, where, abstract_state, data_iterator, data_diffs, saved)
    except CheckpointMismatchError:
      raise
    except Exception as e:  # tensorstore / Orbax errors of a damaged step: any type
      others = [s for s in self.manager.all_steps() if s != step]
      raise CheckpointMismatchError(
          f"{where} cannot be read: it is incomplete or corrupt ({error_line(e)}). Nothing was "
          f"changed; move that folder aside to resume from an earlier step {others}"
      ) from e
    bad = nonfinite_leaves(restored["state"])
    if bad:
      raise CheckpointCorruptError(
          f"{where}: {bad[0]}{f' and {len(bad) - 1} more arrays' if len(bad) > 1 else ''} "
          f"hold{'s' if len(bad) == 1 else ''} NaN or infinite values (a run never saves "
          "those: the step was damaged after the save). Nothing was changed; re-run with "
          "--restore_fallback to resume from the latest intact step, or move that folder "
          "aside")
    if data_diffs:
      logging.warning("%s: resuming with different data settings; the restored data "
                      "position refers to the old stream:\n  %s", where, "\n  ".join(data_diffs))
    changed = [d for d in config_differences(saved, config, result_fields(config),
                                             stored_only=True) if d not in data_diffs]
    try:  # a damaged progress item is named by tokens_seen, which the trainer reads next
      progress = self._progress_item(step) or {}
    except CheckpointMismatchError:
      progress = {}
    self._resumed = resume_history(progress)
    run_id = progress.get("run")
    self.run_id = run_id if isinstance(run_id, str) else None
    lineage = progress.get("lineage")
    self.lineage = (list(lineage) if isinstance(lineage, list)
                    and all(isinstance(s, str) for s in lineage) else [])
    if changed:  # legitimate (a new learning rate, more steps), but the user should see it
      recorded = [d for d in changed if not d.startswith("train.steps:")]  # an extension
      logging.warning("%s: resuming with settings that differ from the checkpoint's: %s%s",
                      where, "; ".join(changed),
                      " (recorded with every later step)" if recorded else "")
      if recorded:
        self._resumed.append({"step": step, "changes": recorded})
    logging.info("restored %s", where)
    return restored["state"]

  def _read(self, step, where, abstract_state, data_iterator, data_diffs, saved):
    """Checks the stored array shapes, then restores the state, then the data position:
    a position that does not fit this run's pipeline (grain's KeyError, IndexError, ...)
    while `data_diffs` name changed data settings is CheckpointMismatchError naming them,
    not a damaged step (the state item read)."""
    stored = self.manager.item_metadata(step)["state"]
    stored_shapes = {_name(p): tuple(m.shape) for p, m in
                     jax.tree_util.tree_flatten_with_path(stored)[0] if hasattr(m, "shape")}
    for p, a in jax.tree_util.tree_flatten_with_path(abstract_state)[0]:
      name = _name(p)
      if name in stored_shapes and stored_shapes[name] != tuple(a.shape):
        raise CheckpointMismatchError(
            f"{where}: {name} has shape {stored_shapes[name]}, this run expects {tuple(a.shape)}")
    restored = self.manager.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(abstract_state)))
    try:
      self.manager.restore(step, args=ocp.args.Composite(data=DataRestore(data_iterator)))
    except CheckpointMismatchError:
      raise
    except Exception as e:  # grain's error for a state of another shape: any type
      if not data_diffs:
        raise
      raise CheckpointMismatchError(
          f"{where}: its data position does not fit this run's data pipeline "
          f"({error_line(e)}), whose settings differ from the checkpoint's: "
          f"{'; '.join(data_diffs)}; resume with {resume_flags(saved, data_diffs)}. "
          "Nothing was changed") from e
    return {"state": restored["state"]}

  def wait(self):
    """Waits for a pending async save (committed with its manifest, see `_sign`).

    Raises:
      CheckpointWriteError: the pending save failed (its temporary folder is removed).
    """
    try:
      self.manager.wait_until_finished()
    except Exception as e:  # the background save's error, any type
      step, self._saving = self._saving, None
      self._write_failed(-1 if step is None else step, e)
    if self._saving is not None:  # committed
      self._latest = self._saving
    self._saving = None

  def close(self):
    """Finishes pending saves (see `wait`), warns when the latest step was removed
    meanwhile (see `_check_latest`) and closes the manager, also on error; Orbax's
    error reports go to the terminal again (a warning names the log file if Orbax
    reported errors that failed no save)."""
    try:
      self.wait()
      self._check_latest()
    finally:
      try:
        self.manager.close()
      finally:
        self.errors.close()
        if self.errors.added and not self._failed:
          logging.warning("Orbax reported %d errors that failed no save; details in %s",
                          self.errors.added, self.errors.path)


class CheckpointReader:
  """Read-only access to a `Checkpointer` folder for inference: its steps, a step's
  config and its parameters alone. It never saves, deletes or cleans up (the folder
  may be a run's, being exported or evaluated).

  The state item is read with Orbax's PyTreeCheckpointHandler, the handler the
  training's StandardCheckpointHandler delegates to (same files): only it restores a
  part of the tree, so the optimizer state is never read. Use as a context manager.

  Methods raise Orbax / tensorstore errors of any type for a missing or damaged item;
  callers name the step (`error_line` shortens them).
  """

  def __init__(self, directory):
    self.directory = epath.Path(directory)
    self.manager = ocp.CheckpointManager(
        self.directory, options=ocp.CheckpointManagerOptions(create=False),
        item_handlers={"state": ocp.PyTreeCheckpointHandler(),
                       "config": ocp.JsonCheckpointHandler(),
                       "progress": ocp.JsonCheckpointHandler()})

  def __enter__(self) -> CheckpointReader:
    return self

  def __exit__(self, *exc) -> None:
    self.close()

  def all_steps(self) -> list[int]:
    """The complete steps, ascending."""
    return sorted(self.manager.all_steps())

  def saved_config(self, step: int) -> dict:
    """The config stored with `step` (JSON: tuples as lists)."""
    return _read_config(self.manager, step)

  def saved_progress(self, step: int) -> dict:
    """The progress item of `step` (module docstring); {} for a step saved without one."""
    if not (self.directory / str(step) / "progress").exists():
      return {}
    progress = self.manager.restore(step, args=ocp.args.Composite(
        progress=ocp.args.JsonRestore()))["progress"]
    return progress if isinstance(progress, dict) else {}

  def params(self, step: int, abstract_params, device=None):
    """The parameters of `step` (state["params"]) on one device.

    Args:
      abstract_params: the parameter tree (nnx.State of ShapeDtypeStruct-likes with
        .shape and .dtype) they are restored into.
      device: where they go (default: the first device).
    Returns:
      `abstract_params`' tree of jax.Array, in their stored dtype.
    """
    sharding = jax.sharding.SingleDeviceSharding(device or jax.devices()[0])
    target = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sharding),
                          abstract_params)
    restore_args = jax.tree.map(lambda a: ocp.ArrayRestoreArgs(sharding=sharding),
                                abstract_params)
    return self.manager.restore(step, args=ocp.args.Composite(state=ocp.args.PyTreeRestore(
        item={"params": target}, restore_args={"params": restore_args},
        partial_restore=True)))["state"]["params"]

  def close(self) -> None:
    self.manager.close()


def write_params(directory, params, *, error_log) -> None:
  """Saves a parameter tree alone into `directory` (must not exist), synchronously.

  Orbax's own error reports of a failed write go to `error_log` (lev_jax.error_log), not
  the terminal.

  Raises:
    CheckpointWriteError: the folder cannot be written (e.g. disk full); one line, ending
      with the file holding the details.
  """
  with ErrorLog(error_log, ("orbax", "tensorstore")) as log:
    try:
      checkpointer = ocp.StandardCheckpointer()
      checkpointer.save(epath.Path(directory), params)
      checkpointer.wait_until_finished()
    except Exception as e:  # Orbax / tensorstore / OSError: any type
      raise CheckpointWriteError(f"the parameters could not be written ({error_line(e)}); "
                                 f"details in {log.report(e)}") from e


def read_params(directory, abstract_params):
  """The parameter tree `write_params` saved, restored into `abstract_params`' shapes.

  Raises:
    Orbax / tensorstore errors (any type): missing, incomplete or corrupt folder.
  """
  return ocp.StandardCheckpointer().restore(epath.Path(directory), abstract_params)


def params_shape_differences(directory, abstract_params) -> list[str]:
  """How the parameter tree `write_params` saved in `directory` differs in shape from
  `abstract_params` (read from Orbax's metadata alone: no array is read), so a restore
  that cannot fit is refused before it starts (a failed restore leaves tensorstore
  coroutines that print tracebacks at exit).

  Returns:
    One line per differing leaf, in tree order: "NAME: stored (32, 4), expected (64, 4)",
    "NAME: not stored", "NAME: stored, not expected"; [] when they fit.
  Raises:
    Orbax / tensorstore errors (any type): a missing or damaged folder.
  """
  stored = ocp.StandardCheckpointer().metadata(epath.Path(directory))
  stored = getattr(stored, "item_metadata", stored)  # StepMetadata (Orbax >= 0.11)
  have = {_name(p): tuple(m.shape) for p, m in jax.tree_util.tree_flatten_with_path(stored)[0]
          if hasattr(m, "shape")}
  want = {_name(p): tuple(a.shape)
          for p, a in jax.tree_util.tree_flatten_with_path(abstract_params)[0]}
  out = [f"{n}: stored {have[n]}, expected {s}" if n in have else f"{n}: not stored"
         for n, s in want.items() if have.get(n) != s]
  return out + [f"{n}: stored, not expected" for n in have if n not in want]


def latest_config_file(directory) -> epath.Path | None:
  """The file holding the config item of the highest step folder of a `Checkpointer`
  folder (Orbax's JsonCheckpointHandler: <step>/config/metadata, plain JSON), for
  readers that do not load Orbax; it may be missing. None when `directory` has no step
  folder (Orbax's temporaries, <step>.orbax-checkpoint-tmp-*, are not step folders).
  """
  directory = epath.Path(directory)
  if not directory.is_dir():
    return None
  # Orbax's step folders only: "6", not "06" (misnamed_step) or a file named 6 (not_a_step)
  steps = sorted(int(p.name) for p in directory.iterdir()
                 if p.name.isdigit() and str(int(p.name)) == p.name and p.is_dir())
  return directory / str(steps[-1]) / "config" / "metadata" if steps else None
