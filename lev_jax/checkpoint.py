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

import logging

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
               "data": ("source", "train_files", "pile_set_names", "tokenizer", "seed",
                        "shuffle_buffer")}


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


def _name(keypath) -> str:
  return jax.tree_util.keystr(keypath, simple=True, separator="/")


class Checkpointer:
  """Saves and restores (state, data iterator, config) under WORKDIR/checkpoints.

  Args:
    directory: where step folders go (local path or gs://).
    keep: how many recent checkpoints to keep (older ones are deleted only after a
      newer one is complete).
    async_save: write in a background thread after the device-to-host copy.
  """

  def __init__(self, directory, *, keep: int, async_save: bool = True):
    self.directory = epath.Path(directory)
    options = ocp.CheckpointManagerOptions(
        max_to_keep=keep, enable_async_checkpointing=async_save, create=True)
    self.manager = ocp.CheckpointManager(self.directory, options=options, item_handlers={
        "state": ocp.StandardCheckpointHandler(),
        "data": grain.checkpoint.CheckpointHandler(),
        "config": ocp.JsonCheckpointHandler()})

  def latest_step(self) -> int | None:
    return self.manager.latest_step()

  def save(self, step: int, state, data_iterator, config: ml_collections.ConfigDict) -> bool:
    """Starts saving `step`; returns at once when async (call `wait` before exit)."""
    return self.manager.save(step, force=True, args=ocp.args.Composite(
        state=ocp.args.StandardSave(state),
        data=grain.checkpoint.CheckpointSave(data_iterator),
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
    stored = self.manager.item_metadata(step)["state"]
    stored_shapes = {_name(p): tuple(m.shape) for p, m in
                     jax.tree_util.tree_flatten_with_path(stored)[0] if hasattr(m, "shape")}
    for p, a in jax.tree_util.tree_flatten_with_path(abstract_state)[0]:
      name = _name(p)
      if name in stored_shapes and stored_shapes[name] != tuple(a.shape):
        raise CheckpointMismatchError(
            f"{where}: {name} has shape {stored_shapes[name]}, this run expects {tuple(a.shape)}")
    restored = self.manager.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(abstract_state),
        data=grain.checkpoint.CheckpointRestore(data_iterator)))
    data_diffs = _differences(saved, config, DATA_FIELDS)
    if data_diffs:
      logging.warning("%s: resuming with different data settings; the restored data "
                      "position refers to the old stream:\n  %s", where, "\n  ".join(data_diffs))
    logging.info("restored %s", where)
    return restored["state"]

  def wait(self):
    self.manager.wait_until_finished()

  def close(self):
    self.manager.wait_until_finished()
    self.manager.close()
