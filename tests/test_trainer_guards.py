"""The trainer's guards: a diverged or refused run never damages what is on disk."""

import errno
import json
import math
import os
import shutil

import jax
import numpy as np
import pytest

from lev_jax.config import ConfigError
from lev_jax.data import DataError
from lev_jax.checkpoint import CheckpointMismatchError
from lev_jax.sharding import ShardingError
from lev_jax.trainer import DivergenceError, train_and_evaluate
from conftest import copy_run, metrics, run_config, saved_state


def _all_finite(workdir, step):
  return all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(saved_state(workdir, step)))


def _steps(workdir):
  return sorted(int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit())


@pytest.fixture
def run(finished_tied_run, tmp_path):
  """A copy of a healthy finished 4-step run (checkpoints 2, 4; keep 2)."""
  c, workdir = copy_run(finished_tied_run, tmp_path / "run")
  c.train.keep_checkpoints = 2
  return c, workdir


def test_a_diverging_resume_stops_and_never_rotates_out_the_finite_checkpoints(run):
  c, workdir = run
  c.train.steps = 40
  c.optim.lr = 1e6
  with pytest.raises(DivergenceError, match=r"step (\d+): loss \S+, gradient norm \S+, "
                     r"update norm nan \(not finite: (loss, )?(gradient, )?update\).*"
                     r"No checkpoint was written after it; the latest is step \d+") as e:
    train_and_evaluate(c, workdir)
  bad = int(str(e.value).split(":")[0].split()[1])
  steps = _steps(workdir)
  assert steps and max(steps) < bad and f"the latest is step {max(steps)}" in str(e.value)
  assert all(_all_finite(workdir, s) for s in steps)


def test_skip_step_goes_on_and_stops_after_the_bound(run):
  c, workdir = run
  c.train.steps = 40
  c.optim.lr = 1e6
  c.train.nan_policy = "skip_step"
  c.train.max_skipped_steps = 2
  with pytest.raises(DivergenceError, match="more than train.max_skipped_steps=2"):
    train_and_evaluate(c, workdir)
  rows = [r for r in metrics(workdir) if "train/skipped_steps" in r]
  assert rows and max(r["train/skipped_steps"] for r in rows) <= 3
  assert all(_all_finite(workdir, s) for s in _steps(workdir))


def _nonfinite(row):
  return not (math.isfinite(float(row["train/loss"]))
              and math.isfinite(float(row["train/grad_norm"])))


def test_skipped_steps_are_counted_per_row_and_across_a_resume(run):
  """Row s counts the non-finite steps <= s (not s + 1); a re-run continues the count
  (from the checkpoint: step - the optimizer's update count) instead of restarting it."""
  c, workdir = run
  c.train.steps, c.train.log_every, c.train.checkpoint_every = 40, 1, 2
  c.optim.lr = 1e6
  c.train.nan_policy, c.train.max_skipped_steps = "skip_step", 3
  with pytest.raises(DivergenceError, match="more than train.max_skipped_steps=3"):
    train_and_evaluate(c, workdir)
  rows = [r for r in metrics(workdir) if "train/skipped_steps" in r and r["step"] > 4]
  seen = 0
  for r in rows:
    seen += _nonfinite(r)
    assert r["train/skipped_steps"] == seen, (r["step"], r["train/skipped_steps"], seen)
  # The re-run resumes after some skipped steps and does not get a fresh allowance.
  with pytest.raises(DivergenceError, match="more than train.max_skipped_steps=3"):
    train_and_evaluate(c, workdir)


def test_the_row_of_the_diverged_step_is_written_before_the_stop(run):
  c, workdir = run
  c.train.steps, c.train.log_every = 40, 1
  c.optim.lr = 1e6
  with pytest.raises(DivergenceError) as e:
    train_and_evaluate(c, workdir)
  bad = int(str(e.value).split(":")[0].split()[1])
  steps = [r["step"] for r in metrics(workdir) if "train/loss" in r and r["step"] > 4]
  assert steps == list(range(5, bad + 1))


def test_a_refused_run_leaves_the_workdir_byte_for_byte(run):
  c, workdir = run
  before = {p: p.read_bytes() for p in workdir.rglob("*") if p.is_file()}
  c.model.vocab_size = 1024
  with pytest.raises((CheckpointMismatchError, DataError), match="vocab_size"):
    train_and_evaluate(c, workdir)
  after = {p: p.read_bytes() for p in workdir.rglob("*") if p.is_file()}
  assert after == before


def test_resumed_steps_appear_once_in_metrics(run):
  c, workdir = run
  shutil.rmtree(workdir / "checkpoints" / "4")  # as if killed after logging step 4
  with (workdir / "metrics.jsonl").open("a") as f:
    f.write('{"step": 5, "train/loss": 1.0}\n{"step": 6, "trai')  # cut mid-write
  c.train.steps = 6
  train_and_evaluate(c, workdir)
  steps = [r["step"] for r in metrics(workdir) if "train/loss" in r]
  assert steps == list(range(1, 7))


class _FullDisk:
  """metrics.jsonl's file object once the disk is full at step `at`: that row and every
  later write fail with ENOSPC, as the OS reports it."""

  def __init__(self, f, at):
    self.f, self.at, self.full = f, at, False

  def write(self, text):
    self.full = self.full or json.loads(text)["step"] >= self.at
    if self.full:
      raise OSError(errno.ENOSPC, "No space left on device")
    return self.f.write(text)

  def flush(self):
    self.f.flush()

  def close(self):
    self.f.close()


@pytest.mark.parametrize("full", ["metrics.jsonl", "eval.json"])
def test_a_full_disk_between_saves_is_one_error_and_the_rerun_loses_nothing(run, full,
                                                                           monkeypatch):
  """Issue 26.13: a write between saves fails (ENOSPC): one OutputWriteError naming the
  file and the intact checkpoints (was a raw OSError from metrics.py); a re-run once
  there is space resumes and each step appears once."""
  from lev_jax import metrics as metrics_lib, trainer
  from lev_jax.workdir import OutputWriteError
  c, workdir = run
  c.train.steps = 6
  if full == "metrics.jsonl":
    init = metrics_lib.MetricWriter.__init__

    def full_at_5(self, path):
      init(self, path)
      self._file = _FullDisk(self._file, at=5)
    monkeypatch.setattr(metrics_lib.MetricWriter, "__init__", full_at_5)
    match = (r"metrics.jsonl: writing the row of step 5 failed \(No space left on device\); "
             r"the run stopped and its checkpoints \[2, 4\] are intact: free space \(or make "
             r"it writable\), then re-run to resume from step 4$")
  else:
    write = trainer.write_json_atomic

    def full_disk(path, *args, **kwargs):
      if path.name == "eval.json":  # the final evaluation's, after the save of step 6
        raise OSError(errno.ENOSPC, "No space left on device")
      write(path, *args, **kwargs)
    monkeypatch.setattr(trainer, "write_json_atomic", full_disk)
    match = (r"eval.json: writing it failed \(No space left on device\); the run stopped "
             r"and its checkpoints \[4, 6\] are intact: .* resume from step 6$")
  with pytest.raises(OutputWriteError, match=match):
    train_and_evaluate(c, workdir)
  monkeypatch.undo()
  assert train_and_evaluate(c, workdir)["step"] == 6
  steps = [r["step"] for r in metrics(workdir) if "train/loss" in r]
  assert steps == list(range(1, 7))


def test_a_garbage_eval_json_is_evaluated_again(run):
  c, workdir = run
  (workdir / "eval.json").write_text("{not json")
  result = train_and_evaluate(c, workdir)
  assert result["step"] == 4
  assert json.loads((workdir / "eval.json").read_text())["step"] == 4


@pytest.mark.parametrize("make,match", [
    (lambda w: w.write_text("x"), "is a file; expected a folder"),
    (lambda w: (w.mkdir(), (w / "checkpoints").write_text("x")), "checkpoints: is a file"),
    (lambda w: (w.mkdir(), (w / "metrics.jsonl").mkdir()), "metrics.jsonl: is a folder"),
    (lambda w: (w.mkdir(), (w / "tensorboard").write_text("x")), "tensorboard: is a file"),
    (lambda w: (w.mkdir(), (w / "data_report.json").mkdir()), "data_report.json: is a folder"),
    (lambda w: (w.mkdir(), (w / "token_counts.npy").mkdir()), "token_counts.npy: is a folder"),
    (lambda w: (w.mkdir(), (w / "tokenizer" / "tokenizer.json").mkdir(parents=True)),
     "tokenizer.json: is a folder; expected a file of the tokenizer"),
    (lambda w: w.mkdir(), "is not writable"),
    (lambda w: (w / "tokenizer").mkdir(parents=True), "tokenizer: is not writable"),
])
def test_a_workdir_of_the_wrong_kind_is_one_error_before_any_work(make, match, data_cache,
                                                                 tmp_path, monkeypatch):
  if "is not writable" in match:  # as a read-only mount would answer (CI runs as root)
    denied = "tokenizer" if match.startswith("tokenizer") else ""  # "": every path
    monkeypatch.setattr(os, "access", lambda path, mode: not str(path).endswith(denied))
  workdir = tmp_path / "run"
  make(workdir)
  before = sorted(map(str, workdir.rglob("*"))) if workdir.is_dir() else None
  with pytest.raises(ConfigError, match=match):
    train_and_evaluate(run_config("tied", data_cache, steps=2), workdir)
  assert (sorted(map(str, workdir.rglob("*"))) if workdir.is_dir() else None) == before


def test_a_validation_split_under_one_batch_fails_before_training(data_cache, tmp_path):
  train = tmp_path / "train.jsonl"
  train.write_text("".join(json.dumps({"text": f"document {i} " * 40}) + "\n"
                           for i in range(40)))
  val = tmp_path / "val.jsonl"
  val.write_text(json.dumps({"text": "too short"}) + "\n")
  c = run_config("tied", data_cache, steps=2)
  c.model.vocab_size = 259
  c.data.tokenizer = "bytes"
  c.data.source = "jsonl"
  c.data.train_files = (str(train),)
  c.data.validation_files = (str(val),)
  with pytest.raises(DataError, match="validation"):
    train_and_evaluate(c, tmp_path / "run")
  assert not (tmp_path / "run").exists()


def _fail_first_step(monkeypatch):
  """The first step fails as an out-of-memory compile or execution would."""
  def make(part, config):
    def step(state, batch):
      raise RuntimeError("RESOURCE_EXHAUSTED: out of memory (simulated)")
    return step
  monkeypatch.setattr("lev_jax.trainer.make_train_step", make)


def _fail_init(monkeypatch):
  def init(part, config):
    raise RuntimeError("RESOURCE_EXHAUSTED: out of memory (simulated)")
  monkeypatch.setattr("lev_jax.trainer.init_state", init)


def _snapshot(workdir):
  return {p: (p.read_bytes() if p.is_file() else None) for p in workdir.rglob("*")}


@pytest.mark.parametrize("check,workdir_kind", [
    ("mesh", "new"), ("validation", "new"), ("init", "new"), ("first_step", "new"),
    ("mesh", "finished"), ("first_step", "finished")])
def test_a_failing_check_writes_nothing(check, workdir_kind, finished_tied_run, tmp_path,
                                        monkeypatch):
  """Issue 14.4: nothing is written until every check has passed, this run's first step
  (its batch, compile and memory) the last: a new workdir is not created, a finished
  run's is byte for byte as it was."""
  if workdir_kind == "new":
    c, workdir = finished_tied_run[0].copy_and_resolve_references(), tmp_path / "run"
    before = None
  else:
    c, workdir = copy_run(finished_tied_run, tmp_path / "run")
    before = _snapshot(workdir)
  c.train.steps = 6
  error = {"mesh": ShardingError, "validation": DataError}.get(check, RuntimeError)
  if check == "mesh":
    c.mesh.tensor = 3  # on 1 device
  elif check == "validation":
    c.eval.batch_size = 4096  # more rows than the validation split holds
  elif check == "init":
    _fail_init(monkeypatch)
  else:
    _fail_first_step(monkeypatch)
  with pytest.raises(error):
    train_and_evaluate(c, workdir)
  assert (_snapshot(workdir) if workdir.exists() else None) == before


def test_a_second_ctrl_c_leaves_no_new_workdir_holding_only_its_lock(tmp_path, monkeypatch):
  """Issue 26: lev-train's abort (a Ctrl-C after the first, os._exit) skipped the lock's
  `with` exit: a new workdir was left holding only a stale .lock."""
  import signal as signals
  from lev_jax import lock, trainer
  monkeypatch.setattr(os, "_exit", lambda status: (_ for _ in ()).throw(SystemExit(status)))
  monkeypatch.setattr(os, "write", lambda fd, data: len(data))
  kept = tmp_path / "kept"
  kept.mkdir()
  (kept / "metrics.jsonl").write_text("{}\n")
  with lock.hold(tmp_path / "new" / "run", prog="lev-train"), lock.hold(kept, prog="x"):
    stop = trainer._StopSignals()
    stop.requested = "SIGINT"
    with pytest.raises(SystemExit, match="130"):
      stop._one(signals.SIGINT)
    assert not (tmp_path / "new").exists()  # created for the run: nothing but its lock
    assert os.listdir(kept) == ["metrics.jsonl"]  # the lock file alone goes
  assert not lock._HELD
