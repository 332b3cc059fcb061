"""launch/: dry-run output of the TPU and SLURM launchers, their input checks, the TPU
restart loop (fake gcloud), the sbatch script run against fake srun/scontrol, and the
local launcher (real processes, and once a real 2-process jax.distributed start-up)."""

import io
import os
import re
import shlex
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from launch import common, local, slurm, tpu  # noqa: E402

V5P = ["--name=lev-v5p", "--zone=us-east5-a", "--accelerator_type=v5p-128", "--queued",
       "--spot", "--workdir=gs://bucket/runs/ladder", "--max_restarts=7", "--dry-run",
       "--no-preflight"]
TRAIN = ["--config=experiments/ladder.py:leviathan_1.2b", "--config.train.steps=20000"]
GPU = ["--nodes=4", "--gpus_per_node=8", "--partition=gpu", "--time=24:00:00",
       "--workdir=/shared/runs/ladder", "--chdir=/shared/lev_jax", "--dry-run", "--no-preflight"]


def run(main, argv):
  out = io.StringIO()
  status = main(argv, out=out)
  return status, out.getvalue()


def error(main, argv, capsys):
  status, out = run(main, argv)
  err = capsys.readouterr().err
  assert status == 2, (out, err)
  assert "Traceback" not in err and err.count("\n") == 1, err
  return err


# --- TPU -------------------------------------------------------------------------------

def test_tpu_dry_run_v5p_128_queued_spot():
  status, out = run(tpu.main, [*V5P, "--", *TRAIN])
  assert status == 0
  cmds = [l for l in out.splitlines() if not l.startswith("#")]
  where = "--zone=us-east5-a"
  train = ("cd ~/lev_jax && .venv/bin/lev-train --workdir=gs://bucket/runs/ladder "
           "--config=experiments/ladder.py:leviathan_1.2b --config.train.steps=20000")
  assert cmds[0] == f"gcloud compute tpus tpu-vm describe lev-v5p {where} '--format=value(state)'"
  assert cmds[1] == (f"gcloud compute tpus queued-resources describe lev-v5p {where} "
                     "'--format=value(state.state)'")
  assert cmds[2] == (f"gcloud compute tpus queued-resources create lev-v5p {where} "
                     "--node-id=lev-v5p --accelerator-type=v5p-128 "
                     "--runtime-version=v2-alpha-tpuv5 --spot")
  assert cmds[3] == cmds[1]  # polled until ACTIVE
  assert cmds[4].startswith("tar -czf ") and cmds[4].endswith(f"-C {REPO} .")
  assert cmds[5].startswith("gcloud compute tpus tpu-vm scp ") and cmds[5].endswith(
      f"lev-v5p:lev_jax.tar.gz {where} --worker=all")
  ssh = f"gcloud compute tpus tpu-vm ssh lev-v5p {where} --worker=all "
  assert cmds[6].startswith(ssh + "'--command=rm -rf ~/lev_jax && mkdir -p ~/lev_jax && tar")
  assert cmds[7].startswith(ssh) and 'pip install -q -e ".[gcs]" "jax[tpu]==' in cmds[7]
  assert cmds[8].startswith(ssh) and "setsid nohup bash -c" in cmds[8]
  remote = shlex.split(shlex.split(cmds[8])[-1].split("=", 1)[1])
  assert train in remote[remote.index("-c") + 1]  # inside the detached bash -c
  assert cmds[9].startswith(ssh) and "tail -n +1 -F train.log" in cmds[9]
  assert cmds[10] == cmds[0]
  assert cmds[11] == (f"gcloud compute tpus queued-resources delete lev-v5p {where} "
                      "--force --quiet")
  assert len(cmds) == 12
  assert all("--worker=all" in c for c in cmds if " ssh " in c or " scp " in c)
  # One ssh --worker=all starts lev-train: the same command line on all 16 workers, with
  # no per-worker flags (JAX's Cloud TPU auto-detection finds the other workers).
  runs = [c for c in cmds if "lev-train" in c]
  assert runs == [cmds[8]] and "--process_id" not in runs[0]
  assert "# launch/tpu.py: v5p-128 (64 chips, 16 hosts), spot queued resource" in out
  assert "at most 7 restarts" in out


def test_tpu_dry_run_tpu_vm_create_preemptible_git_repo():
  status, out = run(tpu.main, ["--name=t1", "--zone=us-central2-b", "--accelerator_type=v4-32",
                               "--preemptible", "--project=proj",
                               "--repo=https://github.com/me/lev_jax.git",
                               "--workdir=gs://b/r", "--dry-run", "--no-preflight", "--",
                               "--config=x.py:tied"])
  assert status == 0
  assert ("gcloud compute tpus tpu-vm create t1 --zone=us-central2-b --project=proj "
          "--accelerator-type=v4-32 --version=tpu-ubuntu2204-base --preemptible") in out
  assert "git clone --depth=1 https://github.com/me/lev_jax.git ~/lev_jax" in out
  assert "gcloud compute tpus tpu-vm delete t1 --zone=us-central2-b --project=proj --quiet" in out
  assert "queued-resources" not in out


def test_tpu_single_host_allows_local_workdir_with_a_warning():
  status, out = run(tpu.main, ["--name=one", "--zone=us-east5-a", "--accelerator_type=v5p-8",
                               "--workdir=runs/x", "--dry-run", "--no-preflight"])
  assert status == 0 and "warning: --workdir=runs/x is on the TPU VM's disk" in out


def _set(argv, flag):
  """argv with `flag` (--NAME=VALUE) in place of its --NAME (the launchers refuse a flag
  given twice), or added."""
  name = flag.split("=", 1)[0] + "="
  return [flag if a.startswith(name) else a for a in argv] + (
      [] if any(a.startswith(name) for a in argv) else [flag])


@pytest.mark.parametrize("argv,needle", [
    (V5P[1:], "--name is required"),
    (["--name=Bad_Name", *V5P[1:]], "--name=Bad_Name: expected lowercase"),
    ([*V5P[:1], *V5P[2:]], "--zone is required"),
    ([*V5P[:2], *V5P[3:]], "--accelerator_type is required"),
    (_set(V5P, "--accelerator_type=v5p-100"), "--accelerator_type=v5p-100: v5p-N counts "
     "TensorCores, N must be a multiple of 8"),
    (_set(V5P, "--accelerator_type=v7-8"), "--accelerator_type=v7-8: unknown TPU type; expected "
     "v2-N, v3-N, v4-N or v5p-N"),
    (_set(V5P, "--accelerator_type=v6e-12"), "--accelerator_type=v6e-12: expected"),
    (_set(V5P, "--workdir=/home/me/runs"), "--workdir=/home/me/runs: v5p-128 (64 chips, 16 hosts) "
     "needs a gs:// workdir"),
    ([x for x in V5P if not x.startswith("--workdir")], "--workdir is required for v5p-128"),
    ([*V5P, "--preemptible"], "--spot and --preemptible: choose one"),
    ([*[x for x in V5P if x != "--spot"], "--preemptible"], "--preemptible with --queued"),
    (_set(V5P, "--repo=/nonexistent/dir"), "--repo=/nonexistent/dir: not a directory"),
    ([*V5P, "--", "--workdir=gs://b/other"], "--workdir after --"),
    (_set(V5P, "--max_restarts=-1"), "--max_restarts=-1: expected 0 or more"),
    ([*V5P, "--reserved"], "--reserved with --spot or --preemptible: choose one"),
    (_set(V5P, "--network=a b"), "--network='a b': expected a name or a path"),
    (_set(V5P, "--service_account=me"), "--service_account='me': expected an e-mail address"),
    ([*V5P, "--bogus"], "unrecognized arguments: --bogus"),
])
def test_tpu_bad_inputs(argv, needle, capsys):
  err = error(tpu.main, argv, capsys)
  assert err.startswith("launch/tpu.py: error: ") and needle in err, err


class FakeGcloud:
  """Answers describes from scripted states and lev-train runs from scripted statuses."""

  def __init__(self, states, statuses, qstates=()):
    self.states, self.statuses, self.qstates = list(states), list(statuses), list(qstates)
    self.log = []

  def note(self, message):
    pass

  def run(self, argv):
    line = " ".join(argv)
    kind = ("start" if "setsid nohup" in line else "train" if "tail -n +1 -F" in line
            else "tar" if argv[0] == "tar" else " ".join(argv[3:5]))
    self.log.append(kind)
    return self.statuses.pop(0) if kind == "train" else 0

  def query(self, argv):
    queued = "queued-resources" in argv
    self.log.append("describe-qr" if queued else "describe")
    return (self.qstates if queued else self.states).pop(0)

  def sleep(self, seconds):
    self.log.append("sleep")


def tpu_job(*extra):
  """V5P's job with `extra` flags (a flag of V5P given again replaces it) and args."""
  argv = list(V5P)
  for i, flag in enumerate(extra):
    if flag == "--":
      argv += extra[i:]
      break
    argv = _set(argv, flag) if "=" in flag else [*argv, flag]
  return tpu.job_from_argv(argv)[0]


def test_tpu_restarts_a_preempted_tpu_and_reruns():
  job = tpu_job("--", *TRAIN)
  fake = FakeGcloud(states=[None, "PREEMPTED"], statuses=[255, 0],
                    qstates=[None, "WAITING_FOR_RESOURCES", "ACTIVE", "ACTIVE"])
  assert tpu.launch(job, fake) == 0
  prepare = ["tar", "tpu-vm scp", "tpu-vm ssh", "tpu-vm ssh"]
  assert fake.log == [
      "describe", "describe-qr", "queued-resources create", "describe-qr", "sleep",
      "describe-qr", *prepare, "start", "train",
      "describe", "queued-resources delete", "queued-resources create", "describe-qr",
      *prepare, "start", "train"]


def test_tpu_reuses_a_ready_tpu_and_stops_on_a_real_failure():
  fake = FakeGcloud(states=["READY", "READY"], statuses=[1])
  assert tpu.launch(tpu_job(), fake) == 1
  assert fake.log == ["describe", "tar", "tpu-vm scp", "tpu-vm ssh", "tpu-vm ssh",
                      "start", "train", "describe"]


def test_tpu_reruns_after_sigterm_checkpoint_on_a_ready_tpu_until_max_restarts():
  fake = FakeGcloud(states=["READY"] * 4, statuses=[143, 143, 143])
  assert tpu.launch(tpu_job("--max_restarts=2"), fake) == 143
  assert fake.log.count("train") == 3 and "queued-resources create" not in fake.log
  assert fake.log.count("start") == 3


def test_tpu_reattaches_after_a_dropped_ssh_without_restarting_lev_train():
  fake = FakeGcloud(states=["READY", "READY", "READY"], statuses=[255, 255, 0])
  assert tpu.launch(tpu_job(), fake) == 0
  assert fake.log[-6:] == ["start", "train", "describe", "train", "describe", "train"]
  assert fake.log.count("start") == 1 and fake.log.count("train") == 3


def test_tpu_runs_gcloud_for_real_with_a_fake_gcloud(tmp_path, monkeypatch):
  log = tmp_path / "gcloud.log"
  gcloud = tmp_path / "gcloud"
  gcloud.write_text(textwrap.dedent(f"""\
      #!/bin/bash
      echo "$*" >> {log}
      case "$*" in
        *"tpu-vm describe"*) echo "ERROR: (gcloud) NOT_FOUND: Resource was not found" >&2
                             exit 1;;
      esac
      """))
  gcloud.chmod(0o755)
  monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
  status = tpu.main(["--name=one", "--zone=us-east5-a", "--accelerator_type=v5p-8", "--spot",
                     "--no-preflight",
                     "--repo=https://example.com/lev_jax.git", "--", "--config=c.py:tied"])
  assert status == 0
  calls = log.read_text().splitlines()
  assert [c.split(" --")[0] for c in calls] == [
      "compute tpus tpu-vm describe one", "compute tpus tpu-vm create one",
      "compute tpus tpu-vm ssh one", "compute tpus tpu-vm ssh one", "compute tpus tpu-vm ssh one",
      "compute tpus tpu-vm ssh one"]
  assert calls[1].endswith("--accelerator-type=v5p-8 --version=v2-alpha-tpuv5 --spot")
  assert "--worker=all --command=cd ~/lev_jax && rm -f train.status" in calls[-2]
  assert "cd ~/lev_jax && .venv/bin/lev-train --config=c.py:tied" in calls[-2]
  assert "tail -n +1 -F train.log" in calls[-1]


def remote_command(argv):
  """The --command=... of a `gcloud ... ssh` argv: what each worker runs with bash."""
  return next(a for a in argv if a.startswith("--command=")).split("=", 1)[1]


def test_tpu_worker_trains_detached_with_a_prefixed_log_and_a_status(tmp_path):
  """The start and attach commands under bash, as on a worker (HOME=tmp, a fake
  lev-train and metadata server): start returns at once, attach streams
  `[worker 3] ` lines and exits with lev-train's status."""
  home = tmp_path / "home"
  (home / "lev_jax" / ".venv" / "bin").mkdir(parents=True)
  lev_train = home / "lev_jax" / ".venv" / "bin" / "lev-train"
  lev_train.write_text('#!/bin/bash\necho "step 1 $*"; /bin/sleep 2; echo "stopped" >&2; '
                       'exit 143\n')
  lev_train.chmod(0o755)
  bin_ = fake_program(tmp_path, "curl", "echo 3")
  fake_program(tmp_path, "sleep", '[ "$1" = 5 ] && exec /bin/sleep 0.1; exec /bin/sleep "$@"')
  env = {**os.environ, "HOME": str(home), "PATH": f"{bin_}:{os.environ['PATH']}"}
  job = tpu_job("--", "--config=c.py:x")
  proc = subprocess.run(["bash", "-c", remote_command(job.start())], env=env, timeout=30)
  assert proc.returncode == 0  # returned while lev-train runs on, detached:
  assert not (home / "lev_jax" / "train.status").exists()
  proc = subprocess.run(["bash", "-c", remote_command(job.attach())], env=env, timeout=60,
                        capture_output=True, text=True)
  assert proc.returncode == 143
  log = (home / "lev_jax" / "train.log").read_text().splitlines()
  assert log == ["[worker 3] step 1 --workdir=gs://bucket/runs/ladder --config=c.py:x",
                 "[worker 3] stopped"]
  assert proc.stdout.splitlines() == log
  assert (home / "lev_jax" / "train.status").read_text().strip() == "143"


def test_tpu_install_waits_for_the_dpkg_lock_and_retries(tmp_path):
  """The install command under bash with a fake sudo whose apt-get fails twice on the
  dpkg lock, then installs a fake python3.42; pip fails once. Sleeps are skipped."""
  home = tmp_path / "home"
  (home / "lev_jax").mkdir(parents=True)
  bin_ = fake_program(tmp_path, "sleep", "exit 0")
  calls = tmp_path / "calls"
  fake_program(tmp_path, "sudo", textwrap.dedent(f"""\
      echo "$*" >> {calls}
      n=$(grep -c 'install' {calls})
      [[ "$*" == *install* && $n -lt 3 ]] && {{ echo "E: Could not get lock" >&2; exit 100; }}
      [[ "$*" == *install* ]] && cp {bin_}/py_template {bin_}/python3.42
      exit 0"""))
  pip = fake_program(tmp_path, "pip_template", f'echo "$*" >> {tmp_path}/pip; '
                     f'[ $(wc -l < {tmp_path}/pip) -eq 1 ] && exit 1; exit 0') / "pip_template"
  fake_program(tmp_path, "py_template", f"mkdir -p .venv/bin && cp {pip} .venv/bin/pip")
  env = {**os.environ, "HOME": str(home), "PATH": f"{bin_}:/usr/bin:/bin"}
  job = tpu_job("--python=python3.42")  # a Python no machine has: apt installs it
  proc = subprocess.run(["bash", "-c", remote_command(job.install())], env=env, timeout=60,
                        capture_output=True, text=True, cwd=home)
  assert proc.returncode == 0, proc.stderr
  apt = calls.read_text().splitlines()
  assert apt[0] == "apt-get -o DPkg::Lock::Timeout=600 update -qq"
  assert apt[1:] == ["apt-get -o DPkg::Lock::Timeout=600 install -y -qq python3.42 "
                     "python3.42-venv"] * 3
  pip = (tmp_path / "pip").read_text().splitlines()
  assert pip == ["install -q --upgrade pip", "install -q --upgrade pip",
                 f'install -q -e .[gcs] jax[tpu]=={tpu.JAX_VERSION}']


def test_tpu_jax_pin_is_builds_tested_version():
  build = (REPO / "BUILD.md").read_text()
  tested = re.search(r"^\| jax / jaxlib \| ([0-9.]+) \|$", build, re.M).group(1)
  assert tpu.JAX_VERSION == tested
  assert f"'jax[tpu]=={tested}'" in build  # BUILD.md's own TPU install line


def test_tpu_passes_network_service_account_and_reserved_to_create():
  extra = ["--network=vpc1", "--subnetwork=projects/p/regions/us-east5/subnetworks/s1",
           "--service_account=tpu@p.iam.gserviceaccount.com"]
  want = ("--network=vpc1 --subnetwork=projects/p/regions/us-east5/subnetworks/s1 "
          "--service-account=tpu@p.iam.gserviceaccount.com")
  status, out = run(tpu.main, [*[a for a in V5P if a != "--spot"], *extra, "--reserved"])
  assert status == 0
  assert ("--runtime-version=v2-alpha-tpuv5 " + want + " --reserved\n") in out
  status, out = run(tpu.main, [*[a for a in V5P if a not in ("--queued", "--spot")], *extra])
  assert status == 0 and ("--version=v2-alpha-tpuv5 " + want + "\n") in out


def test_tpu_logs_prints_every_workers_log(capsys):
  status, out = run(tpu.main, ["logs", "--name=lev-v5p", "--zone=us-east5-a", "--project=p",
                               "--dry-run"])
  assert status == 0 and out == ("gcloud compute tpus tpu-vm ssh lev-v5p --zone=us-east5-a "
                                 "--project=p --worker=all '--command=cat ~/lev_jax/train.log'\n")
  err = error(tpu.main, ["logs", "--zone=us-east5-a"], capsys)
  assert err.startswith("launch/tpu.py: error: --name is required")


# --- SLURM -----------------------------------------------------------------------------

def test_slurm_dry_run_4_nodes_x_8_gpus(tmp_path):
  status, script = run(slurm.main, [*GPU, "--venv=/shared/venv", "--", *TRAIN])
  assert status == 0
  lines = script.splitlines()
  assert lines[0] == "#!/bin/bash"
  for line in ["#SBATCH --nodes=4", "#SBATCH --ntasks-per-node=1", "#SBATCH --gpus-per-node=8",
               "#SBATCH --partition=gpu", "#SBATCH --time=24:00:00",
               "#SBATCH --signal=TERM@120", "#SBATCH --requeue", "#SBATCH --open-mode=append",
               "#SBATCH --chdir=/shared/lev_jax",
               "#SBATCH --output=/shared/runs/ladder.slurm-%j.out",
               "source /shared/venv/bin/activate",
               'COORDINATOR_HOST=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
               'export COORDINATOR="$COORDINATOR_HOST:$((SLURM_JOB_ID % 4096 + 61440))"',
               "srun --ntasks-per-node=1 --gpus-per-node=8 bash -c 'exec lev-train "
               '--coordinator_address="$COORDINATOR" --num_processes="$SLURM_NTASKS" '
               '--process_id="$SLURM_PROCID" --workdir=/shared/runs/ladder '
               "--config=experiments/ladder.py:leviathan_1.2b --config.train.steps=20000'",
               'if [ "$status" -eq 143 ]; then', '    scontrol requeue "$SLURM_JOB_ID"',
               'exit "$status"']:
    assert line in lines, line
  path = tmp_path / "job.sbatch"
  path.write_text(script)
  assert subprocess.run(["bash", "-n", str(path)]).returncode == 0


def test_slurm_script_runs_lev_train_with_coordinator_and_requeues_on_143(tmp_path):
  """The generated script under bash, with fake srun / scontrol / lev-train on PATH."""
  status, script = run(slurm.main, [*_set(GPU, f"--workdir={tmp_path}/run"), "--", "--config=c.py:x"])
  assert status == 0
  bin_ = tmp_path / "bin"
  bin_.mkdir()
  fakes = {
      # srun: drop its own options, run the task as process 2 of 4 (what srun exports)
      "srun": 'while [[ $1 == --* ]]; do shift; done; SLURM_NTASKS=4 SLURM_PROCID=2 "$@"',
      "scontrol": f'if [ "$1" = show ]; then printf "gpu017\\ngpu018\\n"; '
                  f'else echo "$@" >> {tmp_path}/scontrol.log; fi',
      "lev-train": f'echo "$@" > {tmp_path}/args; exit 143',
  }
  for name, body in fakes.items():
    (bin_ / name).write_text(f"#!/bin/bash\n{body}\n")
    (bin_ / name).chmod(0o755)
  (tmp_path / "job.sbatch").write_text(script)
  env = {**os.environ, "PATH": f"{bin_}:{os.environ['PATH']}", "SLURM_JOB_ID": "1234",
         "SLURM_JOB_NODELIST": "gpu[017-020]", "SLURM_JOB_NUM_NODES": "4"}
  proc = subprocess.run(["bash", str(tmp_path / "job.sbatch")], env=env, capture_output=True,
                        text=True, timeout=30)
  assert proc.returncode == 143, proc.stderr
  port = 1234 % 4096 + 61440
  assert (tmp_path / "args").read_text().split() == [
      f"--coordinator_address=gpu017:{port}", "--num_processes=4", "--process_id=2",
      f"--workdir={tmp_path}/run", "--config=c.py:x"]
  assert (tmp_path / "scontrol.log").read_text() == "requeue 1234\n"
  assert "requeueing job 1234" in proc.stderr


def test_slurm_no_requeue():
  status, script = run(slurm.main, [*GPU, "--no-requeue", "--port=29500"])
  assert status == 0
  assert "#SBATCH --no-requeue" in script and "scontrol requeue" not in script
  assert 'export COORDINATOR="$COORDINATOR_HOST:29500"' in script


def test_slurm_writes_the_script_next_to_the_workdir_and_submits_it(tmp_path, monkeypatch):
  sbatch = tmp_path / "bin" / "sbatch"
  sbatch.parent.mkdir()
  sbatch.write_text(f'#!/bin/bash\necho "$@" > {tmp_path}/sbatch.args\n')
  sbatch.chmod(0o755)
  monkeypatch.setenv("PATH", f"{sbatch.parent}:{os.environ['PATH']}")
  workdir = tmp_path / "runs" / "ladder"
  assert slurm.main(["--nodes=2", f"--workdir={workdir}", "--no-preflight", "--",
                     "--config=c.py:x"]) == 0
  script = tmp_path / "runs" / "ladder.sbatch"
  assert (tmp_path / "sbatch.args").read_text().strip() == str(script)
  assert "#SBATCH --nodes=2" in script.read_text() and not workdir.exists()


@pytest.mark.parametrize("argv,needle", [
    (["--nodes=0", *GPU[1:]], "--nodes=0: expected at least 1"),
    (GPU[1:], "--nodes is required"),
    (_set(GPU, "--gpus_per_node=-1"), "--gpus_per_node=-1: expected 0 (CPU nodes) or more"),
    (_set(GPU, "--cpus_per_task=0"), "--cpus_per_task=0: expected at least 1"),
    (_set(GPU, "--mem=lots"), "--mem=lots: expected a size per node such as 200G"),
    (_set(GPU, "--qos=a;b"), "--qos='a;b': expected letters"),
    (_set(GPU, "--constraint=a100 ib"), "--constraint='a100 ib': expected node features"),
    (_set(GPU, "--sbatch_line=--reservation=big"), "--sbatch_line='--reservation=big': expected "
     "one line starting with '#SBATCH --'"),
    (_set(GPU, "--sbatch_line=#SBATCH --a\n#SBATCH --b"), "expected one line"),
    # newcomer pass 16 (L27): a second --time silently replaced the user's --time
    (_set(GPU, "--sbatch_line=#SBATCH --time=01:00:00"), "--sbatch_line='#SBATCH "
     "--time=01:00:00': the script sets --time itself (--time); a second setting would "
     "silently win: give it once, by that flag"),
    (_set(GPU, "--sbatch_line=#SBATCH --no-requeue"), "sets --requeue itself"),
    (_set(GPU, "--sbatch_line=#SBATCH --gres=gpu:8"), "sets --gpus-per-node itself "
     "(--gpus_per_node)"),  # the same setting under another option
    (_set(GPU, "--sbatch_line=#SBATCH --job=x"), "sets --job-name itself"),  # abbreviated
    (_set(GPU, "--sbatch_line=#SBATCH --=x"), "expected one line starting with '#SBATCH "
     "--' and an option's name"),  # newcomer pass 17 (S35: an IndexError)
    (_set(GPU, "--sbatch_line=#SBATCH --"), "and an option's name"),
    # newcomer pass 18 (N14): a line that would replace or multiply the script
    (_set(GPU, "--sbatch_line=#SBATCH --wrap='hostname'"), "--sbatch_line=\"#SBATCH "
     "--wrap='hostname'\": not allowed in this launcher's script: sbatch would run that "
     "command instead of the script's lev-train"),
    (_set(GPU, "--sbatch_line=#SBATCH --ar=0-3"), "would train into the one --workdir"),
    (_set(GPU, "--sbatch_line=#SBATCH --wr=hostname"), "instead of the script's lev-train"),
    (_set(GPU, "--env=NCCL_DEBUG"), "--env='NCCL_DEBUG': expected KEY=VALUE"),
    (_set(GPU, "--env=1X=2"), "--env='1X=2': expected KEY=VALUE with KEY letters"),
    (_set(GPU, "--env=COORDINATOR=h:1"), "COORDINATOR is set by the script itself"),
    (_set(GPU, "--time=tomorrow"), "--time=tomorrow: expected minutes, MM:SS, HH:MM:SS"),
    (_set(GPU, "--time=1"), "--signal_s=120: must be shorter than --time=1 (60 s)"),
    ([x for x in GPU if not x.startswith("--workdir")], "--workdir is required"),
    (_set(GPU, "--workdir=gs://b/r"), "expected a shared filesystem path"),
    ([*GPU, "--", "--process_id=3"], "--process_id after --: launch/slurm.py sets it"),
    (_set(GPU, "--partition=a b"), "--partition='a b': expected letters"),
    # newcomer pass 13: an unset $VENV meant no virtualenv; lev-train's flags before --
    (_set(GPU, "--venv="), "--venv is empty (an unset shell variable?)"),
    (_set(GPU, "--chdir="), "--chdir is empty (an unset shell variable?)"),
    ([*GPU, "--env=A=1", "--env=A=2"], "--env='A=2': A is given twice (A=1 too); give it once"),
    # newcomer pass 15 (K09, K10, K14): its own flags after -- or given twice
    ([*GPU, "--", "--venv=/v"], "--venv after --: a launch/slurm.py flag; put it before --"),
    ([*GPU, "--nodes=3"], "--nodes given twice (--nodes=4, --nodes=3); give it once"),
    (_set(GPU, "--config=c.py:x"), "unrecognized arguments: "
     "--config=c.py:x: the arguments for the program go after --, e.g. launch/slurm.py "
     "[flags] -- --config=c.py:x"),
])
def test_slurm_bad_inputs(argv, needle, capsys):
  err = error(slurm.main, argv, capsys)
  assert err.startswith("launch/slurm.py: error: ") and needle in err, err


def test_slurm_cpu_nodes_use_all_cpus_and_jax_on_cpu(tmp_path):
  status, script = run(slurm.main, [*_set(GPU, "--gpus_per_node=0"), "--", *TRAIN])
  assert status == 0
  lines = script.splitlines()
  assert "gpu" not in script.replace("--partition=gpu", "")  # no GPU request anywhere
  for line in ["#SBATCH --exclusive", "export JAX_PLATFORMS=cpu",
               "# Generated by launch/slurm.py: lev-train on 4 CPU nodes,"]:
    assert line in lines, line
  srun = next(l for l in lines if l.startswith("srun "))
  assert srun.startswith('srun --ntasks-per-node=1 --cpus-per-task="$SLURM_CPUS_ON_NODE" bash')
  status, script = run(slurm.main, [*_set(GPU, "--gpus_per_node=0"), "--cpus_per_task=16"])
  lines = script.splitlines()
  assert "#SBATCH --cpus-per-task=16" in lines and "#SBATCH --exclusive" not in lines
  assert any(l.startswith("srun --ntasks-per-node=1 --cpus-per-task=16 bash") for l in lines)
  path = tmp_path / "job.sbatch"
  path.write_text(script)
  assert subprocess.run(["bash", "-n", str(path)]).returncode == 0


def test_slurm_passes_cluster_options_and_environment_through(tmp_path):
  status, script = run(slurm.main, [
      *GPU, "--account=proj", "--qos=high", "--mem=200G", "--exclusive",
      "--constraint=a100&ib", "--cpus_per_task=32",
      "--sbatch_line=#SBATCH --reservation=big", "--sbatch_line=#SBATCH --mail-type=END",
      "--env=NCCL_DEBUG=WARN", "--env=XLA_FLAGS=--xla_gpu_enable_latency_hiding_scheduler=true "
      "--xla_dump_to='/tmp/x y'", "--env=EMPTY=", "--", *TRAIN])
  assert status == 0
  lines = script.splitlines()
  sbatch = [l for l in lines if l.startswith("#SBATCH ")]
  for option in ["--account=proj", "--qos=high", "--mem=200G", "--exclusive",
                 "--constraint=a100&ib", "--cpus-per-task=32", "--gpus-per-node=8",
                 "--reservation=big", "--mail-type=END"]:
    assert f"#SBATCH {option}" in sbatch, option
  assert sbatch[-2:] == ["#SBATCH --reservation=big", "#SBATCH --mail-type=END"]
  assert "JAX_PLATFORMS" not in script  # GPU nodes: JAX picks the GPUs
  # an option the script writes only when its flag is given passes without that flag
  # (newcomer pass 16: only the options the script writes are refused in --sbatch_line)
  status, script = run(slurm.main, [*[a for a in GPU if not a.startswith("--partition")],
                                    "--sbatch_line=#SBATCH --partition=big", "--", *TRAIN])
  assert status == 0 and script.count("#SBATCH --partition=") == 1
  exports = [l for l in lines if l.startswith("export ")]
  srun = next(i for i, l in enumerate(lines) if l.startswith("srun "))
  assert all(lines.index(e) < srun for e in exports)
  assert lines[srun].startswith("srun --ntasks-per-node=1 --gpus-per-node=8 --cpus-per-task=32 ")
  # The exports, run by bash, give lev-train exactly the values given.
  prog = "\n".join([*exports[:3], 'printf "%s|" "$NCCL_DEBUG" "$XLA_FLAGS" "$EMPTY"'])
  out = subprocess.run(["bash", "-c", prog], capture_output=True, text=True).stdout
  assert out == ("WARN|--xla_gpu_enable_latency_hiding_scheduler=true --xla_dump_to='/tmp/x y'"
                 "||")


def test_scripts_run_from_the_command_line():
  for script, argv in [("tpu.py", [*V5P, "--", *TRAIN]), ("slurm.py", [*GPU, "--", *TRAIN]),
                       ("local.py", ["--num_processes=2", "--dry-run"])]:
    proc = subprocess.run([sys.executable, str(REPO / "launch" / script), *argv],
                          capture_output=True, text=True, timeout=60, cwd="/")
    assert proc.returncode == 0 and proc.stdout, proc.stderr
  proc = subprocess.run([sys.executable, str(REPO / "launch" / "tpu.py"), "--dry-run"],
                        capture_output=True, text=True, timeout=60)
  assert proc.returncode == 2 and proc.stderr == (
      "launch/tpu.py: error: --name is required: the TPU VM (and queued resource) name, "
      "e.g. --name=lev-v5p-128\n")


# --- pre-flight: lev-train's own checks before anything is written or submitted ----------

def fake_program(tmp_path, name, body):
  """An executable `name` in tmp_path/bin running bash `body`; returns the bin folder."""
  bin_ = tmp_path / "bin"
  bin_.mkdir(exist_ok=True)
  (bin_ / name).write_text(f"#!/bin/bash\n{body}\n")
  (bin_ / name).chmod(0o755)
  return bin_


def test_slurm_preflight_stops_a_bad_variant_before_writing_or_submitting(
    tmp_path, monkeypatch, capsys):
  bin_ = fake_program(tmp_path, "sbatch", f"echo called > {tmp_path}/sbatch.called")
  monkeypatch.setenv("PATH", f"{bin_}:{os.environ['PATH']}")
  monkeypatch.chdir(tmp_path)  # the config path is relative to --chdir, not to here
  workdir = tmp_path / "runs" / "r"
  status = slurm.main(["--nodes=2", "--gpus_per_node=0", f"--workdir={workdir}",
                       f"--chdir={REPO}", "--", "--config=experiments/smoke.py:nope"])
  err = capsys.readouterr().err
  assert status == 2 and err.count("\n") == 1 and "Traceback" not in err, err
  assert err == ("launch/slurm.py: error: the lev-train arguments after --: "
                 "experiments/smoke.py: unknown variant 'nope'; expected one of tied, untied, "
                 "leviathan\n")
  assert not (tmp_path / "sbatch.called").exists() and not (tmp_path / "runs").exists()


def test_slurm_preflight_gives_lev_train_the_workdir(tmp_path, monkeypatch, capsys):
  """Newcomer pass 11: the preflight said ok for a --workdir holding another run, which
  the job refuses at its start; lev-train's --preflight now checks the workdir it is
  given (tests/test_cli_train.py)."""
  seen = []

  def fake_check(argv, *args, **kwargs):
    seen.append(argv)
    return subprocess.CompletedProcess(argv, 0, "lev-train: preflight ok: x\n", "")
  monkeypatch.setattr(common, "_run_check", fake_check)
  workdir = tmp_path / "runs" / "r"
  status = slurm.main(["--nodes=2", "--gpus_per_node=0", f"--workdir={workdir}",
                       f"--chdir={REPO}", "--dry-run", "--", "--config=experiments/smoke.py:tied"])
  assert status == 0, capsys.readouterr().err
  assert f"--workdir={workdir}" in seen[0] and "--config=experiments/smoke.py:tied" in seen[0]


def test_tpu_preflight_stops_a_mesh_that_does_not_fit_the_slice(tmp_path, monkeypatch, capsys):
  bin_ = fake_program(tmp_path, "gcloud", f"echo \"$*\" >> {tmp_path}/gcloud.log")
  monkeypatch.setenv("PATH", f"{bin_}:{os.environ['PATH']}")
  # v5p-8: one host, 4 chips = 4 JAX devices; a 3-way tensor axis cannot divide them.
  status = tpu.main(["--name=one", "--zone=us-east5-a", "--accelerator_type=v5p-8", "--",
                     "--config=experiments/smoke.py:tied", "--config.mesh.tensor=3"])
  err = capsys.readouterr().err
  assert status == 2 and err == (
      "launch/tpu.py: error: the lev-train arguments after --: config.mesh (data, fsdp, "
      "tensor) = (1, -1, 3) does not divide 4 devices\n"), err
  assert not (tmp_path / "gcloud.log").exists()


@pytest.mark.skipif(__import__("importlib").util.find_spec("libtpu") is None,
                    reason="libtpu is not installed (pip install -e '.[tpu-aot]')")
def test_tpu_compile_preflight_stops_a_job_that_does_not_fit(tmp_path, monkeypatch, capsys):
  """--compile: lev-compile of the lev-train config for the slice, before any gcloud
  command; a step over the chips' HBM is one line and nothing is created."""
  bin_ = fake_program(tmp_path, "gcloud", f"echo \"$*\" >> {tmp_path}/gcloud.log")
  monkeypatch.setenv("PATH", f"{bin_}:{os.environ['PATH']}")
  base = ["--name=one", "--zone=us-east5-a", "--accelerator_type=v5litepod-4",
          "--no-preflight", "--compile", "--dry-run", "--", "--config=experiments/smoke.py:tied"]
  # (A config that fits prints lev-compile's summary and goes on: tests/test_cli_compile.py
  # covers the compile itself; here, the launcher's refusal. The eval batch is as large
  # as the train batch: XLA:TPU gives up on both steps early, where an eval step that
  # fits would be compiled to the end, 9 of the test's 16 CPU-s.)
  status, _ = run(tpu.main, [*base, "--config.model.vocab_size=65536",
                             "--config.model.n_layers=1", "--config.train.seq_len=512",
                             "--config.train.global_batch_size=1024",
                             "--config.eval.batch_size=1024"])
  err = capsys.readouterr().err
  assert status == 2 and err.startswith("launch/tpu.py: error: compile pre-flight: the train "
                                        "step of smoke_tied does not fit v5litepod-4"), err
  assert err.count("\n") == 1 and not (tmp_path / "gcloud.log").exists()


def test_preflight_without_lev_jax_says_which_python_and_how_to_skip(tmp_path):
  python = fake_program(tmp_path, "python", "echo \"ModuleNotFoundError: No module named "
                        "'absl'\" >&2; exit 1") / "python"
  with pytest.raises(common.LaunchError) as e:
    common.preflight(["--config=c.py:x"], "gpu", 2, 8, python=str(python))
  assert str(e.value) == (f"pre-flight: {python} cannot run lev-train (ModuleNotFoundError: "
                          "No module named 'absl'); run the launcher with the Python (venv) "
                          "that has lev_jax installed, or pass --no-preflight")


@pytest.mark.parametrize("accelerator,devices,hosts", [
    ("v5p-128", 64, 16), ("v4-8", 4, 1), ("v3-32", 32, 4), ("v6e-8", 8, 1)])
def test_tpu_devices_per_accelerator(accelerator, devices, hosts):
  acc = tpu.parse_accelerator(accelerator)
  assert (acc.devices, acc.hosts) == (devices, hosts)


# --- local -----------------------------------------------------------------------------

def test_local_dry_run_lists_one_command_per_process():
  out = io.StringIO()
  assert local.launch_local(["--config=experiments/smoke.py:tied", "--workdir=runs/mp"], 3, 4,
                            port=23456, dry_run=True, out=out) == 0
  lines = out.getvalue().splitlines()
  assert len(lines) == 3
  for k, line in enumerate(lines):
    words = shlex.split(line)
    env = dict(w.split("=", 1) for w in words[1:] if "=" in w and w[0].isupper())
    assert words[0] == "env"
    assert env["LEV_JAX_PROCESS_ID"] == str(k)
    assert env["LEV_JAX_COORDINATOR"] == "127.0.0.1:23456"
    assert env["LEV_JAX_NUM_PROCESSES"] == "3" and env["JAX_PLATFORMS"] == "cpu"
    assert env["XLA_FLAGS"].split()[0] == "--xla_force_host_platform_device_count=4"
    assert words[-4:] == ["-m", "lev_jax.cli.train", "--config=experiments/smoke.py:tied",
                          "--workdir=runs/mp"]


def test_local_default_port_is_shared_and_free():
  out = io.StringIO()
  local.launch_local([], 2, 1, dry_run=True, out=out)
  coords = {w for l in out.getvalue().splitlines() for w in shlex.split(l)
            if w.startswith("LEV_JAX_COORDINATOR=")}
  assert len(coords) == 1


@pytest.mark.parametrize("argv,needle", [
    (["--num_processes=0", "--dry-run"], "--num_processes=0: expected at least 1"),
    # newcomer pass 13: 100,000 processes were planned on a 2-core host
    (["--num_processes=100000", "--dry-run"], "--num_processes=100000: expected at most "),
    # newcomer pass 14: accepted, or Python's blank "No module named " at run time
    (["--num_processes=2", "--devices_per_process=100000", "--dry-run"],
     "--devices_per_process=100000: 2 x 100000 simulated CPU devices; expected at most 4096"),
    (["--num_processes=2", "--grace_s=-1", "--dry-run"], "--grace_s=-1.0: expected seconds"),
    (["--num_processes=2", "--module=", "--dry-run"], "--module is empty"),
    (["--devices_per_process=0", "--dry-run"], "--devices_per_process=0: expected at least 1"),
    (["--port=70000", "--dry-run"], "--port=70000: expected a TCP port"),
    (["--command", "--dry-run"], "--command needs the command after --"),
    (["--command", "--module=x", "--", "true"], "not allowed with argument"),
    # newcomer pass 14 (K05): lev-train then asked for the two flags local.py sets itself
    (["--num_processes=2", "--dry-run", "--", "--coordinator_address=1.2.3.4:5"],
     "--coordinator_address after --: launch/local.py sets it for every process"),
    # newcomer pass 15 (K03n-K07, K05n, K13): its own flags after -- or given twice
    (["--num_processes=2", "--dry-run", "--", "--grace_s=5"], "--grace_s after --: a "
     "launch/local.py flag; put it before -- (the arguments after -- go to the program"),
    (["--num_processes=2", "--", "--dry-run"], "--dry-run after --: a launch/local.py flag"),
    (["--num_processes=2", "--num_processes", "3", "--dry-run"], "--num_processes given "
     "twice (--num_processes=2, --num_processes=3); give it once"),
])
def test_local_bad_inputs(argv, needle, capsys):
  assert local.main(argv) == 2
  err = capsys.readouterr().err
  assert err.startswith("launch/local.py: error: ") and needle in err, err


def test_local_prefixes_output_and_stops_the_others_when_one_fails(tmp_path):
  # Process 1 fails only once process 0 has printed (a marker file), so the check does
  # not race the launcher stopping process 0 on a loaded machine.
  marker = tmp_path / "p0-printed"
  prog = ("import os, sys, time; k = int(os.environ['LEV_JAX_PROCESS_ID']); "
          "print('hello from', k, os.environ['LEV_JAX_NUM_PROCESSES'], flush=True); "
          f"m = {str(marker)!r}; "
          "k == 0 and open(m, 'w').close(); "
          "[time.sleep(0.05) for _ in range(400) if k == 1 and not os.path.exists(m)]; "
          "time.sleep(0.2); "
          "sys.exit(3) if k == 1 else time.sleep(60)")
  out = io.StringIO()
  start = time.monotonic()
  status = local.launch_local([sys.executable, "-c", prog], 2, 1, command=True, grace_s=5,
                              out=out)
  assert status == 3 and time.monotonic() - start < 20
  text = out.getvalue()
  assert "[p0] hello from 0 2" in text and "[p1] hello from 1 2" in text
  assert "[local] process 1 exited with status 3; stopping the others" in text


def test_local_two_jax_processes_form_one_cluster():
  """A real 2-process x 2-device jax.distributed start-up through lev_jax.distributed."""
  prog = textwrap.dedent("""
      import sys
      import jax, numpy as np
      from jax.experimental import multihost_utils
      from lev_jax import distributed
      distributed.initialize()
      ids = multihost_utils.process_allgather(np.array([jax.process_index()]))
      # One write() per line: Gloo's C++ log lines share the pipe and must not land
      # inside ours (print() would write the pieces separately when unbuffered).
      sys.stdout.write(f"index {jax.process_index()} count {jax.process_count()} devices "
                       f"{jax.device_count()} local {jax.local_device_count()} "
                       f"all {ids.ravel().tolist()}\\n")
  """)
  out = io.StringIO()
  assert local.launch_local([sys.executable, "-c", prog], 2, 2, command=True, out=out) == 0, \
      out.getvalue()
  for k in range(2):
    assert f"[p{k}] index {k} count 2 devices 4 local 2 all [0, 1]" in out.getvalue()


def test_local_forwards_sigterm_and_waits_for_the_checkpoints():
  prog = ("import os, signal, sys, time\n"
          "def stop(*_):\n"
          "  time.sleep(0.5); print('checkpointed', os.environ['LEV_JAX_PROCESS_ID'], flush=True)\n"
          "  sys.exit(143)\n"
          "signal.signal(signal.SIGTERM, stop); print('ready', flush=True); time.sleep(60)\n")
  proc = subprocess.Popen([sys.executable, str(REPO / "launch" / "local.py"), "--grace_s=0.1",
                           "--command", "--", sys.executable, "-c", prog],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
  lines = []
  while len([l for l in lines if "ready" in l]) < 2:
    lines.append(proc.stdout.readline())
  proc.send_signal(signal.SIGTERM)
  out, _ = proc.communicate(timeout=30)
  assert proc.returncode == 143, out
  assert "[p0] checkpointed 0" in out and "[p1] checkpointed 1" in out  # not SIGKILLed


def test_slurm_workdir_that_is_not_a_folder_is_refused_before_planning(tmp_path, capsys):
  """Newcomer pass 9: --workdir=/dev/null planned `sbatch /dev/null.sbatch`, exit 0."""
  plain = tmp_path / "notes.txt"
  plain.write_text("x")
  dangling = tmp_path / "gone"
  dangling.symlink_to(tmp_path / "nowhere")
  tail = "expected a folder for lev-train's outputs (a new one, or a run's to resume)"
  for workdir, what in (("/dev/null", "/dev/null: is a device, not a folder"),
                        (str(plain), f"{plain}: is a file, not a folder"),
                        (f"{plain}/run", f"{plain}/run: {plain} is a file, not a folder"),
                        (str(dangling), f"{dangling}: is a link to nothing, not a folder")):
    argv = ["--nodes=1", f"--workdir={workdir}", "--dry-run", "--no-preflight", "--",
            "--config=experiments/smoke.py:tied"]
    err = error(slurm.main, argv, capsys)
    assert err == f"launch/slurm.py: error: --workdir={what}; {tail}\n", err
  argv = ["--nodes=1", "--workdir=" + str(tmp_path / "new" / "run"), "--dry-run",
          "--no-preflight", "--", "--config=experiments/smoke.py:tied"]
  assert run(slurm.main, argv)[0] == 0  # a folder still to create is fine
