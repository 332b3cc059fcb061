"""lev-eval: perplexity and frequency buckets of a checkpoint, overrides, baseline, CLI."""

import json
import os
import re
import subprocess
import sys
import types

import pytest

from conftest import byte_config, write_workdir
from lev_jax import inference, workdir
from lev_jax.cli import eval as eval_cli
from lev_jax.eval import checkpoint_eval
from lev_jax.config import ConfigError


def eval_config(embedding, cache_dir):
  c = byte_config(embedding)
  c.data.cache_dir = str(cache_dir)
  c.train.seq_len = 32
  c.eval.batches = 2
  c.eval.batch_size = 4
  return c


@pytest.fixture(scope="module")
def workdirs(tmp_path_factory):
  root = tmp_path_factory.mktemp("runs")
  for embedding in ("tied", "lev"):
    write_workdir(root / embedding, eval_config(embedding, root / "cache"), steps=(3,))
  return root


def test_perplexity_buckets_recombine_under_both_schemes(workdirs):
  im = inference.load(workdirs / "lev")
  out = checkpoint_eval.perplexity(im, im.config)
  v, m = out["validation"], out["validation_equal_mass"]
  assert v["bucket_scheme"] == "log" and m["bucket_scheme"] == "equal_mass"
  assert v["tokens"] == m["tokens"] == 2 * 4 * 32
  assert v["loss"] == pytest.approx(m["loss"], rel=1e-9)
  for r in (v, m):  # bucket losses recombine, token-weighted, to the overall loss
    total = sum(b["loss"] * b["tokens"] for b in r["buckets"] if b["tokens"])
    assert total / r["tokens"] == pytest.approx(r["loss"], rel=1e-9)
  assert len(m["bucket_edges"]) == 3  # 4 equal-mass buckets


def test_overrides_apply_to_data_and_eval_but_never_to_the_shape(workdirs):
  im = inference.load(workdirs / "tied")
  c = checkpoint_eval.apply_overrides(im.config, {"eval.batches": 1, "eval.downstream.piqa": "p"})
  assert c.eval.batches == 1 and c.eval.downstream.piqa == "p"
  with pytest.raises(ConfigError, match="model.d_model: the model's shape"):
    checkpoint_eval.apply_overrides(im.config, {"model.d_model": 64})
  with pytest.raises(ConfigError, match="eval.batches"):
    checkpoint_eval.apply_overrides(im.config, {"eval.batches": 0})
  # newcomer pass 19 (A80, A82): optimizer and training fields were accepted and ignored
  for field in ("optim.lr", "train.steps"):
    with pytest.raises(ConfigError, match=re.escape(
        f"--config.{field}: an evaluation does not train, so the {field.split('.')[0]} "
        "section has no effect here; expected data.* or eval.* overrides")):
      checkpoint_eval.apply_overrides(im.config, {field: 1})
  for field in ("seed", "model.remat", "lev.remat", "data.shuffle_buffer"):  # N31, N32, V26
    with pytest.raises(ConfigError, match=re.escape(
        f"--config.{field}: an evaluation does not train, so it has no effect here")):
      checkpoint_eval.apply_overrides(im.config, {field: 1})
  with pytest.raises(ConfigError, match=re.escape(  # pass 20 (N34): this CPU
      "config.model.dtype = 'float16': expected 'bfloat16' or 'float32' in a CPU program")):
    checkpoint_eval.apply_overrides(inference.load(workdirs / "tied").config,
                                    {"model.dtype": "float16"})


_EVAL_FLAGS = ("checkpoint", "step", "dtype", "split", "baseline", "allow_different_data",
               "output", "perplexity", "config")


def _eval_here(monkeypatch, capsys, *args, cwd=None):
  """`lev-eval ARGS` in this process (no interpreter start-up: ~4 CPU-s of jax, Orbax
  and flax imports): its flags defined on absl's FLAGS as `run` defines them (the
  --config.* overrides read from sys.argv), parsed by the command's own parser, then
  removed again; its main run in `cwd`. Returns (exit status, stdout, stderr)."""
  from absl import flags
  from lev_jax.cli import common
  argv = ["lev-eval", *args]
  capsys.readouterr()
  with monkeypatch.context() as m:
    m.setattr(sys, "argv", argv)
    if cwd is not None:
      m.chdir(cwd)
    try:
      common.define_or_exit(eval_cli.PROG, eval_cli._define_flags)
      eval_cli.main(common.flags_parser(eval_cli.PROG)(argv))
      status = 0
    except SystemExit as e:
      status = e.code
    finally:
      for name in list(flags.FLAGS):
        if name in _EVAL_FLAGS or name.startswith("config."):
          delattr(flags.FLAGS, name)
  out, err = capsys.readouterr()
  return status, out, err


def test_cli_writes_results_and_compares_with_a_baseline(workdirs, tmp_path, monkeypatch,
                                                         capsys):
  """The baseline's evaluation in this process (_eval_here), the comparison with it as a
  user runs it (a subprocess)."""
  status, _, err = _eval_here(monkeypatch, capsys, "--config.eval.batches=1",
                              "--checkpoint=tied", cwd=workdirs)
  assert status == 0, err[-2000:]
  wrote = lambda stderr: [l for l in stderr.splitlines() if "wrote" in l]
  assert wrote(err) == ["lev-eval: wrote tied/lev_eval.json"]  # once, as the user gave it
  run = subprocess.run([sys.executable, "-m", "lev_jax.cli.eval", "--config.eval.batches=1",
                        f"--checkpoint={workdirs / 'lev'}", f"--baseline={workdirs / 'tied'}",
                        f"--output={tmp_path / 'r.json'}"],
                       env=dict(os.environ, JAX_PLATFORMS="cpu"), capture_output=True,
                       text=True)
  assert run.returncode == 0, run.stderr[-2000:]
  assert wrote(run.stderr) == [f"lev-eval: wrote {tmp_path / 'r.json'}"]
  out = json.loads((tmp_path / "r.json").read_text())
  tied = json.loads((workdirs / "tied" / "lev_eval.json").read_text())
  assert out["step"] == 3 and out["embedding"] == "lev"
  rows = out["relative_change"]["validation_equal_mass"]
  for row, a, b in zip(rows, tied["validation_equal_mass"]["buckets"],
                       out["validation_equal_mass"]["buckets"]):
    assert row["change"] == pytest.approx(b["perplexity"] / a["perplexity"] - 1)
  assert "validation loss" in run.stdout and "vs baseline" in run.stdout


@pytest.mark.parametrize("kwargs, message", [
    (dict(checkpoint="/nonexistent/run"), "/nonexistent/run: no such checkpoint folder"),
    (dict(overrides={"model.n_layers": 4}), "cannot be overridden"),
    (dict(split="test"), "config.data.test_files is empty"),
    (dict(overrides={"data.validation_files": ()}), "^--config.data.validation_files is "
     "empty$"),
    # newcomer pass 12 (Q03): an empty file name did not name the field
    (dict(overrides={"data.validation_files": ("",)}), r"^--config.data.validation_files "
     r"= \(''\,\): expected non-empty paths"),
    # issue 26: "cannot read a lev_eval.json ...; run lev-eval on the baseline first"
    (dict(baseline="/nonexistent/run"), r"^--baseline=/nonexistent/run: no such file or "
     r"folder \(expected another run's lev_eval.json, or the folder holding it\)$"),
])
def test_bad_input_names_what_is_wrong(kwargs, message, workdirs):
  kwargs = dict(dict(checkpoint=workdirs / "lev"), **kwargs)
  with pytest.raises(ValueError, match=message):
    checkpoint_eval.evaluate_checkpoint(**kwargs)


def test_nothing_to_evaluate_is_refused(tmp_path):
  """Newcomer pass 4: --noperplexity without a task wrote a result of nothing."""
  im = types.SimpleNamespace(config=eval_config("tied", tmp_path))
  with pytest.raises(ConfigError, match=r"^--noperplexity and no downstream task \(every "
                     r"config.eval.downstream.<task> file is empty\): nothing to evaluate"):
    checkpoint_eval.evaluate_model(im, perplexity_too=False)


def test_cli_error_is_one_line_and_exit_2(monkeypatch, capsys):
  """The command's flags and main in this process (_eval_here); its start-up as a
  process ends in the same one line: test_cli_train's
  test_unknown_config_field_is_one_line_with_the_nearest_name[eval-...]."""
  status, _, err = _eval_here(monkeypatch, capsys, "--checkpoint=/nonexistent")
  assert status == 2 and err.strip() == (
      "lev-eval: error: /nonexistent: no such checkpoint folder"), err[-2000:]


def test_an_unwritable_output_folder_is_one_line(tmp_path, monkeypatch, capsys):
  """lev-eval's main runs this check before loading or evaluating anything."""
  (tmp_path / "run").mkdir()
  monkeypatch.setattr(os, "access", lambda path, mode: False)  # a read-only mount (CI: root)
  with pytest.raises(SystemExit) as e:
    eval_cli._check_output_writable(None, str(tmp_path / "run"))
  assert e.value.code == 2
  assert capsys.readouterr().err.strip() == (
      f"lev-eval: error: --output (default {tmp_path / 'run' / 'lev_eval.json'}): "
      f"{tmp_path / 'run'} is not writable; pass --output=PATH in a writable folder")


@pytest.mark.parametrize("output,expected", [
    ("{tmp}", "--output={tmp}: is a folder; expected the result file's path, e.g. "
     "{tmp}/lev_eval.json"),
    ("{tmp}/x/e.json", "--output={tmp}/x/e.json: folder {tmp}/x does not exist; expected "
     "a file in an existing folder you can write to"),
])
def test_an_output_that_cannot_be_a_file_is_one_line(tmp_path, capsys, output, expected):
  """Before evaluating: a folder or a missing folder as --output (no traceback after)."""
  (tmp_path / "run").mkdir()
  with pytest.raises(SystemExit) as e:
    eval_cli._check_output_writable(output.format(tmp=tmp_path), str(tmp_path / "run"))
  assert e.value.code == 2
  assert capsys.readouterr().err.strip() == "lev-eval: error: " + expected.format(
      tmp=tmp_path)


def test_a_folder_in_place_of_the_default_output_is_one_line(tmp_path, capsys):
  """Newcomer pass 13: CHECKPOINT/lev_eval.json a folder was told to write a file
  inside it."""
  (tmp_path / "run" / "lev_eval.json").mkdir(parents=True)
  with pytest.raises(SystemExit):
    eval_cli._check_output_writable(None, str(tmp_path / "run"))
  assert capsys.readouterr().err.strip() == (
      f"lev-eval: error: --output (default {tmp_path / 'run' / 'lev_eval.json'}): is a "
      "folder; expected lev-eval's result file there (move the folder aside, or pass "
      "--output=FILE)")


def test_an_output_inside_a_saved_checkpoint_is_refused(tmp_path, capsys):
  """`--output=RUN/checkpoints/300/x.json` wrote into a finished step."""
  (tmp_path / "run" / "checkpoints" / "300").mkdir(parents=True)
  (tmp_path / "run" / "data_report.json").write_text("{}")  # a run's workdir
  output = str(tmp_path / "run" / "checkpoints" / "300" / "x.json")
  with pytest.raises(SystemExit) as e:
    eval_cli._check_output_writable(output, str(tmp_path / "run"))
  assert e.value.code == 2
  assert capsys.readouterr().err.strip() == (
      f"lev-eval: error: --output={output}: is inside {tmp_path / 'run' / 'checkpoints'}, "
      "a run's saved checkpoints (only that run's lev-train writes there); expected a "
      "path outside it")
  for owned in ("metrics.jsonl", "eval.json", "token_counts.npy"):  # issue 26: replaced
    output = str(tmp_path / "run" / owned)
    with pytest.raises(SystemExit) as e:
      eval_cli._check_output_writable(output, str(tmp_path / "run"))
    assert capsys.readouterr().err.strip() == (
        f"lev-eval: error: --output={output}: is {output}, a run's own file (only that "
        "run's lev-train writes it); expected another path")
  eval_cli._check_output_writable(None, str(tmp_path / "run"))  # lev_eval.json: its own
  # newcomer pass 9: into another run's folder (as its lev_eval.json), or an export's
  (tmp_path / "exp").mkdir()
  (tmp_path / "exp" / "export.json").write_text("{}")
  for folder, what in (("run", "a training run's folder (only its lev-train writes there)"),
                       ("exp", "an export (only lev-export writes there)")):
    output = str(tmp_path / folder / "lev_eval.json")
    with pytest.raises(SystemExit):
      eval_cli._check_output_writable(output, str(tmp_path / "other"))
    assert capsys.readouterr().err.strip() == (
        f"lev-eval: error: --output={output}: is inside {tmp_path / folder}, {what}; "
        "expected a path outside it")
    eval_cli._check_output_writable(output, str(tmp_path / folder))  # its own: fine
  (tmp_path / "prep").mkdir()
  (tmp_path / "prep" / "dataset_info.json").write_text("{}")
  with pytest.raises(SystemExit):  # newcomer pass 9: the default --output was named
    eval_cli._check_output_writable(None, str(tmp_path / "prep"))
  assert capsys.readouterr().err.strip() == (
      f"lev-eval: error: --checkpoint={tmp_path / 'prep'}: is prepared data "
      "(lev-prepare-data's output), not a checkpoint; expected a lev-train workdir or a "
      "lev-export folder")


def test_a_folder_s_lev_eval_json_of_another_checkpoint_is_no_baseline(tmp_path):
  """Newcomer pass 9: a lev_eval.json put in a run's folder by `lev-eval --output` was
  compared as that run's result."""
  (tmp_path / "tied").mkdir()
  (tmp_path / "tied" / "lev_eval.json").write_text(json.dumps(
      {"checkpoint": str(tmp_path / "other"), "validation": {}, "data": {}}))
  with pytest.raises(ConfigError, match=re.escape(
      f"--baseline={tmp_path / 'tied'}: {tmp_path / 'tied' / 'lev_eval.json'} is the result "
      f"of {tmp_path / 'other'}, not of this folder (lev-eval --output put it there); "
      f"expected the folder's own (lev-eval --checkpoint={tmp_path / 'tied'})")):
    checkpoint_eval._read_baseline(tmp_path / "tied")
  (tmp_path / "tied" / "lev_eval.json").write_text(json.dumps(
      {"checkpoint": str(tmp_path / "tied"), "validation": {"bucket_edges": []}, "data": {}}))
  assert checkpoint_eval._read_baseline(tmp_path / "tied")[1] == str(
      tmp_path / "tied" / "lev_eval.json")
  (tmp_path / "prep").mkdir()  # newcomer pass 10: "run lev-eval on the baseline first"
  (tmp_path / "prep" / "dataset_info.json").write_text("{}")
  with pytest.raises(ConfigError, match=re.escape(
      f"--baseline={tmp_path / 'prep'}: is prepared data (lev-prepare-data's output), not a "
      "run")):
    checkpoint_eval._read_baseline(tmp_path / "prep")


def test_an_existing_output_that_is_not_a_lev_eval_result_is_kept(tmp_path, capsys):
  """Issue 26: `--output=precious.txt` (an unrelated file) was replaced without a word."""
  (tmp_path / "run").mkdir()
  precious = tmp_path / "precious.txt"
  precious.write_text("my notes\n")
  with pytest.raises(SystemExit) as e:
    eval_cli._check_output_writable(str(precious), str(tmp_path / "run"))
  assert e.value.code == 2
  assert capsys.readouterr().err.strip() == (
      f"lev-eval: error: --output={precious}: is an existing file that is not a lev-eval "
      "result (a JSON object with checkpoint, step, split); expected a new path or an "
      "earlier lev-eval result to replace")
  assert precious.read_text() == "my notes\n"
  precious.write_text('{"checkpoint": "run", "step": 3, "split": "validation"}')
  eval_cli._check_output_writable(str(precious), str(tmp_path / "run"))  # its own: replaced


@pytest.mark.parametrize("output, expected", [
    # newcomer pass 4: read whole to see whether it was a result (23 GB, OOM-killed)
    ("/dev/full", "--output=/dev/full: is a character device, not a regular file; "
     "expected a new path or a regular file"),
    # the whole evaluation ran, then a FileNotFoundError traceback (root: no EACCES)
    ("/proc/r.json", "--output=/proc/r.json: cannot create a file in /proc (No such file "
     "or directory); expected a folder you can write to"),
    # the link was replaced by a file
    ("{tmp}/dangling", "--output={tmp}/dangling: is a symbolic link to {tmp}/gone, which "
     "does not exist; expected a new path or a regular file"),
])
def test_an_output_that_cannot_be_replaced_by_a_file_is_refused_unread(
    tmp_path, capsys, monkeypatch, output, expected):
  (tmp_path / "run").mkdir()
  (tmp_path / "dangling").symlink_to(tmp_path / "gone")
  monkeypatch.setattr(eval_cli, "_is_lev_eval_result", lambda path: pytest.fail("read"))
  with pytest.raises(SystemExit) as e:
    eval_cli._check_output_writable(output.format(tmp=tmp_path), str(tmp_path / "run"))
  assert e.value.code == 2
  assert capsys.readouterr().err.strip() == "lev-eval: error: " + expected.format(
      tmp=tmp_path)
  assert not (tmp_path / "gone").exists() and not list((tmp_path / "run").iterdir())


def test_an_existing_output_is_read_up_to_a_limit(tmp_path, monkeypatch):
  """A large file is not an earlier result (it is not read whole)."""
  result = tmp_path / "r.json"
  result.write_text('{"checkpoint": "run", "step": 3, "split": "validation"}')
  assert eval_cli._is_lev_eval_result(result)
  monkeypatch.setattr(workdir.read_small_text, "__defaults__", (16,))
  assert not eval_cli._is_lev_eval_result(result)


@pytest.mark.parametrize("content, expected", [
    (None, r"^--baseline=/dev/zero: /dev/zero is not a regular file; expected another "
     r"run's lev_eval.json, or the folder holding it$"),  # was a MemoryError
    (b"\xff{}", r"^--baseline=.*b.json: cannot read a lev_eval.json \(not UTF-8 text \(byte "
     r"0xff at offset 0\)\); run lev-eval on the baseline first$"),  # a bare codec line
    # newcomer pass 5: lev-train's eval.json "holds no validation result"
    (b'{"step": 4, "loss": 5.1, "perplexity": 164.0}', r"^--baseline=.*eval.json: is "
     r"lev-train's eval.json, which holds no per-bucket result; expected the baseline's "
     r"lev_eval.json \(run lev-eval --checkpoint=.* first\), or the folder holding it$"),
    (b'{"step": 4}', r"^--baseline=.*eval.json: it holds no validation result to compare "
     r"with \(expected a lev_eval.json written by lev-eval\)$"),
    # newcomer pass 14 (S08): "written by an older lev-eval"
    # newcomer pass 15 (V02b): with --allow_different_data, a KeyError 'bucket_edges'
    (b'{"step": 4, "validation": {"documents": 3}}', r"^--baseline=.*eval.json: its "
     r"validation result holds no buckets \(bucket_edges\); expected a lev_eval.json "
     r"written by lev-eval$"),
    (b'{"step": 4, "validation": {"log": {}}, "test": {"log": {}}}', r"^--baseline=.*"
     r"eval.json: .*eval.json is a lev-study evaluation \(study_eval.json: validation and "
     r"test, bucketed twice\), not a lev-eval result; expected the baseline's "
     r"lev_eval.json \(run lev-eval --checkpoint=.* first\)$"),
])
def test_a_baseline_that_is_no_small_utf8_file_is_one_line(tmp_path, content, expected):
  path = "/dev/zero"
  if content is not None:
    path = tmp_path / ("eval.json" if b"step" in content else "b.json")
    path.write_bytes(content)
  with pytest.raises(ConfigError, match=expected):
    checkpoint_eval._read_baseline(path, allow_different_data=True)


def test_a_run_s_data_report_json_as_baseline_is_named(tmp_path):
  """Newcomer pass 15 (V02, V02b): "written by an older lev-eval", then a KeyError with
  the --allow_different_data that line suggested."""
  path = tmp_path / "run" / "data_report.json"
  path.parent.mkdir()
  path.write_text(json.dumps({"source": "embedded", "validation": {"documents": 3}}))
  for allow in (False, True):
    with pytest.raises(ConfigError, match="^" + re.escape(
        f"--baseline={path}: is lev-train's data_report.json (the data a run read), not a "
        f"lev-eval result; expected the baseline's lev_eval.json (run lev-eval "
        f"--checkpoint={path.parent} first), or the folder holding it") + "$"):
      checkpoint_eval._read_baseline(path, allow_different_data=allow)


def test_an_output_that_is_the_baseline_file_is_refused(tmp_path, capsys):
  """Newcomer pass 15 (V06): --baseline=F --output=F replaced the baseline's result with
  the new one without a word; so would the default output of a run given as its own
  baseline folder."""
  base = tmp_path / "base.json"
  base.write_text("{}")
  (tmp_path / "run").mkdir()
  for output, baseline, flag in (
      (str(base), str(base), f"--output={base}"),
      (None, str(tmp_path / "run"),
       f"--output (default {tmp_path / 'run' / 'lev_eval.json'})")):
    with pytest.raises(SystemExit):
      eval_cli._check_output_not_baseline(output, str(tmp_path / "run"), baseline)
    assert capsys.readouterr().err.strip() == (
        f"lev-eval: error: {flag}: is the --baseline file; the result would replace the "
        "baseline it is compared with: give another --output")
  eval_cli._check_output_not_baseline(str(tmp_path / "new.json"), str(tmp_path / "run"),
                                      str(base))  # another file: fine


def test_a_checkpoint_that_is_a_file_is_named_as_such(tmp_path, capsys):
  (tmp_path / "afile").write_text("x")
  with pytest.raises(SystemExit) as e:
    eval_cli._check_output_writable(None, str(tmp_path / "afile"))
  assert e.value.code == 2
  assert capsys.readouterr().err.strip() == (
      f"lev-eval: error: --checkpoint={tmp_path / 'afile'}: is a file, not a folder "
      "(expected a lev-train workdir or a lev-export folder)")


def test_downstream_tasks_from_config_paths(workdirs, tmp_path):
  arc = tmp_path / "ARC-Easy-Test.jsonl"
  arc.write_text("\n".join(json.dumps(
      {"id": f"q{i}", "question": {"stem": f"What is {i}?", "choices": [
          {"text": "one", "label": "A"}, {"text": "two", "label": "B"}]},
       "answerKey": "AB"[i % 2]}) for i in range(4)) + "\n")
  piqa = tmp_path / "valid.jsonl"
  piqa.write_text("\n".join(json.dumps({"goal": f"g{i}", "sol1": "a", "sol2": "bb"})
                            for i in range(3)) + "\n")
  (tmp_path / "valid-labels.lst").write_text("0\n1\n1\n")
  out = checkpoint_eval.evaluate_checkpoint(
      workdirs / "lev", perplexity_too=False,
      overrides={"eval.downstream.arc_easy": str(arc), "eval.downstream.piqa": str(piqa)})
  assert "validation" not in out
  assert out["downstream"]["arc_easy"]["n"] == 4 and out["downstream"]["piqa"]["n"] == 3
  assert 0 <= out["downstream"]["arc_easy"]["acc"] <= 1
  piqa.write_text('{"goal": "g", "sol1": "a"}\n')
  (tmp_path / "valid-labels.lst").write_text("0\n")
  with pytest.raises(ValueError, match=r"valid.jsonl:1.*sol2"):
    checkpoint_eval.evaluate_checkpoint(workdirs / "lev", perplexity_too=False,
                                 overrides={"eval.downstream.piqa": str(piqa)})
  # Issue 13.9b's sibling: labels without the data file would be ignored.
  with pytest.raises(ConfigError, match=r"^--config.eval.downstream.piqa_labels=.*lst: "
                     r"config.eval.downstream.piqa is empty; give the PIQA data file too$"):
    checkpoint_eval.evaluate_checkpoint(workdirs / "lev", overrides={
        "eval.downstream.piqa_labels": str(tmp_path / "valid-labels.lst")})


def test_other_validation_files_need_no_data_source_and_the_summary_prints_lambada(
    workdirs, tmp_path, capsys):
  import numpy as np
  from lev_jax.data.files import npy_bytes, write_bytes_atomic
  lev = tmp_path / "lev"
  import shutil
  shutil.copytree(workdirs / "lev", lev)
  write_bytes_atomic(lev / "token_counts.npy", npy_bytes(np.arange(259, dtype=np.int64)))
  val = tmp_path / "val.jsonl"
  val.write_text("\n".join(json.dumps({"text": "some held-out text " * 20})
                           for _ in range(8)) + "\n")
  lambada = tmp_path / "lambada_test.jsonl"
  lambada.write_text("\n".join(json.dumps({"text": f"a b c word{i}"}) for i in range(3)))
  out = checkpoint_eval.evaluate_checkpoint(lev, overrides={
      "data.validation_files": (str(val),), "eval.batches": 1,
      "eval.downstream.lambada": str(lambada)})
  assert out["validation"]["tokens"] == 4 * 32 and out["embedding"] == "lev"
  assert out["downstream"]["lambada"]["acc_norm"] is None
  eval_cli._print_summary(out)
  printed = capsys.readouterr().out
  assert "lambada: acc 0.0000 ± 0.0000, perplexity" in printed and "(n=3)" in printed


def test_edited_token_counts_are_refused_naming_the_file(workdirs, tmp_path):
  # Issue 26 (7th pass): a same-size edit of RUN/token_counts.npy moved tokens between
  # frequency buckets without a word; the saved counts are checked against the data's.
  import shutil
  import numpy as np
  from lev_jax.data.files import npy_bytes, read_npy, write_bytes_atomic
  from lev_jax import data
  lev = tmp_path / "lev"
  shutil.copytree(workdirs / "lev", lev)
  counts = data.load(eval_config("lev", workdirs / "cache")).token_counts_V
  write_bytes_atomic(lev / "token_counts.npy", npy_bytes(counts))  # as lev-train saves it
  out = checkpoint_eval.evaluate_checkpoint(lev, overrides={"eval.batches": 1})
  write_bytes_atomic(lev / "token_counts.npy", npy_bytes(counts[::-1].copy()))
  with pytest.raises(ConfigError, match=r"lev/token_counts.npy: the saved training token "
                     r"counts differ from those of the training split config.data gives now "
                     r"\([0-9,]+ of 259 ids' counts differ, sums"):
    checkpoint_eval.evaluate_checkpoint(lev, overrides={"eval.batches": 1})
  (lev / "token_counts.npy").unlink()  # the hint: without it, the data's counts are used
  again = checkpoint_eval.evaluate_checkpoint(lev, overrides={"eval.batches": 1})
  assert again["validation"] == out["validation"]


def test_split_test_of_the_embedded_source_is_its_held_out_shard(tmp_path):
  from lev_jax.data.embedded import cache_name
  c = byte_config()
  c.data.cache_dir = str(tmp_path)
  folder = tmp_path / f"{cache_name()}-val{c.data.validation_fraction:g}"
  with pytest.raises(ConfigError, match=r"test_files is empty and config.data.test_fraction = 0"):
    checkpoint_eval.heldout_test_files(c)
  c.data.test_fraction = 0.1
  (path,) = checkpoint_eval.heldout_test_files(c)
  assert path == str(tmp_path / f"{folder.name}-test0.1" / "test.jsonl")
  lines = (folder / "train.jsonl").read_text().splitlines(keepends=True)  # the two-way split
  held_out = open(path).read().splitlines(keepends=True)
  assert held_out and set(held_out) < set(lines)
  c.data.test_files = ("other.jsonl",)  # explicit files win
  assert checkpoint_eval.heldout_test_files(c) == ("other.jsonl",)


def test_the_record_says_what_was_evaluated_and_the_summary_prints_it(workdirs, capsys):
  """Issue 13.9f: "evaluated N of M tokens" (recorded and printed) when eval.batches
  takes only the start of the split; 13.9d: each bucket's target tokens beside it."""
  from lev_jax.data.corpus import read_documents
  im = inference.load(workdirs / "lev")
  out = checkpoint_eval.evaluate_model(im, overrides={"eval.batches": 1})
  data = out["data"]
  assert data["split"] == "validation" and data["batches"] == 1
  assert data["tokens_evaluated"] == 4 * 33 and len(data["sha256"]) == 64
  texts, _ = read_documents(data["files"])
  total = sum(len(im.tokenizer.encode(t)) + 1 for t in texts)
  assert data["tokens_in_split"] == total > 10 * 4 * 33
  eval_cli._print_summary(out)
  printed = capsys.readouterr().out
  assert f"read 132 of {total:,} validation tokens" in printed, printed
  # Issue 26: the two counts say which is which: rows read (seq_len + 1 tokens each)
  # and the predicted tokens the perplexity is over
  assert f"over {out['validation']['tokens']:,} predicted tokens" in printed, printed
  assert "; 1 batch(es) of 4 x 33 tokens, each row predicting its last 32)" in printed
  assert "raise eval.batches to evaluate more of it" in printed
  for b in out["validation"]["buckets"]:
    if b["perplexity"] is not None:
      assert f"{b['range']} {b['perplexity']:.1f} ({b['tokens']:,} tokens)" in printed


def test_a_baseline_evaluated_on_other_data_is_refused_unless_allowed(workdirs, tmp_path,
                                                                   monkeypatch, capsys):
  """Issue 13.8: lev_eval.json records its data; a baseline evaluated on other data, or
  recording none, is refused before evaluating, unless --allow_different_data."""
  tied = checkpoint_eval.evaluate_checkpoint(workdirs / "tied", overrides={"eval.batches": 1})
  base = tmp_path / "base.json"
  base.write_text(json.dumps(tied))
  same = checkpoint_eval.evaluate_checkpoint(workdirs / "lev", baseline=base,
                                      overrides={"eval.batches": 1})
  assert same["relative_change"]["same_data"] and same["data"] == tied["data"]
  with pytest.raises(ConfigError, match=(
      r"--baseline=.*base.json: evaluated on other data than this run \(baseline: "
      r"validation of .*validation.jsonl, 132 tokens evaluated, sha256 \w{12}; this run: "
      r"validation of .*, 264 tokens evaluated, .*pass --allow_different_data$")):
    checkpoint_eval.evaluate_checkpoint(workdirs / "lev", baseline=base,
                                 overrides={"eval.batches": 2})
  allowed = checkpoint_eval.evaluate_checkpoint(workdirs / "lev", baseline=base,
                                         overrides={"eval.batches": 2},
                                         allow_different_data=True)
  assert allowed["relative_change"]["same_data"] is False
  old = tmp_path / "old.json"
  old.write_text(json.dumps({k: v for k, v in tied.items() if k != "data"}))
  with pytest.raises(ConfigError, match=(
      r"--baseline=.*old.json: it does not record the data it was evaluated on .*; "
      r"re-run lev-eval on the baseline, or pass --allow_different_data")):
    checkpoint_eval.evaluate_checkpoint("/not/even/loaded", baseline=old)
  # The command (its flags and main, in this process): one line, exit 2, nothing written.
  status, _, err = _eval_here(monkeypatch, capsys, f"--checkpoint={workdirs / 'lev'}",
                              f"--baseline={base}", "--config.eval.batches=2",
                              f"--output={tmp_path / 'r.json'}")
  assert status == 2, err[-2000:]
  assert err.strip().splitlines()[-1].startswith(
      f"lev-eval: error: --baseline={base}: evaluated on other data than this run")
  assert not (tmp_path / "r.json").exists()


def test_an_empty_tuple_override_reaches_the_config_check(monkeypatch, tmp_path):
  """Newcomer pass 11: --config.eval.freq_bucket_edges="()" was ignored without a word
  (ml_collections leaves the flag's `present` unset for an empty tuple); lev-params and
  lev-train refuse it."""
  from absl import flags
  from ml_collections import config_flags
  from lev_jax.config import base_config
  argv = ["lev-eval", "--config.eval.freq_bucket_edges=()", "--config.eval.batches=3"]
  monkeypatch.setattr(sys, "argv", argv)  # ml_collections defines its flags from sys.argv
  fv = flags.FlagValues()
  config_flags.DEFINE_config_dict("config", base_config(), flag_values=fv)
  fv(argv)
  monkeypatch.setattr(eval_cli, "flags", types.SimpleNamespace(FLAGS=fv))
  overrides = eval_cli._overrides()
  assert overrides == {"eval.freq_bucket_edges": [], "eval.batches": 3}
  with pytest.raises(ConfigError, match=r"^config.eval.freq_bucket_edges = \(\): expected "
                     "increasing positive counts"):
    checkpoint_eval.apply_overrides(eval_config("tied", tmp_path), overrides)
