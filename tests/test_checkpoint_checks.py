"""A step's checksum manifest, stored-config checks and quarantine
(lev_jax/checkpoint_checks.py) on hand-made step folders: no Orbax, no training."""

import errno
import json
import re

import pytest

from lev_jax import checkpoint_checks
from lev_jax.checkpoint_checks import (MANIFEST, CheckpointCorruptError, CheckpointMismatchError,
                                       config_differences, quarantine, verify_manifest,
                                       write_manifest)
from lev_jax.config import base_config


def _step(tmp_path, name="4"):
  step = tmp_path / "checkpoints" / name
  (step / "state" / "d").mkdir(parents=True)
  (step / "state" / "d" / "chunk").write_bytes(bytes(range(256)) * 8)
  (step / "config").mkdir()
  (step / "config" / "metadata").write_text('{"model": {}}')
  return step


def test_a_manifest_lists_every_file_and_verifies_until_one_changes(tmp_path):
  step = _step(tmp_path)
  assert verify_manifest(step) is False  # no manifest: unverifiable, not corrupt
  write_manifest(step)
  manifest = json.loads((step / MANIFEST).read_text())
  assert sorted(manifest["sha256"]) == ["config/metadata", "state/d/chunk"]
  assert manifest["bytes"]["state/d/chunk"] == 2048
  assert verify_manifest(step) is True
  renamed = step.parent / str(manifest["step"] + 1)  # newcomer pass 10: reported as step 7
  step.rename(renamed)
  with pytest.raises(CheckpointCorruptError, match=re.escape(
      f"its manifest (checksums.json) records step {manifest['step']}, its folder's name "
      f"step {manifest['step'] + 1}: the folder renamed")):
    verify_manifest(renamed)
  renamed.rename(step)
  data = bytearray((step / "state" / "d" / "chunk").read_bytes())
  data[100] ^= 0x01
  (step / "state" / "d" / "chunk").write_bytes(bytes(data))
  with pytest.raises(CheckpointCorruptError, match="state/d/chunk differs from its checksum"):
    verify_manifest(step)
  # issue 26: a finished run's cheap check compares sizes only (no hashing)
  assert verify_manifest(step, checksums=False) is True  # a flipped bit keeps the size
  (step / "state" / "d" / "chunk").write_bytes(bytes(data[:1000]))
  with pytest.raises(CheckpointCorruptError, match="state/d/chunk is 1000 bytes, its "
                     "manifest says 2048"):
    verify_manifest(step, checksums=False)
  (step / "state").rename(step / "state_old")  # newcomer pass 13: "state_old/... is not
  with pytest.raises(CheckpointCorruptError, match=re.escape(  # in its checksum manifest"
      f"checkpoint {step}: its state/ item is missing (its manifest lists state/'s files); "
      "state_old/ is not part of the save (renamed? name it state again)")):
    verify_manifest(step)
  (step / "state_old").rename(step / "state")
  (step / "config" / "metadata").unlink()
  with pytest.raises(CheckpointCorruptError, match="config/metadata is missing"):
    verify_manifest(step)
  (step / MANIFEST).write_text("{}")
  with pytest.raises(CheckpointCorruptError, match="the checksum manifest is unreadable"):
    verify_manifest(step)
  assert issubclass(CheckpointCorruptError, CheckpointMismatchError)


def test_a_manifest_that_lists_nothing_or_misses_a_file_is_refused(tmp_path):
  step = _step(tmp_path)
  (step / "commit_success.txt").write_text("committed")  # a top-level commit record
  write_manifest(step, skip=("commit_success.txt",))
  assert "commit_success.txt" not in json.loads((step / MANIFEST).read_text())["sha256"]
  assert verify_manifest(step) is True  # top-level files it left out are not its business
  (step / "state" / "d" / "extra").write_bytes(b"x")
  with pytest.raises(CheckpointCorruptError, match="state/d/extra is not in its checksum "
                     "manifest"):
    verify_manifest(step)
  (step / MANIFEST).write_text('{"sha256": {}}')
  with pytest.raises(CheckpointCorruptError, match="lists no file .*verifies nothing"):
    verify_manifest(step)
  (step / MANIFEST).write_text('{"sha256": ["state/d/chunk"]}')
  with pytest.raises(CheckpointCorruptError, match="the checksum manifest is unreadable"):
    verify_manifest(step)
  empty = tmp_path / "checkpoints" / "6"
  empty.mkdir()
  with pytest.raises(CheckpointCorruptError, match="no file to list"):
    write_manifest(empty)


def test_quarantine_moves_steps_aside_and_deletes_nothing(tmp_path):
  for name in ("2", "4"):
    _step(tmp_path, name)
  folder = quarantine(tmp_path / "checkpoints", [4])
  assert folder == tmp_path / "checkpoints_quarantine"
  assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["2"]
  (moved,) = folder.iterdir()
  assert moved.name.startswith("4-") and (moved / "state" / "d" / "chunk").exists()


def test_config_differences_name_shape_and_data_fields():
  c = base_config()
  saved = json.loads(json.dumps(c.to_dict()))  # as stored: tuples become lists
  assert config_differences(saved, c) == []
  assert config_differences(saved, c, checkpoint_checks.DATA_FIELDS) == []
  saved["model"]["d_model"] = c.model.d_model + 16
  saved["train"]["seq_len"] = c.train.seq_len * 2
  assert config_differences(saved, c) == [
      f"model.d_model: checkpoint {c.model.d_model + 16}, this run {c.model.d_model}"]
  assert config_differences(saved, c, checkpoint_checks.DATA_FIELDS) == [
      f"train.seq_len: checkpoint {c.train.seq_len * 2}, this run {c.train.seq_len}"]


def test_lev_output_norm_is_a_shape_field_that_checkpoints_before_it_lack():
  """lev.output_norm adds a parameter: a resume under another value is refused by name
  (not as a damaged step); a checkpoint written before the field existed had 'none'."""
  c = base_config()
  saved = json.loads(json.dumps(c.to_dict()))
  del saved["lev"]["output_norm"]
  assert config_differences(saved, c) == []
  c.lev.output_norm = "scale"
  assert config_differences(saved, c) == [
      "lev.output_norm: checkpoint 'none', this run 'scale'"]


def test_quarantine_into_a_file_or_a_read_only_folder_is_one_error_moving_nothing(
    tmp_path, monkeypatch):
  """Issue 26.15: `checkpoints_quarantine` being a file was a FileExistsError traceback."""
  _step(tmp_path, "4")
  (tmp_path / "checkpoints_quarantine").write_text("")
  with pytest.raises(CheckpointMismatchError, match=r"checkpoints_quarantine: is a file; "
                     r"expected the folder the unrestorable steps \[4\] are moved to"):
    quarantine(tmp_path / "checkpoints", [4])
  (tmp_path / "checkpoints_quarantine").unlink()

  def read_only(self, target):
    raise OSError(errno.EROFS, "Read-only file system")
  monkeypatch.setattr(type(checkpoint_checks.epath.Path(tmp_path)), "rename", read_only)
  with pytest.raises(CheckpointMismatchError, match=r"cannot be moved there \(Read-only "
                     r"file system\); nothing was deleted"):
    quarantine(tmp_path / "checkpoints", [4])
  assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["4"]
