"""`lev-train` and `lev-params` as a user runs them: subprocesses, real flags."""

import json
import re
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import copy_run, ctrl_c_not_ignored, files_of
from lev_jax.checkpoint_checks import MANIFEST, verify_manifest

REPO = Path(__file__).resolve().parent.parent
SMOKE = str(REPO / "experiments" / "smoke.py")
TINY = ["--config.model.vocab_size=512", "--config.model.d_model=32",
        "--config.model.n_heads=2", "--config.model.n_kv_heads=2", "--config.model.head_dim=16",
        "--config.model.d_ff=64", "--config.train.seq_len=32", "--config.train.global_batch_size=4",
        "--config.eval.batches=1", "--config.eval.batch_size=2", "--config.optim.warmup_steps=1",
        "--config.model.n_layers=1"]  # what these tests check does not depend on depth


def lev(tool, *args, timeout=240, **env):
  module = {"train": "lev_jax.cli.train", "params": "lev_jax.cli.params", "eval": "lev_jax.cli.eval"}[tool]
  return subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True,
                        timeout=timeout, cwd=REPO, env={**os.environ, **env})


def assert_clean_error(proc, *needles):
  assert proc.returncode == 2, proc.stderr[-3000:]
  assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
  for n in needles:
    assert n in proc.stderr, proc.stderr[-3000:]


def test_bad_config_value_is_one_clear_message(tmp_path):
  proc = lev("train", f"--config={SMOKE}:tied", f"--workdir={tmp_path}", "--config.train.steps=-1")
  assert_clean_error(proc, "config.train.steps = -1: expected a positive number")


def test_missing_data_file_is_named(tmp_path, data_cache):
  missing = tmp_path / "nowhere" / "*.jsonl.zst"
  proc = lev("train", f"--config={SMOKE}:tied", f"--workdir={tmp_path / 'run'}",
             "--config.data.source=jsonl", f"--config.data.train_files=('{missing}',)",
             f"--config.data.cache_dir={data_cache}")
  assert_clean_error(proc, "config.data.train_files", str(missing))
  assert not (tmp_path / "run" / ".lock").exists()  # taken, then released on this exit


def test_malformed_jsonl_line_strict_names_file_and_line(tmp_path, data_cache):
  """lev-train's config trained in this process: the DataError that names the line
  (lev-train's one line for a DataError: test_missing_data_file_is_named)."""
  from lev_jax.data import DataError
  from lev_jax.experiments import load_experiment
  from lev_jax.trainer import train_and_evaluate
  shard = tmp_path / "shard.jsonl"
  good = json.dumps({"text": "some text " * 50, "meta": {"pile_set_name": "Pile-CC"}})
  shard.write_text(f"{good}\n{good}\n{{not json\n{good}\n")
  c = load_experiment(SMOKE).get_config("tied")
  c.data.update(source="jsonl", train_files=(str(shard),), strict=True,
                cache_dir=str(data_cache))
  with pytest.raises(DataError, match=re.escape(f"{shard}:3")):
    train_and_evaluate(c, tmp_path / "run")


def test_kill_9_mid_run_then_rerun_takes_the_lock_over_and_continues_from_last_complete_checkpoint(
    tmp_path, data_cache):
  """On a tied model (what a kill interrupts does not depend on the embedding; the
  Leviathan model's kills are drilled by benchmarks/drills.py). While the killed run
  still ran, a second run on its workdir was refused, naming it; kill -9 leaves its lock
  file (its flock goes), and the rerun takes that lock over and removes it at its end."""
  workdir = tmp_path / "run"
  args = [f"--config={SMOKE}:tied", f"--workdir={workdir}", *TINY,
          "--config.train.steps=400", "--config.train.checkpoint_every=3",
          "--config.train.eval_every=1000", f"--config.data.cache_dir={data_cache}"]
  proc = subprocess.Popen([sys.executable, "-m", "lev_jax.cli.train", *args], cwd=REPO,
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  ckpts, lock = workdir / "checkpoints", workdir / ".lock"
  try:
    deadline = time.time() + 180
    unsigned = set()  # complete steps seen without their manifest (a kill now loses it)
    while time.time() < deadline:  # wait until two checkpoints are complete
      done = [p for p in ckpts.glob("*") if p.name.isdigit()] if ckpts.exists() else []
      unsigned |= {p.name for p in done if not (p / MANIFEST).exists()}
      if len(done) >= 2:
        break
      assert proc.poll() is None, "the run ended early"
      time.sleep(0.01)
    proc.send_signal(signal.SIGSTOP)  # mid-run, holding the lock; leaves the CPUs to `second`
    started = json.loads(lock.read_text())["started"]
    second = lev("train", *args, timeout=120)
  finally:
    proc.send_signal(signal.SIGKILL)
    proc.wait()
  assert_clean_error(second)
  assert second.stderr.strip().splitlines()[-1:] == [  # after the INFO line naming it
      f"lev-train: error: {workdir} is in use by lev-train (pid {proc.pid}, host "
      f"{socket.gethostname()}, started {started}); lock file {lock}. Wait for it to "
      "finish or stop it"]
  assert json.loads(lock.read_text())["pid"] == proc.pid
  completed = sorted(int(p.name) for p in ckpts.glob("*") if p.name.isdigit())
  assert len(completed) >= 2, "the run never wrote two checkpoints"
  # The manifest is committed with its step, not when the next save starts.
  assert not unsigned, f"complete steps {sorted(unsigned)} were seen without {MANIFEST}"
  for step in completed:
    assert verify_manifest(ckpts / str(step)), f"step {step} has no {MANIFEST}"
  # Restart with a nearer end; it must resume (not start over) and finish.
  end = completed[-1] + 3
  rerun = lev("train", *args[:-4], f"--config.train.steps={end}", "--config.train.checkpoint_every=3",
              "--config.train.eval_every=1000", f"--config.data.cache_dir={data_cache}")
  # train.steps changed, so the schedule differs; shapes do not, so the restore is allowed.
  assert rerun.returncode == 0, rerun.stderr[-3000:]
  assert (f"taking over the lock left by lev-train (pid {proc.pid}, host "
          f"{socket.gethostname()}, started {started}): it is no longer running"
          in rerun.stderr), rerun.stderr[-3000:]
  assert not lock.exists()
  rows = [json.loads(l) for l in (workdir / "metrics.jsonl").read_text().splitlines()]
  resumed_steps = [r["step"] for r in rows if "train/loss" in r]
  assert max(resumed_steps) == end
  assert f"step {end}" in rerun.stdout
  assert "resumed from step" in rerun.stderr and "unverified" not in rerun.stderr
  # stderr is a pipe, not a terminal: no progress bar redrawn around every log line.
  assert "%|" not in rerun.stderr, rerun.stderr[-3000:]


def test_rerun_of_a_finished_run_prints_one_line_and_writes_nothing(finished_tied_run,
                                                                    tmp_path):
  """Issue 26.1 as a user meets it: the finished run's own config again is one line on
  stdout and exit 0; no file of the run is written or touched, its lock not even taken
  (another config is refused: tests/test_trainer.py)."""
  c, workdir = copy_run(finished_tied_run, tmp_path / "run")
  same = tmp_path / "same.py"
  same.write_text("import ml_collections\n\n\ndef get_config():\n  return "
                  f"ml_collections.ConfigDict({c.to_dict()!r})\n")
  evaluated = json.loads((workdir / "eval.json").read_text())
  before = files_of(workdir)
  proc = lev("train", f"--config={same}", f"--workdir={workdir}")
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert proc.stdout.splitlines() == [
      f"lev-train: tiny_tied already finished at step 4 (validation loss "
      f"{evaluated['loss']:.4f}, perplexity {evaluated['perplexity']:.2f} in "
      f"{workdir}/eval.json); nothing to do, nothing written"]
  assert files_of(workdir) == before


def test_a_workdir_in_another_runs_files_or_an_export_is_refused(tmp_path, monkeypatch):
  """Issue 26: `--workdir=runs/base/tokenizer` trained inside a finished run's tokenizer/;
  `--workdir=exports/x` put checkpoints/ inside an export."""
  from lev_jax.cli import train as train_cli
  (tmp_path / "base" / "checkpoints").mkdir(parents=True)
  (tmp_path / "base" / "tokenizer").mkdir()
  (tmp_path / "exp").mkdir()
  (tmp_path / "exp" / "export.json").write_text("{}")
  monkeypatch.chdir(tmp_path)
  assert train_cli.workdir_error("base/tokenizer") == (
      "--workdir=base/tokenizer: is base/tokenizer, a run's own folder (only that run's "
      "lev-train writes it); expected another path")
  assert train_cli.workdir_error("exp").startswith("--workdir=exp: is exp, an export")
  assert train_cli.workdir_error("base") is None  # its own run: resumed
  assert train_cli.workdir_error("base/sub") == (  # newcomer pass 10: trained in there
      "--workdir=base/sub: is inside base, a training run's folder (only its lev-train "
      "writes there); expected a path outside it")


def test_lev_params_prints_parts_and_the_lev_difference():
  proc = lev("params", f"--config={REPO / 'experiments' / 'ladder.py'}:leviathan_1.2b")
  assert proc.returncode == 0, proc.stderr[-3000:]
  out = proc.stdout
  assert re.search(r"^  lev +2,252,928$", out, re.M), out
  assert "leviathan - tied = 2,252,928 (LEV closed form 2,252,928; 0.183% of tied)" in out
  assert "+2.66% of the label" in out


@pytest.mark.parametrize("config,needle,extra", [
    # The same line with or without overrides.
    ("experiments/nope.py", "--config=experiments/nope.py: no such file (expected a Python "
     "config file and variant, e.g. experiments/smoke.py:leviathan)", ()),
    (f"{SMOKE}:nonexistent", "lev-train: error: experiments/smoke.py: unknown variant "
     "'nonexistent'; expected one of tied, untied, leviathan", ()),  # no "ValueError: "
    # With an override, ml_collections fails while applying it: still one line.
    ("experiments/nope.py", "--config=experiments/nope.py: no such file",
     ("--config.train.steps=20",)),
    ("/", "--config=/: is a folder", ("--config.train.steps=20",)),
])
def test_bad_config_file_or_variant_is_one_line(config, needle, extra, tmp_path):
  proc = lev("train", f"--config={config}", f"--workdir={tmp_path}", *extra)
  assert_clean_error(proc, needle)
  assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


@pytest.mark.parametrize("module,prog", [("lev_jax.cli.prepare_data", "lev-prepare-data"),
                                         ("lev_jax.cli.train", "lev-train"),
                                         ("lev_jax.cli.params", "lev-params")])
def test_help_shows_the_commands_own_docstring(module, prog, capsys):
  import importlib
  from lev_jax.cli import common as cli
  importlib.import_module(module)
  with pytest.raises(SystemExit) as exit_info:
    cli.flags_parser(prog, module)([prog, "--help"])
  assert exit_info.value.code == 0
  out = capsys.readouterr().out
  assert out.startswith(f"`{prog}`")  # the flags it lists: tests/test_cli_common.py


@pytest.mark.parametrize("module,prog,args", [
    ("lev_jax.cli.train", "lev-train", []),
    ("lev_jax.cli.eval", "lev-eval", []),
    ("lev_jax.cli.export", "lev-export", []),
    ("lev_jax.cli.sample", "lev-sample", []),
    ("lev_jax.cli.prepare_data", "lev-prepare-data", []),
    ("lev_jax.cli.ladder", "lev-ladder", ["--ladder=experiments/smoke_ladder.py", "--root=r"]),
    ("lev_jax.cli.study", "lev-study", ["--study=experiments/smoke_study.py", "--root=r"])])
def test_ctrl_c_in_a_command_is_one_line_and_exit_130(module, prog, args):
  """Ctrl-C while a command runs (Python's KeyboardInterrupt; lev-train's trainer
  handles it itself from the first step on): one line, exit 130, no traceback."""
  code = (f"import os, signal, sys, time\nimport {module} as command\n"
          "def interrupted(argv):\n"
          "  os.kill(os.getpid(), signal.SIGINT)\n"
          "  time.sleep(30)\n"
          "command.main = interrupted\n"
          f"sys.argv = {[prog, *args]!r}\n"
          "command.run()\n")
  with ctrl_c_not_ignored():
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, cwd=REPO)
  assert proc.returncode == 130, proc.stderr[-3000:]
  lines = proc.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith(f"{prog}: interrupted (Ctrl-C)"), lines


def test_sigterm_before_the_first_step_is_one_line_and_releases_the_workdir(tmp_path):
  """Newcomer pass 6: SIGTERM while lev-train compiled ended it silently (status 143 from
  the default action), leaving the new workdir holding only its lock file."""
  workdir = tmp_path / "run"
  code = ("import os, signal, sys, time\nimport lev_jax.cli.train as command\n"
          "from lev_jax import lock\n"
          "def terminated(argv):\n"
          f"  with lock.hold({str(workdir)!r}, prog='lev-train'):\n"
          "    os.kill(os.getpid(), signal.SIGTERM)\n"
          "    time.sleep(30)\n"
          "command.main = terminated\n"
          "sys.argv = ['lev-train']\n"
          "command.run()\n")
  proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                        timeout=120, cwd=REPO)
  assert proc.returncode == 143, proc.stderr[-3000:]
  assert proc.stderr.strip().splitlines() == [
      "lev-train: terminated (SIGTERM) before the first step; nothing was written: re-run "
      "to start"]
  assert not workdir.exists()


def test_ctrl_c_before_the_first_step_says_whether_a_checkpoint_exists(tmp_path):
  """A fresh run interrupted in its first compile said "the workdir's checkpoints are
  unchanged" though it had none."""
  from lev_jax.cli.train import interrupted_line
  head = "interrupted (Ctrl-C) before the first step; "
  assert interrupted_line(None) == head + "nothing was written: re-run to start"
  (tmp_path / "checkpoints").mkdir()  # made by the run, no step saved yet
  assert interrupted_line(str(tmp_path)) == (
      head + "no checkpoint was written yet: re-run to start")
  (tmp_path / "checkpoints" / "2").mkdir()
  assert interrupted_line(str(tmp_path)) == (
      head + "the workdir's checkpoints are unchanged: re-run to continue")


SECTIONS = "data, eval, lev, mesh, model, optim, train"


@pytest.mark.parametrize("tool,args,line", [
    ("train", ["--config.train.stepz=5"], "lev-train: error: --config.train.stepz: the config "
     "has no field 'stepz' (did you mean 'steps'?)"),
    ("train", [f"--config={SMOKE}:tied", "--config.nosuch.x=1"], "lev-train: error: "
     f"--config.nosuch.x: the config has no section 'nosuch' (the config's sections: {SECTIONS})"),
    ("train", [f"--config={SMOKE}:tied", "--config.trian.steps=1"], "lev-train: error: "
     "--config.trian.steps: the config has no section 'trian' (did you mean 'train'?)"),
    ("eval", ["--config.train.stepz=5"], "lev-eval: error: --config.train.stepz: the config "
     "has no field 'stepz' (did you mean 'steps'?)"),
    ("eval", ["--config.nosuch.x=1"], "lev-eval: error: --config.nosuch.x: the config has no "
     f"section 'nosuch' (the config's sections: {SECTIONS})"),
])
def test_unknown_config_field_is_one_line_with_the_nearest_name(tool, args, line, tmp_path):
  proc = lev(tool, *args, *([f"--workdir={tmp_path / 'run'}"] if tool == "train" else []))
  assert_clean_error(proc)
  assert proc.stderr.strip().splitlines() == [line]
  assert not (tmp_path / "run").exists()


def test_config_file_with_a_syntax_error_is_one_line_naming_file_and_line(tmp_path):
  bad = tmp_path / "bad.py"
  bad.write_text("import ml_collections\n\ndef get_config(variant=None):\n  c = (\n"
                 "  return c\n")
  proc = lev("train", f"--config={bad}:tied", f"--workdir={tmp_path / 'run'}")
  assert_clean_error(proc)
  lines = proc.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith(f"lev-train: error: {bad}:4: "), lines
  assert lines[0].endswith("(a Python syntax error in the config file)"), lines


@pytest.mark.parametrize("step", ["-5", "0"])
def test_stop_at_step_below_one_is_refused_before_anything_runs(step, tmp_path):
  proc = lev("train", f"--stop_at_step={step}", f"--workdir={tmp_path / 'run'}")
  assert_clean_error(proc)
  assert proc.stderr.strip().splitlines() == [
      f"lev-train: error: flag --stop_at_step={step}: {step} is not a positive integer"]
  assert not (tmp_path / "run").exists()


def test_stop_at_step_past_the_runs_end_is_refused():
  """Issue 26: --stop_at_step=50 with train.steps=20 was ignored silently."""
  from lev_jax.cli import train as train_cli
  assert train_cli.stop_at_step_error(50, 20) == (
      "flag --stop_at_step=50: past the run's end, train.steps = 20; expected a step in "
      "[1, 20] (or leave the flag out to train to the end)")
  assert train_cli.stop_at_step_error(20, 20) is None
  assert train_cli.stop_at_step_error(None, 20) is None


def test_invalid_config_writes_nothing_not_even_the_workdir(tmp_path):
  proc = lev("train", f"--config={SMOKE}:tied", f"--workdir={tmp_path / 'run'}", *TINY,
             "--config.train.steps=2", "--config.optim.lr=nan")
  assert_clean_error(proc)
  assert proc.stderr.strip().splitlines() == [
      "lev-train: error: config.optim.lr = nan: expected a finite number"]
  assert not (tmp_path / "run").exists()


def _checkpoint_steps(workdir):
  ckpts = workdir / "checkpoints"
  return sorted(int(p.name) for p in ckpts.glob("*") if p.name.isdigit()) if ckpts.exists() else []


def _rows(workdir) -> int:
  metrics = workdir / "metrics.jsonl"
  return metrics.read_text().count("\n") if metrics.exists() else 0


def test_ctrl_c_then_sigterm_save_the_step_reached_and_the_resumed_run_matches_a_straight_run(
    tmp_path, data_cache):
  """Ctrl-C (SIGINT) as SIGTERM: a checkpoint of the step reached, one line, exit 130, no
  traceback. The re-run resumes there; SIGTERM (a preemption notice) checkpoints the
  step it reached and exits 143 (not finished), also when --stop_at_step was given (a
  later step than the one reached). That step's loss and params are a straight run's."""
  from conftest import metrics, saved_state
  import numpy as np
  import jax
  args = [f"--config={SMOKE}:tied", *TINY, "--config.train.steps=100000",
          "--config.train.checkpoint_every=100000", "--config.train.eval_every=100000",
          "--config.train.log_every=1", f"--config.data.cache_dir={data_cache}"]
  workdir = tmp_path / "run"
  with ctrl_c_not_ignored():
    proc = subprocess.Popen([sys.executable, "-m", "lev_jax.cli.train", *args,
                             f"--workdir={workdir}"], cwd=REPO, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
  deadline = time.time() + 180
  while time.time() < deadline and _rows(workdir) < 2:
    time.sleep(0.05)
  os.kill(proc.pid, signal.SIGINT)
  _, stderr = proc.communicate(timeout=120)
  assert proc.returncode == 130, stderr[-3000:]
  assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr, stderr[-3000:]
  after = stderr[stderr.index("Ctrl-C: saving a checkpoint"):].splitlines()
  assert len([l for l in after if l.strip() and not l.startswith(("smoke_tied:", "W"))]) == 2, (
      stderr)
  steps = _checkpoint_steps(workdir)
  assert len(steps) == 1 and steps[0] >= 2, steps
  assert not list((workdir / "checkpoints").glob("*.orbax-checkpoint-tmp*"))
  assert stderr.strip().splitlines()[-1] == (
      f"lev-train: smoke_tied stopped at step {steps[0]} (SIGINT) after a checkpoint; "
      "re-run to resume")
  interrupted = steps[0]
  proc = subprocess.Popen([sys.executable, "-m", "lev_jax.cli.train", *args,
                           f"--workdir={workdir}", "--stop_at_step=90000"], cwd=REPO,
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
  deadline = time.time() + 180
  while time.time() < deadline and _rows(workdir) < interrupted + 2:  # 2 steps trained
    time.sleep(0.05)
  proc.send_signal(signal.SIGTERM)
  _, stderr = proc.communicate(timeout=120)
  assert proc.returncode == 143, stderr[-3000:]
  assert f"resumed from step {interrupted}" in stderr, stderr[-3000:]
  steps = _checkpoint_steps(workdir)
  assert len(steps) == 2 and steps[0] == interrupted and steps[1] >= interrupted + 2, steps
  reached = steps[1]
  assert f"stopped at step {reached} (SIGTERM)" in stderr and "re-run to resume" in stderr
  # The straight run in this process: lev-train's config (smoke.py:tied with `args`'
  # overrides) trained by its trainer; the command's own start-up is what the runs above
  # check, and a subprocess here only repeated its imports (~5 CPU-s).
  from conftest import lev_train_config
  from lev_jax.trainer import Stopped, train_and_evaluate
  stopped = train_and_evaluate(lev_train_config(args[0], args[1:]), tmp_path / "straight",
                               stop_at_step=reached)
  assert isinstance(stopped, Stopped) and stopped.step == reached, stopped
  loss = lambda w: [r["train/loss"] for r in metrics(w) if r["step"] == reached]
  assert loss(workdir) == loss(tmp_path / "straight") and len(loss(workdir)) == 1
  a, b = (saved_state(w, reached)["params"] for w in (workdir, tmp_path / "straight"))
  jax.tree.map(np.testing.assert_array_equal, a, b)


@pytest.mark.parametrize("preflight,jax_platforms", [("tpu:16x4", "tpu"), ("gpu:4x8", "cuda")])
def test_the_readmes_pod_and_cluster_examples_pass_preflight(preflight, jax_platforms):
  """docs/scaling-out.md: experiments/ladder.py:leviathan_1.2b on a v5p-128 slice (16
  hosts x 4 chips) and on 4 nodes x 8 GPUs fits its mesh and batches (train and eval).
  The JAX_PLATFORMS the job would run with is checked, but no backend starts."""
  proc = lev("train", f"--config={REPO / 'experiments' / 'ladder.py'}:leviathan_1.2b",
             f"--preflight={preflight}", JAX_PLATFORMS=jax_platforms)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "preflight ok: ladder_leviathan_1.2b" in proc.stderr + proc.stdout


def test_preflight_refuses_a_jax_platforms_that_would_stop_the_job(monkeypatch):
  """Newcomer pass 7: JAX_PLATFORMS=bogus (or cuda for a TPU job) passed --preflight and
  then stopped the real job at its start."""
  from lev_jax.cli import train as train_cli
  for value, platform, expected in [
      ("bogus", "tpu", "JAX_PLATFORMS=bogus: 'bogus' is not a jax platform; expected a "
       "comma-separated list of cpu, tpu, cuda, rocm, gpu, or leave it unset for jax to "
       "choose"),
      ("cuda", "tpu", "JAX_PLATFORMS=cuda: a tpu job would not use its tpu devices (jax "
       "starts only cuda); expected it to name tpu, or leave it unset"),
      ("cpu", "gpu", "JAX_PLATFORMS=cpu: a gpu job would not use its gpu devices (jax "
       "starts only cpu); expected it to name cuda or gpu or rocm, or leave it unset"),
      ("tpu,cpu", "tpu", None), ("", "gpu", None), ("rocm", "gpu", None)]:
    monkeypatch.setenv("JAX_PLATFORMS", value)
    assert train_cli.jax_platforms_error(platform) == expected, value


def test_preflight_checks_the_workdir_it_is_given(finished_tied_run, tmp_path, capsys):
  """Newcomer pass 11: `launch/slurm.py --dry-run` said "preflight ok" for a --workdir
  holding a run with other settings, which the job refuses at its start."""
  from lev_jax.cli import train as train_cli
  c, workdir = copy_run(finished_tied_run, tmp_path / "run")
  other = c.copy_and_resolve_references()
  other.optim.lr = c.optim.lr * 2
  with pytest.raises(SystemExit) as e:
    train_cli._preflight_workdir(other, str(workdir))
  err = capsys.readouterr().err
  assert e.value.code == 2 and err.startswith(
      f"lev-train: error: {workdir} holds a run finished at step 4 with other settings: "
      "optim.lr: "), err
  assert train_cli._preflight_workdir(c, str(workdir)) == (
      f"; {workdir} already holds this run, finished at step 4: the job will only print "
      "its result")
  assert train_cli._preflight_workdir(c, str(tmp_path / "new")) == ""
  # newcomer pass 12: past the run's end (an extension) with another model, the job's
  # restore refuses it: so does the preflight
  longer = other.copy_and_resolve_references()
  longer.train.steps, longer.model.d_model = 8, 2 * c.model.d_model
  with pytest.raises(SystemExit):
    train_cli._preflight_workdir(longer, str(workdir))
  assert (f"checkpoint {workdir / 'checkpoints' / '4'} does not match this config's model "
          "shape: model.d_model: ") in capsys.readouterr().err
  longer.model.d_model = c.model.d_model
  assert train_cli._preflight_workdir(longer, str(workdir)) == ""  # it would resume
  (tmp_path / "prepared").mkdir()  # newcomer pass 12 (L04): prepared data as --workdir
  (tmp_path / "prepared" / "dataset_info.json").write_text("{}")
  with pytest.raises(SystemExit):
    train_cli._preflight_workdir(c, str(tmp_path / "prepared"))
  assert "is prepared data (lev-prepare-data's output)" in capsys.readouterr().err
  with pytest.raises(SystemExit):
    train_cli._preflight_workdir(c, str(workdir / "sub"))  # inside a run
  assert "is inside" in capsys.readouterr().err
