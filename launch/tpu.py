"""Train on a Cloud TPU VM (single host or pod slice) through gcloud, restarting after preemption.

  python launch/tpu.py --name=lev-v5p --zone=us-east5-a --accelerator_type=v5p-128 \\
      --queued --spot --workdir=gs://BUCKET/runs/ladder_1.2b --max_restarts=10 -- \\
      --config=experiments/ladder.py:leviathan_1.2b
  python launch/tpu.py ... --dry-run -- ...     # print every command, in order; run nothing
  python launch/tpu.py logs --name=lev-v5p --zone=us-east5-a   # every worker's log

Before any gcloud command (also with --dry-run), the lev-train arguments go through
lev-train's own checks on this machine (`lev-train --preflight=tpu:HOSTSxDEVICES ...`, see
launch/common.py), in --repo (or this checkout for a git URL): a bad config file,
variant or field, or a mesh that does not fit the slice's devices, is one line here and
nothing is created. --no-preflight skips it (e.g. on a machine without lev_jax's
dependencies). --compile also compiles the train and eval steps for the slice with
lev-compile (XLA:TPU ahead of time on this machine; needs `pip install -e '.[tpu-aot]'`):
a step that does not fit the chips' HBM stops the launch with one line.

Steps (each one gcloud command; `--dry-run` prints them exactly, in this order):

1. `tpu-vm describe NAME` (with --queued also `queued-resources describe NAME`): reuse a
   READY TPU; otherwise (missing, PREEMPTED, TERMINATED, a FAILED or SUSPENDED queued
   resource, ...) delete what is left and create it: `tpu-vm create NAME --version=RUNTIME`
   (blocks until the TPU is up), or with --queued `queued-resources create NAME
   --node-id=NAME --runtime-version=RUNTIME`, then `queued-resources describe` every
   --poll_s seconds until ACTIVE. --spot / --preemptible pick the provisioning model
   (queued resources have --spot but no preemptible tier).
2. Copy the code to every worker: a git URL is cloned on each worker (`tpu-vm ssh
   --worker=all`); a local path (default: this checkout, minus .git, .venv, runs/) is
   packed with tar here and copied with `tpu-vm scp --worker=all`, then unpacked.
3. Install on every worker: Python 3.11 (apt, if the image lacks it: runtime images ship
   Ubuntu 22.04 with Python 3.10, lev_jax needs >= 3.11), a venv in ~/lev_jax/.venv,
   `pip install -e '.[gcs]' 'jax[tpu]==0.10.2'` (gcs: the gs:// workdir needs gcsfs;
   jax at BUILD.md's tested version). With 16+ workers installing at once, apt waits for
   the dpkg lock (DPkg::Lock::Timeout) and apt and pip are retried 5 times.
4. Start the same lev-train command on every worker (`tpu-vm ssh --worker=all`) detached
   from ssh (`setsid nohup`): a dropped connection does not stop training. Each worker
   writes ~/lev_jax/train.log (lines prefixed `[worker N] `, N from the VM's metadata
   `agent-worker-number`) and, at the end, ~/lev_jax/train.status; a second ssh streams
   the logs here until every worker's status exists and exits with it (after a dropped
   connection to a READY TPU it attaches again, up to 10 times in a row).
   `launch/tpu.py logs` prints the logs at any time. JAX finds the other workers itself
   (Cloud TPU cluster auto-detection, see lev_jax/distributed.py): no coordinator flags.
5. If the command fails: `tpu-vm describe NAME`. Not READY (preempted, or gone) -> delete
   it and repeat from step 1's create; READY and status 143 (lev-train checkpointed after
   a SIGTERM, e.g. a maintenance event) -> run step 4 again; any other failure stops the
   launcher with that status. At most --max_restarts restarts. Each re-run resumes from the
   latest checkpoint in --workdir, which therefore must outlive the TPU: a gs:// path.

Accelerator types (TPU docs, "TPU versions" / "TPU software versions"): v2-N, v3-N, v4-N,
v5p-N count TensorCores, 2 per chip, 4 chips per host (v5p-128: 64 chips, 16 hosts);
v5litepod-N and v6e-N count chips, one host up to 8 chips. The default runtime version is
the one the TPU docs give for JAX: v2-alpha-tpuv5 (v5p), v2-alpha-tpuv5-lite (v5litepod),
v2-alpha-tpuv6e (v6e), tpu-ubuntu2204-base (v4 and older). --network, --subnetwork,
--service_account and --reserved are passed to the create command as given.

Source: gcloud reference for `compute tpus tpu-vm {create,describe,delete,ssh,scp}` and
`compute tpus queued-resources {create,describe,delete}` (--network, --subnetwork,
--service-account, --reserved); cloud.google.com/tpu/docs/queued-resources, /spot,
/preemptible, /runtimes; apt.conf(5) (DPkg::Lock::Timeout); setsid(1), nohup(1).
"""

from __future__ import annotations

import dataclasses
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

if __package__ in (None, ""):  # run as `python launch/tpu.py`
  sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from launch.common import (LaunchError, add_preflight_flag,  # noqa: E402
                           compile_preflight, parse, parser, preflight,
                           reject_passthrough, run_main, shell_join)

PROG = "launch/tpu.py"
REPO_ROOT = Path(__file__).resolve().parent.parent
REMOTE_DIR = "lev_jax"  # on each worker, relative to the ssh user's home
PREEMPTED_EXIT = 143  # lev_jax.cli.train.PREEMPTED_EXIT: SIGTERM -> checkpoint -> exit 143
SSH_FAILED = 255  # ssh's own failure (connection dropped), not the remote command's status
JAX_VERSION = "0.10.2"  # BUILD.md's tested jax / jaxlib; the workers install jax[tpu] at it
LOG = "train.log"        # in ~/lev_jax on each worker: lev-train's output, `[worker N] ` lines
STATUS = "train.status"  # lev-train's exit status once it has ended
# GCE metadata of a TPU VM: this worker's index in the slice (what JAX's Cloud TPU
# detection reads too; cloud.google.com/tpu/docs, "TPU VM metadata").
_WORKER_NUMBER = ("curl -sf -H Metadata-Flavor:Google http://metadata.google.internal/"
                  "computeMetadata/v1/instance/attributes/agent-worker-number")
_REATTACH = 10  # consecutive ssh failures to a READY TPU before the launcher gives up
_TRIES = 5  # apt / pip on every worker at once: tries, 10 s more wait after each failure

# (pattern, what N counts, valid N). Source: cloud.google.com/tpu/docs/v5p, /v5e, /v6e.
_CORE_COUNTED = ("v2", "v3", "v4", "v5p")  # N = TensorCores = 2 x chips; 4 chips per host
_CHIP_COUNTED = ("v5litepod", "v6e")       # N = chips; up to 8 chips on one host
_CHIP_SIZES = (1, 4, 8, 16, 32, 64, 128, 256)
_ACCELERATOR = re.compile(r"^(v2|v3|v4|v5p|v5litepod|v6e)-([0-9]+)$")
_RUNTIME = {"v2": "tpu-ubuntu2204-base", "v3": "tpu-ubuntu2204-base",
            "v4": "tpu-ubuntu2204-base", "v5p": "v2-alpha-tpuv5",
            "v5litepod": "v2-alpha-tpuv5-lite", "v6e": "v2-alpha-tpuv6e"}
_NAME = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")  # GCE resource name rules
_ZONE = re.compile(r"^[a-z]+-[a-z]+[0-9]+-[a-z]$")
_RESOURCE = re.compile(r"^[A-Za-z0-9][\w./-]*$")  # a name, or projects/.../NAME
_EMAIL = re.compile(r"^[^@\s]+@[^@\s]+\.[^@\s]+$")
_GIT_URL = re.compile(r"^(https?|ssh|git)://|^[\w.-]+@[\w.-]+:")
_EXCLUDE = ("./.git", "./.venv", "./runs", "__pycache__", "*.egg-info")


@dataclasses.dataclass(frozen=True)
class Accelerator:
  type: str
  family: str
  chips: int
  hosts: int | None  # None: multi-host, count not pinned here (v5litepod/v6e > 8 chips)

  @property
  def devices(self) -> int:
    """JAX devices: one per TensorCore on v2 / v3 (2 per chip), one per chip from v4 on
    (v4 and v5p chips are one "megacore" device; v5e and v6e chips have one core)."""
    return self.chips * 2 if self.family in ("v2", "v3") else self.chips

  @property
  def multi_host(self) -> bool:
    return self.hosts is None or self.hosts > 1

  def describe(self) -> str:
    hosts = "multi-host" if self.hosts is None else (
        f"{self.hosts} hosts" if self.hosts > 1 else "1 host")
    return f"{self.type} ({self.chips} chips, {hosts})"


def parse_accelerator(value: str | None) -> Accelerator:
  """Accelerator from an --accelerator_type such as v5p-128.

  Raises:
    LaunchError: missing, or not one of the documented patterns and sizes.
  """
  expected = ("expected v2-N, v3-N, v4-N or v5p-N (N TensorCores, a multiple of 8), or "
              f"v5litepod-N or v6e-N (N chips, one of {', '.join(map(str, _CHIP_SIZES))}); "
              "e.g. --accelerator_type=v5p-128")
  if not value:
    raise LaunchError(f"--accelerator_type is required: {expected}")
  m = _ACCELERATOR.match(value)
  if not m:
    raise LaunchError(f"--accelerator_type={value}: unknown TPU type; {expected}")
  family, n = m.group(1), int(m.group(2))
  if family in _CORE_COUNTED:
    if n < 8 or n % 8:
      raise LaunchError(f"--accelerator_type={value}: {family}-N counts TensorCores, "
                        f"N must be a multiple of 8 (one host = {family}-8); {expected}")
    return Accelerator(value, family, n // 2, n // 8)
  if n not in _CHIP_SIZES:
    raise LaunchError(f"--accelerator_type={value}: {expected}")
  return Accelerator(value, family, n, 1 if n <= 8 else None)


@dataclasses.dataclass(frozen=True)
class TpuJob:
  """Validated settings; its methods build each gcloud command (argv lists)."""
  name: str
  zone: str
  accelerator: Accelerator
  runtime_version: str
  project: str | None
  queued: bool
  provisioning: str | None  # "spot" | "preemptible" | None (on demand)
  repo: str
  repo_is_url: bool
  workdir: str | None
  max_restarts: int
  poll_s: float
  python: str
  train_args: tuple[str, ...]
  network: str | None = None
  subnetwork: str | None = None
  service_account: str | None = None
  reserved: bool = False

  def _where(self) -> list[str]:
    return [f"--zone={self.zone}"] + ([f"--project={self.project}"] if self.project else [])

  def describe_node(self) -> list[str]:
    return ["gcloud", "compute", "tpus", "tpu-vm", "describe", self.name, *self._where(),
            "--format=value(state)"]

  def describe_queued(self) -> list[str]:
    return ["gcloud", "compute", "tpus", "queued-resources", "describe", self.name,
            *self._where(), "--format=value(state.state)"]

  def _placement(self) -> list[str]:
    """--network, --subnetwork, --service-account, --reserved as given (both creates)."""
    return ([f"--network={self.network}"] if self.network else []) + (
        [f"--subnetwork={self.subnetwork}"] if self.subnetwork else []) + (
        [f"--service-account={self.service_account}"] if self.service_account else []) + (
        ["--reserved"] if self.reserved else [])

  def create(self) -> list[str]:
    if self.queued:
      return ["gcloud", "compute", "tpus", "queued-resources", "create", self.name,
              *self._where(), f"--node-id={self.name}",
              f"--accelerator-type={self.accelerator.type}",
              f"--runtime-version={self.runtime_version}",
              *(["--spot"] if self.provisioning == "spot" else []), *self._placement()]
    return ["gcloud", "compute", "tpus", "tpu-vm", "create", self.name, *self._where(),
            f"--accelerator-type={self.accelerator.type}", f"--version={self.runtime_version}",
            *([f"--{self.provisioning}"] if self.provisioning else []), *self._placement()]

  def delete(self) -> list[str]:
    if self.queued:  # --force also deletes the queued resource's TPU VM
      return ["gcloud", "compute", "tpus", "queued-resources", "delete", self.name,
              *self._where(), "--force", "--quiet"]
    return ["gcloud", "compute", "tpus", "tpu-vm", "delete", self.name, *self._where(),
            "--quiet"]

  def ssh_all(self, command: str) -> list[str]:
    return ["gcloud", "compute", "tpus", "tpu-vm", "ssh", self.name, *self._where(),
            "--worker=all", f"--command={command}"]

  def tarball(self) -> str:
    return str(Path(tempfile.gettempdir()) / f"lev_jax-{self.name}.tar.gz")

  def copy(self) -> list[list[str]]:
    """Commands that put the code in ~/lev_jax on every worker."""
    if self.repo_is_url:
      return [self.ssh_all(f"rm -rf ~/{REMOTE_DIR} && git clone --depth=1 "
                           f"{shell_join([self.repo])} ~/{REMOTE_DIR}")]
    pack = ["tar", "-czf", self.tarball(), *(f"--exclude={e}" for e in _EXCLUDE),
            "-C", self.repo, "."]
    send = ["gcloud", "compute", "tpus", "tpu-vm", "scp", self.tarball(),
            f"{self.name}:{REMOTE_DIR}.tar.gz", *self._where(), "--worker=all"]
    unpack = self.ssh_all(f"rm -rf ~/{REMOTE_DIR} && mkdir -p ~/{REMOTE_DIR} && "
                          f"tar -xzf ~/{REMOTE_DIR}.tar.gz -C ~/{REMOTE_DIR}")
    return [pack, send, unpack]

  def install(self) -> list[str]:
    """Python (apt, if missing), a venv, lev_jax with gcs and jax[tpu]==JAX_VERSION.

    Every worker runs this at once: apt waits up to 10 min for the dpkg lock (unattended
    upgrades hold it on a fresh VM; `DPkg::Lock::Timeout`, apt >= 1.9.11) and apt and
    pip are retried _TRIES times (a lock, a mirror or PyPI hiccup on 1 of 16+ workers
    would otherwise stop the launch)."""
    py = self.python
    retry = (f"retry() {{ n=1; until \"$@\"; do [ $n -ge {_TRIES} ] && return 1; "
             "sleep $((n * 10)); n=$((n + 1)); done; }; ")
    apt = "sudo apt-get -o DPkg::Lock::Timeout=600"
    return self.ssh_all(
        f"set -e; {retry}command -v {py} >/dev/null || {{ retry {apt} update -qq && "
        f"retry {apt} install -y -qq {py} {py}-venv; }}; cd ~/{REMOTE_DIR} && "
        f"{py} -m venv .venv && retry .venv/bin/pip install -q --upgrade pip && "
        f"retry .venv/bin/pip install -q -e \".[gcs]\" \"jax[tpu]=={JAX_VERSION}\"")

  def train_command(self) -> str:
    """The lev-train command line every worker runs (identical on all of them)."""
    workdir = [f"--workdir={self.workdir}"] if self.workdir else []
    return f"cd ~/{REMOTE_DIR} && " + shell_join([".venv/bin/lev-train", *workdir,
                                                  *self.train_args])

  def start(self) -> list[str]:
    """Starts lev-train on every worker detached from the ssh session (setsid nohup): a
    dropped connection does not stop training. Its output goes to ~/lev_jax/train.log,
    each line prefixed `[worker N] `, and its exit status to ~/lev_jax/train.status."""
    inner = (f"w=$({_WORKER_NUMBER} || echo '?'); "
             f"{{ {self.train_command()}; }} 2>&1 | sed -u \"s/^/[worker $w] /\" > {LOG}; "
             f"echo ${{PIPESTATUS[0]}} > {STATUS}")
    return self.ssh_all(f"cd ~/{REMOTE_DIR} && rm -f {STATUS} {LOG} && setsid nohup bash -c "
                        f"{shell_join([inner])} > /dev/null 2>&1 < /dev/null &")

  def attach(self) -> list[str]:
    """Streams every worker's train.log until lev-train has ended there; exits with its
    status. Run again after a dropped connection: training went on meanwhile. (`tail -F`
    polls each second where inotify is missing: 2 s after the status, the log's last
    lines are out.)"""
    return self.ssh_all(
        f"cd ~/{REMOTE_DIR} || exit 1; tail -n +1 -F {LOG} 2>/dev/null & t=$!; "
        f"until [ -s {STATUS} ]; do sleep 5; done; sleep 2; kill $t; exit $(cat {STATUS})")

  def logs(self) -> list[str]:
    """Prints every worker's train.log (`[worker N] ` lines) once."""
    return self.ssh_all(f"cat ~/{REMOTE_DIR}/{LOG}")


def _check_name_zone(name: str | None, zone: str | None) -> None:
  """Raises LaunchError for a missing or malformed --name or --zone."""
  if not name:
    raise LaunchError("--name is required: the TPU VM (and queued resource) name, "
                      "e.g. --name=lev-v5p-128")
  if not _NAME.match(name):
    raise LaunchError(f"--name={name}: expected lowercase letters, digits and '-', "
                      "starting with a letter, at most 63 characters")
  if not zone:
    raise LaunchError("--zone is required: a zone that offers the TPU type, e.g. "
                      "--zone=us-east5-a")
  if not _ZONE.match(zone):
    raise LaunchError(f"--zone={zone}: expected a zone such as us-east5-a")


def logs_main(argv: Sequence[str], out: TextIO) -> int:
  """`launch/tpu.py logs --name=N --zone=Z [--project=P] [--dry-run]`: every worker's
  ~/lev_jax/train.log through one `tpu-vm ssh --worker=all`; returns gcloud's status."""
  p = parser(f"{PROG} logs", "Print the lev-train log of every worker ([worker N] lines).")
  p.add_argument("--name", help="TPU VM name.")
  p.add_argument("--zone", help="Zone, e.g. us-east5-a.")
  p.add_argument("--project", help="GCP project (default: gcloud's configured project).")
  args = p.parse_args(list(argv))
  _check_name_zone(args.name, args.zone)
  where = [f"--zone={args.zone}"] + ([f"--project={args.project}"] if args.project else [])
  cmd = ["gcloud", "compute", "tpus", "tpu-vm", "ssh", args.name, *where, "--worker=all",
         f"--command=cat ~/{REMOTE_DIR}/{LOG}"]
  if args.dry_run:
    out.write(shell_join(cmd) + "\n")
    return 0
  return Runner().run(cmd)


def build_job(args, train_args: Sequence[str]) -> tuple[TpuJob, list[str]]:
  """(job, warnings) from parsed flags.

  Raises:
    LaunchError: a missing or malformed flag, naming it and what was expected.
  """
  _check_name_zone(args.name, args.zone)
  acc = parse_accelerator(args.accelerator_type)
  if args.spot and args.preemptible:
    raise LaunchError("--spot and --preemptible: choose one")
  if args.queued and args.preemptible:
    raise LaunchError("--preemptible with --queued: queued resources have no preemptible "
                      "tier; use --spot (or neither, for on-demand)")
  if args.reserved and (args.spot or args.preemptible):
    raise LaunchError("--reserved with --spot or --preemptible: choose one provisioning model")
  for flag in ("network", "subnetwork"):
    value = getattr(args, flag)
    if value is not None and not _RESOURCE.match(value):
      raise LaunchError(f"--{flag}={value!r}: expected a name or a path such as "
                        f"projects/PROJECT/{'global/networks' if flag == 'network' else 'regions/REGION/subnetworks'}/NAME")
  if args.service_account is not None and not _EMAIL.match(args.service_account):
    raise LaunchError(f"--service_account={args.service_account!r}: expected an e-mail "
                      "address, e.g. NAME@PROJECT.iam.gserviceaccount.com")
  if args.max_restarts < 0:
    raise LaunchError(f"--max_restarts={args.max_restarts}: expected 0 or more")
  if args.poll_s <= 0:
    raise LaunchError(f"--poll_s={args.poll_s}: expected a positive number of seconds")
  reject_passthrough(train_args, "--workdir",
                     "give it to launch/tpu.py (before --), which checks it and passes it "
                     "to every worker")
  warnings = []
  workdir = args.workdir
  if workdir is not None and not workdir.startswith("gs://"):
    if acc.multi_host:
      raise LaunchError(f"--workdir={workdir}: {acc.describe()} needs a gs:// workdir "
                        "that every worker writes to and that outlives a preempted TPU, "
                        "e.g. --workdir=gs://BUCKET/runs/NAME")
    if args.max_restarts:
      warnings.append(f"--workdir={workdir} is on the TPU VM's disk: a restart after "
                      "preemption recreates the VM and starts training from scratch; use "
                      "a gs:// workdir to resume")
  elif workdir is None and acc.multi_host:
    raise LaunchError(f"--workdir is required for {acc.describe()}: a gs:// path every "
                      "worker writes to, e.g. --workdir=gs://BUCKET/runs/NAME")
  repo = args.repo or str(REPO_ROOT)
  is_url = bool(_GIT_URL.match(repo))
  if not is_url:
    path = Path(repo).expanduser()
    if not path.is_dir():
      raise LaunchError(f"--repo={repo}: not a directory nor a git URL "
                        "(https://..., git@host:..., ssh://...)")
    if not (path / "pyproject.toml").is_file():
      raise LaunchError(f"--repo={repo}: no pyproject.toml there; expected the lev_jax "
                        "checkout to install")
    repo = str(path.resolve())
  provisioning = "spot" if args.spot else "preemptible" if args.preemptible else None
  job = TpuJob(args.name, args.zone, acc, args.runtime_version or _RUNTIME[acc.family],
               args.project, args.queued, provisioning, repo, is_url, workdir,
               args.max_restarts, args.poll_s, args.python, tuple(train_args),
               network=args.network, subnetwork=args.subnetwork,
               service_account=args.service_account, reserved=args.reserved)
  return job, warnings


class Runner:
  """Runs commands for real: their output streams to this terminal."""

  def note(self, message: str) -> None:
    print(f"[tpu] {message}", file=sys.stderr, flush=True)

  def _check(self, argv: Sequence[str]) -> None:
    if shutil.which(argv[0]) is None:
      raise LaunchError(f"{argv[0]} not found on PATH: install the Google Cloud CLI "
                        "(https://cloud.google.com/sdk/docs/install), or use --dry-run "
                        "to print the commands")

  def run(self, argv: Sequence[str]) -> int:
    self._check(argv)
    self.note(shell_join(argv))
    return subprocess.run(list(argv)).returncode

  def query(self, argv: Sequence[str], tries: int = 3, wait_s: float = 10.0) -> str | None:
    """The command's stripped stdout; None when gcloud says NOT_FOUND.

    Raises:
      LaunchError: it failed `tries` times for another reason (auth, network, quota).
    """
    self._check(argv)
    for attempt in range(tries):
      proc = subprocess.run(list(argv), capture_output=True, text=True)
      if proc.returncode == 0:
        return proc.stdout.strip()
      if "NOT_FOUND" in proc.stderr or "not found" in proc.stderr.lower():
        return None
      if attempt + 1 < tries:
        time.sleep(wait_s)
    last = (proc.stderr.strip().splitlines() or ["(no message)"])[-1]
    raise LaunchError(f"`{shell_join(argv)}` failed {tries} times: {last}")

  def sleep(self, seconds: float) -> None:
    time.sleep(seconds)


class DryRun:
  """Prints each command instead of running it (queries print and find nothing)."""

  def __init__(self, out: TextIO):
    self.out = out

  def note(self, message: str) -> None:
    self.out.write(f"# {message}\n")

  def run(self, argv: Sequence[str]) -> int:
    self.out.write(shell_join(argv) + "\n")
    return 0

  def query(self, argv: Sequence[str]) -> str | None:
    self.out.write(shell_join(argv) + "\n")
    return None

  def sleep(self, seconds: float) -> None:
    pass


_WAITING = {"ACCEPTED", "CREATING", "PROVISIONING", "WAITING_FOR_RESOURCES"}


def _ensure_tpu(job: TpuJob, ex, fresh: bool) -> None:
  """Leaves a READY TPU named job.name: reuses, waits for, or (re)creates it.

  fresh: skip the describes (the caller just deleted the TPU).

  Raises:
    LaunchError: a create or delete command fails, or a queued resource ends up neither
      waiting nor ACTIVE (e.g. FAILED).
  """
  state = None if fresh else ex.query(job.describe_node())
  if state == "READY":
    ex.note(f"reusing READY TPU {job.name}")
    return
  if not job.queued:
    if state is not None:
      ex.note(f"TPU {job.name} is {state}: deleting it")
      if ex.run(job.delete()) != 0:
        raise LaunchError(f"could not delete TPU {job.name} (state {state})")
    if ex.run(job.create()) != 0:  # blocks until the TPU is READY
      raise LaunchError(f"could not create TPU {job.name} (see gcloud's message above)")
    return
  qstate = None if fresh else ex.query(job.describe_queued())
  if qstate in _WAITING:
    ex.note(f"queued resource {job.name} is {qstate}: waiting for it")
  else:
    if qstate is not None:  # ACTIVE with a TPU that is not READY, SUSPENDED, FAILED, ...
      ex.note(f"queued resource {job.name} is {qstate} (TPU {state or 'gone'}): deleting it")
      if ex.run(job.delete()) != 0:
        raise LaunchError(f"could not delete queued resource {job.name} (state {qstate})")
    if ex.run(job.create()) != 0:
      raise LaunchError(f"could not create queued resource {job.name} (see gcloud's "
                        "message above)")
  while True:
    qstate = ex.query(job.describe_queued())
    if qstate == "ACTIVE":
      return
    if qstate not in _WAITING:
      raise LaunchError(f"queued resource {job.name} is {qstate or 'gone'}, not ACTIVE; "
                        f"see `{shell_join(job.describe_queued()[:-1])}`")
    ex.sleep(job.poll_s)


def _prepare(job: TpuJob, ex) -> None:
  for cmd in job.copy():
    if ex.run(cmd) != 0:
      raise LaunchError(f"copying the code to {job.name} failed: {shell_join(cmd)}")
  if ex.run(job.install()) != 0:
    raise LaunchError(f"installing lev_jax on {job.name} failed (see the output above)")


def launch(job: TpuJob, ex) -> int:
  """Steps 1-5 of the module docstring with executor `ex`; returns lev-train's status."""
  _ensure_tpu(job, ex, fresh=False)
  _prepare(job, ex)
  restarts, dropped = 0, 0
  start = True
  while True:
    if start and ex.run(job.start()) != 0:
      raise LaunchError(f"starting lev-train on {job.name} failed (see the output above)")
    start = True
    status = ex.run(job.attach())
    if status == 0:
      ex.note("lev-train finished on every worker")
      return 0
    state = ex.query(job.describe_node())
    if state == "READY" and status == SSH_FAILED and dropped < _REATTACH:
      dropped += 1  # the connection, not lev-train: it trains on, detached
      ex.note(f"ssh to {job.name} failed ({dropped}/{_REATTACH}); lev-train runs on "
              "detached: attaching again")
      start = False
      continue
    dropped = 0
    if state == "READY" and status != PREEMPTED_EXIT:
      ex.note(f"lev-train failed with status {status} on a READY TPU: not restarting")
      return status
    if restarts >= job.max_restarts:
      ex.note(f"lev-train stopped (status {status}, TPU {state or 'gone'}) and "
              f"--max_restarts={job.max_restarts} restarts are used up")
      return status
    restarts += 1
    if state == "READY":
      ex.note(f"restart {restarts}/{job.max_restarts}: lev-train was stopped by SIGTERM "
              "on a READY TPU: running it again (it resumes from its checkpoint)")
      continue
    ex.note(f"restart {restarts}/{job.max_restarts}: TPU {job.name} is {state or 'gone'} "
            "(preempted): recreating it; lev-train resumes from its checkpoint")
    ex.run(job.delete())  # may fail when already gone; _ensure_tpu then creates it
    _ensure_tpu(job, ex, fresh=True)
    _prepare(job, ex)


def dry_run(job: TpuJob, out: TextIO, warnings: Sequence[str] = ()) -> None:
  """Prints the commands of a first run on a TPU that does not exist yet, then the
  commands a preemption adds."""
  ex = DryRun(out)
  kind = ("queued resource" if job.queued else "TPU VM")
  ex.note(f"{PROG}: {job.accelerator.describe()}, {job.provisioning or 'on-demand'} "
          f"{kind} {job.name} in {job.zone}, runtime {job.runtime_version}")
  ex.note(f"workdir {job.workdir or '(lev-train default, on the VM)'}; "
          f"max_restarts {job.max_restarts}")
  for w in warnings:
    ex.note(f"warning: {w}")
  ex.note("1. find the TPU (a READY one is reused; shown: it does not exist yet)")
  ex.query(job.describe_node())
  if job.queued:
    ex.query(job.describe_queued())
  ex.note("create it")
  ex.run(job.create())
  if job.queued:
    ex.note(f"every {job.poll_s:g} s until the state is ACTIVE:")
    ex.query(job.describe_queued())
  ex.note("2. copy the code to every worker")
  for cmd in job.copy():
    ex.run(cmd)
  ex.note("3. install on every worker")
  ex.run(job.install())
  ex.note("4. start lev-train on every worker (the same command on each), detached, then "
          f"stream ~/{REMOTE_DIR}/{LOG} until it ends (again if ssh drops)")
  ex.run(job.start())
  ex.run(job.attach())
  ex.note("5. if it fails: is the TPU still READY?")
  ex.query(job.describe_node())
  ex.note(f"not READY (preempted): delete, then repeat create, 2, 3, 4 "
          f"(at most {job.max_restarts} restarts)")
  ex.run(job.delete())
  ex.note(f"READY and status {PREEMPTED_EXIT} (checkpointed after SIGTERM): repeat 4; "
          "READY and any other status: stop with that status")


def _parser():
  p = parser(PROG, __doc__)
  p.add_argument("--name", help="TPU VM name (also the queued resource's name).")
  p.add_argument("--zone", help="Zone, e.g. us-east5-a.")
  p.add_argument("--accelerator_type", help="e.g. v5p-128, v4-32, v6e-8.")
  p.add_argument("--runtime_version", help="TPU software version (default: by TPU type).")
  p.add_argument("--project", help="GCP project (default: gcloud's configured project).")
  p.add_argument("--queued", action="store_true",
                 help="Create through `queued-resources create` (waits for capacity).")
  p.add_argument("--spot", action="store_true", help="Spot TPU (preemptible at any time).")
  p.add_argument("--preemptible", action="store_true", help="Preemptible TPU (tpu-vm only).")
  p.add_argument("--reserved", action="store_true",
                 help="Use the project's reserved capacity (gcloud --reserved).")
  p.add_argument("--network", help="VPC network of the TPU (gcloud --network).")
  p.add_argument("--subnetwork", help="Subnetwork of the TPU (gcloud --subnetwork).")
  p.add_argument("--service_account", help="Service account of the TPU VMs, e.g. for the "
                 "gs:// workdir (gcloud --service-account).")
  p.add_argument("--repo", help="Git URL, or local checkout to copy (default: this one).")
  p.add_argument("--workdir", help="lev-train --workdir; gs://... (required multi-host).")
  p.add_argument("--max_restarts", type=int, default=5,
                 help="Restarts after preemption before giving up (default 5).")
  p.add_argument("--poll_s", type=float, default=60.0,
                 help="Seconds between queued-resource state checks (default 60).")
  p.add_argument("--python", default="python3.11",
                 help="Python on the workers (installed with apt if missing).")
  add_preflight_flag(p)
  p.add_argument("--compile", action="store_true",
                 help="Also compile the train and eval steps for the slice with lev-compile "
                      "on this machine before anything is created (XLA:TPU ahead of time, "
                      "minutes for the largest rungs; a job that does not fit is never "
                      "queued). Needs libtpu here: pip install -e '.[tpu-aot]'.")
  return p


def job_from_argv(argv: Sequence[str]) -> tuple[TpuJob, list[str], bool, bool, bool]:
  """(job, warnings, dry_run, preflight, compile) from `flags -- lev-train args`.

  Raises:
    LaunchError: as build_job, or an unknown flag.
  """
  args, rest = parse(_parser(), argv)
  job, warnings = build_job(args, rest)
  return job, warnings, args.dry_run, args.preflight, args.compile


def check_train_args(job: TpuJob) -> str:
  """lev-train's own checks of job.train_args for the slice (common.preflight): hosts x
  devices per host, one slice; a v5litepod / v6e slice whose host count is not pinned
  here counts as one process of all its devices. Runs with this Python in --repo (a
  local checkout) or, for a git URL, in this checkout.

  Returns:
    lev-train's one-line summary.
  Raises:
    LaunchError: lev-train's one-line error.
  """
  acc = job.accelerator
  hosts = acc.hosts or 1
  return preflight(job.train_args, "tpu", hosts, acc.devices // hosts,
                   cwd=str(REPO_ROOT) if job.repo_is_url else job.repo)


def compile_train_steps(job: TpuJob) -> str:
  """lev-compile of the job's config for its slice (common.compile_preflight).

  Raises:
    LaunchError: a step that does not fit the slice, or libtpu missing / mismatched.
  """
  return compile_preflight(job.train_args, job.accelerator.type,
                           cwd=str(REPO_ROOT) if job.repo_is_url else job.repo)


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
  out = sys.stdout if out is None else out

  def body() -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["logs"]:
      return logs_main(args[1:], out)
    job, warnings, dry, check, compile_ = job_from_argv(args)
    if check:
      print(f"[tpu] {check_train_args(job)}", file=sys.stderr)
    if compile_:
      print(f"[tpu] {compile_train_steps(job)}", file=sys.stderr)
    if dry:
      dry_run(job, out, warnings)
      return 0
    ex = Runner()
    for w in warnings:
      ex.note(f"warning: {w}")
    return launch(job, ex)
  return run_main(PROG, body)


if __name__ == "__main__":
  sys.exit(main())
