"""lev_jax.parent_watch: a pool's workers end with a parent killed by SIGKILL."""

import os
import signal
import subprocess
import sys
import textwrap
import time

from lev_jax import parent_watch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _gone(pid: int) -> bool:
  """True once `pid` has ended (a zombie nobody reaps counts as ended)."""
  try:
    with open(f"/proc/{pid}/stat") as f:
      return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
  except FileNotFoundError:
    return True


def test_pool_workers_end_when_their_parent_is_killed(tmp_path):
  """Issue 26.16: killing lev-prepare-data's main process left its workers running."""
  script = tmp_path / "parent.py"
  script.write_text(textwrap.dedent("""
    import multiprocessing, os, sys, time
    from lev_jax.parent_watch import exit_with_parent

    if __name__ == "__main__":
      ctx = multiprocessing.get_context("spawn")
      watch = sys.argv[1] == "watch"
      pool = ctx.Pool(1, initializer=exit_with_parent if watch else None)
      print(pool.apply(os.getpid), flush=True)
      pool.apply_async(time.sleep, (60,))
      time.sleep(60)
  """))
  workers = {}
  for mode in ("watch", "none"):
    parent = subprocess.Popen([sys.executable, str(script), mode], stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, text=True,  # its semaphore warning
                              env=dict(os.environ, PYTHONPATH=REPO))
    workers[mode] = int(parent.stdout.readline())
    parent.send_signal(signal.SIGKILL)
    parent.wait()
  deadline = time.monotonic() + 10
  while not _gone(workers["watch"]) and time.monotonic() < deadline:
    time.sleep(0.02)
  try:
    assert _gone(workers["watch"])
    assert not _gone(workers["none"])  # without it, the worker runs on (the issue)
  finally:
    for pid in workers.values():
      if not _gone(pid):
        os.kill(pid, signal.SIGKILL)


def test_a_main_process_has_no_parent_to_watch():
  assert parent_watch.exit_with_parent() is False

