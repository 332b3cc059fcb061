"""Checkpoints never restore damaged data silently and never lose the earlier steps."""

import errno
import json
import re
import shutil

import numpy as np
import pytest

from lev_jax import checkpoint, checkpoint_checks
from lev_jax.checkpoint import (CheckpointCorruptError, CheckpointMismatchError,
                                CheckpointWriteError)
from lev_jax.trainer import train_and_evaluate
from conftest import copy_run, files_of, metrics, saved_state


@pytest.fixture
def run(finished_tied_run, tmp_path):
  """A copy of the finished 4-step run (checkpoints 2, 4) set to train on to step 6."""
  c, workdir = copy_run(finished_tied_run, tmp_path / "run")
  c.train.steps = 6
  return c, workdir


def _largest_file(step_dir):
  files = [p for p in step_dir.rglob("*") if p.is_file() and p.name != checkpoint_checks.MANIFEST]
  return max(files, key=lambda p: p.stat().st_size)


def test_every_saved_step_has_a_manifest_that_verifies(run):
  _, workdir = run
  for step in (2, 4):
    manifest = json.loads(
        (workdir / "checkpoints" / str(step) / checkpoint_checks.MANIFEST).read_text())
    assert any(name.startswith("state/") for name in manifest["sha256"])
    assert checkpoint_checks.verify_manifest(workdir / "checkpoints" / str(step))


def test_the_manifest_is_committed_with_its_step(tmp_path):
  """A kill -9 right after Orbax commits a step (before any later save or close) leaves
  the step with its manifest: it is written inside the commit, before the rename."""
  import grain
  import jax.numpy as jnp
  from conftest import byte_config
  ckpt = checkpoint.Checkpointer(tmp_path / "checkpoints", keep=2)
  it = iter(grain.MapDataset.range(4).to_iter_dataset())
  ckpt.save(3, {"w": jnp.arange(4.0), "step": jnp.int32(3)}, it, byte_config("tied"))
  ckpt.manager.wait_until_finished()  # Orbax's commit alone: lev_jax's wait never ran
  step_dir = tmp_path / "checkpoints" / "3"
  manifest = json.loads((step_dir / checkpoint_checks.MANIFEST).read_text())
  assert any(name.startswith("state/") for name in manifest["sha256"])
  assert checkpoint_checks.verify_manifest(step_dir)
  ckpt.close()


def _nonfinite_at(monkeypatch, steps):
  """Checkpoint steps in `steps` restore with NaN parameters (as a damaged step without
  a manifest, written by an older lev_jax, would), after their data position is set."""
  import jax
  import jax.numpy as jnp
  read = checkpoint.Checkpointer._read

  def damaged(self, step, *args):
    restored = read(self, step, *args)
    if step in steps:
      restored["state"]["params"] = jax.tree.map(lambda x: x * jnp.nan,
                                                 restored["state"]["params"])
    return restored
  monkeypatch.setattr(checkpoint.Checkpointer, "_read", damaged)


def test_a_non_finite_restored_state_is_refused_and_fallback_skips_it(run, monkeypatch,
                                                                      caplog):
  c, workdir = run
  _nonfinite_at(monkeypatch, {4})
  with pytest.raises(CheckpointCorruptError, match=r"checkpoints/4: params/\S+ and \d+ more "
                     "arrays hold NaN or infinite values.*--restore_fallback"):
    train_and_evaluate(c, workdir)
  result = train_and_evaluate(c, workdir, restore_fallback=True)
  assert result["step"] == 6 and np.isfinite(result["loss"])
  assert "skipping 4" in caplog.text
  (moved,) = (workdir / "checkpoints_quarantine").iterdir()
  assert moved.name.startswith("4-")


def test_fallback_with_no_restorable_step_starts_again_from_step_0(run, finished_tied_run,
                                                                   monkeypatch, caplog):
  """The drill of issue 26: every step damaged (2: bytes flipped, caught by its
  manifest; 4: NaN state, after its data position was restored). Without the flag:
  one error naming the damage; with it, the run starts again, from the first batch."""
  c, workdir = run
  target = _largest_file(workdir / "checkpoints" / "2")
  target.write_bytes(bytes(b ^ 0xFF for b in target.read_bytes()[:64])
                     + target.read_bytes()[64:])
  _nonfinite_at(monkeypatch, {4})
  with pytest.raises(CheckpointCorruptError, match="checkpoints/4: .* NaN or infinite"):
    train_and_evaluate(c, workdir)
  result = train_and_evaluate(c, workdir, restore_fallback=True)
  assert result["step"] == 6 and np.isfinite(result["loss"])
  assert "starting again from step 0" in caplog.text
  moved = sorted(p.name.split("-")[0] for p in (workdir / "checkpoints_quarantine").iterdir())
  assert moved == ["2", "4"]
  first = lambda w: next(r for r in metrics(w) if r["step"] == 1)["train/loss"]
  assert first(workdir) == first(finished_tied_run[1])  # the data stream from its start


def test_flipped_bytes_are_refused_and_fallback_resumes_from_the_intact_step(run, caplog):
  c, workdir = run
  target = _largest_file(workdir / "checkpoints" / "4")
  data = bytearray(target.read_bytes())
  for i in range(0, len(data), max(1, len(data) // 64))[:64]:
    data[i] ^= 0xFF
  target.write_bytes(bytes(data))
  rel = target.relative_to(workdir / "checkpoints" / "4")
  with pytest.raises(CheckpointCorruptError, match=f"{rel} differs from its checksum"
                     ".*--restore_fallback"):
    train_and_evaluate(c, workdir)
  assert target.read_bytes() == bytes(data)  # nothing changed by the refusal
  result = train_and_evaluate(c, workdir, restore_fallback=True)
  assert result["step"] == 6 and np.isfinite(result["loss"])
  assert "skipping 4" in caplog.text


@pytest.mark.parametrize("damage,match", [
    ("garbage_step", "cannot be read"),
    ("deleted_config", "config/.* is missing"),  # caught by the manifest
    ("deleted_config_no_manifest", "its config cannot be read"),  # e.g. an older run
])
def test_a_damaged_latest_step_is_one_error_and_fallback_skips_it(run, damage, match):
  c, workdir = run
  if damage == "garbage_step":
    (workdir / "checkpoints" / "45").mkdir()
    (workdir / "checkpoints" / "45" / "junk").write_text("not a checkpoint")
  else:
    shutil.rmtree(workdir / "checkpoints" / "4" / "config")
    if damage.endswith("no_manifest"):
      (workdir / "checkpoints" / "4" / checkpoint_checks.MANIFEST).unlink()
  with pytest.raises(CheckpointMismatchError, match=match):
    train_and_evaluate(c, workdir)
  c.train.steps = 5
  assert train_and_evaluate(c, workdir, restore_fallback=True)["step"] == 5


def test_orbax_temporaries_left_by_a_kill_are_removed(run):
  c, workdir = run
  tmp = workdir / "checkpoints" / "6.orbax-checkpoint-tmp-1234"
  (tmp / "state").mkdir(parents=True)
  train_and_evaluate(c, workdir)
  assert not tmp.exists()
  assert sorted(p.name for p in (workdir / "checkpoints").iterdir()) == ["2", "4", "6"]


def test_a_failed_save_is_one_error_and_keeps_the_earlier_checkpoints(run, monkeypatch):
  c, workdir = run

  def disk_full(*args, **kwargs):
    (workdir / "checkpoints" / "6.orbax-checkpoint-tmp-99").mkdir()
    raise OSError(errno.ENOSPC, "No space left on device")
  monkeypatch.setattr("orbax.checkpoint.CheckpointManager.save", disk_full)
  with pytest.raises(CheckpointWriteError, match="checkpoint .*6 could not be written "
                     r"\(\[Errno 28\] No space left on device\).*\[2, 4\] are intact"):
    train_and_evaluate(c, workdir)
  assert sorted(p.name for p in (workdir / "checkpoints").iterdir()) == ["2", "4"]
  assert saved_state(workdir, 4)["step"] == 4


def test_a_read_only_checkpoints_folder_is_one_error_naming_the_temporary_left(
    run, monkeypatch):
  """Issue 26.12: the temporary folder's removal fails too (EROFS); that must not
  replace the save's error."""
  from etils import epath
  c, workdir = run
  tmp = workdir / "checkpoints" / "6.orbax-checkpoint-tmp"

  def read_only(*args, **kwargs):
    (tmp / "state").mkdir(parents=True)
    raise OSError(errno.EROFS, "Read-only file system")

  def cannot_remove(path, *args, **kwargs):
    raise OSError(errno.EROFS, "Read-only file system", "state")
  monkeypatch.setattr("orbax.checkpoint.CheckpointManager.save", read_only)
  monkeypatch.setattr(type(epath.Path(tmp)), "rmtree", cannot_remove)
  with pytest.raises(CheckpointWriteError, match=r"checkpoints/6 could not be written "
                     r"\(\[Errno 30\] Read-only file system\); the checkpoints \[2, 4\] are "
                     rf"intact; its temporary folder could not be removed: {tmp} \(\[Errno 30\] "
                     r"Read-only file system: 'state'\); the next run on this workdir removes it"):
    train_and_evaluate(c, workdir)
  assert saved_state(workdir, 4)["step"] == 4


def test_a_scan_layers_change_is_named(run):
  c, workdir = run
  c.model.scan_layers = not c.model.scan_layers
  with pytest.raises(CheckpointMismatchError, match="model.scan_layers: checkpoint False, "
                     "this run True"):
    train_and_evaluate(c, workdir)


def test_the_reader_and_latest_config_file_read_the_trained_config(run):
  c, workdir = run
  path = checkpoint.latest_config_file(workdir / "checkpoints")
  with checkpoint.CheckpointReader(workdir / "checkpoints") as reader:
    assert reader.all_steps() == [2, 4]
    saved = reader.saved_config(4)
  assert path == workdir / "checkpoints" / "4" / "config" / "metadata"
  assert json.loads(path.read_text()) == saved
  assert checkpoint_checks.config_differences(saved, c) == []
  assert checkpoint.latest_config_file(workdir / "none") is None


def _tiny_iterator():
  import grain
  return iter(grain.MapDataset.range(4).to_iter_dataset())


def _tiny_save(ckpt, step, config):
  import jax.numpy as jnp
  state = {"step": jnp.int32(step), "w": jnp.arange(4.0) * step}
  ckpt.save(step, state, _tiny_iterator(), config)
  return state


def test_a_failed_async_save_is_one_line_and_orbaxs_tracebacks_go_to_errors_log(
    tmp_path, make_config, monkeypatch, caplog):
  """Issue 26.9/14: Orbax logs a failure of its save thread with tracebacks (2 to 84);
  they go to WORKDIR/errors.log, which the one-line error names, and the earlier step
  stays restorable."""
  import jax
  config = make_config()
  ckpt = checkpoint.Checkpointer(tmp_path / "checkpoints", keep=3, async_save=False)
  saved = _tiny_save(ckpt, 1, config)

  def disk_full(*args, **kwargs):  # the manifest, in Orbax's save thread (the commit)
    raise OSError(errno.ENOSPC, "No space left on device")
  monkeypatch.setattr(checkpoint, "write_manifest", disk_full)
  with pytest.raises(CheckpointWriteError) as info:
    _tiny_save(ckpt, 2, config)
  orbax = [r for r in caplog.records if "orbax" in r.pathname and r.levelname == "ERROR"]
  assert orbax == []  # on the terminal: none of Orbax's own error lines
  log = tmp_path / "errors.log"
  assert str(info.value).endswith(f"temporary folder was removed; details in {log}")
  assert "\n" not in str(info.value) and "[Errno 28]" in str(info.value)
  text = log.read_text()
  assert text.count("Traceback") >= 2 and "No space left on device" in text
  assert "async_checkpointer.py" in text and "lev_jax: the error its one-line" in text
  monkeypatch.undo()
  assert ckpt.all_steps() == [1]
  abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), saved)
  step, state = ckpt.restore_latest(abstract, _tiny_iterator(), config)
  assert step == 1 and np.array_equal(state["w"], saved["w"])
  _tiny_save(ckpt, 2, config)  # the next save works again
  ckpt.close()
  assert ckpt.all_steps() == [1, 2] and log.read_text() == text


def test_error_line_keeps_the_os_error_at_the_end_of_a_long_tensorstore_message():
  """Issue 26.14: the reason (File too large, No space left) came after the cut."""
  long = ('OUT_OF_RANGE: Error writing "opt_state.1.0.mu.blocks.0.attn.wk.value/0.0.0" in '
          'OCDBT database at local file "/runs/x/checkpoints/6.orbax-checkpoint-tmp/state/'
          'ocdbt.process_0/": Failed writing: "/runs/x/checkpoints/6.orbax-checkpoint-tmp/'
          'state/d/64ff": Failed to write 185940 bytes to file 8: File too large '
          "[os_error_code='27']")
  spec = long.replace("[os_error_code", "[tensorstore_spec='{\"context\": 1}'] [os_error_code")
  line = checkpoint.error_line(ValueError(long))
  assert len(line) <= 165 and line.startswith("OUT_OF_RANGE: Error writing")
  assert line.endswith("...: File too large [os_error_code='27']")
  assert checkpoint.error_line(ValueError(spec)).endswith("...: File too large")
  assert checkpoint.error_line(ValueError("x" * 200)) == "x" * 160 + "..."


class _OtherShapeIterator:
  """A data iterator whose saved state has another shape than grain's range iterator
  (as a pipeline built under other data settings has): set_state raises KeyError."""

  def get_state(self):
    return {"iterators_in_use_states": []}

  def set_state(self, state):
    state["iterators_in_use_states"]  # pylint: disable=pointless-statement


def _saved_step(tmp_path):
  """A Checkpointer holding step 3 of a tiny state with a grain range position."""
  import grain
  import jax
  import jax.numpy as jnp
  from conftest import byte_config
  c = byte_config("tied")
  ckpt = checkpoint.Checkpointer(tmp_path / "checkpoints", keep=2)
  state = {"w": jnp.arange(4.0), "step": jnp.int32(3)}
  ckpt.save(3, state, iter(grain.MapDataset.range(4).to_iter_dataset()), c)
  ckpt.wait()
  abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), state)
  return ckpt, c, abstract


def test_another_worker_count_is_named_with_the_flag_to_resume_with(tmp_path, caplog):
  """Issue 26.7 (MaxText #1760): not "incomplete or corrupt ... move that folder aside"
  (every step would fail so; following it loses good checkpoints), and not restored
  into another stream either (2 -> 3 workers restores without an error)."""
  import grain
  ckpt, c, abstract = _saved_step(tmp_path)
  c.data.worker_processes = 2
  for fallback in (False, True):  # --restore_fallback skips and moves nothing
    with pytest.raises(CheckpointMismatchError) as e:
      ckpt.restore_latest(abstract, iter(grain.MapDataset.range(4).to_iter_dataset()), c,
                          fallback=fallback)
    assert str(e.value).endswith(
        "data.worker_processes: checkpoint 0, this run 2; resume with "
        "--config.data.worker_processes=0. Nothing was changed")
    assert "corrupt" not in str(e.value) and "aside" not in str(e.value)
  assert ckpt.all_steps() == [3] and not (tmp_path / "checkpoints_quarantine").exists()
  # A data setting that reshapes the saved position in another way (e.g. data.source:
  # a stream's state) is named too, once the state item has read: not blamed on the step.
  c.data.worker_processes = 0
  c.data.source = "jsonl_stream"
  with pytest.raises(CheckpointMismatchError, match=r"checkpoints/3: its data position does "
                     r"not fit this run's data pipeline \(.+\), whose "
                     r"settings differ from the checkpoint's: data.source: checkpoint "
                     r"'embedded', this run 'jsonl_stream'; resume with "
                     r"--config.data.source=embedded. Nothing was changed$"):
    ckpt.restore_latest(abstract, _OtherShapeIterator(), c, fallback=True)
  c.data.source = "embedded"  # the same settings: the step is at fault, as before
  with pytest.raises(CheckpointMismatchError, match="incomplete or corrupt"):
    ckpt.restore(3, abstract, _OtherShapeIterator(), c)
  ckpt.close()


def test_a_resume_with_another_learning_rate_is_one_warning_naming_it(tmp_path, caplog):
  """Issue 26: a resume with --config.optim.lr=0.5 (was 0.003) said nothing; it is not
  refused (a new learning rate on resume is a researcher's choice)."""
  import grain
  ckpt, c, abstract = _saved_step(tmp_path)
  lr = c.optim.lr
  c.optim.lr, c.train.log_every = 0.5, 7  # log_every cannot change results: not named
  ckpt.restore_latest(abstract, iter(grain.MapDataset.range(4).to_iter_dataset()), c)
  lines = [r.getMessage() for r in caplog.records if "differ" in r.getMessage()]
  assert lines == [f"checkpoint {tmp_path / 'checkpoints' / '3'}: resuming with settings that differ "
                   f"from the checkpoint's: optim.lr: checkpoint {lr!r}, this run 0.5 "
                   "(recorded with every later step)"]
  ckpt.close()


def test_a_run_resumed_with_another_learning_rate_records_it_and_says_so(run):
  """Newcomer pass 13 (N491): a run resumed with another lr recorded only the new one,
  so its own config was then refused as "other settings" with no word of the history."""
  from lev_jax.trainer import finished_run
  c, workdir = run  # finished at step 4; on to 6 with another learning rate
  lr = c.optim.lr
  c.optim.lr = lr * 2
  train_and_evaluate(c, workdir)
  with checkpoint.CheckpointReader(workdir / "checkpoints") as reader:
    history = checkpoint.resume_history(reader.saved_progress(6))
  changes = [f"optim.lr: checkpoint {lr!r}, this run {lr * 2!r}"]
  assert history == [{"step": 4, "changes": changes}]  # on every later step
  c.optim.lr = lr
  with pytest.raises(CheckpointMismatchError, match=re.escape(
      f"optim.lr: checkpoint {lr * 2!r}, this run {lr!r} (it was resumed at step 4 with "
      f"{changes[0]}). Nothing was changed")):
    finished_run(c, workdir)


def test_tokens_seen_is_a_running_count_across_a_resume_with_another_batch(run):
  """Issue 26.17: 4 steps of 8 x 32 tokens, then 1 of 4 x 32: 1024, 1152 (not step *
  this run's batch * seq_len, which went back to 640); saved with step 5."""
  c, workdir = run
  c.train.global_batch_size = 4
  train_and_evaluate(c, workdir, stop_at_step=5)
  seen = {r["step"]: r["train/tokens_seen"] for r in metrics(workdir) if "train/loss" in r}
  assert [seen[s] for s in (4, 5)] == [1024, 1152]
  ckpt = checkpoint.Checkpointer(workdir / "checkpoints", keep=3)
  assert ckpt.tokens_seen(5) == 1152
  # lev-train records its tokenizer in the step too (the loaders check tokenizer/ by it)
  from lev_jax.data.tokenizer_files import load_tokenizer
  with checkpoint.CheckpointReader(workdir / "checkpoints") as reader:
    report = json.loads((workdir / "data_report.json").read_text())
    assert reader.saved_progress(5) == {
        "tokens_seen": 1152, "run": report["run"], "lineage": report["lineage"],
        "tokenizer_fingerprint": load_tokenizer(workdir / "tokenizer").fingerprint}
    assert len(report["lineage"]) == 2  # the first start, and the resume at step 4
  shutil.rmtree(workdir / "checkpoints" / "5" / "progress")  # as an older lev_jax saved
  assert ckpt.tokens_seen(5) == 5 * 4 * 32  # its own config's count: all it knows
  ckpt.close()


def test_a_latest_step_removed_during_the_run_is_one_warning(tmp_path, caplog):
  """Issue 26.17: `rm -rf checkpoints/N` of the step last saved, noticed by the next
  save and by the end of the run (close); Orbax and lev_jax only delete older steps."""
  import grain
  import jax.numpy as jnp
  ckpt, c, _ = _saved_step(tmp_path)
  shutil.rmtree(tmp_path / "checkpoints" / "3")
  ckpt.save(4, {"w": jnp.arange(4.0), "step": jnp.int32(4)},
            iter(grain.MapDataset.range(4).to_iter_dataset()), c)
  ckpt.wait()
  shutil.rmtree(tmp_path / "checkpoints" / "4")
  ckpt.close()
  assert [r.getMessage() for r in caplog.records if "removed" in r.getMessage()] == [
      f"checkpoint {tmp_path}/checkpoints/{step} was removed during the run (not by "
      f"lev_jax); the checkpoints on disk are now {left}" for step, left in ((3, []), (4, []))]


def test_a_step_folder_under_another_name_is_named_by_every_reader(finished_tied_run, tmp_path):
  """Newcomer pass 11: a finished run's checkpoints renamed (4 -> 4.bak): lev-train's
  re-run trained from step 0 over the run's files, and lev-eval called the run "still
  starting"; Orbax lists only folders named by their step."""
  from lev_jax import inference, trainer
  from lev_jax.config import ConfigError
  c, workdir = copy_run(finished_tied_run, tmp_path / "run")
  (workdir / "checkpoints" / "2").rename(workdir / "checkpoints" / "two")
  (workdir / "checkpoints" / "4").rename(workdir / "checkpoints" / "4.bak")
  before = files_of(workdir)
  expected = (f"{workdir / 'checkpoints' / '4.bak'}: a checkpoint step (checksums.json "
              f"records step 4) under a name that is not its step's, which no restore "
              f"sees: name it 4 again, or move it out of {workdir / 'checkpoints'}")
  with pytest.raises(ConfigError, match=re.escape(expected + ". Nothing was changed")):
    trainer.finished_run(c, workdir)
  with pytest.raises(ConfigError, match=re.escape(expected)):
    train_and_evaluate(c, workdir)
  with pytest.raises(inference.InferenceError, match=re.escape(expected)):
    inference.load(workdir)
  assert files_of(workdir) == before
  # newcomer pass 12: zero-padded (Orbax lists no "04" either) and a copy beside its step
  (workdir / "checkpoints" / "4.bak").rename(workdir / "checkpoints" / "04")
  with pytest.raises(ConfigError, match=re.escape(f"{workdir / 'checkpoints' / '04'}: a ")):
    trainer.finished_run(c, workdir)
  shutil.copytree(workdir / "checkpoints" / "04", workdir / "checkpoints" / "4")
  with pytest.raises(ConfigError, match=re.escape(
      f"{workdir / 'checkpoints' / '04'}: a checkpoint step (checksums.json records step 4) "
      "under a name that is not its step's, which no restore sees: a copy of step 4, which "
      f"is there too: move it out of {workdir / 'checkpoints'}")):
    trainer.finished_run(c, workdir)
  # newcomer pass 13: a copy under another step's number beside its step
  shutil.rmtree(workdir / "checkpoints" / "04")
  (workdir / "checkpoints" / "two").rename(workdir / "checkpoints" / "2")
  shutil.copytree(workdir / "checkpoints" / "4", workdir / "checkpoints" / "12")
  copy = (f"checkpoint {workdir / 'checkpoints' / '12'}: its manifest records step 4: a "
          f"copy of step 4, which is there too; move it out of "
          f"{workdir / 'checkpoints'}")
  with pytest.raises(inference.InferenceError, match="^" + re.escape(copy)):
    inference.load(workdir)
  with pytest.raises(checkpoint_checks.CheckpointRenamedError, match="^" + re.escape(copy)):
    trainer.finished_run(c, workdir)


def test_a_step_of_another_run_s_model_is_refused_by_the_loaders(finished_tied_run,
                                                                   tmp_path):
  """Newcomer pass 13 (N162): a Leviathan run's step copied into a tied run's
  checkpoints/ was evaluated as that run without a word. lev-train records the model's
  shape in data_report.json; the loaders compare the step's config with it."""
  from lev_jax import inference
  c, workdir = copy_run(finished_tied_run, tmp_path / "run")
  report = json.loads((workdir / "data_report.json").read_text())
  assert report["model_shape"] == checkpoint_checks.shape_record(c)
  assert report["model_shape"]["model.embedding"] == "tied"
  assert not any(k.startswith("lev.") for k in report["model_shape"])
  inference.load(workdir)  # its own steps load
  report["model_shape"]["model.embedding"] = "lev"  # as if the step were another run's
  (workdir / "data_report.json").write_text(json.dumps(report))
  line = (f"checkpoint {workdir / 'checkpoints' / '4'} holds another model than the one "
          f"recorded for the run in {workdir} (model.embedding: checkpoint 'tied', run "
          f"'lev'; the record: {workdir / 'data_report.json'}): a step copied in from "
          "another run, or data_report.json replaced or edited? Put back the one that "
          "changed")
  with pytest.raises(inference.InferenceError, match="^" + re.escape(line) + "$"):
    inference.load(workdir)
  # newcomer pass 14: lev-train said "use the run's own config" (M10), or extended the
  # run over the record (M15)
  from lev_jax.trainer import finished_run
  with pytest.raises(CheckpointMismatchError, match="^" + re.escape(
      line + ". Nothing was changed") + "$"):
    finished_run(c, workdir)
  c.train.steps += 2
  with pytest.raises(CheckpointMismatchError, match="^" + re.escape(line)):
    finished_run(c, workdir)
  for damaged, what in (("garbage", "str"), ({"model.foo": 1}, "unknown field 'model.foo'")):
    report["model_shape"] = damaged  # M03, M11: not lev-train's record
    (workdir / "data_report.json").write_text(json.dumps(report))
    with pytest.raises(inference.InferenceError, match="^" + re.escape(
        f"{workdir / 'data_report.json'}: its model_shape holds {what}; expected ")):
      inference.load(workdir)


def _edited(report: dict, key: str, value) -> dict:
  """A copy of a data_report.json's dict with `key` deleted (value "delete") or set."""
  edited = dict(report)
  if value == "delete":
    del edited[key]
  else:
    edited[key] = value
  return edited


def test_a_step_of_another_run_of_the_same_model_is_refused_and_a_resume_keeps_the_id(
    finished_tied_run, tmp_path):
  """Newcomer pass 14: a step of another run of the same shape (M14: another seed; M07:
  other data) copied over a run's step was evaluated as that run without a word, and a
  copy under another step's number was called "a copy" of the run's own step (M20).
  lev-train records the run's id in data_report.json and every step's progress item."""
  from lev_jax import inference
  from lev_jax.trainer import finished_run
  c, workdir = copy_run(finished_tied_run, tmp_path / "run")
  report = json.loads((workdir / "data_report.json").read_text())
  with checkpoint.CheckpointReader(workdir / "checkpoints") as reader:
    ids = {reader.saved_progress(s)["run"] for s in (2, 4)}
  # the copy keeps the id the run was trained under (not its own folder's)
  assert ids == {report["run"]} == {checkpoint.new_run_id(
      finished_tied_run[1] / "checkpoints", finished_tied_run[0])}
  other = c.copy_and_resolve_references()
  other.seed, other.train.steps = 1, 2
  train_and_evaluate(other, tmp_path / "seed1")
  shutil.rmtree(workdir / "checkpoints" / "4")  # the latest is now step 2: replace it
  shutil.rmtree(workdir / "checkpoints" / "2")
  shutil.copytree(tmp_path / "seed1" / "checkpoints" / "2", workdir / "checkpoints" / "2")
  with checkpoint.CheckpointReader(tmp_path / "seed1" / "checkpoints") as reader:
    foreign = reader.saved_progress(2)["run"]
  assert foreign != report["run"]
  line = (f"checkpoint {workdir / 'checkpoints' / '2'} belongs to another run than the one "
          f"in {workdir} (its progress item records run {foreign}, "
          f"{workdir / 'data_report.json'} run {report['run']}): a step copied in from "
          "another run of the same model (another seed or data?), or data_report.json "
          "replaced? Put back the one that changed")
  with pytest.raises(inference.InferenceError, match="^" + re.escape(line) + "$"):
    inference.load(workdir)
  c.train.steps = 2
  with pytest.raises(CheckpointMismatchError, match="^" + re.escape(line)):
    finished_run(c, workdir)
  # newcomer pass 15 (Q02, Q05, Q28): the record's run deleted or null
  for gone in ("delete", None):
    (workdir / "data_report.json").write_text(json.dumps(_edited(report, "run", gone)))
    unchecked = (f"checkpoint {workdir / 'checkpoints' / '2'} records run {foreign}, but "
                 f"{workdir / 'data_report.json'} records no run (its \"run\" deleted, or "
                 "the file replaced by an older one?): the step cannot be checked")
    with pytest.raises(inference.InferenceError, match="^" + re.escape(unchecked)):
      inference.load(workdir)
    with pytest.raises(CheckpointMismatchError, match="^" + re.escape(unchecked)):
      finished_run(c, workdir)
  (workdir / "data_report.json").write_text(json.dumps(report))
  # M20: the foreign step beside the run's own step 2 (under 12) is not "a copy" of it
  shutil.rmtree(workdir / "checkpoints" / "2")
  shutil.copytree(finished_tied_run[1] / "checkpoints" / "2", workdir / "checkpoints" / "2")
  shutil.copytree(tmp_path / "seed1" / "checkpoints" / "2", workdir / "checkpoints" / "12")
  with pytest.raises(inference.InferenceError, match="^" + re.escape(
      f"checkpoint {workdir / 'checkpoints' / '12'}: its manifest records step 2: a step 2 "
      "other than the run's own step 2 (their files differ: another run's step?); move it "
      f"out of {workdir / 'checkpoints'}")):
    inference.load(workdir)
  shutil.rmtree(workdir / "checkpoints" / "12")
  # a resume (here an extension of the copied run) keeps the run's id in its new steps
  c.train.steps = 6
  train_and_evaluate(c, workdir)
  with checkpoint.CheckpointReader(workdir / "checkpoints") as reader:
    assert reader.saved_progress(6)["run"] == report["run"]
  assert json.loads((workdir / "data_report.json").read_text())["run"] == report["run"]


def test_a_run_without_its_model_record_is_loaded_with_a_warning(finished_tied_run,
                                                                 tmp_path, caplog):
  """Newcomer pass 14 (M05, M16): a run whose data_report.json has no model_shape (an
  older lev_jax) or is missing was evaluated without a word that its step cannot be
  checked against the run."""
  from lev_jax import inference
  _, workdir = copy_run(finished_tied_run, tmp_path / "run")
  report = json.loads((workdir / "data_report.json").read_text())
  del report["model_shape"]
  (workdir / "data_report.json").write_text(json.dumps(report))
  with caplog.at_level("WARNING"):
    inference.load(workdir)
  assert (f"{workdir / 'data_report.json'} records no model_shape (written by an older "
          "lev_jax, or edited): the step's model cannot be checked") in caplog.text
  caplog.clear()
  (workdir / "data_report.json").unlink()
  with caplog.at_level("WARNING"):
    inference.load(workdir)
  assert f"{workdir / 'data_report.json'} is missing: the step's model cannot be" in caplog.text
  caplog.clear()  # newcomer pass 15 (Q29): lev-train extended such a run without a word
  from lev_jax.trainer import finished_run
  c = finished_tied_run[0].copy_and_resolve_references()
  c.train.steps += 2
  with caplog.at_level("WARNING"):
    assert finished_run(c, workdir) is None  # an extension: trains on
  assert f"{workdir / 'data_report.json'} is missing: the step's model cannot be" in caplog.text


@pytest.mark.parametrize("entry", ["empty folder", "file"])
def test_an_entry_named_like_a_step_that_is_none_is_named(finished_tied_run, tmp_path,
                                                          entry):
  """Newcomer pass 12 (B11, B15-B18, X13): an empty folder checkpoints/9 was Orbax's
  latest step (its warnings, then "written by an older lev_jax" and "its config cannot
  be read"); a file checkpoints/6 made lev-eval say the run was "still starting"."""
  from lev_jax import inference, trainer
  from lev_jax.config import ConfigError
  c, workdir = copy_run(finished_tied_run, tmp_path / "run")
  odd = workdir / "checkpoints" / "9"
  if entry == "file":
    shutil.rmtree(workdir / "checkpoints" / "4")
    odd = workdir / "checkpoints" / "4"
    odd.write_text("x")
    expected = f"{odd}: a file named like a checkpoint step; expected a step folder"
  else:
    odd.mkdir()
    expected = f"{odd}: an empty folder named like a checkpoint step"
  before = files_of(workdir)
  with pytest.raises(ConfigError, match=re.escape(expected)):
    trainer.finished_run(c, workdir)
  with pytest.raises(inference.InferenceError, match="^" + re.escape(expected)):
    inference.load(workdir)
  assert files_of(workdir) == before


def test_a_tokenizer_file_that_is_a_folder_is_refused_before_an_extension_is_announced(
    finished_tied_run, tmp_path, caplog):
  """Newcomer pass 14 (N361): tokenizer/spm.model a folder: "extending the run finished
  at step 4 ..." was logged, then the refusal."""
  from lev_jax import trainer
  from lev_jax.config import ConfigError
  c, workdir = copy_run(finished_tied_run, tmp_path / "run")
  entry = next(p for p in (workdir / "tokenizer").iterdir() if p.is_file())
  entry.unlink()
  entry.mkdir()
  c.train.steps += 1
  with pytest.raises(ConfigError, match=re.escape(f"{entry}: is a folder; expected a file "
                                                  "of the tokenizer")):
    trainer.finished_run(c, workdir)
  assert "extending" not in caplog.text


def test_a_finished_run_s_output_of_the_wrong_kind_is_one_line(finished_tied_run, tmp_path):
  """Newcomer pass 11: eval.json a folder made lev-train's re-run of a finished run an
  IsADirectoryError traceback (the check of the outputs' kinds came after it)."""
  from lev_jax import trainer
  from lev_jax.config import ConfigError
  c, workdir = copy_run(finished_tied_run, tmp_path / "run")
  (workdir / "eval.json").unlink()
  (workdir / "eval.json").mkdir()
  with pytest.raises(ConfigError, match=re.escape(
      f"{workdir / 'eval.json'}: is a folder; expected a file (move it aside)")):
    trainer.finished_run(c, workdir)


def test_a_renamed_or_edited_finished_step_is_named_before_the_settings(finished_tied_run,
                                                                        tmp_path):
  """Newcomer pass 11: lev-train's re-run of a finished run compared the settings of a
  renamed step folder (4 -> 5: "train.steps: checkpoint 5, this run 4") or of a
  hand-edited stored config ("optim.lr: checkpoint 0.03, ...") and blamed the user's
  settings; the step's manifest (sizes only, no hashing) is checked first."""
  from lev_jax import trainer
  c, renamed = copy_run(finished_tied_run, tmp_path / "renamed")
  (renamed / "checkpoints" / "4").rename(renamed / "checkpoints" / "5")
  with pytest.raises(checkpoint_checks.CheckpointRenamedError, match=re.escape(
      f"checkpoint {renamed / 'checkpoints' / '5'}: its manifest (checksums.json) records "
      "step 4, its folder's name step 5: the folder renamed (then name it 4 again) or "
      "checksums.json edited (then restore it); move it aside if unsure")):
    trainer.finished_run(c, renamed)
  c, edited = copy_run(finished_tied_run, tmp_path / "edited")
  stored = edited / "checkpoints" / "4" / "config" / "metadata"
  stored.write_text(stored.read_text().replace(f'"lr": {c.optim.lr}', f'"lr": {c.optim.lr}0'))
  with pytest.raises(CheckpointCorruptError, match=re.escape(
      f"checkpoint {edited / 'checkpoints' / '4'}: config/metadata is ")):
    trainer.finished_run(c, edited)


def test_a_step_of_another_copy_of_the_run_extended_apart_is_refused(finished_tied_run,
                                                                     tmp_path):
  """Newcomer pass 15 (Q11): two copies of a finished run share its id (a copied or
  moved run is the same run); one copy extended to step 6 under another learning rate
  and its step 6 copied into the other copy was evaluated there as that copy's own.
  Every start of lev-train that trains records its id in the steps it saves and in
  data_report.json ("lineage"); a step whose lineage the folder's does not begin with
  is refused. The copy's own earlier steps, and its own extension, pass."""
  from lev_jax import inference
  c, extended = copy_run(finished_tied_run, tmp_path / "extended")
  _, other = copy_run(finished_tied_run, tmp_path / "other")
  report = json.loads((other / "data_report.json").read_text())
  with checkpoint.CheckpointReader(other / "checkpoints") as reader:
    lineage = reader.saved_progress(4)["lineage"]
  assert report["lineage"] == lineage and len(lineage) == 1
  c.train.steps, c.optim.lr = 6, c.optim.lr * 3
  train_and_evaluate(c, extended)
  with checkpoint.CheckpointReader(extended / "checkpoints") as reader:
    extended_lineage = reader.saved_progress(6)["lineage"]
    assert reader.saved_progress(4)["lineage"] == lineage  # restored, not re-saved
  assert extended_lineage[:1] == lineage and len(extended_lineage) == 2
  assert json.loads((extended / "data_report.json").read_text())["lineage"] == extended_lineage
  inference.load(extended)  # its own extension passes
  shutil.copytree(extended / "checkpoints" / "6", other / "checkpoints" / "6")
  line = (f"checkpoint {other / 'checkpoints' / '6'} was trained by a start of lev-train "
          f"that this folder's run never made (start {extended_lineage[1]} in its progress "
          f"item's lineage, not in {other / 'data_report.json'}'s): a step of another copy "
          f"of this run (run {report['run']}), extended apart after the copy (evaluate it "
          f"in the folder it was trained in, or move it out of {other / 'checkpoints'}), or "
          "this folder's data_report.json replaced by an older one or another copy's (put "
          "back its own)?")
  with pytest.raises(inference.InferenceError, match="^" + re.escape(line) + "$"):
    inference.load(other)
  from lev_jax.trainer import finished_run  # newcomer pass 19: no "?." before lev-train's
  with pytest.raises(CheckpointMismatchError, match=re.escape(  # last sentence
      "(put back its own)? Nothing was changed")):
    finished_run(c, other)
  inference.load(other, step=4)  # the copy's own steps still load
  # newcomer pass 17 (A06-A10): the record's lineage deleted, null or a string
  for edit in ("delete", None, "abc"):
    (other / "data_report.json").write_text(json.dumps(_edited(report, "lineage", edit)))
    with pytest.raises(inference.InferenceError, match="^" + re.escape(
        f"checkpoint {other / 'checkpoints' / '6'} records the lineage of lev-train starts "
        f"that trained it, but {other / 'data_report.json'} "
        + ("holds str" if edit == "abc" else "records none"))):
      inference.load(other)
  # newcomer pass 18 (L08, L15): the same starts in another order are not "not in" it
  swapped = dict(report, lineage=[extended_lineage[1], *lineage])
  (other / "data_report.json").write_text(json.dumps(swapped))
  with pytest.raises(inference.InferenceError, match=re.escape(
      f"records its lev-train starts in another order than {other / 'data_report.json'} "
      f"(start {extended_lineage[0]} is in another place there)")):
    inference.load(other)
  # newcomer pass 18 (L17): a run id that is no string, while the step records one
  (other / "data_report.json").write_text(json.dumps(dict(report, run=7)))
  with pytest.raises(inference.InferenceError, match="^" + re.escape(
      f"{other / 'data_report.json'}: its run holds int; expected lev-train's id of the "
      f"run (edited? restore the file: checkpoint {other / 'checkpoints' / '6'} records "
      f"run {report['run']})") + "$"):
    inference.load(other)
  (other / "data_report.json").write_text(json.dumps(report))
  # a start repeated unchanged (a restart before the next save) adds nothing
  assert checkpoint.extended_lineage(lineage, lineage[-1]) == lineage
  assert checkpoint.new_start_id(other / "checkpoints", report["run"], 4, c) == \
      checkpoint.new_start_id(other / "checkpoints", report["run"], 4, c)


@pytest.mark.parametrize("damage,why", [
    ("garbage", "Extra data: line"), ("null", "it holds null, not a JSON object"),
    ("half", "Expecting"), ("empty", "Expecting value: line 1 column 1")])
def test_a_damaged_run_record_refuses_the_step_instead_of_skipping_its_checks(
    finished_tied_run, tmp_path, damage, why):
  """Newcomer pass 16 (J09b-d, J10b, J10c, L10c): with data_report.json truncated,
  emptied, `null` or a garbage line appended, the run and model checks were skipped:
  another run's step was evaluated and exported as this run's, and lev-train extended
  it and rewrote the record with the foreign id. Now one line, before anything."""
  from lev_jax import inference
  from lev_jax.trainer import finished_run
  c, workdir = copy_run(finished_tied_run, tmp_path / "run")
  path = workdir / "data_report.json"
  text = path.read_text()
  path.write_text({"garbage": text + "garbage\n", "null": "null\n",
                   "half": text[:len(text) // 2], "empty": ""}[damage])
  before = path.read_bytes()
  start = f"{path}: cannot be read ("
  end = (f"): checkpoint {workdir / 'checkpoints' / '4'} cannot be checked against the "
         "run's record of its model and id (the file truncated or edited?). Restore it "
         "(deleted, the checks are skipped: a loader warns and goes on, lev-train takes "
         "the step as the run's)")
  with pytest.raises(inference.InferenceError) as e:
    inference.load(workdir)
  assert str(e.value).startswith(start) and why in str(e.value)
  assert str(e.value).endswith(end)
  c.train.steps = 6  # an extension: refused before anything is written
  with pytest.raises(CheckpointMismatchError) as e:
    finished_run(c, workdir)
  assert str(e.value).endswith(end + ". Nothing was changed")
  assert path.read_bytes() == before
