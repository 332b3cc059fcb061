"""lev-study: the paired t-interval, the refusal of non-factor differences, and the driver
end to end on 2 tiny cells x 2 seeds (trained in this process, evaluated on validation
and test, reported)."""

import csv
import io
import json
import math
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from conftest import byte_config
from lev_jax.ladder import study
from lev_jax.cli import study as study_cli
from lev_jax.ladder.runs import LadderError
from lev_jax.ladder.study import StudyError
from lev_jax.workdir import file_sha256


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
  b.model.rope_theta, b.data.shuffle_buffer = 500.0, 7
  with pytest.raises(StudyError, match=r"data.shuffle_buffer \(1024 in a; 7 in b\) \| "
                     r"model.rope_theta \(10000.0 in a; 500.0 in b\)"):
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
  assert ev["run"] == "leviathan_s1" and ev["manifest_sha256"] == file_sha256(
      root / "leviathan_s1" / "checkpoints" / "4" / "checksums.json")  # N182
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
    tmp_path, monkeypatch, capsys, study_arg, root_is_file, message):
  """The command's flag parser and main in this process (a fresh FlagValues; a
  subprocess only repeated jax's imports): exit 2 with the line, no exception beyond
  it, ROOT not created. Its start-up as a process: test_cli_train's
  test_ctrl_c_in_a_command_is_one_line_and_exit_130[lev-study]."""
  import signal  # noqa: PLC0415
  import types  # noqa: PLC0415
  from absl import flags  # noqa: PLC0415
  from lev_jax.cli import common  # noqa: PLC0415
  root = tmp_path / "root"
  if root_is_file:
    root.write_text("")
  study_file = tmp_path / (study_arg or "study.py")
  if study_arg is None:
    study_file.write_text("from lev_jax.config import base_config\nRUNGS = ('a',)\n"
                          "def get_config(run):\n  return base_config()\n")
  fv = flags.FlagValues()
  study_cli._define_flags(fv)
  monkeypatch.setattr(study_cli, "flags", types.SimpleNamespace(FLAGS=fv))
  sigterm = signal.getsignal(signal.SIGTERM)  # main's terminate_as_interrupt sets it
  try:
    with pytest.raises(SystemExit) as e:
      study_cli.main(common.flags_parser("lev-study", None, fv)(
          ["lev-study", f"--study={study_file}", f"--root={root}", "--run"]))
  finally:
    signal.signal(signal.SIGTERM, sigterm)
  err = capsys.readouterr().err
  assert e.value.code == 2, err[-2000:]
  assert re.search(message, err) and err.startswith("lev-study: error: "), err[-2000:]
  assert root_is_file == root.exists() and (not root_is_file or root.is_file())


@pytest.mark.parametrize("spec,message", [
    ("IMPERR", "--study=IMPERR: failed to import: ModuleNotFoundError"),
    ("TXT", "--study=TXT: not a Python file (no .py suffix); expected a .py study file"),
    ("SCALE:nopiece", "--study=SCALE:nopiece: SCALE has no piece 'nopiece'; expected one of "
     "foldoc"),
    ("SCALE:", "--study=SCALE:: an empty piece name after ':'; expected one of foldoc"),
])
def test_a_study_that_does_not_load_is_refused_before_root_is_created(
    tmp_path, monkeypatch, capsys, spec, message):
  """Newcomer pass 4: `--run` created an empty ROOT before the study's one-line error;
  FILE.txt was an AttributeError traceback; FILE: (no piece) was "no such file"."""
  import types  # noqa: PLC0415
  from absl import flags  # noqa: PLC0415
  (tmp_path / "imperr.py").write_text("import no_such_module_xyz\n")
  (tmp_path / "study.txt").write_text("RUNGS = ('a',)\n")
  names = {"IMPERR": str(tmp_path / "imperr.py"), "TXT": str(tmp_path / "study.txt"),
           "SCALE": str(Path(study.__file__).parents[2] / "experiments" / "scale_study.py")}
  for key, value in names.items():
    spec, message = spec.replace(key, value), message.replace(key, value)
  fv = flags.FlagValues()
  study_cli._define_flags(fv)
  fv(["lev-study", f"--study={spec}", f"--root={tmp_path / 'root'}", "--run"])
  monkeypatch.setattr(study_cli, "flags", types.SimpleNamespace(FLAGS=fv))
  with pytest.raises(SystemExit) as e:
    study_cli.main(["lev-study"])
  err = capsys.readouterr().err
  assert e.value.code == 2 and err.startswith(f"lev-study: error: {message}"), err
  assert not (tmp_path / "root").exists()


def test_a_root_that_is_a_run_or_holds_a_ladder_report_is_refused(tmp_path):
  """Issue 26: `lev-study --root=runs/cb` (a training run, holding a ladder's report/)
  overwrote that ladder's report.md and analysis.json, two reports mixed."""
  (tmp_path / "cb" / "checkpoints").mkdir(parents=True)
  (tmp_path / "cb" / "eval.json").write_text("{}")
  assert study_cli.folders_error(str(tmp_path / "cb"), run=True, report_dir=None) == (
      f"--root={tmp_path / 'cb'}: is {tmp_path / 'cb'}, a training run's folder (only its "
      "lev-train writes there); expected another path")
  # newcomer pass 5: lev-prepare-data's output was "a training run's folder"
  (tmp_path / "prep" / "tokenizer").mkdir(parents=True)
  (tmp_path / "prep" / "token_counts.npy").touch()
  (tmp_path / "prep" / "dataset_info.json").write_text("{}")
  assert study_cli.folders_error(str(tmp_path / "new"), run=True,
                                 report_dir=str(tmp_path / "prep")) == (
      f"--report_dir={tmp_path / 'prep'}: is {tmp_path / 'prep'}, lev-prepare-data's output "
      "(prepared data; only lev-prepare-data writes there); expected another path")
  (tmp_path / "lad" / "report").mkdir(parents=True)
  (tmp_path / "lad" / "report" / "ladder.csv").write_text("")
  # newcomer pass 7: named --report_dir, which the user had not given
  assert study_cli.folders_error(str(tmp_path / "lad"), run=False, report_dir=None) == (
      f"--root={tmp_path / 'lad'}: its default report folder {tmp_path / 'lad' / 'report'}: "
      "holds a lev-ladder report (ladder.csv); expected an empty folder or this command's "
      "own report folder (give another --report_dir)")
  assert study_cli.folders_error(str(tmp_path / "new"), run=True, report_dir=None) is None
  # issue 26: a bad --root is named before a bad --report_dir (it was the other way)
  (tmp_path / "f").write_text("")
  assert study_cli.folders_error(str(tmp_path / "f" / "r"), run=True,
                                 report_dir=str(tmp_path / "f")).startswith(
      f"--root={tmp_path / 'f' / 'r'}: cannot write in {tmp_path / 'f'}")


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
    assert study.cell_of(c).options == expect
  c = base_config()
  c.model.embedding = "tied"
  c.optim.clip_mode = "per_group"  # acts on every model: always in the label
  assert study.cell_of(c).options == "clip_mode=per_group"


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
  for c in cells:
    c.update(size="d32-L2", corpus="python_docs")
  runs = {(c["variant"], c["vocab"], c["size"], c["corpus"], c["options"]): {0: "a", 1: "b"}
          for c in cells}
  selection, final = study._select(cells, runs)
  assert final == ["tied V=2048", f"leviathan V=2048 [{lr1}]", "tied V=32768",
                   "leviathan V=32768"]
  assert [s["selected"] for s in selection] == ["leviathan V=32768"]
  cells[-1]["validation"]["perplexity"]["mean"] = 19.5  # now multiplier 1 wins at 32k
  assert study._select(cells, runs)[1][-1] == f"leviathan V=32768 [{lr1}]"


def test_backbone_size_and_corpus_are_factors_and_nothing_else_is():
  """Issue 25.2: runs may differ in the backbone's shape and data.corpus (new cells);
  a LEV shape field still is refused, and so are two shapes under one size label."""
  a, b = byte_config("tied"), byte_config("lev")
  b.model.update(d_model=64, n_layers=3, n_heads=2, n_kv_heads=2, head_dim=32, d_ff=192)
  b.data.corpus = "foldoc"
  study.check_factors({"a": a, "b": b})
  assert study.cell_of(b) == ("leviathan", 259, "d64-L3", "foldoc", "default", 0)
  assert study.cell_of(a).cell == ("tied", 259, "d32-L1", "python_docs", "default")
  b.lev.d_seed = 16
  with pytest.raises(StudyError, match=r"lev.d_seed \(8 in a; 16 in b\)"):
    study.check_factors({"a": a, "b": b})
  c = byte_config("lev")
  c.model.d_ff = 96
  with pytest.raises(StudyError, match=r"share the size d32-L1.*model.d_ff \(64 in a; 96 in c\)"):
    study.check_factors({"a": a, "c": c})


def test_linear_fit_recovers_a_known_slope_with_its_t_interval():
  x = [5.0, 5.0, 6.0, 6.0, 7.0, 7.0]
  noise = [0.01, -0.01, -0.02, 0.02, 0.01, -0.01]
  fit = study.linear_fit(x, [0.3 - 0.1 * xi + e for xi, e in zip(x, noise)])
  assert fit["slope"] == pytest.approx(-0.1, abs=1e-9)  # the noise is symmetric per x
  assert fit["intercept"] == pytest.approx(0.3, abs=1e-8) and fit["df"] == 4
  # se = sqrt(SSE / (n - 2) / Sxx): SSE = 0.0012, Sxx = 4; t(0.975, 4) = 2.7764451
  se = math.sqrt(0.0012 / 4 / 4)
  assert fit["se"] == pytest.approx(se, rel=1e-6)
  assert fit["lo"] == pytest.approx(-0.1 - 2.7764451 * se, rel=1e-6)
  assert fit["hi"] == pytest.approx(-0.1 + 2.7764451 * se, rel=1e-6)
  two = study.linear_fit([1.0, 2.0], [0.0, 0.5])
  assert two["slope"] == pytest.approx(0.5) and two["lo"] is None
  assert study.linear_fit([3.0, 3.0], [0.1, 0.2])["reason"].startswith("fewer than 2")
  flat = study.linear_fit([1.0, 2.0, 3.0], [0.25, 0.25, 0.25])  # on a line: 0-wide interval
  assert flat["slope"] == 0.0 and flat["lo"] == flat["hi"] == 0.0


def _fake_study(ppl):
  """(LadderResult, factors, evals) of 3 variants x 2 sizes x 2 corpora x 2 seeds, no
  files: ppl(variant, size, corpus, seed) gives each run's perplexity (both splits)."""
  from lev_jax.ladder import runs
  backbone = {"d32-L2": 10_000, "d64-L4": 100_000}
  factors, rungs, evals = {}, [], {}
  for corpus in ("foldoc", "python_docs"):
    for size in backbone:
      for variant in ("tied", "untied", "leviathan"):
        for seed in (0, 1):
          run = f"{variant}_{size}_{corpus}_s{seed}"
          factors[run] = study.Factors(variant, 259, size, corpus, "default", seed)
          rungs.append(runs.Rung(
              variant=run, kind=variant, size=size, workdir=run, status="finished",
              reason=None, steps=4, step=4, tokens_per_step=8,
              params={"total": 1, "backbone": backbone[size]}, config_source="ladder",
              train_curve={"tokens": [], "loss": []}, eval_curve={"tokens": [], "loss": []},
              final={"loss": 1.0}))
          p = ppl(variant, size, corpus, seed)
          log = {"loss": math.log(p), "perplexity": p, "bucket_edges": [10], "buckets": [
              {"range": "[0,10)", "perplexity": p, "tokens": 5, "ids": 3}]}
          evals[run] = {split: {"log": log, "equal_mass": None} for split in study.SPLITS}
  return runs.LadderResult("fake.py", "root", rungs), factors, evals


def test_cells_of_a_size_and_corpus_pair_with_their_own_baselines_and_the_trend_fits():
  """Each Leviathan cell is compared with the tied and the untied cell of its own size
  and corpus, seed by seed; the trend's slope is the change per decade of backbone."""
  base = {"tied": 100.0, "untied": 80.0}
  lev_vs_untied = {("d32-L2", "foldoc"): 0.5, ("d64-L4", "foldoc"): 0.2,
                   ("d32-L2", "python_docs"): 0.1, ("d64-L4", "python_docs"): 0.1}

  def ppl(variant, size, corpus, seed):
    scale = (1 + seed) * (2 if corpus == "foldoc" else 1) * (1 if size == "d32-L2" else 0.5)
    if variant == "leviathan":
      return 80.0 * scale * (1 + lev_vs_untied[size, corpus] + 0.01 * seed)
    return base[variant] * scale
  analysis = study.analyse(*_fake_study(ppl))
  assert analysis["sizes"] == ["d32-L2", "d64-L4"]
  assert analysis["corpora"] == ["foldoc", "python_docs"]
  vs_untied = {c["label"]: c for c in analysis["comparisons_vs_untied"]}
  assert set(vs_untied) == {f"leviathan V=259 {s} {c}" for s, c in lev_vs_untied}
  comp = vs_untied["leviathan V=259 d64-L4 foldoc"]
  assert comp["baseline"] == "untied V=259 d64-L4 foldoc" and comp["seeds"] == [0, 1]
  assert comp["perplexity"]["test"]["values"] == pytest.approx([0.2, 0.21])
  vs_tied = {c["label"]: c for c in analysis["comparisons"]}
  assert vs_tied["untied V=259 d32-L2 python_docs"]["perplexity"]["test"]["values"] == (
      pytest.approx([-0.2, -0.2]))
  assert vs_tied["leviathan V=259 d32-L2 foldoc"]["baseline"] == "tied V=259 d32-L2 foldoc"
  trend = {(t["corpus"], t["variant"], t["baseline"]): t for t in analysis["trend"]}
  assert len(trend) == 6  # per corpus: untied vs tied, leviathan vs tied and vs untied
  fit = trend["foldoc", "leviathan", "untied"]["fit"]["test"]
  assert fit["slope"] == pytest.approx(-0.3) and fit["n"] == 4  # one decade: 0.5 -> 0.2
  assert fit["lo"] < -0.3 < fit["hi"]
  assert trend["python_docs", "leviathan", "untied"]["fit"]["test"]["slope"] == (
      pytest.approx(0.0, abs=1e-12))
  assert trend["foldoc", "untied", "tied"]["fit"]["validation"]["slope"] == (
      pytest.approx(0.0, abs=1e-12))


def test_a_piece_of_the_scale_study_runs_alone_with_its_own_report_folder():
  """experiments/scale_study.py:foldoc is its 36 foldoc runs (RUNGS order: seed 0 of
  every size first), 12 cells of 3 seeds; an unknown piece is one line naming them."""
  from lev_jax.experiments import experiments_dir
  path = experiments_dir() / "scale_study.py"
  module = study.load_study_module(f"{path}:foldoc")
  assert len(module.RUNGS) == 36 and module.RUNGS[:3] == (
      "tied_d128_foldoc_s0", "untied_d128_foldoc_s0", "leviathan_d128_foldoc_s0")
  configs = {run: module.get_config(run) for run in module.RUNGS}
  study.check_factors(configs)
  cells = {study.cell_of(c).cell for c in configs.values()}
  assert len(cells) == 12 and {c[3] for c in cells} == {"foldoc"}
  assert {c[2] for c in cells} == {"d128-L2", "d192-L3", "d256-L4", "d384-L6"}
  assert len(study.load_study_module(path).RUNGS) == 108
  assert study_cli.default_report_dir("r", f"{path}:foldoc") == Path("r/report_foldoc")
  assert study_cli.default_report_dir("r", str(path)) == Path("r/report")
  with pytest.raises(StudyError, match=r"has no piece 'folddoc'; expected one of foldoc, "
                     r"debian_books, python_docs"):
    study.load_study_module(f"{path}:folddoc")
  # issue 26: a file that is not a study was worded for lev-ladder ("ladder ... variant")
  with pytest.raises(LadderError, match=r"^--study=.*smoke.py: expected a module-level RUNGS "
                     r"tuple of run names"):
    study.load_study_module(str(experiments_dir() / "smoke.py"))


def test_a_negative_eval_batches_is_refused_when_parsed(capsys):
  """Issue 26: `lev-study --eval_batches=-1` was accepted (exit 0, an empty report)."""
  from absl import flags
  from lev_jax.cli import common
  fv = flags.FlagValues()
  study_cli._define_flags(fv)
  parse = common.flags_parser("lev-study", None, fv)
  assert fv["eval_batches"].value == 0 and parse(
      ["lev-study", "--study=s.py", "--root=r", "--eval_batches=0"]) == ["lev-study"]
  with pytest.raises(SystemExit) as e:
    parse(["lev-study", "--study=s.py", "--root=r", "--eval_batches=-1"])
  assert e.value.code == 2
  assert capsys.readouterr().err == (
      "lev-study: error: flag --eval_batches=-1: -1 is not a non-negative integer\n")


def test_issue25_ablation_options_are_factors_and_lev_shape_is_labelled_vs_the_study():
  """Issue 25.3: each ablation option is a factor; LEV's n_knots and rank are named
  against the value most of the study's Leviathan runs hold (the small studies' LEV is
  not base_config's), LEV-only options not at all for a tied run; LEV's d_seed and any
  other field are still refused."""
  changes = {"id": ("lev.id_permutation", True), "norm": ("lev.output_norm", "rmsnorm"),
             "warm": ("optim.lev_warmup_steps", 32), "wd": ("optim.lev_weight_decay", 0.0),
             "knots": ("lev.n_knots", 32), "rank": ("lev.rank", 32)}
  configs = {"tied": byte_config("tied"), "lev": byte_config("lev"),
             "lev_again": byte_config("lev")}
  configs["lev_again"].seed = 1
  configs["tied"].lev.rank = 32  # a model without LEV: not in its label
  for run, (field, value) in changes.items():
    c = configs[run] = byte_config("lev")
    section, key = field.split(".")
    c[section][key] = value
  study.check_factors(configs)
  labels = {run: f.options for run, f in study.cells_of(configs).items()}
  assert labels == {"tied": "default", "lev": "default", "lev_again": "default",
                    "id": "id_permutation=True", "norm": "output_norm=rmsnorm",
                    "warm": "lev_warmup_steps=32", "wd": "lev_weight_decay=0.0",
                    "knots": "n_knots=32", "rank": "rank=32"}
  configs["lev_again"].optim.lr = 1e-2
  with pytest.raises(StudyError, match=r"1 field\(s\) that are not factors: optim.lr"):
    study.check_factors(configs)


def _gap_study(ppl, metrics):
  """(LadderResult, factors, evals) of tied, untied, Leviathan and Leviathan [rank=32]
  at one size and corpus, seeds 0 and 1: ppl[cell][seed] on both splits, metrics[cell]
  each run's group_metrics."""
  from lev_jax.ladder import runs
  factors, rungs, evals = {}, [], {}
  for cell, per_seed in ppl.items():
    variant, _, options = cell.partition(":")
    for seed, p in enumerate(per_seed):
      run = f"{cell}_s{seed}"
      factors[run] = study.Factors(variant, 259, "d32-L2", "x", options or "default", seed)
      rungs.append(runs.Rung(
          variant=run, kind=variant, size="d32-L2", workdir=run, status="finished",
          reason=None, steps=4, step=4, tokens_per_step=8, params={"total": 1, "backbone": 1},
          config_source="ladder", train_curve={"tokens": [], "loss": []},
          eval_curve={"tokens": [], "loss": []}, final={"loss": 1.0},
          group_metrics=metrics.get(cell, {})))
      log = {"loss": math.log(p), "perplexity": p, "bucket_edges": [], "buckets": []}
      evals[run] = {split: {"log": log, "equal_mass": None} for split in study.SPLITS}
  return runs.LadderResult("fake.py", "root", rungs), factors, evals


def test_issue25_gap_closed_per_seed_with_its_interval_and_lev_dynamics_in_the_report():
  """(ppl_default - ppl_option) / (ppl_default - ppl_untied) per seed, t-interval over
  seeds; None with the reason where the default does not trail untied; LEV's last
  logged grad norm and update ratio per cell, mean over seeds."""
  from lev_jax.ladder import runs, study_report
  gap = study.gap_closed([120.0, 130.0, 125.0], [110.0, 110.0, 120.0], [100.0, 110.0, 100.0])
  assert gap["values"] == pytest.approx([0.5, 1.0, 0.2]) and gap["reason"] is None
  half = 4.3026527 * float(np.std([0.5, 1.0, 0.2], ddof=1)) / math.sqrt(3)
  assert (gap["lo"], gap["hi"]) == pytest.approx((1.7 / 3 - half, 1.7 / 3 + half), rel=1e-6)
  level = study.gap_closed([120.0, 99.0], [110.0, 98.0], [100.0, 100.0], seeds=[3, 4])
  assert level["mean"] is None and level["reason"] == (
      "the Leviathan default does not trail untied at seed 4 (99.00 vs 100.00): no gap "
      "to close")
  assert runs.last_values([{"step": 2, "train/grad_norm/lev": 0.5}, {"step": 1, "x": 1},
                           {"step": 2, "train/grad_norm/lev": "nan"}],
                          runs.GROUP_METRICS) == {"train/grad_norm/lev": 0.5}
  lev = {"train/grad_norm/lev": 0.25, "train/update_ratio/lev": 0.002}
  analysis = study.analyse(*_gap_study(
      {"tied": [150.0, 160.0], "untied": [100.0, 110.0], "leviathan": [120.0, 130.0],
       "leviathan:rank=32": [110.0, 125.0]}, {"leviathan:rank=32": lev}))
  comp = {c["label"]: c for c in analysis["comparisons_vs_untied"]}
  assert comp["leviathan V=259"]["gap_closed"] is None
  assert comp["leviathan V=259 [rank=32]"]["gap_closed"]["test"]["values"] == (
      pytest.approx([0.5, 0.25]))
  cell = next(c for c in analysis["cells"] if c["options"] == "rank=32")
  assert cell["group_metrics"]["train/update_ratio/lev"]["mean"] == 0.002
  text = "\n".join(study_report._gap_section(analysis))
  assert "| leviathan V=259 [rank=32] | 117.50 ± 7.50 (n=2) | +11.8 % " in text
  assert ("| +37.5 % [-121.3, +196.3] | +37.5 % [-121.3, +196.3] | 0.2500 ± 0.0000 (n=2) "
          "| 0.0020 ± 0.0000 (n=2) |") in text
  assert "| leviathan V=259 | 125.00 ± 5.00 (n=2) |  | reference | reference | n/a | n/a |" in text


def test_issue25_ablation_study_reuses_the_scale_studys_runs_and_changes_one_field_each():
  """experiments/ablation_study.py: its baselines are scale_study's runs, config for
  config (so runs/scale's finished runs are reused: lev-train refuses a finished run
  under other settings); each ablation is scale_study's Leviathan + its options; per
  corpus (a piece), seed 0 of every ablation before any seed 1; an unknown run is one
  line with the grammar."""
  from lev_jax.experiments import experiments_dir, load_experiment
  ablation = load_experiment(experiments_dir() / "ablation_study.py")
  scale = load_experiment(experiments_dir() / "scale_study.py")
  configs = {run: ablation.get_config(run) for run in ablation.RUNGS}
  study.check_factors(configs)
  assert len({f.cell for f in study.cells_of(configs).values()}) == 3 * 3 + 11 + 3 + 3
  assert list(ablation.PIECES) == [f"ablation_{c}" for c in ablation.CORPORA]
  for corpus in ablation.CORPORA:
    runs = ablation.PIECES[f"ablation_{corpus}"]
    seeds = [int(run.rsplit("_s", 1)[1]) for run in runs]
    assert seeds == sorted(seeds) and all(f"_d192_{corpus}_" in run for run in runs)
  assert len(ablation.PIECES["ablation_debian_books"]) == 42 and len(ablation.RUNGS) == 78
  for run, c in configs.items():
    kind, rest = run.split("_", 1)
    prefix, seed = rest.rsplit("_s", 1)
    corpus = next(x for x in ablation.CORPORA if prefix.startswith(f"d192_{x}"))
    if prefix == f"d192_{corpus}":  # <kind>_d192_<corpus>_s<seed>
      assert c.to_dict() == scale.get_config(run).to_dict()
      continue
    name = prefix.removeprefix(f"d192_{corpus}_")
    assert c.data.corpus == corpus and name in ablation.CORPUS_ABLATIONS[corpus]
    flat = study.flatten(c)
    base = study.flatten(scale.get_config(f"{kind}_d192_{corpus}_s{seed}"))
    changed = {f: flat[f] for f in flat if f != "name" and flat[f] != base[f]}
    assert changed == ablation.ABLATIONS[name] and set(changed) <= set(study.OPTION_FIELDS)
  with pytest.raises(ValueError, match=r"unknown run 'leviathan_d192_debian_books_rank_s0'"
                     r"; expected <kind>_d192_<corpus>_s<seed> .* with ablation in "
                     r"idperm, .*; seed in \(0, 1, 2\)$"):
    ablation.get_config("leviathan_d192_debian_books_rank_s0")
  with pytest.raises(ValueError, match=r"unknown run 'leviathan_d192_foldoc_idperm_s0'"):
    ablation.get_config("leviathan_d192_foldoc_idperm_s0")  # not run at foldoc


def _synthetic_study(tmp_path):
  """test_ladder_runs' synthetic ladder as a study (tied_a, leviathan_a: one cell each,
  seed 0), both runs finished with checkpoints and a study_eval.json whose figures agree
  (each split and scheme a write_rung eval.json); returns (study file, root)."""
  from test_ladder_runs import TIED_BUCKET_PPL, _eval_result, build_ladder
  ladder, root, _ = build_ladder(tmp_path, sizes={"a": 16}, downstream=False)
  for variant in ("tied_a", "leviathan_a"):
    final = json.loads((root / variant / "eval.json").read_text())
    r = _eval_result(final["loss"] + 0.01, final["step"], TIED_BUCKET_PPL)
    del r["step"]
    ev = {"step": final["step"], "eval_batches": 2,
          **{split: {"log": r, "equal_mass": r, "data": None} for split in study.SPLITS}}
    (root / variant / "study_eval.json").write_text(json.dumps(ev))
  return ladder, root


def _report_only(ladder, root, tmp_path):
  return study_cli.run_study(str(ladder), str(root), report_dir=str(tmp_path / "report"),
                             evaluate=lambda *a, **k: pytest.fail("evaluated"))


def test_an_edited_study_eval_json_makes_its_run_unreadable_never_summarised(tmp_path):
  """Newcomer pass 9: loss and perplexity of a study_eval.json edited to agree were
  reported (-41.1 %)."""
  ladder, root = _synthetic_study(tmp_path)
  analysis, _, failed = _report_only(ladder, root, tmp_path)
  assert not analysis["missing"] and not failed
  assert analysis["comparisons"][0]["perplexity"]["test"]["n"] == 1
  path = root / "leviathan_a" / "study_eval.json"
  ev = json.loads(path.read_text())
  mean = ev["test"]["log"]["loss"]
  ev["test"]["log"].update(loss=mean - 0.5, perplexity=math.exp(mean - 0.5))
  path.write_text(json.dumps(ev))
  analysis, _, failed = _report_only(ladder, root, tmp_path)
  assert not failed
  (missing,) = analysis["missing"]
  assert missing["run"] == "leviathan_a" and missing["status"] == "unreadable"
  assert missing["reason"] == (
      f"{path}: its test log loss {mean - 0.5} is not the token-weighted mean of its "
      f"buckets' losses ({mean:.10g}): the file was edited; expected lev-study's own "
      "evaluation (delete it and re-run lev-study to evaluate again)")
  comp = analysis["comparisons"][0]
  assert comp["reason"] and comp["perplexity"] == {}  # nothing summarised
  for edit, phrase in (
      (lambda e: e["validation"]["log"].update(perplexity=2.0),
       "its validation log perplexity 2.0 is not exp(loss)"),
      (_shift_equal_mass, "its test log and equal_mass results (one evaluation bucketed "
       "twice) differ: loss "),
      (lambda e: e.pop("test"), "no test results")):
    ev = _synthetic_ev(root)
    edit(ev)
    assert study.study_eval_problem(ev, ev["step"]).startswith(phrase)
  assert study.study_eval_problem(_synthetic_ev(root), 7) == (
      f"its step {_synthetic_ev(root)['step']} is not the run's final step 7")
  assert study.study_eval_problem([1], 7) == "not a JSON object"


def test_a_run_s_file_replaced_by_a_folder_makes_it_unreadable(tmp_path):
  """Newcomer pass 11: a run's study_eval.json, eval.json or metrics.jsonl replaced by a
  folder was an IsADirectoryError traceback in lev-study and lev-ladder."""
  ladder, root = _synthetic_study(tmp_path)
  for name in ("study_eval.json", "eval.json", "metrics.jsonl"):
    path = root / "leviathan_a" / name
    shutil.move(path, tmp_path / "aside")
    path.mkdir()
    analysis, _, failed = _report_only(ladder, root, tmp_path)
    (missing,) = analysis["missing"]
    assert not failed and missing["status"] == "unreadable", missing
    assert missing["reason"].startswith(f"{path}: is a folder; expected "), missing
    path.rmdir()
    shutil.move(tmp_path / "aside", path)


def test_another_run_s_study_eval_json_copied_in_makes_its_run_unreadable(tmp_path, capsys):
  """Newcomer pass 13 (N182): tied_s1's study_eval.json copied over tied_s0's was read as
  tied_s0's (two seeds became one counted twice): nothing in the file tied it to its
  run. It records its run and the sha256 of the evaluated step's checksums.json now."""
  from lev_jax.checkpoint_checks import write_manifest
  from test_ladder_runs import STEPS
  ladder, root = _synthetic_study(tmp_path)
  for variant in ("tied_a", "leviathan_a"):  # as evaluate_run writes them now
    write_manifest(root / variant / "checkpoints" / str(STEPS))
    path = root / variant / "study_eval.json"
    ev = json.loads(path.read_text())
    ev.update(study.study_eval_identity(root / variant, ev["step"]))
    path.write_text(json.dumps(ev))
  assert ev["run"] == "leviathan_a" and len(ev["manifest_sha256"]) == 64
  analysis, _, failed = _report_only(ladder, root, tmp_path)
  assert not analysis["missing"] and not failed
  path = root / "leviathan_a" / "study_eval.json"
  own = path.read_text()
  shutil.copy(root / "tied_a" / "study_eval.json", path)
  tail = ("; expected lev-study's own evaluation of this run's checkpoint (delete it and "
          "re-run lev-study to evaluate again)")
  analysis, _, failed = _report_only(ladder, root, tmp_path)
  assert not failed and analysis["missing"] == [{
      "run": "leviathan_a", "status": "unreadable",
      "reason": f"{path}: it belongs to another run: it records run 'tied_a', not "
                f"leviathan_a{tail}"}]
  assert analysis["comparisons"][0]["perplexity"] == {}  # nothing summarised
  # newcomer pass 15 (E09): the same digest in upper case is the same checkpoint's
  upper = json.loads(own)
  upper["manifest_sha256"] = upper["manifest_sha256"].upper()
  assert study.study_eval_owner_problem(upper, root / "leviathan_a") is None
  path.write_text(own)  # its own file, but the run trained again: another checkpoint
  step_dir = root / "leviathan_a" / "checkpoints" / str(STEPS)
  recorded = json.loads(own)["manifest_sha256"]
  (step_dir / "state").mkdir()
  (step_dir / "state" / "params").write_bytes(b"retrained")
  write_manifest(step_dir)
  now = study.study_eval_identity(root / "leviathan_a", STEPS)["manifest_sha256"]
  (missing,) = _report_only(ladder, root, tmp_path)[0]["missing"]
  assert missing["status"] == "unreadable" and missing["reason"] == (
      f"{path}: it belongs to another checkpoint: it records checksums.json sha256 "
      f"{recorded[:16]}..., but this run's {step_dir / 'checksums.json'} has sha256 "
      f"{now[:16]}... (the run trained again, or its checkpoints replaced){tail}")
  (step_dir / "checksums.json").unlink()
  (missing,) = _report_only(ladder, root, tmp_path)[0]["missing"]
  assert missing["reason"].endswith(f"but this run's {step_dir / 'checksums.json'} is "
                                    f"absent (the run trained again, or its checkpoints "
                                    f"replaced){tail}")
  ev = json.loads(own)
  # newcomer pass 14 (S06): its run kept, its checksum deleted: not "trained again"
  del ev["manifest_sha256"]
  path.write_text(json.dumps(ev))
  (missing,) = _report_only(ladder, root, tmp_path)[0]["missing"]
  assert missing["reason"] == (f"{path}: it records its run but no manifest_sha256 "
                               f"(lev-study writes both: the file was edited){tail}")
  # A file written before lev-study recorded its run is read as before (unchecked).
  del ev["run"]
  path.write_text(json.dumps(ev))
  capsys.readouterr()
  analysis, _, failed = _report_only(ladder, root, tmp_path)
  assert not analysis["missing"] and not failed
  assert (f"lev-study: leviathan_a: {path} records no run (written before lev-study "
          "recorded which checkpoint it evaluated): read unchecked") in capsys.readouterr().out


def test_another_eval_batches_says_which_evaluation_it_replaces(tmp_path):
  """Newcomer pass 13 (N371): a report-only lev-study with another --eval_batches
  replaced every run's study_eval.json without a word saying so."""
  from test_ladder_runs import STEPS
  ladder, root = _synthetic_study(tmp_path)
  batches = json.loads((root / "tied_a" / "study_eval.json").read_text())["eval_batches"]
  out = io.StringIO()
  def evaluate(workdir, eval_batches):
    raise ValueError("stop here")  # the line before the evaluation is what is checked
  study_cli.run_study(str(ladder), str(root), report_dir=str(tmp_path / "report"),
                      eval_batches=batches + 1, evaluate=evaluate, out=out)
  assert (f"lev-study: tied_a: evaluating validation and test (replacing its "
          f"study_eval.json of step {STEPS}, eval_batches {batches})") in out.getvalue()


def test_a_study_eval_json_that_cannot_be_written_is_one_line(tmp_path):
  """Newcomer pass 16 (O10): on a read-only study root (with --report_dir elsewhere) a
  run was evaluated, then writing its study_eval.json ended in an OSError traceback."""
  ladder, root = _synthetic_study(tmp_path)
  (root / "tied_a" / "study_eval.json").unlink()
  out = io.StringIO()
  def evaluate(workdir, eval_batches):
    raise OSError(30, "Read-only file system", str(root / "tied_a" / ".study_eval.json.tmp"))
  _, _, failed = study_cli.run_study(str(ladder), str(root), evaluate=evaluate, out=out,
                                     report_dir=str(tmp_path / "report"))
  line = (f"{root / 'tied_a' / '.study_eval.json.tmp'}: cannot be written (Read-only file "
          "system); lev-study stores each run's evaluation in the run's folder: copy the "
          "study root to a writable place")
  assert failed == {"tied_a": f"evaluation failed: {line}"}
  assert f"lev-study: tied_a: evaluation failed: {line}" in out.getvalue()


def _shift_equal_mass(ev):
  """Every loss of the test split's equal_mass result 0.1 higher, each perplexity its
  exp: consistent in itself, no longer the log scheme's evaluation."""
  shifted = json.loads(json.dumps(ev["test"]["log"]))
  for r in (shifted, *[b for b in shifted["buckets"] if b["loss"] is not None]):
    r.update(loss=r["loss"] + 0.1, perplexity=math.exp(r["loss"] + 0.1))
  ev["test"]["equal_mass"] = shifted


def _synthetic_ev(root):
  return json.loads((root / "tied_a" / "study_eval.json").read_text())


def test_a_run_without_its_checkpoints_says_so_and_is_not_evaluated(tmp_path):
  """Newcomer pass 9: with checkpoints/ and study_eval.json deleted, lev-study said
  "finished; not evaluated; evaluation failed: ... no checkpoints/; it is still starting
  or compiling"."""
  import shutil
  ladder, root = _synthetic_study(tmp_path)
  shutil.rmtree(root / "tied_a" / "checkpoints")
  (root / "tied_a" / "study_eval.json").unlink()
  analysis, paths, failed = _report_only(ladder, root, tmp_path)
  assert not failed
  (missing,) = analysis["missing"]
  assert missing["status"] == "unverified" and missing["reason"] == (
      f"{root / 'tied_a' / 'checkpoints'}: missing, so the config it was trained with "
      f"cannot be checked against the study's tied_a: left out; move {root / 'tied_a'} "
      "aside and train the run there")
  assert f"  missing tied_a: {missing['reason']}" in study_cli.summary(analysis, paths)


def test_a_ladder_file_given_as_a_study_is_refused_naming_lev_ladder():
  """Newcomer pass 14 (H02): experiments/smoke_ladder.py given to lev-study was taken as
  a study of one run per cell (each rung evaluated as a study run, no intervals); a
  study of one seed at one size is still a study."""
  ladder = Path(__file__).resolve().parent.parent / "experiments" / "smoke_ladder.py"
  with pytest.raises(LadderError, match="^" + re.escape(
      f"--study={ladder}: its runs are a ladder's rungs (tied_SIZE and leviathan_SIZE at ")
      + r"\d+ sizes, one run each: no seeds to average\); a ladder file\? use lev-ladder "
      + re.escape(f"--ladder={ladder}") + "$"):
    study_cli.load_study(str(ladder))
  from lev_jax.ladder import runs
  cells = {"tied_s0": study.Factors("tied", 8, "d8-L1", "", "", 0),
           "leviathan_s0": study.Factors("leviathan", 8, "d8-L1", "", "", 0)}
  study_cli._check_not_a_ladder("s.py", tuple(cells), cells)  # one size: a study
  assert runs.partner_of("tied_s0") == "leviathan_s0"


def test_train_flags_that_make_two_seeds_one_run_are_refused(tmp_path):
  """Newcomer pass 15 (S20): --train_flags="--config.seed=0" trained every seed of a
  cell as the same run, reported as n = 2 with an interval; the same collision written
  in the study file is refused (check_factors), and now under --train_flags too."""
  smoke = Path(__file__).resolve().parent.parent / "experiments" / "smoke_study.py"
  with pytest.raises(StudyError, match="^" + re.escape(
      "--train_flags=--config.seed=0: runs tied_s0 and tied_s1 are the same cell and seed")):
    study_cli.run_study(str(smoke), str(tmp_path / "root"), train_flags=["--config.seed=0"],
                        evaluate=lambda *a, **k: pytest.fail("evaluated"))
  assert not (tmp_path / "root").exists()
