"""lev-ladder's collection (lev_jax/ladder/runs.py) on synthetic workdirs with known curves,
and the builders of those workdirs (test_ladder_analysis.py and test_ladder_report.py use
them).

No training: each rung's metrics.jsonl / eval.json is written from closed-form curves,
    eval loss(tokens) = c_N + B * (s * tokens)^-beta,   s = 1 (tied), 2.1 (Leviathan)
with c_N chosen so that the tied final losses lie exactly on L(N) = E + A N^-alpha over
the rungs' real parameter counts. The analysis must give back 2.1 and (E, A, alpha).
"""

import json
import math
import os
import re
import shutil
import subprocess
import sys
from io import StringIO
from pathlib import Path

import pytest

from lev_jax.ladder import runs as ladder_lib
from lev_jax.ladder.analysis import analyse
from lev_jax.ladder.runs import LadderError, collect, load_ladder
from lev_jax.cli import common, ladder as ladder_cli

REPO = Path(__file__).resolve().parent.parent
E, A, ALPHA = 1.5, 40.0, 0.3     # the tied rungs' power law in N
B, BETA = 20.0, 0.3              # every rung's loss-vs-tokens curve
SHIFT = 2.1                      # Leviathan = tied at 2.1x the tokens
STEPS, EVAL_EVERY, LOG_EVERY = 100, 2, 10
TOKENS_PER_STEP = 4 * 16         # global_batch_size * seq_len of the ladder below
EDGES = [1, 10, 100]
TIED_BUCKET_PPL = [None, 400.0, 100.0, 20.0]
LEV_BUCKET_PPL = [None, 200.0, 95.0, 20.0]

LADDER_SOURCE = '''
from lev_jax.config import base_config

SIZES = {sizes!r}
RUNGS = tuple(f"{{kind}}_{{size}}" for size in SIZES for kind in ("tied", "leviathan"))

def get_config(variant):
  kind, _, size = variant.partition("_")
  if kind not in ("tied", "leviathan") or size not in SIZES:
    raise ValueError(f"unknown variant {{variant!r}}")
  c = base_config()
  c.name = variant
  c.model.embedding = {{"tied": "tied", "leviathan": "lev"}}[kind]
  c.model.vocab_size = 300
  c.model.d_model = SIZES[size]
  c.model.n_layers = 1
  c.model.n_heads = 2
  c.model.n_kv_heads = 2
  c.model.head_dim = 8
  c.model.d_ff = 2 * SIZES[size]
  c.lev.d_seed = 8
  c.lev.n_heads = 2
  c.lev.n_knots = 6
  c.lev.rank = 4
  c.train.steps = {steps}
  c.train.seq_len = 16
  c.train.global_batch_size = 4
  c.optim.warmup_steps = 2
  return c
'''

SIZES4 = {"a": 16, "b": 32, "c": 48, "d": 64}


def write_ladder(path: Path, sizes=None, steps=STEPS) -> Path:
  path.write_text(LADDER_SOURCE.format(sizes=sizes or SIZES4, steps=steps))
  return path


def rung_config(variant: str, steps: int = STEPS):
  """get_config(variant) of write_ladder's ladder (SIZES4 holds every size the tests use)."""
  namespace = {}
  exec(LADDER_SOURCE.format(sizes=SIZES4, steps=steps), namespace)  # pylint: disable=exec-used
  return namespace["get_config"](variant)


def tied_final_loss(n_params) -> float:
  return E + A * n_params ** -ALPHA


def _eval_result(loss: float, step: int, bucket_ppl) -> dict:
  """An evaluate() result whose figures agree as lev_jax/eval/evaluate.py's do: the
  buckets' perplexities are `bucket_ppl` times one factor that makes `loss` the
  token-weighted mean of their losses (a bucket's change between twins is then its
  ratio in `bucket_ppl` times the twins' common factor ratio)."""
  labels = ["[0,1)", "[1,10)", "[10,100)", "[100,inf)"]
  tokens = [0 if p is None else 100 * (i + 1) for i, p in enumerate(bucket_ppl)]
  mean = sum(t * math.log(p) for t, p in zip(tokens, bucket_ppl) if p) / sum(tokens)
  buckets = [{"range": r, "tokens": t, "ids": 10,
              "loss": None if p is None else math.log(p) + loss - mean,
              "perplexity": None if p is None else math.exp(math.log(p) + loss - mean)}
             for r, t, p in zip(labels, tokens, bucket_ppl)]
  return {"loss": loss, "perplexity": math.exp(loss), "tokens": sum(tokens),
          "buckets": buckets, "bucket_edges": EDGES, "step": step}


def write_rung(root: Path, variant: str, c_n: float, *, shift: float = 1.0,
               last_step: int = STEPS, bucket_ppl=TIED_BUCKET_PPL, lev_eval=None,
               resume_at: int | None = None, checkpoint: bool = True) -> dict:
  """A workdir as lev-train leaves it (metrics.jsonl, eval.json and, with checkpoint,
  the config stored with its checkpoint at last_step: checkpoints/<step>/config/metadata,
  the ladder's); returns the eval curve.

  resume_at: rows of steps resume_at..resume_at+10 are written twice, the first copy
  with a wrong loss (+1), as a resumed run re-logs them: the later row must win.
  """
  wd = root / variant
  wd.mkdir(parents=True)
  loss_at = lambda step: c_n + B * (shift * step * TOKENS_PER_STEP) ** -BETA
  rows = []
  for step in range(1, last_step + 1):
    if step % LOG_EVERY == 0:
      # Train loss above eval loss by an offset that differs between the twins: the
      # token efficiency must come from the eval curves, not these.
      rows.append({"step": step, "time": 0.0, "train/loss": loss_at(step) + 0.1 * shift,
                   "train/tokens_seen": float(step * TOKENS_PER_STEP)})
    if step % EVAL_EVERY == 0:
      rows.append({"step": step, "time": 0.0, "eval/loss": loss_at(step),
                   "eval/perplexity": math.exp(loss_at(step))})
  if resume_at is not None:
    stale = [dict(r) for r in rows if resume_at <= r["step"] <= resume_at + 10]
    for r in stale:
      for k in ("train/loss", "eval/loss"):
        if k in r:
          r[k] += 1.0
    i = next(i for i, r in enumerate(rows) if r["step"] >= resume_at)
    rows[i:i] = stale
  (wd / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
  final_step = last_step - last_step % EVAL_EVERY
  (wd / "eval.json").write_text(json.dumps(_eval_result(loss_at(final_step), final_step,
                                                        bucket_ppl)))
  if lev_eval is not None:
    (wd / "lev_eval.json").write_text(json.dumps(lev_eval))
  if checkpoint:
    meta = wd / "checkpoints" / str(last_step) / "config" / "metadata"
    meta.parent.mkdir(parents=True)
    meta.write_text(json.dumps(rung_config(variant).to_dict()))
  return {"tokens": [s * TOKENS_PER_STEP for s in range(EVAL_EVERY, last_step + 1, EVAL_EVERY)],
          "loss": [loss_at(s) for s in range(EVAL_EVERY, last_step + 1, EVAL_EVERY)]}


def params_of(ladder_path: Path) -> dict:
  module = load_ladder(ladder_path)
  return {v: ladder_lib._param_counts(module.get_config(v))["total"] for v in module.RUNGS}


def build_ladder(tmp_path: Path, sizes=None, skip=(), unfinished=(), no_metrics=(),
                 downstream=True) -> tuple[Path, Path, dict]:
  """A ladder file and ROOT with a workdir per rung; returns (ladder, root, params)."""
  sizes = sizes or SIZES4
  ladder = write_ladder(tmp_path / "synthetic_ladder.py", sizes)
  root = tmp_path / "root"
  root.mkdir()
  params = params_of(ladder)
  t_final = STEPS * TOKENS_PER_STEP
  for size in sizes:
    # c_N: the tied curve ends exactly on the power law at N = the tied rung's params.
    c_n = tied_final_loss(params[f"tied_{size}"]) - B * t_final ** -BETA
    for kind, shift, ppl in (("tied", 1.0, TIED_BUCKET_PPL), ("leviathan", SHIFT, LEV_BUCKET_PPL)):
      variant = f"{kind}_{size}"
      if variant in skip:
        continue
      if variant in no_metrics:
        (root / variant).mkdir()
        continue
      lev_eval = None
      if downstream and size == "a":
        acc = 0.60 if kind == "tied" else 0.64
        lev_eval = {"step": STEPS, "validation": {},
                    "downstream": {"piqa": {"acc": acc, "acc_stderr": 0.011, "acc_norm": acc + 0.01,
                                            "acc_norm_stderr": 0.011, "n": 1838}}}
      write_rung(root, variant, c_n, shift=shift, bucket_ppl=ppl, lev_eval=lev_eval,
                 last_step=40 if variant in unfinished else STEPS,
                 resume_at=30 if variant == "tied_b" else None)
  return ladder, root, params


def test_a_finished_rung_without_its_metrics_says_so_and_how_to_get_them_back(tmp_path):
  """Newcomer pass 16 (J21): a finished rung whose metrics.jsonl was deleted was "never
  started?" though it holds its checkpoints and eval.json."""
  ladder = write_ladder(tmp_path / "l.py", {"a": 16})
  root = tmp_path / "root"
  write_rung(root, "tied_a", 2.0)
  (root / "tied_a" / "metrics.jsonl").unlink()
  rung = collect(ladder, root, {}).rung("tied_a")
  assert rung.status != "finished" and rung.reason == (
      f"no metrics: {root / 'tied_a' / 'metrics.jsonl'} is missing although the rung "
      f"holds {root / 'tied_a' / 'checkpoints' / str(STEPS)} (deleted?); re-run lev-train "
      f"on --workdir={root / 'tied_a'} with the rung's config to write its evaluation again")
  (tmp_path / "b").mkdir()
  ladder, root, _ = build_ladder(tmp_path / "b", no_metrics=("tied_a",))
  assert collect(ladder, root, {}).rung("tied_a").reason.endswith("(never started?)")


def test_stored_checkpoint_config_decides_steps_and_tokens(tmp_path):
  """A rung trained with --config.train.steps=40: the checkpoint's config says so."""
  ladder = write_ladder(tmp_path / "l.py", {"a": 16})
  root = tmp_path / "root"
  write_rung(root, "tied_a", 2.0, last_step=40)
  stored = load_ladder(ladder).get_config("tied_a")
  stored.train.steps = 40
  meta = root / "tied_a" / "checkpoints" / "40" / "config" / "metadata"
  meta.write_text(json.dumps(stored.to_dict()))
  (root / "tied_a" / "checkpoints" / "40.orbax-checkpoint-tmp-1").mkdir()  # ignored
  expected = load_ladder(ladder).get_config("tied_a")
  expected.train.steps = 40  # what lev-ladder --train_flags=--config.train.steps=40 gives
  rung = collect(ladder, root, {"tied_a": expected}).rung("tied_a")
  assert rung.status == "finished" and rung.steps == 40 and rung.config_source == "checkpoint"
  assert rung.eval_curve["tokens"][-1] == 40 * TOKENS_PER_STEP
  # newcomer pass 7: without those --train_flags the 40-step run was "finished" as the
  # ladder's STEPS-step rung; other eval settings were not noticed either
  rung = collect(ladder, root).rung("tied_a")
  assert rung.status == "other config" and rung.reason == (
      f"{root / 'tied_a'} was trained with other settings than the ladder's tied_a "
      f"(train.steps: checkpoint 40, ladder {STEPS}): left out; if --train_flags made "
      "them, give the same --train_flags here; else move it aside and train the rung there")
  stored.eval.batches += 1
  meta.write_text(json.dumps(stored.to_dict()))
  reason = collect(ladder, root).rung("tied_a").reason
  assert "train.steps: checkpoint 40, ladder" in reason and "eval.batches: checkpoint" in reason
  stored.eval.batches -= 1
  # newcomer pass 6: another model's run copied in was summarised as the rung
  stored.model.d_model = 48
  meta.write_text(json.dumps(stored.to_dict()))
  rung = collect(ladder, root, {"tied_a": expected}).rung("tied_a")
  assert rung.status == "other config" and rung.reason == (
      f"{root / 'tied_a'} holds a model of another shape than the ladder's tied_a "
      f"(model.d_model: checkpoint 48, ladder {load_ladder(ladder).get_config('tied_a').model.d_model}"
      "): left out; move it aside and train the rung there")
  # newcomer pass 13: --run (lev-ladder's and lev-study's) refuses before training
  # anything: lev-train would refuse the rung, and the report would lose it
  result = collect(ladder, root, {"tied_a": expected})
  assert "tied_a" not in ladder_cli.trainable(result)
  with pytest.raises(ValueError, match=re.escape(
      f"--run: {root / 'tied_a'} holds a model of another shape than the ladder's tied_a "
      "(model.d_model: checkpoint 48, ladder ") + ".*Nothing was run or written \\(without "
      "--run, lev-ladder only reports\\)$"):
    ladder_cli.check_runnable(result)
  # newcomer pass 14: a report-only run given contradicting --train_flags replaced the
  # finished ladder's report with one leaving every rung out
  with pytest.raises(ValueError, match="^--train_flags: .*Nothing was run or written "
                     r"\(without --train_flags, lev-ladder reports the rungs as they were "
                     r"trained\)$"):
    ladder_cli.check_runnable(result, flag="--train_flags")
  # newcomer pass 8: lev-study's lines spoke of "the ladder's" run and "the rung"
  reason = collect(ladder, root, {"tied_a": expected}, owner="study").rung("tied_a").reason
  assert "another shape than the study's tied_a (model.d_model: checkpoint 48, study " in reason
  assert reason.endswith("left out; move it aside and train the run there"), reason


def test_a_broken_metrics_line_is_reported_with_file_and_line(tmp_path):
  ladder = write_ladder(tmp_path / "l.py", {"a": 16})
  root = tmp_path / "root"
  write_rung(root, "tied_a", 2.0)
  path = root / "tied_a" / "metrics.jsonl"
  lines = path.read_text().splitlines()
  lines[2] = '{"step": "unterminated'
  lines.append(json.dumps({"step": STEPS, "eval/loss": "nan"}))  # non-finite: left out
  path.write_text("\n".join(lines) + "\n")
  rung = collect(ladder, root).rung("tied_a")
  assert rung.status == "unreadable"  # issue 13.9a's sibling: the column, not a bare "at"
  assert rung.reason == f"{path}:3: not JSON (Unterminated string starting at: column 10)"
  lines[2] = json.dumps({"step": 1, "train/loss": 9.0})
  path.write_text("\n".join(lines) + "\n")
  rung = collect(ladder, root).rung("tied_a")
  assert rung.status == "finished"
  assert any("1 non-finite eval/loss" in n for n in rung.notes)
  assert math.isfinite(rung.eval_curve["loss"][-1])


def test_an_eval_json_whose_perplexity_is_not_exp_of_its_loss_is_unreadable(tmp_path):
  # newcomer pass 7: an edited perplexity (1789.5 -> 1189.5) was reported as the rung's
  ladder = write_ladder(tmp_path / "l.py", {"a": 16})
  root = tmp_path / "root"
  write_rung(root, "tied_a", 2.0)
  path = root / "tied_a" / "eval.json"
  result = json.loads(path.read_text())
  result["perplexity"] = round(result["perplexity"] * 0.66, 2)
  path.write_text(json.dumps(result))
  rung = collect(ladder, root).rung("tied_a")
  assert rung.status == "unreadable" and rung.reason.startswith(
      f"{path}: perplexity {result['perplexity']} is not exp(loss) = ")
  assert rung.reason.endswith(": the file was edited; expected lev-train's own result "
                              "(delete it and re-run lev-train on the run to evaluate again)")


def test_an_eval_json_edited_consistently_is_unreadable(tmp_path):
  """Newcomer pass 8: loss and perplexity both edited (perplexity = exp(loss)) were
  reported (-99.7 %); metrics.jsonl's row of the same evaluation tells."""
  ladder = write_ladder(tmp_path / "l.py", {"a": 16})
  root = tmp_path / "root"
  write_rung(root, "tied_a", 2.0)
  path = root / "tied_a" / "eval.json"
  result = json.loads(path.read_text())
  recorded = result["loss"]
  result.update(loss=1.6, perplexity=math.exp(1.6))
  path.write_text(json.dumps(result))
  rung = collect(ladder, root).rung("tied_a")
  assert rung.status == "unreadable"
  assert rung.reason == (
      f"{path}: its loss 1.6 differs from the step-{result['step']} evaluation in "
      f"metrics.jsonl ({recorded}): one of the two files was edited or replaced (from "
      "another run?); expected lev-train's own pair (put back the one that changed; a "
      "re-run of lev-train evaluates again into eval.json but keeps metrics.jsonl's rows)")


@pytest.mark.parametrize("source,match", [
    (None, "no such file"),
    ("def get_config(v):\n  return None\n", "expected a module-level RUNGS tuple"),
    ("RUNGS = ('tied_a', 'tied_a')\ndef get_config(v):\n  return None\n", "twice"),
    ("RUNGS = ('tied_a',)\n", "no get_config"),
    # Newcomer pass 10 (N38): rungs of these names trained into the root's report and
    # compilation-cache folders.
    ("RUNGS = ('tied_a', 'report')\ndef get_config(v):\n  return None\n",
     r"RUNGS names a variant 'report': the root's report folder \(report and "
     r"report_PIECE are reserved"),
    ("RUNGS = ('report_x',)\ndef get_config(v):\n  return None\n", "'report_x': the root's report"),
    ("RUNGS = ('jax_cache',)\ndef get_config(v):\n  return None\n",
     "'jax_cache': the root's shared compilation cache folder"),
    ("RUNGS = ('a/b',)\ndef get_config(v):\n  return None\n", "'a/b': not one plain folder"),
    ("RUNGS = ('..',)\ndef get_config(v):\n  return None\n", "'..': not one plain folder"),
    ("RUNGS = ('~',)\ndef get_config(v):\n  return None\n", "'~': not one plain folder"),
    ("import no_such_module_xyz\n", "failed to import: ModuleNotFoundError"),
])
def test_bad_ladder_files_are_named(tmp_path, source, match):
  path = tmp_path / "bad.py"
  if source is not None:
    path.write_text(source)
  with pytest.raises(LadderError, match=match):
    load_ladder(path)


def test_a_ladder_file_without_the_py_suffix_is_one_line_naming_the_flag(tmp_path):
  """Newcomer pass 4: --ladder=smoke_copy.txt was an AttributeError traceback."""
  txt = tmp_path / "smoke_copy.txt"
  txt.write_text((REPO / "experiments" / "smoke_ladder.py").read_text())
  with pytest.raises(LadderError, match=rf"^--ladder={txt}: not a Python file \(no .py "
                     r"suffix\); expected a .py experiment file with RUNGS"):
    ladder_cli.load_inputs(str(txt), str(tmp_path), run=False, report_dir=None)


def test_a_rung_without_its_partner_is_refused(tmp_path):
  """Newcomer pass 14 (R02): RUNGS = ("tied_xs", "leviathan_s") reported "2 of 2 rungs
  finished" over a table that compares nothing."""
  path = tmp_path / "r02.py"
  path.write_text("RUNGS = ('tied_xs', 'leviathan_s')\ndef get_config(v):\n  return None\n")
  with pytest.raises(LadderError, match="^" + re.escape(
      f"--ladder={path}: RUNGS has tied_xs without leviathan_xs and leviathan_s without "
      "tied_s: a ladder compares tied_SIZE with leviathan_SIZE at each size, so each "
      "needs its partner") + "$"):
    collect(path, tmp_path)


def test_get_config_failure_names_the_variant(tmp_path):
  path = tmp_path / "bad.py"
  path.write_text("RUNGS = ('tied_a', 'leviathan_a')\ndef get_config(v):\n"
                  "  raise ValueError('nope')\n")
  with pytest.raises(LadderError, match=r"get_config\('tied_a'\) failed: ValueError: nope"):
    collect(path, tmp_path)


def test_repo_ladders_have_rungs_that_build():
  for name in ("ladder.py", "smoke_ladder.py"):
    module = load_ladder(REPO / "experiments" / name)
    assert len(module.RUNGS) == 8
    assert sum(v.startswith("tied_") for v in module.RUNGS) >= 4  # enough for a fit
    for v in module.RUNGS:
      assert module.get_config(v).model.embedding == ("tied" if v.startswith("tied") else "lev")
  with pytest.raises(ValueError, match="unknown variant 'huge_l'; expected one of tied_xs"):
    load_ladder(REPO / "experiments" / "smoke_ladder.py").get_config("huge_l")


# ---------------------------------------------------------------------------- the command

def test_rung_commands_per_launcher_are_what_lev_train_and_launch_accept(tmp_path,
                                                                        monkeypatch):
  # a GPU job inherits the submitting shell's JAX_PLATFORMS (conftest's cpu): unset here
  monkeypatch.delenv("JAX_PLATFORMS")
  smoke = str(REPO / "experiments" / "smoke_ladder.py")
  local = ladder_cli.rung_commands("local", smoke, ["tied_xs"], "/r", train_flags=["--x=1"])
  assert local == [("tied_xs", [sys.executable, "-m", "lev_jax.cli.train",
                                f"--config={smoke}:tied_xs", "--workdir=/r/tied_xs", "--x=1"])]
  printed = ladder_cli.rung_commands("print", "experiments/smoke_ladder.py", ["leviathan_s"],
                                     "gs://b/root/")
  assert printed[0][1] == ["lev-train", "--config=experiments/smoke_ladder.py:leviathan_s",
                           "--workdir=gs://b/root/leviathan_s"]
  (_, slurm), = ladder_cli.rung_commands(
      "slurm", smoke, ["tied_m"], "/shared/runs", launcher_flags=["--nodes=2"])
  assert slurm[1] == str(REPO / "launch" / "slurm.py")
  from launch import slurm as slurm_launch
  out = StringIO()
  assert slurm_launch.main([*slurm[2:slurm.index("--")], "--dry-run",
                            *slurm[slurm.index("--"):]], out=out) == 0
  assert "--job-name=lev-tied_m" in out.getvalue()
  assert f"--workdir=/shared/runs/tied_m --config={smoke}:tied_m" in out.getvalue()
  (_, tpu), = ladder_cli.rung_commands(
      "tpu", smoke, ["tied_m"], "gs://b/runs",
      launcher_flags=["--name=lev", "--zone=us-east5-a", "--accelerator_type=v5p-16"])
  from launch import tpu as tpu_launch
  job, *_ = tpu_launch.job_from_argv(tpu[2:])
  assert job.workdir == "gs://b/runs/tied_m"
  assert job.train_args == ("--config=experiments/smoke_ladder.py:tied_m",)  # repo-relative
  with pytest.raises(ValueError, match="put the ladder file inside it"):
    ladder_cli.rung_commands("tpu", str(tmp_path / "l.py"), ["tied_m"], "gs://b")
  with pytest.raises(ValueError, match="--workdir is set by lev-ladder"):
    ladder_cli.rung_commands("local", smoke, ["tied_m"], "/r", train_flags=["--workdir=/x"])
  # newcomer pass 14 (B18, B19): lev-study's refusal spoke of lev-ladder and rungs
  with pytest.raises(ValueError, match=re.escape(
      "--train_flags: --config is set by lev-study for every run (--config=STUDY:RUN)")):
    ladder_cli.rung_commands("local", smoke, [], "/r", train_flags=["--config=x.py:a"],
                             prog="lev-study")


def test_launcher_flags_are_checked_once_before_any_rung_is_launched(capsys):
  """Issue 26: `--launcher=slurm` without --nodes printed "launch/slurm.py: error:
  --nodes is required" once per rung (8 launches): one dry run of the first rung's
  command (no pre-flight) now refuses it, naming --launcher_flags."""
  from launch import slurm as slurm_launch
  smoke = str(REPO / "experiments" / "smoke_ladder.py")
  calls = []

  def runner(argv, **_):  # launch/slurm.py in this process: no interpreter start-up
    calls.append(argv)
    status = slurm_launch.main(argv[2:], out=StringIO())
    return subprocess.CompletedProcess(argv, status, "", capsys.readouterr().err)
  bad = ladder_cli.rung_commands("slurm", smoke, ["tied_m", "leviathan_m"], "/shared/runs")
  with pytest.raises(ValueError, match=r"^--launcher_flags: --nodes is required: .*\(checked "
                     r"with slurm.py --dry-run before any rung was launched\)$"):
    ladder_cli.check_launcher(bad, runner=runner, which=lambda _: "/usr/bin/sbatch")
  good = ladder_cli.rung_commands("slurm", smoke, ["tied_m"], "/shared/runs",
                                  launcher_flags=["--nodes=2"])
  ladder_cli.check_launcher(good, runner=runner, which=lambda _: "/usr/bin/sbatch")
  assert len(calls) == 2 and all("--dry-run" in c and "--no-preflight" in c for c in calls)
  # newcomer pass 19 (B58): no sbatch here: one line before any rung, not one per rung
  with pytest.raises(ValueError, match=r"^--launcher=slurm: sbatch not found on PATH: "):
    ladder_cli.check_launcher(good, runner=runner, which=lambda _: None)
  dry = ladder_cli.rung_commands("slurm", smoke, ["tied_m"], "/shared/runs",
                                 launcher_flags=["--nodes=2", "--dry-run"])
  ladder_cli.check_launcher(dry, runner=runner, which=lambda _: None)


def test_a_failing_rung_is_reported_and_the_next_still_runs():
  ran = []
  runner = lambda argv: ran.append(argv[0]) or (3 if argv[0] == "bad" else 0)
  out = StringIO()
  failed = ladder_cli.train_rungs([("tied_a", ["bad"]), ("leviathan_a", ["good"])], "local",
                                  runner=runner, out=out)
  assert failed == {"tied_a": 3} and ran == ["bad", "good"]
  assert "tied_a: exited with status 3; continuing" in out.getvalue()


def _cli(*args):
  return subprocess.run([sys.executable, "-m", "lev_jax.cli.ladder", *args], capture_output=True,
                        text=True, cwd=REPO, timeout=120, env=dict(os.environ))


_LADDER_FLAGS = ("ladder", "root", "run", "launcher", "launcher_flags", "train_flags",
                 "report_dir")


def _cli_here(capsys, monkeypatch, *args):
  """`lev-ladder ARGS` in this process: its flags defined on absl's FLAGS (as `run` does,
  then removed again), parsed by the command's own parser, and its main run; returns
  (exit status, stdout, stderr). No interpreter start-up: each `_cli` pays ~5 CPU-s of
  jax, Orbax and SciPy imports. SIGTERM's handler (main's terminate_as_interrupt) is
  restored."""
  import signal  # pylint: disable=import-outside-toplevel
  from absl import flags  # pylint: disable=import-outside-toplevel
  argv = ["lev-ladder", *args]
  monkeypatch.setattr(sys, "argv", argv)  # main writes the command line into the report
  # train_rungs prints to the sys.stdout its default argument was bound to at import (the
  # process's stdout in a real run): here the one capsys reads
  train_rungs = ladder_cli.train_rungs
  monkeypatch.setattr(ladder_cli, "train_rungs",
                      lambda *a, **k: train_rungs(*a, **{"out": sys.stdout, **k}))
  sigterm = signal.getsignal(signal.SIGTERM)
  capsys.readouterr()
  ladder_cli._define_flags()  # pylint: disable=protected-access
  try:
    ladder_cli.main(common.flags_parser(ladder_cli.PROG)(argv))
    status = 0
  except SystemExit as e:
    status = e.code
  finally:
    for name in _LADDER_FLAGS:
      delattr(flags.FLAGS, name)
    signal.signal(signal.SIGTERM, sigterm)
  out, err = capsys.readouterr()
  return status, out, err


def test_cli_print_launcher_prints_the_commands_of_unfinished_rungs_and_writes_nothing(
    tmp_path, capsys, monkeypatch):
  """The command's flags, main and output streams, in this process (_cli_here); its
  start-up as a process, one line and exit 2 included:
  test_a_study_file_given_to_lev_ladder_is_refused_before_anything_is_written."""
  ladder, root, _ = build_ladder(tmp_path, skip=("leviathan_d",))
  before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
  status, out, err = _cli_here(capsys, monkeypatch, f"--ladder={ladder}", f"--root={root}",
                               "--run", "--launcher=print")
  assert status == 0, err[-3000:]
  # stdout is the plan only: one lev-train command per unfinished rung, ready for a shell
  assert out == f"lev-train --config={ladder}:leviathan_d --workdir={root}/leviathan_d\n"
  assert "1 of 8 rungs would be trained" in err and "nothing written" in err
  assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before  # no report
  # newcomer pass 13: without --run the launcher was ignored and a report written
  status, out, err = _cli_here(capsys, monkeypatch, f"--ladder={ladder}", f"--root={root}",
                               "--launcher=print")
  assert status == 2 and err == (
      "lev-ladder: error: --launcher=print acts only with --run (how the unfinished rungs "
      "are trained; --launcher=print prints their commands); without --run lev-ladder "
      "writes the report alone\n"), err[-3000:]
  assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before
  status, out, err = _cli_here(capsys, monkeypatch, f"--ladder={ladder}", f"--root={root}")
  assert status == 0, err[-3000:]  # report only
  assert f"7 of 8 rungs finished; report {root}/report/report.md" in out
  assert "2.10x" in out and "missing leviathan_d: no workdir" in out
  assert (root / "report" / "report.md").exists()
  # A missing --ladder file's line: test_a_missing_ladder_file_is_named_before_the_root


def test_a_rung_trained_to_the_end_without_its_final_evaluation_says_so(tmp_path):
  ladder, root, _ = build_ladder(tmp_path)
  (root / "tied_a" / "eval.json").unlink()
  missing = {m["variant"]: m for m in analyse(collect(ladder, root))["missing"]}
  assert missing["tied_a"]["status"] == "unfinished"
  assert missing["tied_a"]["reason"] == (
      f"step {STEPS} of {STEPS} reached but {root / 'tied_a' / 'eval.json'} is missing: "
      "re-run lev-train on it to evaluate")


def test_a_missing_ladder_file_is_named_before_the_root(tmp_path):
  """Issue 26: without --run, a missing ladder file was reported as a missing --root."""
  with pytest.raises(LadderError) as e:
    ladder_cli.load_inputs(str(tmp_path / "nope.py"), str(tmp_path / "no_root"), run=False,
                           report_dir=None)
  assert str(e.value) == (f"--ladder={tmp_path / 'nope.py'}: no such file; expected a .py "
                          "experiment file with RUNGS and get_config(variant), e.g. "
                          "experiments/smoke_ladder.py")
  smoke = str(REPO / "experiments" / "smoke_ladder.py")
  # newcomer pass 5: FILE.py:PIECE (lev-study's form) was "no such file"
  with pytest.raises(LadderError, match=r"^--ladder=.*smoke_ladder.py:foo: lev-ladder runs "
                     r"every variant of a ladder file and takes no :PIECE"):
    ladder_cli.load_inputs(smoke + ":foo", str(tmp_path / "no_root"), run=False,
                           report_dir=None)
  with pytest.raises(ValueError, match=r"no_root: no such folder \(add --run"):
    ladder_cli.load_inputs(smoke, str(tmp_path / "no_root"), run=False, report_dir=None)
  assert ladder_cli.load_inputs(smoke, str(tmp_path / "no_root"), run=True,
                                report_dir=None).RUNGS
  assert not (tmp_path / "no_root").exists()  # issue 26: main creates it after every check
  (tmp_path / "afile").write_text("")  # before hours of training, not after
  with pytest.raises(ValueError, match=r"^--root=.*afile: is a file; expected a folder"):
    ladder_cli.load_inputs(smoke, str(tmp_path / "afile"), run=False, report_dir=None)
  with pytest.raises(ValueError, match=r"^--report_dir=.*afile: is a file; expected a "
                     "folder$"):
    ladder_cli.load_inputs(smoke, str(tmp_path / "no_root"), run=True,
                           report_dir=str(tmp_path / "afile"))
  with pytest.raises(ValueError, match=r"^--root=.*afile/r: cannot write in "):  # --root first
    ladder_cli.load_inputs(smoke, str(tmp_path / "afile" / "r"), run=True,
                           report_dir=str(tmp_path / "afile"))
  # a root the filesystem refuses although the permission bits allow it (/proc/x as
  # root): every rung trained and failed, then the report's mkdir raised a traceback
  # (lev-ladder's main creates --root with this check once every other one passed)
  assert common.created_folder_error("--root", "/proc/lev_root").startswith(
      "--root=/proc/lev_root: cannot be created ")


def test_a_root_that_is_a_run_or_a_study_report_is_refused(tmp_path):
  """Issue 26: `lev-ladder --root=runs/cb` (a training run) wrote report/ into the run;
  a study's report folder was then overwritten by a ladder's, two reports mixed."""
  smoke = str(REPO / "experiments" / "smoke_ladder.py")
  (tmp_path / "cb" / "checkpoints").mkdir(parents=True)
  (tmp_path / "cb" / "metrics.jsonl").write_text("")
  with pytest.raises(ValueError, match=r"^--root=.*cb: is .*cb, a training run's folder"):
    ladder_cli.load_inputs(smoke, str(tmp_path / "cb"), run=False, report_dir=None)
  (tmp_path / "study" / "report").mkdir(parents=True)
  (tmp_path / "study" / "report" / "study.csv").write_text("")
  with pytest.raises(ValueError, match=r"report: holds a lev-study report \(study.csv\)"):
    ladder_cli.load_inputs(smoke, str(tmp_path / "study"), run=False, report_dir=None)
  assert not (tmp_path / "cb" / "report").exists()


def test_the_summary_says_n_a_for_an_infinite_effective_size():
  """Issue 26: a Leviathan loss below the fitted floor printed `inf (inf - inf)` where
  the report says n/a."""
  inf = math.inf
  pair = {"size": "xs", "ppl_change": -0.1, "tied_ppl": 10.0, "leviathan_ppl": 9.0,
          "efficiency": {"ratio": 2.0},
          "effective": {"n_eff": inf, "ratio": inf, "ratio_lo": inf, "ratio_hi": inf,
                        "warning": None}}
  analysis = {"rungs": [{"status": "finished"}] * 2, "pairs": [pair], "missing": [],
              "fit": {"ok": False, "reason": "too few points"}}
  row = ladder_cli.summary(analysis, {"report": "r.md"}).splitlines()[2]
  assert row.split() == ["xs", "10.00", "->", "9.00", "(-10.0", "%)", "2.00x", "n/a"], row




def test_train_flags_are_checked_once_as_lev_train_parses_them():
  """Issue 26: a misspelt --train_flags field started every rung (each failing with the
  same lev-train line); --launcher=print said the rungs would be trained."""
  smoke = str(REPO / "experiments" / "smoke_ladder.py")
  variant = load_ladder(smoke).RUNGS[0]
  assert ladder_cli.train_flags_error(smoke, variant, ["--config.train.stpes=5"]) == (
      "--train_flags: --config.train.stpes: the config has no field 'stpes' (did you mean "
      "'steps'?)")
  assert ladder_cli.train_flags_error(smoke, variant, ["--config.train.steps=abc"]) == (
      "--train_flags: --config.train.steps=abc: expected an integer (config.train.steps is "
      "300)")
  assert ladder_cli.train_flags_error(smoke, variant, ["--config.train.steps=-5"]) == (
      "--train_flags: config.train.steps = -5: expected a positive number")
  assert ladder_cli.train_flags_error(smoke, variant, ["--config.train.steps=50"]) is None
  # and the same flags give each rung's expected config (a report counts only runs
  # trained with them)
  assert ladder_cli.expected_configs(smoke, [variant], []) == {}
  got = ladder_cli.expected_configs(smoke, [variant], ["--config.train.steps=50"])
  assert got[variant].train.steps == 50 and got[variant].name == f"smoke_ladder_{variant}"


@pytest.mark.parametrize("returned,what", [
    ("42", "returned an int; expected an ml_collections.ConfigDict"),
    ("ml_collections.ConfigDict({'name': 'x'})",
     "returned a config without its data, eval, lev, mesh, model, optim, train sections; "
     "expected an ml_collections.ConfigDict"),
])
def test_a_get_config_returning_no_full_config_is_one_line_before_anything_is_created(
    tmp_path, capsys, monkeypatch, returned, what):
  """Newcomer pass 9: get_config returning 42 was AttributeError: 'int' object has no
  attribute 'train' (lev-study said "a int"). The command in this process (_cli_here);
  the same one-line exit of main as a process:
  test_a_study_file_given_to_lev_ladder_is_refused_before_anything_is_written."""
  ladder = tmp_path / "odd_ladder.py"
  ladder.write_text(f"import ml_collections\nRUNGS = ('tied_a', 'leviathan_a')\n"
                    f"def get_config(r):\n  return {returned}\n")
  root = tmp_path / "root"
  status, _, err = _cli_here(capsys, monkeypatch, f"--ladder={ladder}", f"--root={root}",
                             "--run")
  assert status == 2, err[-3000:]
  assert err == f"lev-ladder: error: {ladder}: get_config('tied_a') " \
      f"{what} (config.base_config() with fields changed, as experiments/smoke_ladder.py " \
      "builds them)\n"
  assert not root.exists()
  from lev_jax.cli import study as study_cli
  with pytest.raises(LadderError, match=rf"^{ladder}: get_config\('tied_a'\) {what} "):
    study_cli.load_study(str(ladder))


def test_a_rung_whose_step_is_another_runs_is_left_out(tmp_path):
  """Newcomer pass 15 (L10): a rung's step replaced by the same rung trained in another
  folder (another run id) was reported without a word; lev-eval and lev-study refuse it.
  lev-ladder reads the step's progress item and data_report.json as plain JSON."""
  ladder, root, _ = build_ladder(tmp_path, sizes={"a": 16}, downstream=False)
  step_dir = root / "tied_a" / "checkpoints" / str(STEPS)
  (step_dir / "progress").mkdir()
  (step_dir / "progress" / "metadata").write_text(json.dumps({"run": "0123456789abcdef"}))
  (root / "tied_a" / "data_report.json").write_text(json.dumps({"run": "0123456789abcdef"}))
  assert collect(ladder, root).rung("tied_a").finished  # the run's own step
  (root / "tied_a" / "data_report.json").write_text(json.dumps({"run": "fedcba9876543210"}))
  rung = collect(ladder, root).rung("tied_a")
  assert rung.status == "unverified" and rung.reason == (
      f"checkpoint {step_dir} belongs to another run than the one in {root / 'tied_a'} (its "
      f"progress item records run 0123456789abcdef, {root / 'tied_a' / 'data_report.json'} "
      "run fedcba9876543210): a step copied in from another run of the same model (another "
      "seed or data?), or data_report.json replaced? Put back the one that changed; the "
      "rung is left out until then")


def test_a_finished_rung_without_its_checkpoints_is_unverified_and_left_out(tmp_path):
  """Newcomer pass 9: with checkpoints/ deleted, a run of another shape copied in was
  "finished" from metrics.jsonl and eval.json alone (the shape check needs the stored
  config)."""
  import shutil
  ladder, root, _ = build_ladder(tmp_path, sizes={"a": 16, "b": 32}, downstream=False)
  shutil.rmtree(root / "tied_a" / "checkpoints")
  ckpt = root / "leviathan_a" / "checkpoints"
  (ckpt / str(STEPS)).rename(ckpt / "60")  # the final step's checkpoint is gone
  (root / "tied_b" / "checkpoints" / str(STEPS) / "config" / "metadata").write_text("{")
  result = collect(ladder, root)
  tail = "left out; move {wd} aside and train the rung there"
  for variant, why in (
      ("tied_a", f"{root / 'tied_a' / 'checkpoints'}: missing"),
      ("leviathan_a", f"{ckpt}: its latest checkpoint is step 60, not the final step {STEPS}")):
    rung = result.rung(variant)
    assert rung.status == "unverified" and rung.reason == (
        f"{why}, so the config it was trained with cannot be checked against the ladder's "
        f"{variant}: " + tail.format(wd=root / variant))
  rung = result.rung("tied_b")
  assert rung.status == "unverified" and rung.reason.startswith(
      f"{root / 'tied_b' / 'checkpoints' / str(STEPS) / 'config' / 'metadata'}: not JSON")
  assert result.rung("leviathan_b").finished
  analysis = analyse(result)
  assert {m["variant"] for m in analysis["missing"]} == {"tied_a", "leviathan_a", "tied_b"}
  assert all(p["ppl_change"] is None for p in analysis["pairs"])
  # --run leaves them alone: lev-train refuses a folder of outputs without checkpoints/
  assert ladder_cli.trainable(result) == []
  # a study's run says "run"
  rung = collect(ladder, root, owner="study").rung("tied_a")
  assert rung.reason.endswith(f"against the study's tied_a: left out; move "
                              f"{root / 'tied_a'} aside and train the run there")


def test_a_rung_whose_step_folder_was_renamed_is_named_not_retrained(tmp_path):
  """Newcomer pass 12 (W05, W08): checkpoints/6 renamed 6.bak: the rung "holds no
  checkpoint ... move it aside and train the rung there" (throwing a finished rung
  away); lev-train and lev-eval name the renamed folder."""
  import json as json_lib
  ladder, root, _ = build_ladder(tmp_path, sizes={"a": 16}, downstream=False)
  ckpt = root / "tied_a" / "checkpoints"
  (ckpt / str(STEPS) / "checksums.json").write_text(json_lib.dumps(
      {"sha256": {"config/metadata": "0" * 64}, "step": STEPS}))
  (ckpt / str(STEPS)).rename(ckpt / f"{STEPS}.bak")
  for owner, member in (("ladder", "rung"), ("study", "run")):
    rung = collect(ladder, root, owner=owner).rung("tied_a")
    assert rung.status == "unverified" and rung.reason == (
        f"{ckpt / f'{STEPS}.bak'}: a checkpoint step (checksums.json records step {STEPS}) "
        f"under a name that is not its step's, which no restore sees: name it {STEPS} "
        f"again, or move it out of {ckpt}; the {member} is left out until then")
  # newcomer pass 13 (N433-N439): zero-padded, a file named like the step (a
  # NotADirectoryError traceback), an empty folder named like a later step
  (ckpt / f"{STEPS}.bak").rename(ckpt / f"0{STEPS}")
  assert collect(ladder, root).rung("tied_a").reason.startswith(
      f"{ckpt / f'0{STEPS}'}: a checkpoint step (checksums.json records step {STEPS}) under "
      "a name that is not its step's")
  (ckpt / str(STEPS)).write_text("x")
  assert collect(ladder, root).rung("tied_a").reason == (
      f"{ckpt / str(STEPS)}: a file named like a checkpoint step; expected a step folder "
      f"(move it out of {ckpt}); the rung is left out until then")
  (ckpt / str(STEPS)).unlink()
  (ckpt / f"0{STEPS}").rename(ckpt / f"{STEPS}.bak")
  (ckpt / str(2 * STEPS)).mkdir()
  (ckpt / f"{STEPS}.bak").rename(ckpt / str(STEPS))
  rung = collect(ladder, root).rung("tied_a")
  assert rung.status == "unverified" and rung.reason.startswith(
      f"{ckpt / str(2 * STEPS)}: an empty folder named like a checkpoint step")
  (ckpt / str(2 * STEPS)).rmdir()
  (ckpt / str(STEPS)).rename(ckpt / f"{STEPS}.bak")
  # newcomer pass 13 (N189): a copy under a later step's number beside the intact step
  (ckpt / f"{STEPS}.bak").rename(ckpt / str(STEPS))
  shutil.copytree(ckpt / str(STEPS), ckpt / str(2 * STEPS))
  rung = collect(ladder, root).rung("tied_a")
  assert rung.status == "unverified" and rung.reason == (
      f"checkpoint {ckpt / str(2 * STEPS)}: its manifest records step {STEPS}: a copy of step "
      f"{STEPS}, which is there too; move it out of {ckpt}; the rung is left out "
      "until then")


def test_an_eval_json_edited_with_its_metrics_row_is_unreadable_by_its_buckets(tmp_path):
  """Newcomer pass 9: eval.json and metrics.jsonl's eval row both edited to loss 5.0,
  perplexity exp(5) were reported; the buckets' token-weighted loss tells."""
  ladder = write_ladder(tmp_path / "l.py", {"a": 16})
  root = tmp_path / "root"
  write_rung(root, "tied_a", 2.0)
  assert collect(ladder, root).rung("tied_a").finished  # the fixture's figures agree
  path, metrics = root / "tied_a" / "eval.json", root / "tied_a" / "metrics.jsonl"
  result = json.loads(path.read_text())
  mean = sum(b["tokens"] * b["loss"] for b in result["buckets"] if b["tokens"]) / sum(
      b["tokens"] for b in result["buckets"])
  result.update(loss=5.0, perplexity=math.exp(5.0))
  path.write_text(json.dumps(result))
  rows = [json.loads(line) for line in metrics.read_text().splitlines()]
  for row in rows:
    if row["step"] == result["step"] and "eval/loss" in row:
      row.update({"eval/loss": 5.0, "eval/perplexity": math.exp(5.0)})
  metrics.write_text("".join(json.dumps(r) + "\n" for r in rows))
  rung = collect(ladder, root).rung("tied_a")
  assert rung.status == "unreadable" and rung.reason == (
      f"{path}: its loss 5.0 is not the token-weighted mean of its buckets' losses "
      f"({mean:.10g}): the file was edited; expected lev-train's own result (delete it and "
      "re-run lev-train on the run to evaluate again)")
  assert ladder_lib.bucket_problem({**result, "loss": mean * (1 + 1e-9)}) is None
  result["buckets"][2]["perplexity"] *= 1.1  # one bucket's perplexity edited
  assert ladder_lib.bucket_problem(result).startswith(
      "its bucket [10,100) perplexity ")


CHILD = '''
import os, signal, sys, time
folder = sys.argv[1]
def stop(signum, frame):
  time.sleep(0.5)  # a checkpoint being saved
  open(os.path.join(folder, "checkpointed"), "w").write(str(signum))
  sys.exit(128 + signum)
signal.signal(signal.SIGTERM, stop)
signal.signal(signal.SIGINT, stop)
open(os.path.join(folder, "started"), "w").write(str(os.getpid()))
time.sleep(120)
'''

DRIVER = '''
import signal, sys
# Ctrl-C raises KeyboardInterrupt, as in a terminal, also when the suite itself runs in
# the background (a shell's background job, and nohup, start it with SIGINT ignored).
signal.signal(signal.SIGINT, signal.default_int_handler)
from lev_jax.cli import ladder
child, folder = sys.argv[1], sys.argv[2]
ladder.rung_commands = lambda launcher, ladder_file, variants, root, **k: [
    (v, [sys.executable, child, folder]) for v in variants]
sys.argv = ["lev-ladder", *sys.argv[3:]]
ladder.run()
'''


@pytest.mark.parametrize("signum,status,cause", [
    (15, 143, "terminated (SIGTERM)"), (2, 130, "interrupted (Ctrl-C)")])
def test_a_signal_to_lev_ladder_run_stops_the_rung_in_training_first(tmp_path, signum,
                                                                     status, cause):
  """Newcomer pass 9: SIGTERM to lev-ladder --run exited 143 but left its lev-train child
  training, orphaned."""
  import signal
  import time
  ladder, root, _ = build_ladder(tmp_path, skip=("tied_d", "leviathan_d"), downstream=False)
  (tmp_path / "child.py").write_text(CHILD)
  (tmp_path / "driver.py").write_text(DRIVER)
  proc = subprocess.Popen(
      [sys.executable, str(tmp_path / "driver.py"), str(tmp_path / "child.py"),
       str(tmp_path), f"--ladder={ladder}", f"--root={root}", "--run"],
      cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
      env=dict(os.environ, PYTHONPATH=f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"))
  started = tmp_path / "started"
  deadline = time.monotonic() + 60
  while not started.exists() and proc.poll() is None and time.monotonic() < deadline:
    time.sleep(0.05)
  assert started.exists(), proc.communicate()
  time.sleep(0.2)
  proc.send_signal(signum)
  out, err = proc.communicate(timeout=60)
  assert proc.returncode == status, err[-3000:]
  assert (tmp_path / "checkpointed").read_text() == str(signum)  # forwarded, waited for
  with pytest.raises(ProcessLookupError):
    os.kill(int(started.read_text()), 0)  # not left running
  assert err.strip().splitlines()[-1] == (
      f"lev-ladder: {cause}: stopped rung tied_d (it exited with status {status}); re-run "
      "the same command to resume it and the unfinished rungs")
  assert "leviathan_d" not in out  # the next rung was not started


def test_a_study_file_given_to_lev_ladder_is_refused_before_anything_is_written(tmp_path):
  """Newcomer pass 13 (N185): `lev-ladder --ladder=mystudy.py` said "4 of 4 rungs
  finished" over n/a rows such as "s0 n/a (leviathan_s0 is not in RUNGS)": a study's
  run names (leviathan-lr3_s0) are not a ladder's tied_SIZE / leviathan_SIZE."""
  study = REPO / "experiments" / "smoke_study.py"
  root = tmp_path / "root"
  with pytest.raises(LadderError) as e:
    ladder_cli.load_inputs(str(study), str(root), run=True, report_dir=None)
  assert str(e.value) == (
      f"--ladder={study}: RUNGS holds 'leviathan-lr1_s0', 'leviathan-lr3_s0', "
      "'leviathan-lr1_s1' and 3 more, which are not KIND_SIZE with KIND tied or leviathan "
      "(a ladder pairs tied_SIZE with leviathan_SIZE, e.g. 'tied_200m', 'leviathan_200m' "
      f"in experiments/ladder.py); a study file? use lev-study --study={study}")
  assert not root.exists()
  for source, odd in (("RUNGS = ('tied_a', 'untied_a')\n", "'untied_a', which is not"),
                      ("RUNGS = ('tied_a', 'leviathan')\n", "'leviathan', which is not")):
    (tmp_path / "odd.py").write_text(source + "def get_config(v):\n  return None\n")
    with pytest.raises(LadderError, match=rf"^--ladder=.*odd.py: RUNGS holds {odd} "):
      load_ladder(tmp_path / "odd.py")
    assert load_ladder(tmp_path / "odd.py", kind="study").RUNGS  # a study names runs freely
  for name in ("ladder.py", "smoke_ladder.py"):  # the repo's ladders still load
    assert len(load_ladder(REPO / "experiments" / name).RUNGS) == 8
  for name in ("smoke_study.py", "fidelity_study.py", "scale_study.py", "ablation_study.py"):
    with pytest.raises(LadderError, match=r"a study file\? use lev-study --study="):
      load_ladder(REPO / "experiments" / name)
    assert load_ladder(REPO / "experiments" / name, kind="study").RUNGS
  root.mkdir()  # the command: one line, exit 2, no report
  proc = _cli(f"--ladder={study}", f"--root={root}")
  assert proc.returncode == 2 and proc.stderr.strip() == f"lev-ladder: error: {e.value}"
  assert not any(root.iterdir())


def test_a_rung_folder_replaced_by_a_file_is_named_as_such(tmp_path):
  """Newcomer pass 13 (N173): ROOT/tied_a a file: lev-ladder said "missing tied_a: no
  workdir ROOT/tied_a" (there is something there; training into it fails)."""
  ladder, root, _ = build_ladder(tmp_path, sizes={"a": 16}, downstream=False)
  shutil.rmtree(root / "tied_a")
  (root / "tied_a").write_text("not a workdir")
  for owner, member in (("ladder", "rung"), ("study", "run")):
    rung = collect(ladder, root, owner=owner).rung("tied_a")
    assert rung.status == "unreadable" and rung.reason == (
        f"{root / 'tied_a'}: is a file; expected the {member}'s workdir folder (move it "
        "aside)")
  missing = analyse(collect(ladder, root))["missing"]
  assert [m["variant"] for m in missing] == ["tied_a"]
  assert collect(ladder, root).rung("leviathan_a").finished
