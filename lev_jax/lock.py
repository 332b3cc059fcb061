"""One writer per output folder: an exclusive lock that `lev-train`, `lev-prepare-data`
and `lev-export` take before they write anything.

  with lock.hold("runs/x", prog="lev-train"):   # lev-train: runs/x/.lock
    train_and_evaluate(config, "runs/x")

The lock is `fcntl.flock(LOCK_EX | LOCK_NB)` on a lock file holding JSON
{"prog", "host", "pid", "started"} (started: local time, ISO 8601, seconds). A second
process on the same folder fails at once with `WorkdirLockedError` naming the holder;
on every exit of the `with` block the lock file is removed and the lock released.

Stale locks. On a local filesystem the flock is authoritative: the kernel drops it
when its holder dies (kill -9, crash), so a lock file whose flock can be taken is
simply taken over (logged, naming the dead holder). On a network filesystem a flock
may outlive a host that went away (NFS keeps it until the lease expires) or may not
be shared between hosts at all; `force_unlock=True` (the commands' --force_unlock)
removes a lock file recorded by a process on ANOTHER host and takes a fresh lock. It
never overrides a holder on this host, which can be checked here. Object stores
(gs://, any URL) have no flock: the lock is skipped with a warning.

A filesystem without flock (some GPFS / NFS mounts: EINVAL, ENOLCK, EOPNOTSUPP) is
WorkdirLockError before anything is left behind (the lock file and the folders `hold`
created are removed); the commands' --nolock (`hold(enabled=False)`, LOCK_FLAG_HELP)
runs without the lock when the user makes sure no other run writes to the folder; a
lock file that a live process holds (where flock works, e.g. a run on this host) is
refused all the same, naming the holder.

Where the lock file lives: FOLDER/.lock (`inside=True`, lev-train), or PARENT/.NAME.lock
beside the folder (`inside=False`) for commands that replace or empty the folder
itself (lev-export renames a new folder into place, lev-prepare-data --overwrite
removes it), which would take a lock file inside with it.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import fcntl
import json
import os
import socket
from typing import Iterator

from absl import logging

from lev_jax.workdir import LOCK as LOCK_FILE


# The help of the commands' `lock` flag (absl: --nolock turns it off).
LOCK_FLAG_HELP = ("Hold the output folder's exclusive lock while writing (lev_jax/lock.py). "
                  "--nolock writes without it, for a filesystem without flock (some GPFS / "
                  "NFS mounts): you then make sure no other run writes to that folder.")


class WorkdirLockError(RuntimeError):
  """The folder's lock cannot be taken; the one-line message says why."""


class WorkdirLockedError(WorkdirLockError):
  """Another process holds the folder's lock; the one-line message names it (prog,
  pid, host, start time) and the lock file."""


def lock_path(folder, inside: bool = True) -> str:
  """The lock file of `folder`: FOLDER/.lock, or PARENT/.NAME.lock when not `inside`."""
  folder = os.path.abspath(os.path.expanduser(os.fspath(folder)))
  if inside:
    return os.path.join(folder, LOCK_FILE)
  parent, name = os.path.split(folder.rstrip(os.sep))
  return os.path.join(parent, f".{name}.lock")


def lock_kind_error(folder, inside: bool = True) -> str | None:
  """`_open_error`'s line when the folder's lock file is there as a folder, else None:
  for commands that read before they lock (lev-train reads a finished run first, and
  announced an extension that the lock then refused: newcomer pass 13)."""
  path = lock_path(folder, inside)
  if not os.path.isdir(path):
    return None
  folder = os.path.abspath(os.path.expanduser(os.fspath(folder)))
  return _open_error(folder, path, "", OSError(errno.EISDIR, "Is a directory"))


def describe(record: dict | None) -> str:
  """'lev-train (pid 12, host h, started 2026-12-01T10:00:00+00:00)' for a lock record."""
  if not record:
    return "an unknown process (its lock file is empty or unreadable)"
  return (f"{record.get('prog', 'a process')} (pid {record.get('pid', '?')}, host "
          f"{record.get('host', '?')}, started {record.get('started', '?')})")


def _this_host() -> str:
  return socket.gethostname()


def _record(prog: str) -> dict:
  return {"prog": prog, "host": _this_host(), "pid": os.getpid(),
          "started": datetime.datetime.now().astimezone().isoformat(timespec="seconds")}


def _read(fd: int) -> dict | None:
  """The JSON record in the open lock file, None when empty or not a record."""
  try:
    data = os.pread(fd, 1 << 16, 0)
    record = json.loads(data.decode()) if data.strip() else None
  except (OSError, ValueError):
    return None
  return record if isinstance(record, dict) else None


def _pid_running(pid) -> bool:
  """True when a process `pid` exists on this host (or its existence cannot be ruled out)."""
  if not isinstance(pid, int) or pid <= 0:
    return False
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except OSError:  # EPERM: it exists, owned by someone else
    return True
  return True


def _same_file(fd: int, path: str) -> bool:
  """True while `path` still names the file open as `fd` (not unlinked or replaced)."""
  try:
    st = os.stat(path)
  except FileNotFoundError:
    return False
  own = os.fstat(fd)
  return (st.st_dev, st.st_ino) == (own.st_dev, own.st_ino)


def _refuse(folder: str, path: str, holder: dict | None, force_unlock: bool):
  """Raises WorkdirLockedError for a lock that is held (the message says what to do)."""
  message = f"{folder} is in use by {describe(holder)}; lock file {path}"
  host = holder.get("host") if holder else None
  if host and host != _this_host():
    message += (f". If host {host} is gone (a network filesystem can keep its lock), "
                "re-run with --force_unlock")
  elif holder and not _pid_running(holder.get("pid")):
    message += (f". Its pid {holder.get('pid')} is no longer running: a process it "
                "started still holds the lock; stop that process")
    if force_unlock:
      message += " (--force_unlock only removes a lock held from another host)"
  else:
    message += ". Wait for it to finish or stop it"
    if force_unlock and holder:
      message += " (--force_unlock only removes a lock held from another host)"
  raise WorkdirLockedError(message)


def _open_error(folder: str, path: str, prog: str, error: OSError) -> str:
  """The one line for a lock file that cannot be opened: what is wrong, what to do."""
  if error.errno == errno.EISDIR:
    return (f"{path}: is a folder; expected {folder}'s lock file: remove that folder (or "
            "move it aside) and re-run")
  if error.errno == errno.EROFS:
    return (f"{path}: the lock file cannot be created: {folder} is on a read-only "
            f"filesystem and {prog} writes there; copy the folder to a writable place, "
            "or remount it read-write")
  if error.errno in (errno.EPERM, errno.EACCES):
    return (f"{path}: the lock file cannot be opened for writing ({error.strerror}); if "
            f"no run uses {folder}, remove that file (an immutable one: chattr -i first) "
            "or make it writable, and re-run")
  return f"{path}: the lock file cannot be opened ({error.strerror or error})"


def _open(path: str) -> tuple[int, bool]:
  """(descriptor, created): the lock file, opened read-write, created when missing (not
  inherited by exec'd children)."""
  try:
    return os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644), True
  except FileExistsError:
    pass
  try:
    return os.open(path, os.O_RDWR), False
  except FileNotFoundError:  # its holder removed it meanwhile: create it after all
    return _open(path)


def _acquire(folder: str, path: str, prog: str, force_unlock: bool) -> int:
  """Opens, flocks and fills the lock file; returns its descriptor (see the module)."""
  for _ in range(20):  # retried only when the file is replaced between open and flock
    try:
      fd, created = _open(path)
    except OSError as e:  # a folder there, read-only filesystem, immutable or foreign file
      raise WorkdirLockError(_open_error(folder, path, prog, e)) from e
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
      holder = _read(fd)
      os.close(fd)
      if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
        if created:  # nothing left behind: the file is ours, never locked by anyone
          with contextlib.suppress(OSError):
            os.unlink(path)
        raise WorkdirLockError(
            f"{path}: cannot be locked ({e.strerror or e}): this filesystem does not "
            f"support flock; nothing was written. To run without the lock, re-run with "
            f"--nolock (you then make sure no other run writes to {folder})") from e
      host = holder.get("host") if holder else None
      if force_unlock and host and host != _this_host():
        logging.warning("%s: --force_unlock: removing the lock of %s on another host",
                        path, describe(holder))
        with contextlib.suppress(FileNotFoundError):
          os.unlink(path)
        force_unlock = False  # once: a lock taken again meanwhile is a live holder
        continue
      _refuse(folder, path, holder, force_unlock)
    if not _same_file(fd, path):  # its holder removed it while we opened it: start over
      os.close(fd)
      continue
    previous = _read(fd)
    if previous:
      if previous.get("host") == _this_host() and not _pid_running(previous.get("pid")):
        why = "it is no longer running"
      else:
        why = "its lock was free (the holder ended without removing the file)"
      logging.warning("%s: taking over the lock left by %s: %s", path, describe(previous),
                      why)
    try:
      os.ftruncate(fd, 0)
      os.pwrite(fd, (json.dumps(_record(prog)) + "\n").encode(), 0)
      os.fsync(fd)
    except OSError as e:  # e.g. the disk is full: leave no empty lock file behind
      with contextlib.suppress(OSError):
        os.unlink(path)
      os.close(fd)
      raise WorkdirLockError(f"{path}: the lock file cannot be written ({e.strerror or e}); "
                             "free space on that filesystem and re-run") from e
    return fd
  raise WorkdirLockError(f"{folder}: its lock file {path} keeps being replaced by "
                         "other processes; try again")


def _probe(folder: str, path: str) -> None:
  """For --nolock: raises WorkdirLockedError when the lock file `path` exists and a live
  process holds its flock (a run on this host, or wherever flock is shared), naming the
  holder; returns otherwise, changing nothing (no file created, written or kept locked).
  On a filesystem without flock, --nolock's purpose, the probe cannot tell: it returns."""
  try:
    fd = os.open(path, os.O_RDONLY)
  except OSError:  # no lock file (or none readable): nothing to tell
    return
  try:
    fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
  except OSError as e:
    if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
      holder = _read(fd)
      os.close(fd)
      _refuse(folder, path, holder, force_unlock=False)
  os.close(fd)  # closing releases the probe's shared lock


def _missing_dirs(folder: str) -> list[str]:
  """`folder` and its ancestors that do not exist yet, deepest last."""
  missing = []
  while folder and not os.path.exists(folder):
    missing.append(folder)
    parent = os.path.dirname(folder)
    if parent == folder:
      break
    folder = parent
  return missing[::-1]


@contextlib.contextmanager
def hold(folder, *, prog: str, inside: bool = True, force_unlock: bool = False,
         enabled: bool = True) -> Iterator[str | None]:
  """Holds `folder`'s exclusive lock for the duration of the `with` block.

  Creates the folder (inside=True) or its parent (inside=False) when missing, and
  removes the ones it created on leaving if they are still empty (a command that fails
  before writing leaves nothing behind).

  Args:
    folder: the output folder (local path; a URL is not locked).
    prog: the command, recorded in the lock file and named to a second process.
    inside: lock file FOLDER/.lock (True) or PARENT/.NAME.lock (False); see the module.
    force_unlock: remove a lock recorded by a process on another host (see the module).
    enabled: False (the commands' --nolock): lock nothing and create nothing (a
      warning says so); for a filesystem without flock. A lock file whose flock a live
      process holds (a run on this host) is still refused (`_probe`).
  Yields:
    The lock file's path, or None when `folder` is a URL or not `enabled` (nothing
    locked).
  Raises:
    WorkdirLockedError: another live process holds the lock (host, pid, start named),
      with --nolock too where flock works.
    WorkdirLockError: the filesystem has no flock (the lock file and the folders
      created for it are removed first; the message names --nolock), or the lock file
      keeps changing.
    WorkdirLockError: also when the folder is a file or cannot be created, or the lock
      file cannot be opened (a folder, a read-only filesystem, an immutable or foreign
      file) or written (disk full): the one line says what to do.
  """
  text = os.fspath(folder)
  if not enabled:
    if "://" not in text:
      _probe(text, lock_path(text, inside))  # a live holder is refused all the same
    logging.warning("%s: not locked (--nolock): make sure no other run writes to it", text)
    yield None
    return
  if "://" in text:
    logging.warning("%s: not a local folder, so not locked (flock does not work on "
                    "object stores): make sure no other run writes to it", text)
    yield None
    return
  path = lock_path(text, inside)
  where = os.path.dirname(path)
  if os.path.exists(where) and not os.path.isdir(where):
    raise WorkdirLockError(f"{where}: is a file; expected a folder")
  created = _missing_dirs(where)
  try:
    os.makedirs(where, exist_ok=True)
  except OSError as e:  # a file on the way, no permission, read-only filesystem
    link = next((d for d in [*created, where] if os.path.islink(d)), None)
    if link:  # makedirs' "File exists" for a symbolic link to nothing
      raise WorkdirLockError(f"{link}: is a dangling symbolic link to {os.readlink(link)}; "
                             "expected a folder (create the folder it points to, or remove "
                             "the link)") from e
    raise WorkdirLockError(f"{where}: cannot create the folder ({e.strerror or e})") from e
  try:
    fd = _acquire(text, path, prog, force_unlock)
  except BaseException:
    _remove_empty(created)
    raise
  held = (fd, path, created)
  _HELD.append(held)
  try:
    yield path
  finally:
    if held in _HELD:  # else released by release_held
      _HELD.remove(held)
      _release(*held)


# The locks this process holds: (fd, lock file, folders `hold` created), for
# `release_held`.
_HELD: list[tuple[int, str, list[str]]] = []


def _release(fd: int, path: str, created: list[str]) -> None:
  if _same_file(fd, path):  # unlink while holding the flock, then release it
    try:
      os.unlink(path)
    except FileNotFoundError:
      pass
    except OSError as e:  # e.g. remounted read-only: the error being raised matters
      logging.warning("%s: the lock file cannot be removed (%s); the next run takes it "
                      "over", path, e.strerror or e)
  os.close(fd)
  _remove_empty(created)


def release_held() -> None:
  """Releases every lock this process holds as leaving its `hold` would: the lock file
  removed, then the folders `hold` created removed if they are empty. For a process
  about to end with os._exit (lev-train's second Ctrl-C), which skips the `with`
  exits: a new workdir that holds nothing but its lock is not left behind."""
  while _HELD:
    _release(*_HELD.pop())


def _remove_empty(dirs: list[str]) -> None:
  for d in reversed(dirs):
    try:
      os.rmdir(d)
    except OSError:  # not empty (or gone): keep it
      return
