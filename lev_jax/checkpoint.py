"""One Orbax CheckpointManager for the train state, the data iterator and the config.

Each checkpoint step holds three items:
  state   params, optimizer state, step, rng (StandardSave: OCDBT/zarr arrays)
  data    the grain iterator position (grain.checkpoint.CheckpointSave)
  config  the experiment config as JSON

Orbax writes each step into a temporary directory and renames it only when every item
is complete, so a run killed at any moment (kill -9) leaves the earlier checkpoints
intact and the restart resumes from the last complete one. Source: orbax-checkpoint
docs, "CheckpointManager" and "Async checkpointing".
"""

from __future__ import annotations

import dataclasses
import json
import logging
from typing import Any

import grain
import jax
import ml_collections
import orbax.checkpoint as ocp
from etils import epath

# Config sections whose values decide parameter shapes; a restore with any of them
# changed is refused with the list of differences.
SHAPE_FIELDS = {
    "model": ("embedding", "vocab_size", "vocab_multiple", "d_model", "n_layers", "n_heads",
              "n_kv_heads", "head_dim", "d_ff", "param_dtype"),
    "lev": ("n_coords", "base", "d_seed", "n_heads", "n_knots", "rank", "basis"),
}


# Fields that do not change shapes but change what the restored data position means.
DATA_FIELDS = {"train": ("seq_len", "global_batch_size"),
               "data": ("source", "train_files", "prepared_dir", "pile_set_names",
                        "tokenizer", "seed", "shuffle_buffer", "segment_masking",
                        "worker_processes")}


def error_line(error: BaseException, limit: int = 160) -> str:
  """The start of an error's first line: Orbax and tensorstore errors carry kilobytes."""
  line = (str(error).strip().splitlines() or [type(error).__name__])[0]
  return line if len(line) <= limit else line[:limit] + "..."


class CheckpointMismatchError(ValueError):
  """The checkpoint was written for a different model shape than this config's."""


def _differences(saved: dict, config: ml_collections.ConfigDict, table: dict) -> list[str]:
  diffs = []
  for section, fields in table.items():
    if section == "lev" and config.model.embedding != "lev":
      continue
    for f in fields:
      old = saved.get(section, {}).get(f)
      new = config[section][f]
      if isinstance(new, tuple):
        new = list(new)  # JSON stores tuples as lists
      if old != new:
        diffs.append(f"{section}.{f}: checkpoint {old!r}, this run {new!r}")
  return diffs


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


class Checkpointer:
  """Saves and restores (state, data iterator, config) under WORKDIR/checkpoints.

  Args:
    directory: where step folders go (local path or gs://).
    keep: how many recent checkpoints to keep (older ones are deleted only after a
      newer one is complete).
    async_save: write in a background thread after the device-to-host copy.
    portable_data: the data iterator state is the same in every process
      (data.host_batches = "global"), so it restores under any process count.
  """

  def __init__(self, directory, *, keep: int, async_save: bool = True,
               portable_data: bool = True):
    self.directory = epath.Path(directory)
    options = ocp.CheckpointManagerOptions(
        max_to_keep=keep, enable_async_checkpointing=async_save, create=True)
    self.manager = ocp.CheckpointManager(self.directory, options=options, item_handlers={
        "state": ocp.StandardCheckpointHandler(),
        "data": DataIteratorHandler(portable_data),
        "config": ocp.JsonCheckpointHandler()})

  def latest_step(self) -> int | None:
    return self.manager.latest_step()

  def save(self, step: int, state, data_iterator, config: ml_collections.ConfigDict) -> bool:
    """Starts saving `step`; returns at once when async (call `wait` before exit)."""
    return self.manager.save(step, force=True, args=ocp.args.Composite(
        state=ocp.args.StandardSave(state),
        data=DataSave(data_iterator),
        config=ocp.args.JsonSave(config.to_dict())))

  def saved_config(self, step: int) -> dict:
    return self.manager.restore(step, args=ocp.args.Composite(
        config=ocp.args.JsonRestore()))["config"]

  def restore(self, step: int, abstract_state, data_iterator,
              config: ml_collections.ConfigDict):
    """Restores `step` into the shapes of `abstract_state`; sets the iterator's position.

    Raises:
      CheckpointMismatchError: the checkpoint's model shape differs from `config`'s
        (every differing field is named), or an array's stored shape differs.
    """
    where = f"checkpoint {self.directory / str(step)}"
    saved = self.saved_config(step)
    diffs = _differences(saved, config, SHAPE_FIELDS)
    if diffs:
      raise CheckpointMismatchError(
          f"{where} does not match this config's model shape:\n  " + "\n  ".join(diffs)
          + "\nUse a new --workdir, or the checkpoint's config.")
    try:
      restored = self._read(step, where, abstract_state, data_iterator)
    except CheckpointMismatchError:
      raise
    except Exception as e:  # tensorstore / Orbax errors of a damaged step: any type
      others = [s for s in self.manager.all_steps() if s != step]
      raise CheckpointMismatchError(
          f"{where} cannot be read: it is incomplete or corrupt ({error_line(e)}). Nothing was "
          f"changed; move that folder aside to resume from an earlier step {others}"
      ) from e
    data_diffs = _differences(saved, config, DATA_FIELDS)
    if data_diffs:
      logging.warning("%s: resuming with different data settings; the restored data "
                      "position refers to the old stream:\n  %s", where, "\n  ".join(data_diffs))
    logging.info("restored %s", where)
    return restored["state"]

  def _read(self, step, where, abstract_state, data_iterator):
    """Checks the stored array shapes, then restores the state and the data position."""
    stored = self.manager.item_metadata(step)["state"]
    stored_shapes = {_name(p): tuple(m.shape) for p, m in
                     jax.tree_util.tree_flatten_with_path(stored)[0] if hasattr(m, "shape")}
    for p, a in jax.tree_util.tree_flatten_with_path(abstract_state)[0]:
      name = _name(p)
      if name in stored_shapes and stored_shapes[name] != tuple(a.shape):
        raise CheckpointMismatchError(
            f"{where}: {name} has shape {stored_shapes[name]}, this run expects {tuple(a.shape)}")
    return self.manager.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(abstract_state),
        data=DataRestore(data_iterator)))

  def wait(self):
    self.manager.wait_until_finished()

  def close(self):
    self.manager.wait_until_finished()
    self.manager.close()
