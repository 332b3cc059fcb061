"""One writer per folder: lev_jax.lock, its holder record and stale locks."""

import errno
import json
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap

import pytest

from lev_jax import lock
from lev_jax.lock import WorkdirLockedError

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _holder(folder, record=None):
  """A process holding `folder`'s lock until killed: through lock.hold, or (with
  `record`) a bare flock on FOLDER/.lock holding that JSON record."""
  if record is None:
    body = f"""
      from lev_jax import lock
      with lock.hold({str(folder)!r}, prog="holder"):
        print("locked", flush=True)
        time.sleep(600)
    """
  else:
    body = f"""
      os.makedirs({str(folder)!r}, exist_ok=True)
      fd = os.open(os.path.join({str(folder)!r}, ".lock"), os.O_RDWR | os.O_CREAT)
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
      os.write(fd, {json.dumps(record)!r}.encode())
      print("locked", flush=True)
      time.sleep(600)
    """
  code = "import fcntl, os, time\n" + textwrap.dedent(body)
  proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                          env=dict(os.environ, PYTHONPATH=REPO))
  assert proc.stdout.readline().strip() == "locked"
  return proc


def _kill(proc):
  proc.send_signal(signal.SIGKILL)
  proc.wait()


@pytest.fixture
def warnings(monkeypatch):
  lines = []
  monkeypatch.setattr(lock.logging, "warning", lambda msg, *a: lines.append(msg % a))
  return lines


def test_the_lock_file_records_the_holder_and_is_removed_on_leaving(tmp_path):
  run = tmp_path / "run"
  with lock.hold(run, prog="lev-train") as path:
    assert path == str(run / ".lock")
    record = json.loads((run / ".lock").read_text())
    assert record["prog"] == "lev-train" and record["pid"] == os.getpid()
    assert record["host"] == socket.gethostname() and record["started"][:2] == "20"
    (run / "metrics.jsonl").write_text("")
  assert sorted(p.name for p in run.iterdir()) == ["metrics.jsonl"]


def test_a_second_holder_is_refused_naming_prog_pid_host_and_start(tmp_path):
  with lock.hold(tmp_path, prog="lev-train"):
    started = json.loads((tmp_path / ".lock").read_text())["started"]
    with pytest.raises(WorkdirLockedError) as info:
      with lock.hold(tmp_path, prog="lev-train"):
        pass
  message = str(info.value)
  assert message == (f"{tmp_path} is in use by lev-train (pid {os.getpid()}, host "
                     f"{socket.gethostname()}, started {started}); lock file "
                     f"{tmp_path / '.lock'}. Wait for it to finish or stop it")
  with lock.hold(tmp_path, prog="lev-train"):  # released: free again
    pass


def test_the_lock_is_released_when_the_block_raises(tmp_path):
  with pytest.raises(KeyboardInterrupt):
    with lock.hold(tmp_path, prog="lev-train"):
      raise KeyboardInterrupt
  assert not (tmp_path / ".lock").exists()
  with lock.hold(tmp_path, prog="lev-train"):
    pass


def test_a_live_holder_is_refused_and_its_lock_taken_over_once_it_is_killed(tmp_path,
                                                                           warnings):
  proc = _holder(tmp_path)
  try:
    with pytest.raises(WorkdirLockedError, match=rf"in use by holder \(pid {proc.pid}, "
                       rf"host {socket.gethostname()}, started"):
      with lock.hold(tmp_path, prog="lev-train", force_unlock=True):
        pass
  finally:
    _kill(proc)  # kill -9: no clean-up; the kernel drops its flock
  assert json.loads((tmp_path / ".lock").read_text())["pid"] == proc.pid
  with lock.hold(tmp_path, prog="lev-train"):
    assert json.loads((tmp_path / ".lock").read_text())["pid"] == os.getpid()
  assert len(warnings) == 1 and f"pid {proc.pid}" in warnings[0], warnings
  assert "it is no longer running" in warnings[0]


def test_force_unlock_removes_a_lock_recorded_by_another_host(tmp_path, warnings):
  """A network filesystem can keep a gone host's flock: --force_unlock drops it."""
  record = {"prog": "lev-train", "host": "gone-host-7", "pid": 4242,
            "started": "2026-11-30T09:00:00+00:00"}
  proc = _holder(tmp_path, record)
  try:
    with pytest.raises(WorkdirLockedError, match=r"in use by lev-train \(pid 4242, host "
                       r"gone-host-7, started 2026-11-30T09:00:00\+00:00\).*If host "
                       r"gone-host-7 is gone .* re-run with --force_unlock$"):
      with lock.hold(tmp_path, prog="lev-train"):
        pass
    with lock.hold(tmp_path, prog="lev-train", force_unlock=True):
      assert json.loads((tmp_path / ".lock").read_text())["pid"] == os.getpid()
  finally:
    _kill(proc)
  assert any("--force_unlock" in w and "gone-host-7" in w for w in warnings), warnings


def test_url_folders_are_not_locked(tmp_path, warnings):
  with lock.hold("gs://bucket/runs/x", prog="lev-train") as path:
    assert path is None
  assert "not locked" in warnings[0] and "gs://bucket/runs/x" in warnings[0]


def test_folders_it_created_are_removed_if_still_empty(tmp_path):
  run = tmp_path / "a" / "b" / "run"
  with lock.hold(run, prog="lev-train"):
    assert run.is_dir()
  assert not (tmp_path / "a").exists()
  with pytest.raises(WorkdirLockedError):  # also when the lock is refused
    with lock.hold(tmp_path, prog="x"):
      with lock.hold(tmp_path, prog="y"):
        pass
  assert list(tmp_path.iterdir()) == []


def test_a_lock_beside_the_folder_leaves_the_folder_alone(tmp_path):
  out = tmp_path / "exports" / "lev"
  with lock.hold(out, prog="lev-export", inside=False) as path:
    assert path == str(tmp_path / "exports" / ".lev.lock") and not out.exists()
    with pytest.raises(WorkdirLockedError, match="in use by lev-export"):
      with lock.hold(out, prog="lev-export", inside=False):
        pass
  assert not (tmp_path / "exports").exists()


def test_a_folder_that_is_a_file_is_one_error(tmp_path):
  (tmp_path / "run").write_text("x")
  with pytest.raises(lock.WorkdirLockError, match="run: is a file; expected a folder"):
    with lock.hold(tmp_path / "run", prog="lev-train"):
      pytest.fail("held a lock inside a file")
  assert (tmp_path / "run").read_text() == "x"


def test_a_lock_file_that_is_a_folder_is_one_error(tmp_path):
  """Issue 26.15: an IsADirectoryError traceback."""
  (tmp_path / ".lock").mkdir()
  with pytest.raises(lock.WorkdirLockError, match=rf"^{tmp_path / '.lock'}: is a folder; "
                     rf"expected {tmp_path}'s lock file: remove that folder"):
    with lock.hold(tmp_path, prog="lev-train"):
      pass
  # newcomer pass 13: lev-train asks before it reads the run (which announced an
  # extension the lock then refused)
  assert lock.lock_kind_error(tmp_path) == (
      f"{tmp_path / '.lock'}: is a folder; expected {tmp_path}'s lock file: remove that "
      "folder (or move it aside) and re-run")
  (tmp_path / ".lock").rmdir()
  assert lock.lock_kind_error(tmp_path) is None


@pytest.mark.parametrize("code, line", [
    (errno.EROFS, "the lock file cannot be created: {run} is on a read-only filesystem and "
     "lev-train writes there; copy the folder to a writable place"),
    (errno.EPERM, r"the lock file cannot be opened for writing \(Operation not permitted\); "
     r"if no run uses {run}, remove that file \(an immutable one: chattr -i first\)"),
])
def test_a_lock_file_that_cannot_be_opened_is_one_error(tmp_path, monkeypatch, code, line):
  """Issue 26.15: an existing run on a read-only mount (EROFS), an immutable .lock
  (EPERM) were tracebacks (root ignores permissions: os.open fails as they would)."""
  run = tmp_path / "run"
  run.mkdir()
  real_open = os.open

  def refused(path, *args, **kwargs):
    if str(path).endswith(".lock"):
      raise OSError(code, os.strerror(code), str(path))
    return real_open(path, *args, **kwargs)
  monkeypatch.setattr(lock.os, "open", refused)
  with pytest.raises(lock.WorkdirLockError,
                     match=re.escape(f"{run / '.lock'}: ") + line.format(run=re.escape(str(run)))):
    with lock.hold(run, prog="lev-train"):
      pass


def test_a_lock_record_that_cannot_be_written_is_one_error_leaving_no_lock_file(
    tmp_path, monkeypatch):
  def disk_full(*args):
    raise OSError(errno.ENOSPC, "No space left on device")
  monkeypatch.setattr(lock.os, "pwrite", disk_full)
  with pytest.raises(lock.WorkdirLockError, match=r"\.lock: the lock file cannot be "
                     r"written \(No space left on device\); free space"):
    with lock.hold(tmp_path / "run", prog="lev-train"):
      pass
  assert list(tmp_path.iterdir()) == []


def test_a_lock_file_that_cannot_be_removed_on_leaving_keeps_the_blocks_error(
    tmp_path, monkeypatch, warnings):
  def read_only(path):
    raise OSError(errno.EROFS, "Read-only file system")
  with pytest.raises(KeyError, match="the block's own error"):
    with lock.hold(tmp_path, prog="lev-train") as path:
      monkeypatch.setattr(lock.os, "unlink", read_only)
      raise KeyError("the block's own error")
  assert warnings == [f"{path}: the lock file cannot be removed (Read-only file system); "
                      "the next run takes it over"]


@pytest.mark.parametrize("exists", [False, True])
def test_a_filesystem_without_flock_is_refused_leaving_nothing_behind(tmp_path, monkeypatch,
                                                                      exists):
  """Issue 26.10 (T5X #452, GPFS: EINVAL): one line naming --nolock; neither the new
  folders nor an empty .lock are left (an existing folder is left as it was)."""
  import errno

  def no_flock(fd, op):
    raise OSError(errno.EINVAL, "Invalid argument")
  monkeypatch.setattr(lock.fcntl, "flock", no_flock)
  run = tmp_path / "a" / "run"
  if exists:
    run.mkdir(parents=True)
  with pytest.raises(lock.WorkdirLockError, match=r"run/\.lock: cannot be locked \(Invalid "
                     r"argument\): this filesystem does not support flock; nothing was "
                     r"written\. To run without the lock, re-run with --nolock"):
    with lock.hold(run, prog="lev-train"):
      pytest.fail("held a lock without flock")
  assert [p.relative_to(tmp_path) for p in tmp_path.rglob("*")] == (
      [run.parent.relative_to(tmp_path), run.relative_to(tmp_path)] if exists else [])


def test_nolock_still_refuses_a_live_holder(tmp_path):
  """Newcomer pass 4: a second lev-train --nolock on a run live on this host truncated
  its metrics.jsonl and wrote a stray checkpoint."""
  with lock.hold(tmp_path, prog="lev-train"):
    before = (tmp_path / ".lock").read_text()
    with pytest.raises(WorkdirLockedError, match=rf"^{tmp_path} is in use by lev-train \(pid "
                       rf"{os.getpid()}, .*; lock file {tmp_path / '.lock'}\. Wait for it"):
      with lock.hold(tmp_path, prog="lev-train", enabled=False):
        pytest.fail("wrote beside a live run")
    assert (tmp_path / ".lock").read_text() == before
  (tmp_path / ".lock").write_text("{}")  # a lock file left by a run that ended
  with lock.hold(tmp_path, prog="lev-train", enabled=False) as path:  # free: runs
    assert path is None and (tmp_path / ".lock").read_text() == "{}"
  with lock.hold(tmp_path, prog="lev-train"):  # the probe kept no lock
    pass


def test_nolock_locks_and_creates_nothing(tmp_path, warnings):
  with lock.hold(tmp_path / "run", prog="lev-train", enabled=False) as path:
    assert path is None and not (tmp_path / "run").exists()
  assert "not locked (--nolock)" in warnings[0]
  from lev_jax.cli import export
  from absl import flags
  fv = flags.FlagValues()
  export.define_flags(fv)
  assert "--nolock" in fv["lock"].help and fv(["x", "--nolock"]) == ["x"] and not fv.lock
