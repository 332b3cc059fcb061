"""Checks of a checkpoint step that need no Orbax: its checksum manifest, its stored
config against this run's, and the quarantine of steps that fail them.

  write_manifest(step_dir)     # process 0, as Orbax commits the step (before its rename)
  verify_manifest(step_dir)    # before a restore: True, False (no manifest) or raises
  verify_manifest(step_dir, checksums=False)  # a finished run: sizes only, no hashing
  config_differences(saved, config, SHAPE_FIELDS)   # ["model.d_model: checkpoint 64, ..."]
  config_differences(saved, config, result_fields(config), stored_only=True)  # finished run
  resume_flags(saved, diffs)   # "--config.data.worker_processes=2": resume as it was saved
  quarantine(directory, [4])   # DIRECTORY/4 -> DIRECTORY_quarantine/4-<ns>

The manifest, `<step>/checksums.json` (MANIFEST), holds the sha256 and size of every
file of the step (but the commit records its writer leaves out, `skip`): a flipped bit,
a missing file or a file of an item folder that it does not list is
CheckpointCorruptError naming the file, never a silent restore; so is a manifest that
lists nothing. lev_jax/checkpoint.py (the only module that imports Orbax) writes and checks
steps through these; lev_jax/inference.py checks a run's steps before reading them.
"""

from __future__ import annotations

import json
import logging
import time

import ml_collections
from etils import epath

from lev_jax.workdir import CHECKPOINTS, DATA_REPORT, file_sha256, write_json_atomic

# Config sections whose values decide parameter shapes; a restore with any of them
# changed is refused with the list of differences.
SHAPE_FIELDS = {
    "model": ("embedding", "vocab_size", "vocab_multiple", "d_model", "n_layers", "n_heads",
              "n_kv_heads", "head_dim", "d_ff", "param_dtype", "scan_layers"),
    "lev": ("n_coords", "base", "d_seed", "n_heads", "n_knots", "rank", "basis",
            "output_norm"),
}

# The same as dotted names ("model.d_model"), as `config_differences` names them.
SHAPE_FIELD_NAMES = frozenset(f"{section}.{f}" for section, fields in SHAPE_FIELDS.items()
                              for f in fields)

# Fields of SHAPE_FIELDS added after checkpoints were written, with the value every
# run before them had: a stored config without the field is compared as holding it.
FIELDS_ADDED = {"lev.output_norm": "none"}


# Fields that do not change shapes but change what the restored data position means.
DATA_FIELDS = {"train": ("seq_len", "global_batch_size"),
               "data": ("source", "train_files", "prepared_dir", "pile_set_names",
                        "tokenizer", "seed", "shuffle_buffer", "segment_masking",
                        "worker_processes")}


# Fields that decide the shape of the data iterator's saved state itself (one state per
# worker process, taken round-robin): under another value the saved position cannot be
# restored (or restores a different stream), so a resume must keep them; refused before
# any read, naming the field and the flag to resume with (`resume_flags`).
ITERATOR_FIELDS = {"data": ("worker_processes",)}


# Fields that cannot change a finished run's results (its name, how often it logged or
# saved, what it profiled, where caches live, how many processes prepared data): a re-run
# of a finished run may differ in these and still be the same run. Every other field
# counts (`result_fields`).
RUN_ONLY_FIELDS = ("name", "train.log_every", "train.checkpoint_every",
                   "train.keep_checkpoints", "train.profile_steps", "data.cache_dir",
                   "data.prepare_workers")


class CheckpointMismatchError(ValueError):
  """The checkpoint was written for a different model shape than this config's, or
  cannot be read."""


class CheckpointCorruptError(CheckpointMismatchError):
  """A file of the checkpoint differs from its checksum manifest (MANIFEST)."""


class CheckpointRenamedError(CheckpointCorruptError):
  """A step folder whose manifest records another step: it was renamed (or copied in
  from elsewhere); the message names both and says to name it back."""


MANIFEST = "checksums.json"


def step_files(step_dir: epath.Path, skip=()) -> dict[str, epath.Path]:
  """{path relative to the folder: path} of every file of a step folder (or an export)
  but the manifest and the top-level files named in `skip`."""
  out, folders = {}, [step_dir]
  while folders:  # epath has no recursive glob on every backend (gs://)
    for p in folders.pop().iterdir():
      if p.is_dir():
        folders.append(p)
      elif p.parent != step_dir or (p.name != MANIFEST and p.name not in skip):
        out[str(p.relative_to(step_dir))] = p
  return out


def file_digests(files: dict[str, epath.Path]) -> dict:
  """{"sha256": {name: hex digest}, "bytes": {name: size}} of `files` ({name: path}):
  a checkpoint step's manifest, and an export's "checksums"."""
  ordered = sorted(files.items())
  return {"sha256": {rel: file_sha256(p) for rel, p in ordered},
          "bytes": {rel: p.stat().length for rel, p in ordered}}


def write_manifest(step_dir, skip=()) -> None:
  """Writes `step_dir/checksums.json`: {"sha256": {file: hex}, "bytes": {file: size}}.

  Args:
    step_dir: the step's folder (or the temporary folder it is committed from).
    skip: names of top-level files left out (files the writer changes after the
      manifest, e.g. Orbax's commit records); files in sub-folders are always listed.
  Raises:
    CheckpointCorruptError: the folder holds no file to list (a manifest that lists
      nothing would verify nothing).
    OSError: the manifest cannot be written (e.g. disk full).
  """
  step_dir = epath.Path(step_dir)
  files = step_files(step_dir, skip)
  if not files:
    raise CheckpointCorruptError(f"checkpoint {step_dir}: no file to list in {MANIFEST}")
  manifest = file_digests(files)
  step = _folder_step(step_dir)
  if step is not None:  # "6" or Orbax's "6.orbax-checkpoint-tmp-..." being committed
    manifest["step"] = step
  write_json_atomic(step_dir / MANIFEST, manifest)


def _folder_step(step_dir: epath.Path) -> int | None:
  """The step a step folder's name gives ("6", "6.orbax-checkpoint-tmp-..."), or None."""
  head = step_dir.name.split(".", 1)[0]
  return int(head) if head.isdigit() else None


def misnamed_step(directory) -> str | None:
  """The line for a step folder under another name in a checkpoints folder, or None.

  Orbax lists only folders named by their step: a complete step renamed (6 -> six,
  6_backup) holds a manifest recording its step but is invisible to a restore, so a
  run would train from scratch over it and a loader would find no checkpoint
  (newcomer pass 11). Orbax's own temporaries (<step>.orbax-checkpoint-tmp-...) are not
  steps under another name."""
  directory = epath.Path(directory)
  if not directory.is_dir():
    return None
  for p in sorted(directory.iterdir()):
    if ((p.name.isdigit() and str(int(p.name)) == p.name)  # "06" is no step to Orbax
        or ".orbax-checkpoint-tmp" in p.name or not (p / MANIFEST).is_file()):
      continue
    try:
      recorded = json.loads((p / MANIFEST).read_text()).get("step")
    except (OSError, ValueError, AttributeError):
      recorded = None
    if isinstance(recorded, int) and (directory / str(recorded)).exists():
      name = f"{_beside(p, directory / str(recorded), recorded)}: move it"
    else:
      name = (f"name it {recorded} again, or move it" if isinstance(recorded, int)
              else "give it its step's number, or move it")
    return (f"{p}: a checkpoint step ({MANIFEST} records step {recorded}) under a name "
            f"that is not its step's, which no restore sees: {name} out of {directory}")
  return None


def _renamed_line(step_dir: epath.Path, recorded) -> str | None:
  """The line for a step folder whose manifest records another step (`recorded`) than
  its name: renamed (name it back), or a copy of a step that is there too (newcomer pass
  13: a copy named 12 beside its step 6 was told to be named 6); None when they agree."""
  named = _folder_step(step_dir)
  if not isinstance(recorded, int) or named is None or recorded == named:
    return None
  if (step_dir.parent / str(recorded)).is_dir():
    return (f"checkpoint {step_dir}: its manifest records step {recorded}: "
            f"{_beside(step_dir, step_dir.parent / str(recorded), recorded)}; move it out "
            f"of {step_dir.parent}")
  # newcomer pass 16 (J24): an edited manifest was blamed on a rename, with advice to
  # rename an intact step; which of the two happened cannot be told from here
  return (f"checkpoint {step_dir}: its manifest ({MANIFEST}) records step {recorded}, its "
          f"folder's name step {named}: the folder renamed (then name it {recorded} "
          f"again) or {MANIFEST} edited (then restore it); move it aside if unsure")


def _beside(copy_dir: epath.Path, step_dir: epath.Path, step: int) -> str:
  """What a step folder `copy_dir` whose manifest records `step` is, beside that step's
  own folder `step_dir`: "a copy of step 6, which is there too" when both manifests list
  the same files and checksums, else another step 6 (another run's: newcomer pass 14's
  M20 was called a copy)."""
  def digests(folder):
    try:
      return json.loads((folder / MANIFEST).read_text()).get("sha256")
    except (OSError, ValueError, AttributeError):
      return None
  ours = digests(step_dir)
  if ours is not None and ours == digests(copy_dir):
    return f"a copy of step {step}, which is there too"
  return (f"a step {step} other than the run's own step {step} (their files differ: "
          "another run's step?)")


def renamed_step(step_dir) -> str | None:
  """`_renamed_line` of a step folder, its manifest's recorded step read (None when the
  manifest is missing or unreadable: `verify_manifest` names that)."""
  step_dir = epath.Path(step_dir)
  try:
    recorded = json.loads((step_dir / MANIFEST).read_text()).get("step")
  except (OSError, ValueError, AttributeError):
    return None
  return _renamed_line(step_dir, recorded)


def not_a_step(directory) -> str | None:
  """The line for an entry of a checkpoints folder named like a step (digits) that
  cannot be one, or None: a file, or an empty folder. Orbax lists an empty folder as
  the latest step (then fails reading its items, and a loader blamed "an older lev_jax"
  and the step's config) and skips a file (a loader said the run was "still starting"):
  newcomer pass 12. Orbax's own writes never leave either (a step is written in a
  temporary folder and renamed, or on GCS under its name, never empty)."""
  directory = epath.Path(directory)
  if not directory.is_dir():
    return None
  for p in sorted(directory.iterdir()):
    if not p.name.isdigit():
      continue
    if not p.is_dir():
      return (f"{p}: a file named like a checkpoint step; expected a step folder (move "
              f"it out of {directory})")
    if not any(p.iterdir()):
      return (f"{p}: an empty folder named like a checkpoint step (a step holds its "
              f"items and {MANIFEST}); move it out of {directory}")
  return None


def verify_manifest(step_dir, checksums: bool = True) -> bool:
  """Checks every file of a step against its manifest.

  Args:
    step_dir: the step's folder.
    checksums: hash every file (what a restore does); False compares only each file's
      size in bytes with the manifest's (no file is read: a finished run's cheap check,
      which finds a truncated, emptied or deleted file, not a flipped bit).
  Returns:
    True when verified, False when the step has no manifest (unverifiable).
  Raises:
    CheckpointCorruptError: the manifest is unreadable or lists no file, records
      another step than the folder's name (a renamed folder), a listed file
      is missing or its checksum (or size) differs, or a file in one of the step's
      folders is not listed (the first such file is named).
  """
  step_dir = epath.Path(step_dir)
  path = step_dir / MANIFEST
  if not path.exists():
    return False
  try:
    if path.is_dir():  # newcomer pass 11: reported as the step's config being unreadable
      raise ValueError("a folder in its place")
    manifest = json.loads(path.read_text())
    expected, sizes = manifest["sha256"], manifest.get("bytes", {})
    if not isinstance(expected, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in expected.items()):
      raise TypeError('"sha256" is not a {file: hex digest} object')
    if not isinstance(sizes, dict):
      raise TypeError('"bytes" is not a {file: size} object')
  except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
    raise CheckpointCorruptError(f"{path}: the checksum manifest is unreadable ({e})") from e
  if not expected:
    raise CheckpointCorruptError(f"{path}: the checksum manifest lists no file (expected "
                                 "every file of the step); it verifies nothing")
  renamed = _renamed_line(step_dir, manifest.get("step"))
  if renamed:  # newcomer pass 10: a folder renamed 6 -> 7 was step 7
    raise CheckpointRenamedError(renamed)
  unlisted = sorted(rel for rel in step_files(step_dir)
                    if "/" in rel and rel not in expected)  # item folders' files
  items = {rel.split("/")[0] for rel in expected if "/" in rel}
  gone = sorted(item for item in items if not (step_dir / item).exists())
  if gone:  # newcomer pass 13: state/ renamed was "state_old/_METADATA is not in ..."
    extra = sorted({rel.split("/")[0] for rel in unlisted} - items)
    raise CheckpointCorruptError(
        f"checkpoint {step_dir}: its {gone[0]}/ item is missing (its manifest lists "
        f"{gone[0]}/'s files)" + (f"; {extra[0]}/ is not part of the save (renamed? name "
                                   f"it {gone[0]} again)" if extra else ""))
  if unlisted:
    raise CheckpointCorruptError(
        f"checkpoint {step_dir}: {unlisted[0]} is not in its checksum manifest (added "
        f"after the save, or the manifest is incomplete)")
  for rel, digest in expected.items():
    f = step_dir / rel
    if not f.exists():
      raise CheckpointCorruptError(f"checkpoint {step_dir}: {rel} is missing")
    if rel in sizes and f.stat().length != sizes[rel]:  # first: no file is read
      raise CheckpointCorruptError(
          f"checkpoint {step_dir}: {rel} is {f.stat().length} bytes, its manifest says "
          f"{sizes[rel]} (the file was cut or changed after the save)")
    if checksums and file_sha256(f) != digest:
      raise CheckpointCorruptError(
          f"checkpoint {step_dir}: {rel} differs from its checksum (the file was changed "
          "or damaged after the save)")
  return True


def quarantine(directory, steps) -> epath.Path:
  """Moves step folders aside, never deleting them: DIRECTORY/<step> to
  DIRECTORY_quarantine/<step>-<time in ns> (so the run can save those steps again).

  Args:
    directory: the checkpoints folder (local path or gs://).
    steps: the steps to move.

  Returns:
    The quarantine folder (created if needed).
  Raises:
    CheckpointMismatchError: the quarantine folder is a file (nothing was moved), or a
      step cannot be moved there (e.g. a read-only filesystem; nothing is deleted).
  """
  directory = epath.Path(directory)
  folder = directory.parent / (directory.name + "_quarantine")
  if folder.exists() and not folder.is_dir():
    raise CheckpointMismatchError(
        f"{folder}: is a file; expected the folder the unrestorable steps {list(steps)} "
        "are moved to; move that file aside and re-run")
  try:
    folder.mkdir(parents=True, exist_ok=True)
    for bad in steps:
      (directory / str(bad)).rename(folder / f"{bad}-{time.time_ns()}")
      logging.warning("moved the unrestorable step %d to %s", bad, folder)
  except OSError as e:
    raise CheckpointMismatchError(
        f"{folder}: the unrestorable steps {list(steps)} cannot be moved there "
        f"({e.strerror or e}); nothing was deleted: move them aside yourself, or make "
        "the folder writable, and re-run") from e
  return folder


def result_fields(config: ml_collections.ConfigDict) -> dict:
  """{section: field names} of every field of `config` but RUN_ONLY_FIELDS, for
  `config_differences`; section "" holds the top-level values (name, seed)."""
  table = {"": tuple(k for k, v in config.items()
                     if not isinstance(v, ml_collections.ConfigDict) and k not in RUN_ONLY_FIELDS)}
  for section, value in config.items():
    if isinstance(value, ml_collections.ConfigDict):
      table[section] = tuple(f for f in value.keys() if f"{section}.{f}" not in RUN_ONLY_FIELDS)
  return table


def resume_flags(saved: dict, differences: list[str]) -> str:
  """The flags that resume with the stored values of the fields `config_differences`
  named, e.g. "--config.data.worker_processes=2 --config.train.seq_len=128"."""
  out = []
  for line in differences:
    field = line.split(":", 1)[0]
    section, _, name = field.rpartition(".")
    value = (saved.get(section, {}) if section else saved).get(name)
    if isinstance(value, list):
      value = "'(" + ", ".join(repr(v) for v in value) + ("," if len(value) == 1 else "") + ")'"
    out.append(f"--config.{field}={value}")
  return " ".join(out)


def resume_mismatch(saved: dict, config: ml_collections.ConfigDict, where: str,
                    one_line: bool = False) -> str | None:
  """Why a run of `config` cannot resume the checkpoint whose stored config is `saved`
  (`where`: "checkpoint DIR/STEP"), or None: its model shape differs (SHAPE_FIELDS,
  every field named, one per line unless `one_line`), or a field that shapes the data
  iterator's state (ITERATOR_FIELDS, named with the flags that resume). What
  Checkpointer.restore refuses and lev-train's --preflight (one_line) foresees."""
  diffs = config_differences(saved, config, SHAPE_FIELDS)
  if diffs:
    listed = ("; ".join(diffs) + ". " if one_line
              else "\n  " + "\n  ".join(diffs) + "\n")
    return (f"{where} does not match this config's model shape:{' ' * one_line}{listed}"
            "Use a new --workdir, or the checkpoint's config.")
  moved = config_differences(saved, config, ITERATOR_FIELDS, stored_only=True)
  if moved:  # grain would fail, or restore another stream: the step is not at fault
    return (f"{where}: its data position was saved under other data settings: "
            f"{'; '.join(moved)}; resume with {resume_flags(saved, moved)}. Nothing was "
            "changed")
  return None


def _as_stored(value):
  """`value` as the config item stores it: JSON (tuples as lists, sections as dicts)."""
  if isinstance(value, ml_collections.ConfigDict):
    value = value.to_dict()
  return json.loads(json.dumps(value))


def shape_record(config: ml_collections.ConfigDict) -> dict:
  """{"model.d_model": 512, ...}: the config's SHAPE_FIELDS (LEV's only for a Leviathan
  model), as lev-train records them in data_report.json ("model_shape") so that a loader
  can tell a step copied in from another run (newcomer pass 13: a Leviathan run's step in
  a tied run's folder was evaluated as that run). JSON values (tuples as lists)."""
  record = {}
  for section, fields in SHAPE_FIELDS.items():
    if section == "lev" and config.model.embedding != "lev":
      continue
    for name in fields:
      value = config[section].get(name)
      record[f"{section}.{name}"] = list(value) if isinstance(value, tuple) else value
  return record


def shape_record_differences(record: dict, saved: dict) -> list[str]:
  """"model.embedding: checkpoint 'lev', run 'tied'" for each field of a `shape_record`
  (from data_report.json) that a stored config `saved` holds with another value."""
  out = []
  for key, value in record.items():
    section, _, name = key.partition(".")
    stored = saved.get(section, {}).get(name, FIELDS_ADDED.get(key))
    if stored != value:
      out.append(f"{key}: checkpoint {stored!r}, run {value!r}")
  return out


def run_shape_problem(folder, saved: dict, where: str,
                      progress: dict | None = None) -> str | None:
  """The line when a step does not belong to the run in `folder` as lev-train recorded
  it in DATA_REPORT, or when that record is damaged; None when they agree, or the run
  has no record (runs from before it: not checked; `run_record_missing` warns).

  The step's stored config `saved` (`where`: "checkpoint DIR/STEP") must hold the
  recorded model ("model_shape", `shape_record`); its progress item `progress`, when
  it holds a run id, the recorded "run" (checkpoint.new_run_id: a step of another run
  of the same shape, e.g. another seed, newcomer pass 14); and its "lineage" (the
  starts of lev-train that led to it, checkpoint.new_start_id) must begin the recorded
  one: a step of another copy of the same run, extended apart after the copy, has a
  start this folder never made (newcomer pass 15, Q11). Which of the two changed
  cannot be told: a step copied in from another run, or data_report.json replaced or
  edited."""
  path = epath.Path(folder) / DATA_REPORT
  if not path.exists():
    return None  # `run_record_missing` warns
  try:
    report = json.loads(path.read_text())
  except (OSError, ValueError) as e:  # newcomer pass 16 (J09b-d, J10b, L10c): a damaged
    report = e  # record skipped every check below, and lev-train then rewrote it
  if not isinstance(report, dict):
    why = (f"{report}" if isinstance(report, Exception) else
           f"it holds {'null' if report is None else type(report).__name__}, not a JSON "
           "object")
    return (f"{path}: cannot be read ({why}): {where} cannot be checked against the "
            "run's record of its model and id (the file truncated or edited?). Restore "
            "it (deleted, the checks are skipped: a loader warns and goes on, lev-train "
            "takes the step as the run's)")
  record, run_id = report.get("model_shape"), report.get("run")
  if record is not None and record != {}:
    unknown = (sorted(set(record) - SHAPE_FIELD_NAMES) if isinstance(record, dict)
               else None)
    if unknown is None or unknown:
      what = f"unknown field {unknown[0]!r}" if unknown else f"{type(record).__name__}"
      return (f"{path}: its model_shape holds {what}; expected lev-train's record of the "
              "model's shape fields (edited? restore the file, or delete that field to "
              "skip the check)")
    diffs = shape_record_differences(record, saved)
    if diffs:
      return (f"{where} holds another model than the one recorded for the run in {folder} "
              f"({'; '.join(diffs)}; the record: {path}): a step copied in from another "
              "run, or data_report.json replaced or edited? Put back the one that changed")
  step_run = (progress or {}).get("run")
  if run_id is not None and not isinstance(run_id, str):
    # newcomer pass 18 (L17): deleting the field only helps when the step has no run
    fix = (f"restore the file: {where} records run {step_run}"
           if isinstance(step_run, str) else
           "restore the file, or delete that field to skip the check")
    return (f"{path}: its run holds {type(run_id).__name__}; expected lev-train's id of "
            f"the run (edited? {fix})")
  if isinstance(step_run, str) and not run_id:
    # newcomer pass 15 (Q02, Q05, Q28): the step records its run, the record none: a
    # lev_jax that records the step's id writes it in data_report.json too
    return (f"{where} records run {step_run}, but {path} records no run (its \"run\" "
            "deleted, or the file replaced by an older one?): the step cannot be checked "
            "against the run. Put back the run's own data_report.json, or move the step "
            "out if it is another run's")
  if isinstance(run_id, str) and isinstance(step_run, str) and step_run != run_id:
    return (f"{where} belongs to another run than the one in {folder} (its progress item "
            f"records run {step_run}, {path} run {run_id}): a step copied in from another "
            "run of the same model (another seed or data?), or data_report.json replaced? "
            "Put back the one that changed")
  step_lineage, lineage = (progress or {}).get("lineage"), report.get("lineage")
  if isinstance(step_lineage, list) and step_lineage and not isinstance(lineage, list):
    # newcomer pass 17 (A06-A10): the record's lineage deleted, null or a string skipped
    # the check, and lev-train then rewrote the record from the foreign step
    return (f"{where} records the lineage of lev-train starts that trained it, but {path} "
            f"{'records none' if lineage is None else 'holds ' + type(lineage).__name__} "
            "(its \"lineage\" deleted or edited?): the step cannot be checked against the "
            "run. Put back the run's own data_report.json, or move the step out if it is "
            "another copy's")
  if (isinstance(step_lineage, list) and isinstance(lineage, list)
      and lineage[:len(step_lineage)] != step_lineage):
    gone = next(s for i, s in enumerate(step_lineage) if i >= len(lineage) or lineage[i] != s)
    if gone in lineage:  # the same starts in another order (newcomer pass 18, L08, L15)
      return (f"{where} records its lev-train starts in another order than {path} (start "
              f"{gone} is in another place there): the file edited, or replaced by another "
              "copy's? Put back the run's own data_report.json")
    return (f"{where} was trained by a start of lev-train that this folder's run never "
            f"made (start {gone} in its progress item's lineage, not in {path}'s): a step "
            f"of another copy of this run (run {run_id}), extended apart after the copy "
            "(evaluate it in the folder it was trained in, or move it out of "
            f"{epath.Path(folder) / CHECKPOINTS}), or this folder's data_report.json "
            "replaced by an older one or another copy's (put back its own)?")
  return None


def run_record_missing(folder) -> str | None:
  """The warning when the run in `folder` has no record of its model to check a step
  against (`run_shape_problem`): data_report.json missing, or without "model_shape"
  (written by lev_jax before the record existed); None when the record is there or
  data_report.json cannot be read (the tokenizer check names that)."""
  path = epath.Path(folder) / DATA_REPORT
  if not path.exists():
    return (f"{path} is missing: the step's model cannot be checked against the run's "
            "record (a step copied in from another run would go unnoticed)")
  try:
    report = json.loads(path.read_text())
  except (OSError, ValueError):
    return None
  if isinstance(report, dict) and report.get("model_shape") in (None, {}):
    return (f"{path} records no model_shape (written by an older lev_jax, or edited): "
            "the step's model cannot be checked against the run's record")
  return None


def config_differences(saved: dict, config: ml_collections.ConfigDict,
                       table: dict = SHAPE_FIELDS, *, stored_only: bool = False) -> list[str]:
  """The fields of `table` (SHAPE_FIELDS, DATA_FIELDS, result_fields) whose stored value
  differs.

  Args:
    saved: a stored config (`saved_config`, JSON: tuples stored as lists).
    config: this run's config; its `lev` fields count only for model.embedding "lev".
    table: {section: field names}; section "" = the config's top-level values.
    stored_only: compare only the fields `saved` holds (a run saved before a field
      existed ran as its default did); else a missing one counts as None (as its
      FIELDS_ADDED value for those).
  Returns:
    One line per difference: "section.field: checkpoint OLD, this run NEW"; [] if none.
  """
  diffs = []
  for section, fields in table.items():
    if section == "lev" and config.model.embedding != "lev":
      continue
    stored = saved.get(section, {}) if section else saved
    for f in fields:
      if stored_only and f not in stored:
        continue
      old = stored.get(f, FIELDS_ADDED.get(f"{section}.{f}"))
      new = _as_stored(config[section][f] if section else config[f])
      if old != new:
        diffs.append(f"{section + '.' if section else ''}{f}: checkpoint {old!r}, "
                     f"this run {new!r}")
  return diffs
