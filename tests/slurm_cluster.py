"""A private one-node SLURM cluster for the tests: its own munged, slurmctld and slurmd.

Nothing is installed here. With Debian's `slurm-wlm` and `munge` packages on the machine
(`apt-get install -y slurm-wlm munge`, what .ci/run does as root) and running as root,
`LocalSlurm(root).start()` writes under `root`:

  slurm.conf          one node (this host's name, 127.0.0.1, all its CPUs), partition
                      `debug`, no accounting, ProctrackType=proctrack/linuxproc,
                      TaskPlugin=task/none (no cgroups needed), its own free ports
  munge/              its own key and socket (the system's munged is not used)
  state/ spool/ log/  slurmctld's state, slurmd's spool, the daemons' logs

and starts the three daemons in the foreground as children of this process. Clients
(sbatch, squeue, scontrol, scancel) reach it through `SLURM_CONF` (`env()`); a job
inherits it, so `scontrol requeue` inside a job works too. `stop()` cancels every job of
this cluster, stops the daemons and leaves the files for a failed test's report.

A requeued job waits until its credential expires before it starts again (slurm.conf(5):
AuthInfo cred_expire, default 120 s); here cred_expire is CRED_EXPIRE_S so that a
preemption test waits seconds, not minutes.

Source: slurm.conf(5), slurmctld(8), slurmd(8), munged(8) of SLURM 22.05 / MUNGE 0.5.15
(Debian 12); SLURM's "Quick Start Administrator Guide".
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "squeue", "scontrol", "scancel", "sinfo")
CRED_EXPIRE_S = 5
PARTITION = "debug"


def _find(program: str) -> str | None:
  """The program on PATH or in /usr/sbin (root's PATH may lack sbin in containers)."""
  return shutil.which(program) or shutil.which(program, path="/usr/sbin:/sbin")


def unavailable() -> str | None:
  """Why a private cluster cannot start here (a skip reason), or None."""
  missing = [p for p in DAEMONS + CLIENTS if _find(p) is None]
  if missing:
    return (f"no local SLURM: {', '.join(missing)} not found (Debian: apt-get install -y "
            "slurm-wlm munge; .ci/run does it as root)")
  if os.geteuid() != 0:
    return "no local SLURM: slurmd must run as root to start jobs"
  return None


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


class LocalSlurm:
  """One private cluster under `root` (see the module docstring)."""

  def __init__(self, root: Path):
    self.root = Path(root)
    self.node = socket.gethostname().split(".")[0]
    self.cpus = os.cpu_count() or 1
    self.conf = self.root / "slurm.conf"
    self.procs: dict[str, subprocess.Popen] = {}

  def env(self, base: dict | None = None) -> dict:
    """`base` (default os.environ) with SLURM_CONF pointing at this cluster."""
    return {**(os.environ if base is None else base), "SLURM_CONF": str(self.conf)}

  def _write(self) -> None:
    r = self.root
    for d in ("munge", "state", "spool", "log"):
      (r / d).mkdir(parents=True, exist_ok=True)
    os.chmod(r / "munge", 0o700)
    key = r / "munge" / "munge.key"
    key.write_bytes(os.urandom(1024))
    os.chmod(key, 0o600)
    self.conf.write_text("\n".join([
        f"ClusterName=levtest{os.getpid()}",
        f"SlurmctldHost={self.node}(127.0.0.1)",
        f"SlurmctldPort={free_port()}",
        f"SlurmdPort={free_port()}",
        "SlurmUser=root",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={r}/munge/munge.socket,cred_expire={CRED_EXPIRE_S}",
        f"StateSaveLocation={r}/state",
        f"SlurmdSpoolDir={r}/spool",
        f"SlurmctldPidFile={r}/slurmctld.pid",
        f"SlurmdPidFile={r}/slurmd.pid",
        f"SlurmctldLogFile={r}/log/slurmctld.log",
        f"SlurmdLogFile={r}/log/slurmd.log",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "SchedulerType=sched/builtin",
        # The main scheduling loop every second (default 60): a requeued job whose
        # begin time has passed starts at once.
        "SchedulerParameters=sched_interval=1",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_CPU",
        "ReturnToService=2",
        "MpiDefault=none",
        "MinJobAge=600",  # finished jobs stay visible to `squeue -t all` (no sacct here)
        "KillWait=30",    # SIGTERM -> SIGKILL on scancel / time limit: room for a checkpoint
        f"NodeName={self.node} NodeAddr=127.0.0.1 CPUs={self.cpus} State=UNKNOWN",
        f"PartitionName={PARTITION} Nodes={self.node} Default=YES MaxTime=INFINITE State=UP",
        ""]))

  def _spawn(self, name: str, argv: list[str]) -> None:
    log = open(self.root / "log" / f"{name}.out", "wb")
    self.procs[name] = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL, env=self.env(),
                                        start_new_session=True)
    log.close()

  def logs(self) -> str:
    """The daemons' logs (their last lines), for a failure message."""
    parts = []
    for path in sorted((self.root / "log").glob("*")):
      lines = path.read_text(errors="replace").splitlines()[-15:]
      parts.append(f"--- {path.name}\n" + "\n".join(lines))
    return "\n".join(parts)

  def run(self, *argv: str, timeout: float = 30, check: bool = True) -> subprocess.CompletedProcess:
    """A client command against this cluster, e.g. run("squeue", "-h")."""
    proc = subprocess.run(list(argv), env=self.env(), capture_output=True, text=True,
                          timeout=timeout)
    if check and proc.returncode:
      raise RuntimeError(f"`{' '.join(argv)}` exited {proc.returncode}: {proc.stderr.strip()}")
    return proc

  def start(self, timeout_s: float = 60) -> "LocalSlurm":
    """Writes the files, starts the daemons, waits until the node is idle.

    Raises:
      RuntimeError: a daemon exited, or the node was not idle within timeout_s (with
        the daemons' logs).
    """
    self._write()
    r = self.root
    self._spawn("munged", [_find("munged"), "--foreground", "--force",
                           f"--key-file={r}/munge/munge.key",
                           f"--socket={r}/munge/munge.socket",
                           f"--pid-file={r}/munge/munged.pid",
                           f"--seed-file={r}/munge/munged.seed",
                           f"--log-file={r}/log/munged.log"])
    self._wait(lambda: (r / "munge" / "munge.socket").exists(), 15, "munged's socket")
    self._spawn("slurmctld", [_find("slurmctld"), "-D", "-c", "-f", str(self.conf)])
    self._spawn("slurmd", [_find("slurmd"), "-D", "-N", self.node, "-f", str(self.conf)])

    def idle():
      proc = self.run("sinfo", "-h", "-N", "-o", "%t", check=False, timeout=10)
      return proc.returncode == 0 and proc.stdout.strip() == "idle"
    self._wait(idle, timeout_s, f"node {self.node} idle in sinfo")
    return self

  def _wait(self, ready, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
      dead = [n for n, p in self.procs.items() if p.poll() is not None]
      if dead:
        self.stop()
        raise RuntimeError(f"local SLURM: {', '.join(dead)} exited while waiting for {what}"
                           f"\n{self.logs()}")
      if ready():
        return
      time.sleep(0.2)
    self.stop()
    raise RuntimeError(f"local SLURM: no {what} after {timeout_s:g} s\n{self.logs()}")

  def stop(self) -> None:
    """Cancels this cluster's jobs, then stops slurmd, slurmctld and munged."""
    if self.procs.get("slurmctld") and self.procs["slurmctld"].poll() is None:
      self.run("scancel", "--full", f"--partition={PARTITION}", check=False)
      deadline = time.monotonic() + 30
      while time.monotonic() < deadline:  # running jobs end (their steps get SIGKILL)
        q = self.run("squeue", "-h", "-o", "%i", check=False)
        if q.returncode or not q.stdout.strip():
          break
        time.sleep(0.3)
    for name in ("slurmd", "slurmctld", "munged"):
      p = self.procs.pop(name, None)
      if p is None or p.poll() is not None:
        continue
      p.send_signal(signal.SIGTERM)
      try:
        p.wait(timeout=15)
      except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
