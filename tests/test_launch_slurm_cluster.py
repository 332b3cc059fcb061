"""launch/slurm.py against a real SLURM: a private one-node cluster (the `slurm_cluster`
fixture, tests/slurm_cluster.py) on this machine's CPUs. A tiny 20-step run submitted
for real equals a direct lev-train run bitwise; a SIGTERM from `scancel` is checkpointed,
requeued and resumed to the same result; bad lev-train arguments never reach the queue.
Skipped without slurm-wlm and munge (Debian packages; .ci/run installs them as root)."""

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

# One pytest-xdist worker runs this file (--dist loadgroup): its module fixture
# (the SLURM cluster and its runs) is built once, not once per worker.
pytestmark = pytest.mark.xdist_group("slurm")

REPO = Path(__file__).resolve().parent.parent
STEPS = 20
TINY = ["--config=experiments/smoke.py:tied", "--config.model.vocab_size=512",
        "--config.model.d_model=32", "--config.model.n_heads=2", "--config.model.n_kv_heads=2",
        "--config.model.head_dim=16", "--config.model.d_ff=64", "--config.train.seq_len=32",
        "--config.train.global_batch_size=4", "--config.eval.batches=1",
        "--config.eval.batch_size=2", "--config.optim.warmup_steps=1",
        "--config.model.n_layers=1", f"--config.train.steps={STEPS}", "--config.train.log_every=1",
        "--config.train.eval_every=5", "--config.train.checkpoint_every=5"]
FINAL = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
         "BOOT_FAIL", "DEADLINE")


def train_args(data_cache):
  return [*TINY, f"--config.data.cache_dir={data_cache}"]


@pytest.fixture(scope="module")
def direct_run(tmp_path_factory, data_cache):
  """eval.json and metrics of the same run trained directly (no SLURM): lev-train's
  config and trainer in this process (no second start-up of lev-train: the submitted
  jobs are lev-train runs, checked against this)."""
  from conftest import lev_train_config
  from lev_jax.trainer import train_and_evaluate
  workdir = tmp_path_factory.mktemp("direct") / "run"
  config, *overrides = train_args(data_cache)
  train_and_evaluate(lev_train_config(config.replace("=", f"={REPO}/", 1), overrides), workdir)
  return json.loads((workdir / "eval.json").read_text()), last_train_loss(workdir)


def last_train_loss(workdir):
  rows = [json.loads(l) for l in (workdir / "metrics.jsonl").read_text().splitlines()]
  return [r for r in rows if "train/loss" in r][-1]


def submit(cluster, workdir, args, *extra):
  """launch/slurm.py as a user runs it (from another folder); the CompletedProcess."""
  venv = [f"--venv={sys.prefix}"] if (Path(sys.prefix) / "bin" / "activate").exists() else []
  argv = [sys.executable, str(REPO / "launch" / "slurm.py"), "--nodes=1", "--gpus_per_node=0",
          "--partition=debug", "--time=10", "--signal_s=60", f"--workdir={workdir}",
          f"--chdir={REPO}", *venv, f"--env=PYTHONPATH={REPO}", *extra, "--", *args]
  return subprocess.run(argv, cwd=workdir.parent, env=cluster.env(), capture_output=True,
                        text=True, timeout=120)


def job_id(proc):
  m = re.search(r"Submitted batch job (\d+)", proc.stdout)
  assert proc.returncode == 0 and m, (proc.stdout, proc.stderr)
  return m.group(1)


def job_log(workdir, job):
  path = Path(f"{workdir}.slurm-{job}.out")
  return path.read_text(errors="replace") if path.exists() else f"(no log {path} yet)"


def state(cluster, job):
  return cluster.run("squeue", "-h", "-t", "all", "-j", job, "-o", "%T").stdout.strip()


def wait_for(cluster, job, workdir, done, what, timeout_s):
  """Polls until done(state) holds; fails naming `what` with the job's log."""
  deadline = time.monotonic() + timeout_s
  while time.monotonic() < deadline:
    s = state(cluster, job)
    if done(s):
      return s
    time.sleep(0.2)
  pytest.fail(f"job {job}: no {what} within {timeout_s} s (state {state(cluster, job)})\n"
              f"--- job log\n{job_log(workdir, job)[-4000:]}\n{cluster.logs()}", pytrace=False)


def finish(cluster, job, workdir, timeout_s=240):
  s = wait_for(cluster, job, workdir, lambda s: s in FINAL, "final state", timeout_s)
  assert s == "COMPLETED", f"job {job} ended {s}\n{job_log(workdir, job)[-4000:]}"
  return job_log(workdir, job)


def test_submitted_run_equals_a_direct_run_bitwise(slurm_cluster, direct_run, data_cache,
                                                   tmp_path):
  workdir = tmp_path / "run"
  proc = submit(slurm_cluster, workdir, train_args(data_cache))
  job = job_id(proc)
  assert "lev-train: preflight ok: smoke_tied on 1 x 1 cpu devices" in proc.stderr
  log = finish(slurm_cluster, job, workdir)
  assert f"lev-train: job {job}, restart 0, 1 nodes" in log
  evaluation, train_row = direct_run
  assert json.loads((workdir / "eval.json").read_text())["loss"] == evaluation["loss"], log
  assert last_train_loss(workdir)["train/loss"] == train_row["train/loss"]
  assert last_train_loss(workdir)["step"] == STEPS


def test_sigterm_from_scancel_checkpoints_requeues_and_resumes_to_the_same_loss(
    slurm_cluster, direct_run, data_cache, tmp_path):
  workdir = tmp_path / "run"
  job = job_id(submit(slurm_cluster, workdir, train_args(data_cache)))
  metrics = workdir / "metrics.jsonl"
  deadline = time.monotonic() + 180
  while not (metrics.exists() and metrics.read_text().strip()):  # in the training loop
    assert time.monotonic() < deadline, f"no training step in 180 s\n{job_log(workdir, job)}"
    assert state(slurm_cluster, job) in ("PENDING", "CONFIGURING", "RUNNING"), \
        job_log(workdir, job)
    time.sleep(0.05)
  slurm_cluster.run("scancel", "--signal=TERM", job)  # to the job step: lev-train
  log = finish(slurm_cluster, job, workdir)
  stopped = re.search(r"stopped at step (\d+) \(SIGTERM\) after a checkpoint", log)
  assert stopped and int(stopped.group(1)) < STEPS, f"lev-train was not stopped:\n{log}"
  assert f"requeueing job {job}" in log and f"lev-train: job {job}, restart 1" in log, log
  assert "restarts=1" in slurm_cluster.run("scontrol", "show", "job", job).stdout.lower()
  evaluation, train_row = direct_run
  assert json.loads((workdir / "eval.json").read_text())["loss"] == evaluation["loss"], log
  assert last_train_loss(workdir)["train/loss"] == train_row["train/loss"]


def test_bad_lev_train_arguments_never_reach_the_queue(slurm_cluster, data_cache, tmp_path):
  before = slurm_cluster.run("squeue", "-h", "-t", "all", "-o", "%i").stdout.split()
  workdir = tmp_path / "run"
  proc = submit(slurm_cluster, workdir, [*train_args(data_cache), "--config.train.stepz=3"])
  assert proc.returncode == 2 and proc.stderr == (
      "launch/slurm.py: error: the lev-train arguments after --: --config.train.stepz: the "
      "config has no field 'stepz' (did you mean 'steps'?)\n"), proc.stderr
  assert slurm_cluster.run("squeue", "-h", "-t", "all", "-o", "%i").stdout.split() == before
  assert not list(tmp_path.iterdir())  # no script, no workdir, no log
