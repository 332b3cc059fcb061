"""The whole trainer on the embedded data: learning, exact resume, outputs, bad input."""

import json
import math
import shutil

import jax
import numpy as np
import pytest

from conftest import (copy_run, ctrl_c_not_ignored, files_of, metrics, run_config,
                      saved_state, tiny_config)
from lev_jax.checkpoint import CheckpointMismatchError
from lev_jax.config import ConfigError
from lev_jax.trainer import Finished, Stopped, finished_run, train_and_evaluate


@pytest.mark.parametrize("embedding", ["tied", "lev"])
def test_a_few_steps_lower_the_loss_and_write_every_output(embedding, data_cache, tmp_path):
  c = run_config(embedding, data_cache, steps=12)
  result = train_and_evaluate(c, tmp_path)
  rows = [r for r in metrics(tmp_path) if "train/loss" in r]
  assert rows[-1]["train/loss"] < rows[0]["train/loss"] - 0.5, rows
  for key in ("train/perplexity", "train/grad_norm", "train/lr", "train/tokens_seen",
              "perf/tokens_per_s", "perf/step_time_s"):
    assert key in rows[-1]
  assert rows[-1]["train/tokens_seen"] == 12 * 8 * 32
  groups = {"tied": ("embedding_table", "backbone"), "lev": ("lev", "head", "backbone")}
  logged = {k for k in rows[-1] if k.startswith(("train/grad_norm/", "train/update_ratio/"))}
  assert logged == {f"train/{m}/{g}" for m in ("grad_norm", "update_ratio")
                    for g in groups[embedding]}, logged
  assert sum(rows[-1][f"train/grad_norm/{g}"] ** 2 for g in groups[embedding]) == pytest.approx(
      rows[-1]["train/grad_norm"] ** 2, rel=1e-4)
  assert all(0 < rows[-1][f"train/update_ratio/{g}"] < 1 for g in groups[embedding])
  saved = json.loads((tmp_path / "eval.json").read_text())
  assert saved["step"] == 12 and saved["loss"] == pytest.approx(result["loss"])
  assert np.isfinite(saved["perplexity"]) and saved["bucket_edges"] == [1, 10, 100, 1000, 10000]
  evals = [r for r in metrics(tmp_path) if "eval/loss" in r]
  assert [r["step"] for r in evals] == [4, 8, 12] and evals[-1]["eval/loss"] < evals[0]["eval/loss"]
  assert "eval/perplexity_bucket_10000-inf" in evals[-1]  # TensorBoard-legal tag
  assert list((tmp_path / "tensorboard").iterdir())
  report = json.loads((tmp_path / "data_report.json").read_text())
  assert report["source"] == "embedded" and report["train"]["documents"] > 500
  assert set(report["train"]["skipped"]) >= {"bad_json", "bad_utf8", "missing_file"}
  assert sorted(int(p.name) for p in (tmp_path / "checkpoints").iterdir()
                if p.name.isdigit()) == [4, 8, 12]
  from lev_jax.data.files import read_npy
  from lev_jax.data.tokenizer_files import load_tokenizer
  assert load_tokenizer(tmp_path / "tokenizer").vocab_size == 512
  assert read_npy(tmp_path / "token_counts.npy").sum() == report["train_tokens"]


@pytest.mark.parametrize("embedding", ["lev"])
def test_stop_and_resume_equals_straight_run_bitwise(embedding, data_cache, tmp_path):
  """N steps straight == N/2, restart (new trainer, restored state and data), N/2.

  Bitwise on CPU: same programs, same inputs, deterministic XLA:CPU reductions. Before
  the restart, a restore under another model shape is refused naming the mismatch, and
  loses nothing: the restart after it still gives the straight run's bits.
  """
  c = run_config(embedding, data_cache, steps=8)
  c.train.grad_accum_steps = 2
  straight, sliced = tmp_path / "straight", tmp_path / "sliced"
  train_and_evaluate(c, straight)
  assert train_and_evaluate(c, sliced, stop_at_step=4) == Stopped(4, "stop_at_step")
  assert (sliced / "checkpoints" / "4").exists() and not (sliced / "checkpoints" / "8").exists()
  n_rows = len(metrics(sliced))
  other = c.copy_and_resolve_references()  # unfinished: the restore's own check
  other.model.d_model = 48
  other.lev.rank = 8
  with pytest.raises(CheckpointMismatchError, match=r"model.d_model: checkpoint 32, this run 48"
                     r"(.|\n)*lev.rank: checkpoint 4, this run 8"):
    train_and_evaluate(other, sliced)
  for at_or_before in (4, 2):  # resumed at 4: nothing to train, nothing written
    assert train_and_evaluate(c, sliced, stop_at_step=at_or_before) == Stopped(4, "stop_at_step")
  assert len(metrics(sliced)) == n_rows and not (sliced / "checkpoints" / "5").exists()
  train_and_evaluate(c, sliced)
  a, b = saved_state(straight, 8), saved_state(sliced, 8)
  for (path, x), y in zip(jax.tree_util.tree_flatten_with_path(a)[0], jax.tree.leaves(b)):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y), err_msg=jax.tree_util.keystr(path))
  # The data stream continued where it stopped: identical losses after the restart.
  loss = lambda w: [(r["step"], r["train/loss"]) for r in metrics(w) if "train/loss" in r]
  assert loss(straight)[-2:] == loss(sliced)[-2:]


def test_a_finished_run_is_only_read_and_another_config_is_refused(finished_tied_run,
                                                                   tmp_path, caplog):
  """Issue 26.1: a re-run of a finished run (train.steps 4 < 20 there) re-evaluated it
  with the new eval settings, overwrote eval.json, appended a second metrics row for the
  step and rewrote data_report.json, tokenizer/, token_counts.npy and TensorBoard's
  events. Now: the same config returns Finished and writes nothing (not a byte, not an
  mtime); a field that decides results refuses in one line naming it; a run-only field
  (train.log_every) does not count."""
  c, workdir = copy_run(finished_tied_run, tmp_path / "run")
  before = files_of(workdir)
  evaluated = json.loads((workdir / "eval.json").read_text())
  c.train.log_every = 3
  assert train_and_evaluate(c, workdir) == Finished(4, evaluated)
  for field, value, named in [
      ("train.steps", 2, "train.steps: checkpoint 4, this run 2"),
      ("eval.batches", 1, "eval.batches: checkpoint 2, this run 1"),
      ("eval.freq_bucket_edges", (1, 10), r"eval.freq_bucket_edges: checkpoint \[1, 10, 100, "
       r"1000, 10000\], this run \[1, 10\]")]:
    other = c.copy_and_resolve_references()
    section, name = field.split(".")
    other[section][name] = value
    with pytest.raises(CheckpointMismatchError, match=f"^{tmp_path / 'run'} holds a run "
                       f"finished at step 4 with other settings: {named}. Nothing was changed"):
      train_and_evaluate(other, workdir)
  assert files_of(workdir) == before
  # A larger train.steps extends the run (MaxText's and Levanter's meaning), with a
  # warning: eval.json will be replaced, the step-4 evaluation stays in metrics.jsonl.
  other = c.copy_and_resolve_references()
  other.train.steps = 6
  assert finished_run(other, workdir) is None
  # issue 26: lev-train reads the run twice (before its lock, then train_and_evaluate,
  # told so by finished_checked): the warning was logged twice
  assert finished_run(other, workdir, warn=False) is None
  extending = [r.getMessage() for r in caplog.records if "extending" in r.getMessage()]
  assert len(extending) == 1 and extending[0].startswith(
      f"{workdir}: extending the run finished at step 4 to train.steps = 6")
  assert any(r.get("step") == 4 and "eval/loss" in r for r in metrics(workdir))
  assert files_of(workdir) == before


def test_a_model_whose_state_cannot_fit_is_refused_before_compiling(data_cache, tmp_path,
                                                                   monkeypatch):
  """Newcomer pass 6: d_model 1e6 x 100 layers compiled for minutes, silent, and left a
  workdir holding its lock. Here the host's memory is made 4 KiB."""
  from lev_jax import trainer  # noqa: PLC0415
  c = run_config("tied", data_cache, steps=2)
  real = trainer.os.sysconf
  monkeypatch.setattr(trainer.os, "sysconf", lambda name: 1 if name == "SC_PHYS_PAGES"
                      else 4096 if name == "SC_PAGE_SIZE" else real(name))
  with pytest.raises(ConfigError, match=r"^config.model: the parameters and optimizer state "
                     r"alone need [0-9.]+ GiB, more than this host's 0.0 GiB of memory \(1 "
                     r"CPU device\(s\)\); expected a smaller model"):
    train_and_evaluate(c, tmp_path / "run")
  assert not (tmp_path / "run").exists()


def test_tokenizer_and_model_vocab_must_agree(data_cache, tmp_path):
  c = run_config("tied", data_cache)
  c.data.tokenizer = "o200k_base"
  c.data.tiktoken_file = str(tmp_path / "missing.tiktoken")
  from lev_jax.data import DataError
  with pytest.raises(DataError, match="tiktoken_file"):
    train_and_evaluate(c, tmp_path / "run")


@pytest.mark.parametrize("field,value,match", [
    ("train.steps", -1, "train.steps"),
    ("train.seq_len", 4096, "model.max_seq_len"),
    ("model.embedding", "hashed", "model.embedding"),
])
def test_bad_config_fails_before_any_work(field, value, match, data_cache, tmp_path):
  c = run_config("tied", data_cache)
  section, name = field.split(".")
  c[section][name] = value
  with pytest.raises(ConfigError, match=match):
    train_and_evaluate(c, tmp_path / "run")
  assert not (tmp_path / "run").exists()


def test_array_shape_mismatch_is_named_even_when_the_config_agrees(tmp_path):
  """Second line of defence: stored array shapes are compared before any read."""
  import grain
  from lev_jax.checkpoint import Checkpointer
  from lev_jax.train import create_train_state
  c = tiny_config("tied")
  _, state = create_train_state(c)
  ckpt = Checkpointer(tmp_path, keep=2)
  it = iter(grain.MapDataset.range(10).to_iter_dataset())
  ckpt.save(1, state, it, c)
  ckpt.wait()
  other = tiny_config("tied")
  other.model.d_ff = 96
  _, state2 = create_train_state(other)
  abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), state2)
  with pytest.raises(CheckpointMismatchError, match=r"w_down/value has shape \(64, 32\), "
                     r"this run expects \(96, 32\)"):
    ckpt.restore(1, abstract, it, c)
  ckpt.close()


def test_gradient_accumulation_matches_one_big_batch():
  """4 micro-batches give the same update as the whole batch (float32 sum order aside)."""
  from lev_jax.train import create_train_state, make_train_step
  rng = np.random.default_rng(0)
  batch = {"inputs": rng.integers(0, 300, (8, 16)).astype(np.int32),
           "targets": rng.integers(0, 300, (8, 16)).astype(np.int32),
           "weights": (rng.random((8, 16)) > 0.1).astype(np.float32)}
  results = []
  for accum in (1, 4):
    c = tiny_config("lev")
    c.train.global_batch_size, c.train.grad_accum_steps = 8, accum
    part, state = create_train_state(c)
    init = jax.tree.map(np.array, state["params"])  # copies: the step may donate its input
    state, m = make_train_step(part, c)(state, batch)
    results.append((state, m))
  (s1, m1), (s4, m4) = results
  assert float(m1["loss"]) == pytest.approx(float(m4["loss"]), rel=1e-6)
  assert float(m1["grad_norm"]) == pytest.approx(float(m4["grad_norm"]), rel=1e-5)
  for group in ("lev", "head", "backbone"):  # per-group norms: after accumulation too
    assert float(m1[f"grad_norm/{group}"]) == pytest.approx(float(m4[f"grad_norm/{group}"]),
                                                           rel=1e-5)
  # The first update moves parameters by up to lr (Adam's first step is ~lr * sign(g));
  # where |g| ~ eps the sum order shows up as ~1e-6 of it.
  moved = 0.0
  for a, b, before in zip(jax.tree.leaves(s1["params"]), jax.tree.leaves(s4["params"]),
                          jax.tree.leaves(init)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=5e-6)
    moved = max(moved, float(np.abs(np.asarray(a) - before).max()))
  assert moved > 0.1 * c.optim.lr / c.optim.warmup_steps


def test_a_non_finite_step_changes_nothing_and_logs_the_rate_it_would_have_used():
  """The NaN guard inside the step: params, optimizer state and the schedule's count
  stay as they were (exactly), the step counter moves, `nonfinite` is 1, and `lr` is
  the rate of the update that was not applied (so it repeats on the next step)."""
  from lev_jax.train import create_train_state, make_train_step
  c = tiny_config("tied")
  c.train.steps, c.optim.warmup_steps = 100, 10
  rng = np.random.default_rng(0)
  batch = {"inputs": rng.integers(0, 300, (4, 16)).astype(np.int32),
           "targets": rng.integers(0, 300, (4, 16)).astype(np.int32),
           "weights": np.ones((4, 16), np.float32)}
  part, state = create_train_state(c)
  step = make_train_step(part, c)
  state, first = step(state, batch)
  poisoned = jax.tree.map(lambda x: x, state)
  leaf = poisoned["params"]["final_norm"]["scale"]
  leaf[...] = leaf[...].at[0].set(np.nan)
  before = jax.tree.map(np.asarray, poisoned)
  after, m = step(poisoned, batch)
  assert float(m["nonfinite"]) == 1.0 and int(after["step"]) == 2
  for a, b in zip(jax.tree.leaves(after["opt_state"]), jax.tree.leaves(before["opt_state"])):
    np.testing.assert_array_equal(np.asarray(a), b)
  assert float(first["lr"]) == pytest.approx(c.optim.lr / 10)
  assert float(m["lr"]) == pytest.approx(2 * c.optim.lr / 10)  # update 2, not applied
  _, again = step(after, batch)
  assert float(again["lr"]) == float(m["lr"])


def test_relative_workdir_as_the_cli_default(data_cache, tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  c = run_config("tied", data_cache, steps=2)
  c.train.checkpoint_every = 1
  train_and_evaluate(c, "runs/relative")
  assert (tmp_path / "runs" / "relative" / "checkpoints" / "2").is_dir()
  assert (tmp_path / "runs" / "relative" / "eval.json").is_file()


def test_data_position_saved_by_another_process_count(tmp_path):
  """'global' streams restore from any process's file; 'documents' refuses, naming counts."""
  import grain
  from lev_jax.checkpoint import DataIteratorHandler, DataRestore
  it = iter(grain.MapDataset.range(10).to_iter_dataset())
  next(it), next(it), next(it)
  (tmp_path / "process_0-of-2.json").write_text(json.dumps(it.get_state()))
  (tmp_path / "process_1-of-2.json").write_text(json.dumps(it.get_state()))
  fresh = iter(grain.MapDataset.range(10).to_iter_dataset())
  DataIteratorHandler(portable=True).restore(tmp_path, args=DataRestore(fresh))
  assert next(fresh) == 3
  with pytest.raises(CheckpointMismatchError, match="saved by 2 processes with "
                     "data.host_batches='documents'; this run has 1"):
    DataIteratorHandler(portable=False).restore(tmp_path, args=DataRestore(fresh))


def test_documents_mode_gives_each_host_its_own_documents(data_cache):
  from lev_jax import data
  c = run_config("tied", data_cache)
  bundle = data.load(c)
  b0 = next(iter(bundle.train_dataset(4, 0, 2)))
  b1 = next(iter(bundle.train_dataset(4, 1, 2)))
  assert b0["inputs"].shape == (4, 32) and not np.array_equal(b0["inputs"], b1["inputs"])


def test_gs_workdir_without_gcs_support_names_the_install(data_cache, monkeypatch):
  import builtins
  real_import = builtins.__import__

  def no_gcsfs(name, *a, **k):
    if name == "gcsfs":
      raise ImportError("No module named 'gcsfs'", name="gcsfs")
    return real_import(name, *a, **k)

  monkeypatch.setattr(builtins, "__import__", no_gcsfs)
  c = run_config("tied", data_cache)
  with pytest.raises(ConfigError, match=r"--workdir is on gs:// .*gcsfs missing.*\[gcs\]"):
    train_and_evaluate(c, "gs://bucket/runs/x")


def test_a_streamed_run_reports_its_counts_at_every_checkpoint(tmp_path, caplog):
  """Issue 13.7: data_report.json of a jsonl_stream run holds what the streams counted,
  rewritten at each checkpoint (also after a resume), and says whether it is complete."""
  docs = [f"doc {i}: short text here" for i in range(6)]  # 6 x 23 tokens with eos
  lines = [json.dumps({"text": d}) for d in docs]
  (tmp_path / "train.jsonl").write_text("\n".join(lines[:4] + ["{bad"] + lines[4:]) + "\n")
  (tmp_path / "val.jsonl").write_text("\n".join(json.dumps({"text": "validation " * 20})
                                                for _ in range(6)) + "\n")
  c = tiny_config("tied")
  c.model.vocab_size = 259
  c.data.update(source="jsonl_stream", tokenizer="bytes", shuffle_buffer=2,
                train_files=(str(tmp_path / "train.jsonl"),),
                validation_files=(str(tmp_path / "val.jsonl"),),
                cache_dir=str(tmp_path / "cache"))
  c.train.update(steps=4, checkpoint_every=1, eval_every=100, log_every=1)
  c.optim.warmup_steps = 1
  c.eval.update(batch_size=2, batches=1)
  run = tmp_path / "run"
  # Step 1 reads 4 x 17 tokens (+ a window of 2 rows, + a document): not all 138.
  assert train_and_evaluate(c, run, stop_at_step=1) == Stopped(1, "stop_at_step")
  first = json.loads((run / "data_report.json").read_text())
  assert first["counted_at_step"] == 1 and first["counted"]["train"] == "partial"
  assert 1 <= first["train"]["documents"] < 6 and first["train"]["tokens"] > 0
  assert first["validation"]["count"] == "partial" and first["validation"]["documents"] >= 1
  # newcomer pass 9: a resume on data with another tokenizer trained on (two vocabularies)
  report_text = (run / "data_report.json").read_text()
  recorded = first["tokenizer_fingerprint"]
  (run / "data_report.json").write_text(report_text.replace(recorded, "0" * 64))
  with pytest.raises(ConfigError, match=f"^--workdir={run}: this run trained with tokenizer "
                     f"{'0' * 16} .*data_report.json\\), but config.data now gives tokenizer "
                     f"{recorded[:16]}: the data or its tokenizer changed since"):
    train_and_evaluate(c, run)
  (run / "data_report.json").write_text(report_text)
  with caplog.at_level("INFO"):
    train_and_evaluate(c, run)  # resumes with the counts of checkpoint 1
  # Issue 13.9f: the eval log line says how much of the validation split was read.
  assert "eval at step 4: loss" in caplog.text
  assert ("read 34 validation tokens (1 batch(es) of 2 x 17 tokens, each row predicting "
          "its last 16) of a stream not read to its end") in caplog.text
  last = json.loads((run / "data_report.json").read_text())
  assert last["counted_at_step"] == 4 and last["counted"]["train"] == "complete"
  assert last["train"]["documents"] == 6 and last["train"]["skipped"]["bad_json"] == 1
  assert last["train"]["tokens"] == sum(map(len, docs)) and last["train_tokens"] == 6 * 23


def test_an_edited_eval_json_is_not_taken_as_the_finished_result(tmp_path, caplog):
  """Newcomer pass 8: a finished run's eval.json edited to loss 0, perplexity 1 was
  quoted by the re-run ("already finished ... perplexity 1.00"); metrics.jsonl's row of
  the same evaluation tells (loss, perplexity and bucket perplexities)."""
  from lev_jax import trainer  # noqa: PLC0415
  from etils import epath  # noqa: PLC0415
  path = epath.Path(tmp_path / "eval.json")
  result = {"step": 4, "loss": 6.5, "perplexity": math.exp(6.5),
            "buckets": [{"range": "[1,10)", "perplexity": 30.0},
                        {"range": "[10,100)", "perplexity": None}]}
  row = {"step": 4, "time": 0.0, "eval/loss": 6.5, "eval/perplexity": math.exp(6.5),
         "eval/perplexity_bucket_1-10": 30.0}
  (tmp_path / "metrics.jsonl").write_text(
      json.dumps({"step": 4, "train/loss": 7.0}) + "\n{cut by a kil\n" + json.dumps(row)
      + "\n")
  path.write_text(json.dumps(result))
  assert trainer._finished_eval(path, 4) == result
  for edit, what in (({"loss": 0.0, "perplexity": 1.0}, "its loss 0.0 differs from the "
                      "step-4 evaluation in metrics.jsonl (6.5)"),
                     ({"buckets": [{"range": "[1,10)", "perplexity": 3.0}]},
                      "its bucket [1,10) perplexity 3.0 differs from the step-4 evaluation "
                      "in metrics.jsonl (30.0)")):
    path.write_text(json.dumps({**result, **edit}))
    caplog.clear()
    assert trainer._finished_eval(path, 4) is None
    assert caplog.messages == [f"{path}: {what}: one of the two was edited; evaluating "
                               "step 4 again (its row is appended to metrics.jsonl)"]
  path.write_text(json.dumps(result))
  (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 4, "train/loss": 7.0}) + "\n")
  caplog.clear()
  assert trainer._finished_eval(path, 4) is None
  assert caplog.messages == [f"{path}: metrics.jsonl holds no evaluation at step 4: one of "
                             "the two was edited; evaluating step 4 again (its row is "
                             "appended to metrics.jsonl)"]


def test_a_missing_or_other_step_eval_json_says_why_it_is_evaluated_again(tmp_path, caplog):
  """Newcomer pass 16 (J03, J12): a finished run whose eval.json was deleted, or edited
  to another step, was evaluated again (a second row in metrics.jsonl) without a word."""
  from lev_jax import trainer  # noqa: PLC0415
  from etils import epath  # noqa: PLC0415
  path = epath.Path(tmp_path / "eval.json")
  again = "evaluating step 6 again (its row is appended to metrics.jsonl)"
  assert trainer._finished_eval(path, 6) is None
  path.write_text(json.dumps({"step": 5, "loss": 1.0}))
  assert trainer._finished_eval(path, 6) is None
  assert trainer._finished_eval(path, 6, warn=False) is None  # lev-train's second read
  assert caplog.messages == [
      f"{path} is missing (deleted, or the run stopped before writing it); {again}",
      f"{path} records step 5, not the run's final step 6 (edited, or another run's?); "
      f"{again}"]


def test_an_unreadable_eval_json_is_warned_about_once(tmp_path, caplog, monkeypatch):
  """Newcomer pass 4: lev-train reads a run twice (before its lock, then to train): an
  unreadable eval.json was warned about twice. The second read (train_and_evaluate with
  finished_checked, as lev-train calls it) is silent."""
  from lev_jax import trainer  # noqa: PLC0415
  from etils import epath  # noqa: PLC0415
  (tmp_path / "eval.json").write_bytes(b"\xff")
  assert trainer._finished_eval(epath.Path(tmp_path / "eval.json"), 4) is None
  assert trainer._finished_eval(epath.Path(tmp_path / "eval.json"), 4, warn=False) is None
  assert [r.getMessage() for r in caplog.records if "unreadable" in r.getMessage()] == [
      f"{tmp_path / 'eval.json'} is unreadable ('utf-8' codec can't decode byte 0xff in "
      "position 0: invalid start byte); evaluating again"]
  asked = []
  def finished(config, workdir, restore_fallback=False, warn=True):
    asked.append(warn)
    return trainer.Finished(4, {})
  monkeypatch.setattr(trainer, "finished_run", finished)
  config = tiny_config("tied")
  for checked in (False, True):
    assert trainer.train_and_evaluate(config, tmp_path, finished_checked=checked).step == 4
  assert asked == [True, False]


def test_a_run_stopped_short_of_its_train_steps_is_not_called_finished(finished_tied_run,
                                                                       tmp_path, monkeypatch):
  """Newcomer pass 4: a run stopped at step 10 of 20, re-run with train.steps 5 or 10,
  "holds a run finished at step 10". Here the 4-step run's stored train.steps reads 8:
  stopped at step 4 of 8."""
  from lev_jax.checkpoint import CheckpointReader  # noqa: PLC0415
  c, workdir = copy_run(finished_tied_run, tmp_path / "run")
  before = files_of(workdir)
  real = CheckpointReader.saved_config
  def stopped_at_4_of_8(self, step):
    saved = real(self, step)
    saved["train"]["steps"] = 8
    return saved
  monkeypatch.setattr(CheckpointReader, "saved_config", stopped_at_4_of_8)
  for steps in (2, 4):
    c.train.steps = steps
    with pytest.raises(CheckpointMismatchError, match=(
        rf"^{workdir} holds an unfinished run: checkpoints up to step 4, trained toward "
        rf"train.steps = 8; this run's train.steps = {steps} is not past step 4. Nothing "
        r"was changed: re-run with the run's own config \(--config.train.steps=8\) to "
        r"resume it .*, evaluate step 4 with lev-eval --checkpoint=.* --step=4, or use a "
        "new --workdir$")):
      finished_run(c, workdir)
  assert files_of(workdir) == before


def test_a_finished_run_with_a_damaged_last_checkpoint_or_none_is_refused(finished_tied_run,
                                                                         tmp_path):
  """Issue 26: a finished run whose step-4 checkpoint was damaged (a truncated state
  file or checksums.json, an emptied state/_METADATA, state/ deleted) said "already
  finished ... nothing to do"; one whose checkpoints/ was removed was trained again from
  scratch over its metrics.jsonl and eval.json; a folder of other files (notes.txt) got
  a run mixed into it. Each is now refused, naming the step and file or the entries,
  and nothing is written."""
  c, workdir = copy_run(finished_tied_run, tmp_path / "run")
  step = workdir / "checkpoints" / "4"
  state_file = max((p for p in (step / "state").rglob("*") if p.is_file()),
                   key=lambda p: p.stat().st_size)
  for path, damage, named in [
      (state_file, lambda b: b[:len(b) // 2], f"{state_file.relative_to(step)} "),
      # newcomer pass 6: 64 flipped bytes, same size, were "already finished"
      (state_file, lambda b: bytes(x ^ 0xFF for x in b[:64]) + b[64:],
       f"{state_file.relative_to(step)} differs from its checksum"),
      (step / "checksums.json", lambda b: b[:20], "the checksum manifest is unreadable"),
      (step / "state" / "_METADATA", lambda b: b"", "state/_METADATA is 0 bytes")]:
    intact = path.read_bytes()
    path.write_bytes(damage(intact))
    before = files_of(workdir)
    with pytest.raises(CheckpointMismatchError, match=f"^.*{named}.*The run finished at "
                       "step 4 but that checkpoint is damaged; nothing was changed: re-run "
                       "with --restore_fallback"):
      train_and_evaluate(c, workdir)
    assert finished_run(c, workdir, restore_fallback=True) is None  # the restore skips it
    assert files_of(workdir) == before
    path.write_bytes(intact)
  assert finished_run(c, workdir) is not None
  shutil.rmtree(step / "state")
  with pytest.raises(CheckpointMismatchError, match=r"checkpoint .*/4: its state/ item is "
                     "missing"):  # newcomer pass 13: the item named, not its first file
    finished_run(c, workdir)
  shutil.rmtree(workdir / "checkpoints")
  before = files_of(workdir)
  with pytest.raises(ConfigError, match=f"^--workdir={workdir}: holds a run's outputs "
                     r"\(data_report.json, eval.json, metrics.jsonl, tensorboard\) but no "
                     "checkpoints/ to resume from"):
    train_and_evaluate(c, workdir)
  assert files_of(workdir) == before
  notes = tmp_path / "notes"
  notes.mkdir()
  (notes / "notes.txt").write_text("mine")
  with pytest.raises(ConfigError, match=f"^--workdir={notes}: is a folder of other files "
                     r"\(notes.txt\), not a run's"):
    train_and_evaluate(c, notes)
  assert [p.name for p in notes.iterdir()] == ["notes.txt"]
  (notes / "tokenizer").mkdir()  # newcomer pass 5: lev-prepare-data's output (it holds
  (notes / "token_counts.npy").touch()  # tokenizer/ and token_counts.npy) was "a run's"
  (notes / "dataset_info.json").write_text("{}")
  with pytest.raises(ConfigError, match=f"^--workdir={notes}: is prepared data "
                     r"\(lev-prepare-data's output\), not a run's folder"):
    train_and_evaluate(c, notes)


def test_eval_json_records_what_was_evaluated(finished_tied_run):
  """Issue 13.9f/13.8: eval.json says which data was evaluated: N of the split's M
  tokens, the files and a sha256 of the batches."""
  from lev_jax.eval.evaluate import coverage
  c, run = finished_tied_run
  data = json.loads((run / "eval.json").read_text())["data"]
  n = c.eval.batches * c.eval.batch_size * (c.train.seq_len + 1)
  assert data["split"] == "validation" and data["tokens_evaluated"] == n
  assert data["tokens_in_split"] > n and len(data["sha256"]) == 64
  assert data["files"][0].endswith("validation.jsonl")
  assert coverage(data).startswith(
      f"read {n:,} of {data['tokens_in_split']:,} validation tokens")


def test_a_second_ctrl_c_aborts_at_once_in_one_line():
  """The first SIGINT asks for a checkpoint (one line); the second ends the process at
  once, exit 130, one more line, no traceback (a partial save stays an Orbax temporary:
  test_checkpoint.test_orbax_temporaries_left_by_a_kill_are_removed)."""
  import signal
  import subprocess
  import sys
  code = ("import os, signal, time\n"
          "from lev_jax.trainer import _StopSignals\n"
          "stop = _StopSignals()\n"
          "stop.install()\n"
          "os.kill(os.getpid(), signal.SIGINT)\n"
          "time.sleep(0.2)\n"
          "print(stop.agreed(), flush=True)\n"
          "os.kill(os.getpid(), signal.SIGINT)\n"
          "time.sleep(30)\n"
          "print('not aborted', flush=True)\n")
  with ctrl_c_not_ignored():
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
  assert proc.returncode == 130, proc.stderr[-3000:]
  assert proc.stdout == "SIGINT\n"
  assert proc.stderr.strip().splitlines() == [
      "Ctrl-C: saving a checkpoint of the current step, then stopping (Ctrl-C again "
      "aborts at once)", "",
      "Ctrl-C again: aborted at once, no checkpoint of this step; earlier complete "
      "checkpoints are kept, if there are any (a partial one is removed when the run is "
      "restarted; with none, the re-run starts at step 0)"]
  from lev_jax.trainer import _StopSignals
  stop = _StopSignals()  # in this process: installed, then the previous handlers back
  with ctrl_c_not_ignored():
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    stop.install()
    assert signal.getsignal(signal.SIGINT) == stop._handle
    stop.uninstall()
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # started as `lev-train &` by a script
    stop.install()
    assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN  # stays ignored
    stop.uninstall()


def test_a_handler_call_before_its_wakeup_byte_still_counts(monkeypatch):
  """The C-level handler flags a signal, then writes its wakeup byte; run on another
  thread (a loaded machine showed it), Python's handler can come first and find the
  pipe empty. Two Ctrl-C whose bytes each come late: the second still aborts, and a
  late byte is not counted twice."""
  import os
  import signal
  from lev_jax import trainer

  class Exit(Exception):
    pass

  def exit_(code):
    raise Exit(code)
  monkeypatch.setattr(trainer.os, "_exit", exit_)
  stop = trainer._StopSignals()
  with ctrl_c_not_ignored():
    stop.install()
    try:
      stop._handle(signal.SIGINT, None)  # the first Ctrl-C, its byte not written yet
      assert stop.requested == "SIGINT"
      os.write(stop._pipe[1], bytes([signal.SIGINT]))  # the first one's byte, late
      with pytest.raises(Exit) as e:
        stop._handle(signal.SIGINT, None)  # the second: reads only the first's byte
    finally:
      stop.uninstall()
  assert e.value.args == (130,)
  stop = trainer._StopSignals()
  with ctrl_c_not_ignored():
    stop.install()
    try:
      stop._handle(signal.SIGTERM, None)
      os.write(stop._pipe[1], bytes([signal.SIGTERM, signal.SIGINT]))
      with pytest.raises(Exit):
        stop._handle(signal.SIGINT, None)  # SIGTERM's late byte is not a new arrival
      assert stop._counted == {signal.SIGTERM: 1, signal.SIGINT: 1}
    finally:
      stop.uninstall()


@pytest.mark.parametrize("first", ["SIGINT", "SIGTERM"])
def test_each_signal_counts_and_the_first_decides_the_status(first, monkeypatch, capfd):
  """Issue 26.17: a Ctrl-C 20 ms after the first signal, both inside one long C call
  (Python runs the handler once for the two), still aborts; after SIGTERM with 143, the
  first signal's status (the scheduler requeues a preempted run), not 130."""
  import hashlib
  import os
  import signal
  import threading
  import time
  from lev_jax import trainer

  class Exit(Exception):
    pass

  def exit_(code):
    raise Exit(code)
  monkeypatch.setattr(trainer.os, "_exit", exit_)

  def send():
    time.sleep(0.05)  # the main thread is inside sha256 by now
    os.kill(os.getpid(), signal.Signals[first])
    time.sleep(0.02)
    os.kill(os.getpid(), signal.SIGINT)
  data = bytes(300_000_000)
  stop = trainer._StopSignals()
  with ctrl_c_not_ignored():
    stop.install()
    try:
      with pytest.raises(Exit) as e:
        sender = threading.Thread(target=send)
        sender.start()
        hashlib.sha256(data).digest()  # ~0.5 s in C, the GIL released: both arrive
        sender.join()
        time.sleep(1)
    finally:
      stop.uninstall()
  assert e.value.args == (128 + signal.Signals[first],)
  assert (f"Ctrl-C {'again' if first == 'SIGINT' else 'after SIGTERM'}: aborted at once"
          in capfd.readouterr().err)


# --- train.profile_steps: a jax.profiler trace of a window of steps (trainer._Profile)

def test_profile_steps_write_a_trace_a_log_line_and_a_perf_row_and_a_resume_traces_the_rest(
    data_cache, tmp_path, caplog):
  """(1, 2) traces steps 2 and 3; stopped after step 2, the resumed run traces step 3."""
  import gzip
  c = run_config("tied", data_cache, steps=4)  # finished_tied_run's programs: cached
  c.train.profile_steps = (1, 2)
  with caplog.at_level("INFO"):
    assert train_and_evaluate(c, tmp_path, stop_at_step=2) == Stopped(2, "stop_at_step")
    train_and_evaluate(c, tmp_path)
  traces = sorted((tmp_path / "profile" / "plugins" / "profile").iterdir())
  assert len(traces) == 2, traces
  for trace in traces:  # one log line names each
    assert len(list(trace.glob("*.xplane.pb"))) == 1 and f"): {trace} (" in caplog.text
    events = json.loads(gzip.decompress((trace / "perfetto_trace.json.gz").read_bytes()))
    assert {"train", "PjitFunction(train_step)"} <= {e.get("name") for e in
                                                     events["traceEvents"]}
  rows = metrics(tmp_path)
  profiled = {r["step"]: r for r in rows if "perf/profile_step_time_s" in r}
  assert sorted(profiled) == [2, 3] and len(rows) == len({(r["step"], "eval/loss" in r)
                                                          for r in rows})
  assert all(r["perf/profile_steps"] == 1 and r["perf/profile_step_time_s"] > 0
             for r in profiled.values())
  assert "train/loss" in profiled[2]  # a log step (log_every=2): the train row
  assert "train/loss" not in profiled[3] and profiled[3]["perf/profile_includes_compile"] == 1
  assert "perf/profile_includes_compile" not in profiled[2]


def test_profile_window_after_a_resume_and_no_profiler_when_off(finished_tied_run,
                                                                monkeypatch):
  from lev_jax.trainer import _Profile
  c, run = finished_tied_run  # trained with profile_steps off: nothing written
  assert not (run / "profile").exists()
  assert not any(k.startswith("perf/profile") for r in metrics(run) for k in r)
  monkeypatch.setattr(jax.profiler, "start_trace", lambda *a, **k: pytest.fail("started"))
  c = c.copy_and_resolve_references()
  for window in ((), (0, 0), (2, 0)):
    c.train.profile_steps = window
    profile = _Profile(c, run, resumed=0)
    assert not profile.on and profile.start(0, {}) == 0.0 and not profile.tracing
  c.train.profile_steps = (1, 2)  # steps 2 and 3
  for resumed, expected in ((0, (True, 1)), (2, (True, 2)), (3, (False, 3)), (4, (False, 4))):
    profile = _Profile(c, run, resumed)
    assert (profile.on, profile.begin) == expected, resumed


@pytest.mark.parametrize("window,match", [
    ((-1, 2), r"= \(-1, 2\): expected first >= 0"),
    ((1, -2), r"= \(1, -2\): expected count >= 0"),
    ((3, 2), r"= \(3, 2\): expected first \+ count <= train.steps = 4"),
    ((1.5, 2), r"= \(1.5, 2\): expected \(\) \(off\) or \(first, count\), two integers"),
    ((True, 2), r"= \(True, 2\): expected \(\) \(off\)"),
    (("1", 2), r"= \('1', 2\): expected \(\) \(off\)"),
    ((5,), r"= \(5,\): expected \(\) \(off\)"),
    ((1, 2, 3), r"= \(1, 2, 3\): expected \(\) \(off\)"),
])
def test_bad_profile_steps_are_one_line_before_any_work(window, match, data_cache, tmp_path):
  c = run_config("tied", data_cache, steps=4)
  c.train.profile_steps = window
  with pytest.raises(ConfigError, match=r"^config.train.profile_steps " + match) as e:
    train_and_evaluate(c, tmp_path / "run")
  assert "\n" not in str(e.value) and not (tmp_path / "run").exists()


def test_profile_folder_that_is_a_file_is_refused_before_any_work(data_cache, tmp_path):
  c = run_config("tied", data_cache, steps=4)
  c.train.profile_steps = (1, 2)
  (tmp_path / "profile").write_text("")
  with pytest.raises(ConfigError, match=r"profile: is a file; expected a folder"):
    train_and_evaluate(c, tmp_path)
  assert sorted(p.name for p in tmp_path.iterdir()) == ["profile"]
