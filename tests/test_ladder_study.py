"""lev-study: the paired t-interval, the refusal of non-factor differences, and the driver
end to end on 2 tiny cells x 2 seeds (trained in this process, evaluated on validation
and test, reported)."""

import csv
import json
import math
import re
from pathlib import Path

import pytest

from conftest import byte_config
from lev_jax.ladder import study
from lev_jax.cli import study as study_cli
from lev_jax.ladder.study import StudyError


def test_paired_t_interval_on_fixed_numbers():
  changes = study.paired_changes([10.0, 20.0, 30.0], [9.0, 19.0, 27.0])
  assert changes == pytest.approx([-0.1, -0.05, -0.1])
  iv = study.t_interval(changes)
  # mean -1/12; sd 0.0288675 (ddof 1); se = sd / sqrt(3); t(0.975, df=2) = 4.3026527
  se = 0.05 / math.sqrt(3) / math.sqrt(3)
  assert iv["n"] == 3 and iv["mean"] == pytest.approx(-1 / 12)
  assert iv["se"] == pytest.approx(se, rel=1e-6)
  assert iv["lo"] == pytest.approx(-1 / 12 - 4.3026527 * se, rel=1e-6)
  assert iv["hi"] == pytest.approx(-1 / 12 + 4.3026527 * se, rel=1e-6)
  assert study.t_interval([0.2])["lo"] is None  # one seed: a mean, no interval
  assert study.t_interval([])["mean"] is None
  with pytest.raises(StudyError, match="equal lengths"):
    study.paired_changes([1.0], [1.0, 2.0])


def _data_files(folder):
  """Tiny Pile-format train / validation / test files of pydoc help texts (no stdlib
  walk, no tokenizer training: the study's byte vocabulary)."""
  from pydoc_data import topics
  texts = [topics.topics[k] for k in sorted(topics.topics) if topics.topics[k].strip()]
  folder.mkdir(exist_ok=True)
  parts = {"train": texts[:40], "validation": texts[40:52], "test": texts[52:64]}
  for split, docs in parts.items():
    (folder / f"{split}.jsonl").write_text(
        "".join(json.dumps({"text": t, "meta": {"pile_set_name": "x"}}) + "\n" for t in docs))
  return {split: str(folder / f"{split}.jsonl") for split in parts}


def _study_file(tmp_path, *, odd_run=None, odd_field="", odd_value=None):
  """A study of tied and Leviathan at one byte vocabulary, seeds 0 and 1; `odd_run`
  gets `odd_field` = odd_value (a non-factor difference)."""
  files = _data_files(tmp_path / "data")
  path = tmp_path / "tiny_study.py"
  path.write_text(f'''
import sys
sys.path.insert(0, {str(Path(__file__).parent)!r})
from conftest import byte_config
RUNGS = ("tied_s0", "leviathan_s0", "tied_s1", "leviathan_s1")
FINAL_EVAL_BATCHES = 2

def get_config(run):
  kind, seed = run.split("_")
  c = byte_config("tied" if kind == "tied" else "lev")
  c.name = run
  c.seed = c.data.seed = int(seed[1:])
  c.data.source = "jsonl"
  c.data.train_files = ({files["train"]!r},)
  c.data.validation_files = ({files["validation"]!r},)
  c.data.test_files = ({files["test"]!r},)
  c.data.cache_dir = {str(tmp_path / "cache")!r}
  c.model.n_layers = 1  # a smaller program: compilation is most of this test's time
  c.train.steps, c.train.log_every, c.train.eval_every = 4, 2, 2
  c.train.checkpoint_every, c.optim.warmup_steps = 4, 1
  c.eval.batches, c.eval.batch_size = 1, 4
  if run == {odd_run!r}:
    section, field = {odd_field!r}.split(".")
    c[section][field] = {odd_value!r}
  return c
''')
  return path


def test_runs_that_differ_in_a_non_factor_field_are_refused_before_anything_runs(tmp_path):
  path = _study_file(tmp_path, odd_run="leviathan_s1",
                     odd_field="train.steps", odd_value=5)
  calls = []
  with pytest.raises(StudyError) as e:
    study_cli.run_study(str(path), str(tmp_path / "root"), run=True,
                        runner=lambda argv: calls.append(argv) or 0)
  assert "train.steps (4 in tied_s0, leviathan_s0, tied_s1; 5 in leviathan_s1)" in str(e.value)
  assert "model.embedding" not in str(e.value).split("Runs may differ")[0]
  assert not calls and not (tmp_path / "root").exists()
  a, b = byte_config("tied"), byte_config("lev")
  b.model.d_model, b.data.shuffle_buffer = 64, 7
  with pytest.raises(StudyError, match=r"data.shuffle_buffer \(1024 in a; 7 in b\) \| "
                     r"model.d_model \(32 in a; 64 in b\)"):
    study.check_factors({"a": a, "b": b})
  with pytest.raises(StudyError, match="same cell and seed"):
    study.check_factors({"a": a, "a_again": byte_config("tied")})


def _train_in_process(module_path):
  """A runner for run_study: lev-train's argv, trained in this process (no JAX start-up
  per run)."""
  from lev_jax.experiments import load_experiment
  from lev_jax.trainer import train_and_evaluate
  module = load_experiment(module_path)

  def run(argv):
    run_name = next(a for a in argv if a.startswith("--config=")).rsplit(":", 1)[1]
    workdir = next(a for a in argv if a.startswith("--workdir=")).split("=", 1)[1]
    train_and_evaluate(module.get_config(run_name), workdir)
    return 0
  return run


def test_driver_trains_evaluates_and_reports_means_and_intervals(tmp_path):
  path = _study_file(tmp_path)
  root = tmp_path / "root"
  analysis, paths, failed = study_cli.run_study(
      str(path), str(root), run=True, runner=_train_in_process(path))
  assert not failed and not analysis["missing"]
  ev = json.loads((root / "leviathan_s1" / "study_eval.json").read_text())
  assert ev["step"] == 4 and ev["eval_batches"] == 2
  assert ev["validation"]["log"]["loss"] != ev["test"]["log"]["loss"]  # distinct splits
  assert ev["test"]["equal_mass"]["bucket_scheme"] == "equal_mass"
  comp = analysis["comparisons"][0]
  assert comp["label"] == "leviathan V=259" and comp["baseline"] == "tied V=259"
  assert comp["seeds"] == [0, 1]
  test = comp["perplexity"]["test"]
  per_seed = [analysis["runs"][i]["test_ppl"] / analysis["runs"][i - 1]["test_ppl"] - 1
              for i in (1, 3)]  # RUNGS order: tied_s0, leviathan_s0, tied_s1, ...
  assert test["values"] == pytest.approx(per_seed)
  assert test["lo"] < test["mean"] < test["hi"]
  assert {r["range"] for r in comp["buckets"]["test"]["equal_mass"]["rows"]}
  report = (root / "report" / "report.md").read_text()
  assert "## Final table (test split)" in report
  cell = next(c for c in analysis["cells"] if c["variant"] == "leviathan")
  mean, se = cell["test"]["perplexity"]["mean"], cell["test"]["perplexity"]["se"]
  assert f"{mean:.2f} ± {se:.2f} (n=2)" in report
  assert f"{100 * test['mean']:+.1f} % [{100 * test['lo']:+.1f}, {100 * test['hi']:+.1f}]" in report
  rows = list(csv.DictReader(open(paths["csv"])))
  lev = next(r for r in rows if r["variant"] == "leviathan")
  assert float(lev["test_ppl_se"]) == pytest.approx(se)
  assert float(lev["test_change_lo"]) == pytest.approx(test["lo"])
  assert any(r["scheme"] == "equal_mass" and r["change_lo"]
             for r in csv.DictReader(open(paths["buckets_csv"])))
  for png in ("loss_vs_tokens", "freq_buckets"):
    assert open(paths[png], "rb").read(4) == b"\x89PNG"
  # A second call resumes: nothing is trained or evaluated again.
  again, _, _ = study_cli.run_study(str(path), str(root), run=True,
                                    runner=lambda argv: pytest.fail(f"retrained {argv}"),
                                    evaluate=lambda *a, **k: pytest.fail("re-evaluated"))
  assert again["comparisons"][0]["perplexity"]["test"] == test


@pytest.mark.parametrize("study_arg,root_is_file,message", [
    ("missing.py", False, "--study=.*missing.py: no such file"),
    (None, True, "--root=.*: is a file; expected a folder"),
])
def test_command_refuses_a_missing_study_or_a_file_root_before_any_run(
    tmp_path, study_arg, root_is_file, message):
  import subprocess  # noqa: PLC0415
  import sys  # noqa: PLC0415
  root = tmp_path / "root"
  if root_is_file:
    root.write_text("")
  study_file = tmp_path / (study_arg or "study.py")
  if study_arg is None:
    study_file.write_text("RUNGS = ('a',)\ndef get_config(run):\n  raise AssertionError\n")
  proc = subprocess.run(
      [sys.executable, "-m", "lev_jax.cli.study", f"--study={study_file}", f"--root={root}",
       "--run"], capture_output=True, text=True, timeout=120)
  assert proc.returncode == 2, proc.stderr[-2000:]
  assert re.search(message, proc.stderr), proc.stderr[-2000:]
  assert "Traceback" not in proc.stderr
  assert root_is_file == root.exists() and (not root_is_file or root.is_file())


def test_a_root_that_is_a_run_or_holds_a_ladder_report_is_refused(tmp_path):
  """Issue 26: `lev-study --root=runs/cb` (a training run, holding a ladder's report/)
  overwrote that ladder's report.md and analysis.json, two reports mixed."""
  (tmp_path / "cb" / "checkpoints").mkdir(parents=True)
  (tmp_path / "cb" / "eval.json").write_text("{}")
  assert study_cli.folders_error(str(tmp_path / "cb"), run=True, report_dir=None) == (
      f"--root={tmp_path / 'cb'}: is {tmp_path / 'cb'}, a training run's folder (only its "
      "lev-train writes there); expected another path")
  (tmp_path / "lad" / "report").mkdir(parents=True)
  (tmp_path / "lad" / "report" / "ladder.csv").write_text("")
  assert "report: holds a lev-ladder report (ladder.csv)" in study_cli.folders_error(
      str(tmp_path / "lad"), run=False, report_dir=None)
  assert study_cli.folders_error(str(tmp_path / "new"), run=True, report_dir=None) is None


def test_lev_only_options_do_not_relabel_a_model_without_lev():
  """A tied baseline stays "default" whatever LEV's learning-rate multiplier is set to,
  so it remains the baseline of every Leviathan cell; for LEV models the label names
  every option that differs from base_config's."""
  from lev_jax.ladder import study
  from lev_jax.config import base_config
  default = base_config().optim.lev_lr_multiplier
  for embedding, expect in (("tied", "default"),
                            ("lev", f"lev_lr_multiplier={default + 1.0}")):
    c = base_config()
    c.model.embedding = embedding
    c.optim.lev_lr_multiplier = default + 1.0
    assert study.cell_of(c)[2] == expect
  c = base_config()
  c.model.embedding = "tied"
  c.optim.clip_mode = "per_group"  # acts on every model: always in the label
  assert study.cell_of(c)[2] == "clip_mode=per_group"


def test_bucket_changes_of_seeds_evaluated_on_other_data_are_refused():
  """Issue 13.8's sibling: a seed pair whose study_eval.json record other data gets no
  per-bucket interval, and a reason naming both."""
  def evals(sha, ppl):
    log = {"bucket_edges": [10], "buckets": [
        {"range": r, "perplexity": p, "tokens": 5, "ids": 3}
        for r, p in (("[0,10)", ppl), ("[10,inf)", 2.0))]}
    data = {"split": "validation", "files": ["val.jsonl"], "sha256": sha,
            "tokens_evaluated": 66, "tokens_in_split": 660}
    return {"validation": {"log": log, "equal_mass": None, "data": data}}
  same = study._bucket_rows([evals("a" * 64, 10.0)], [evals("a" * 64, 5.0)],
                            "validation", "log")
  assert same["reason"] is None and same["rows"][0]["change"]["mean"] == pytest.approx(-0.5)
  other = study._bucket_rows([evals("a" * 64, 10.0)], [evals("b" * 64, 5.0)],
                             "validation", "log")
  assert other["rows"] == [] and other["reason"] == (
      "evaluated on other data: validation of val.jsonl, 66 tokens evaluated, sha256 "
      "aaaaaaaaaaaa vs validation of val.jsonl, 66 tokens evaluated, sha256 bbbbbbbbbbbb")


def test_final_table_keeps_a_variants_only_cell_whatever_its_options():
  """fidelity_study pins lev_lr_multiplier=1 at 2k and 8k (its only Leviathan cell there)
  and tries 1 and 3 (the default) at 32k: 2k and 8k keep their Leviathan row, 32k gets
  the one selected on validation."""
  def cell(variant, vocab, options, ppl):
    label = f"{variant} V={vocab}" + ("" if options == "default" else f" [{options}]")
    return {"label": label, "variant": variant, "vocab": vocab, "options": options,
            "seeds": [0, 1], "validation": {"perplexity": {"mean": ppl, "n": 2}}}
  lr1 = "lev_lr_multiplier=1.0"
  cells = [cell("tied", 2048, "default", 10.0), cell("leviathan", 2048, lr1, 9.0),
           cell("tied", 32768, "default", 20.0), cell("leviathan", 32768, lr1, 19.0),
           cell("leviathan", 32768, "default", 18.0)]
  runs = {(c["variant"], c["vocab"], c["options"]): {0: "a", 1: "b"} for c in cells}
  selection, final = study._select(cells, runs)
  assert final == ["tied V=2048", f"leviathan V=2048 [{lr1}]", "tied V=32768",
                   "leviathan V=32768"]
  assert [s["selected"] for s in selection] == ["leviathan V=32768"]
  cells[-1]["validation"]["perplexity"]["mean"] = 19.5  # now multiplier 1 wins at 32k
  assert study._select(cells, runs)[1][-1] == f"leviathan V=32768 [{lr1}]"
