"""Two processes x 4 CPU devices (jax.distributed on localhost) == one process x 8 devices.

The pair restores the single-process reference run's checkpoint of step 4 and runs
steps 5-6; one process restores that and runs 7-8. Every step's loss must equal the
uninterrupted single-process run's (rtol 1e-5: the same math, collectives across
processes summing in another order). Every run has train.steps 100000 and stops by
--stop_at_step (or a signal): the same train step (its schedule's length included) in
all of them, so each process count compiles it once for the whole file (the persistent
cache), and no final evaluation is compiled. data.host_batches = "global" makes the data stream
and its saved position the same in every process, so checkpoints move freely.

The model is tied: what crosses processes here (sharded and replicated arrays in
checkpoints, the data position, collectives) is the same for every embedding, and
LEV's own sharding is checked on 8 devices in test_sharding.py; a tied model compiles
in about half the time, in each of the 6 processes these tests start. One layer
(smoke's two: the same sharded layer twice) for the same reason.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import tiny_config

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from launch.local import launch_local  # noqa: E402

# One pytest-xdist worker runs this file (--dist loadgroup): its module fixture
# (the reference run: one process, 8 steps) is built once, not once per worker.
pytestmark = pytest.mark.xdist_group("multiprocess")


def args(workdir, cache, *extra):
  return [f"--config={REPO / 'experiments' / 'smoke.py'}:tied", f"--workdir={workdir}",
          "--config.model.vocab_size=512", "--config.model.d_model=32",
          "--config.model.n_heads=4", "--config.model.n_kv_heads=4",
          "--config.model.head_dim=8", "--config.model.d_ff=64", "--config.model.n_layers=1",
          "--config.train.seq_len=16", "--config.train.global_batch_size=8",
          "--config.train.steps=100000", "--config.train.log_every=1",
          "--config.train.checkpoint_every=4", "--config.train.eval_every=1000",
          "--config.eval.batches=1", "--config.eval.batch_size=8",
          "--config.optim.warmup_steps=1", "--config.mesh.fsdp=8",  # 8 in all (-1)
          f"--config.data.cache_dir={cache}", *extra]


def single(argv):
  env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=os.environ.get("XLA_FLAGS", "")
             + " --xla_force_host_platform_device_count=8")
  proc = subprocess.run([sys.executable, "-m", "lev_jax.cli.train", *argv], capture_output=True,
                        text=True, env=env, cwd=REPO, timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  return proc.stderr


def pair(argv, log_path):
  with open(log_path, "w") as log:
    status = launch_local(argv, num_processes=2, devices_per_process=4, out=log, cwd=str(REPO))
  text = Path(log_path).read_text()
  assert status == 0, text[-3000:]
  return text


def losses(workdir):
  rows = [json.loads(l) for l in (Path(workdir) / "metrics.jsonl").read_text().splitlines()]
  return {r["step"]: r["train/loss"] for r in rows if "train/loss" in r}


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
  """An uninterrupted single-process run of steps 1-8 on 8 devices, and the shared data
  cache."""
  tmp = tmp_path_factory.mktemp("multiprocess")
  cache = tmp / "cache"
  from lev_jax import data  # build the corpus and tokenizer cache once, not per process
  c = tiny_config("tied")
  c.model.vocab_size, c.data.cache_dir = 512, str(cache)
  data.load(c)
  single(args(tmp / "single", cache, "--stop_at_step=8"))
  return tmp, cache, losses(tmp / "single")


def _check(got, ref, steps):
  assert sorted(got) == steps, got
  np.testing.assert_allclose([got[s] for s in steps], [ref[s] for s in steps], rtol=1e-5)


def test_single_then_pair_then_single(reference, tmp_path):
  """Steps 1-4 in one process (the reference run's checkpoint 4), 5-6 in two, 7-8 in
  one: each restore crosses process counts, both ways."""
  tmp, cache, ref = reference
  workdir = tmp_path / "run"
  shutil.copytree(tmp / "single", workdir)
  shutil.rmtree(workdir / "checkpoints" / "8")  # the latest step is now 4
  log = pair(args(workdir, cache, "--stop_at_step=6"), tmp_path / "pair.log")
  assert "[p0]" in log and "[p1]" in log and "resumed from step 4" in log
  assert "unverified" not in log  # the single process's save has its manifest
  _check(losses(workdir), ref, list(range(1, 7)))  # only process 0 writes: one row a step
  stderr = single(args(workdir, cache, "--stop_at_step=8"))
  assert "resumed from step 6" in stderr
  assert "unverified" not in stderr  # the pair's save has its manifest (process 0 wrote it)
  _check(losses(workdir), ref, list(range(1, 9)))


def test_sigterm_to_one_process_stops_both_at_the_same_step(reference, tmp_path):
  """A preemption notice reaching one host only: the hosts agree and checkpoint together."""
  import socket
  import signal
  import time
  tmp, cache, _ = reference
  workdir = tmp_path / "run"
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
  procs = []
  for pid in range(2):
    env = dict(os.environ, JAX_PLATFORMS="cpu", LEV_JAX_COORDINATOR=f"127.0.0.1:{port}",
               LEV_JAX_NUM_PROCESSES="2", LEV_JAX_PROCESS_ID=str(pid),
               XLA_FLAGS=os.environ.get("XLA_FLAGS", "") +
               " --xla_force_host_platform_device_count=4")
    argv = args(workdir, cache, "--config.train.checkpoint_every=100000")
    procs.append(subprocess.Popen([sys.executable, "-m", "lev_jax.cli.train", *argv], cwd=REPO,
                                  env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                  text=True))
  metrics = workdir / "metrics.jsonl"
  deadline = time.time() + 180
  while time.time() < deadline and not (metrics.exists() and metrics.read_text().count("\n") >= 3):
    time.sleep(0.05)
  procs[1].send_signal(signal.SIGTERM)
  codes = [p.wait(timeout=120) for p in procs]
  assert codes == [143, 143], [p.stderr.read()[-2000:] for p in procs]
  steps = [int(p.name) for p in (workdir / "checkpoints").glob("*") if p.name.isdigit()]
  assert len(steps) == 1 and steps[0] >= 3


def test_an_8_device_run_evaluates_on_the_one_device_here(reference, tmp_path):
  """Issue 26.8 (MaxText #5106): lev-eval of a run whose stored config.mesh needs 8
  devices, in this 1-device process: a mesh of the devices present, as lev-sample and
  lev-export load it; perplexity with its buckets and a downstream task."""
  import jax
  from lev_jax.eval.checkpoint_eval import evaluate_checkpoint
  tmp, _, _ = reference
  assert jax.device_count() == 1
  lambada = tmp_path / "lambada.jsonl"
  lambada.write_text('{"text": "the quick brown fox"}\n')
  out = evaluate_checkpoint(tmp / "single", overrides={"eval.downstream.lambada": str(lambada)})
  assert out["step"] == 8 and np.isfinite(out["validation"]["perplexity"])
  assert out["validation"]["buckets"] and out["downstream"]["lambada"]["n"] == 1
