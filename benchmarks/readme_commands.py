"""Run every command of README.md and docs/*.md in order, as written, in a scratch clone.

  python benchmarks/readme_commands.py                 # all runnable commands
  python benchmarks/readme_commands.py --list          # print them (and the skipped ones)
  python benchmarks/readme_commands.py --venv .venv    # reuse a venv: skip the installs

The commands are the lines of the ```bash blocks and the "$ " lines of the ```console
blocks (a trailing backslash continues a line; "# ..." comments are dropped) of
README.md, then of each guide in docs/ in DOCS order, each file in its own order. They
run with bash in a fresh `git clone` of this repository (committed files only), with
`.venv/bin` first on PATH, as a user who activated the venv would. Commands that need
what one machine does not have (a TPU pod, a SLURM cluster, gs:// buckets, The Pile at
/data or /path/to, the 1.2B ladder) are listed as skipped with the reason. With --venv,
the README's first two lines (which create the venv) run without their install step, on
a link to that venv.

Exit status: 0 when every runnable command exited 0, else 1 (each failure is printed
with its exit status and the last lines of its output).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# A command matching one of these is not run here, for the reason given.
SKIP = (
    (r"gs://", "needs a gs:// bucket"),
    (r"/path/to/|/data/|/shared/", "needs files this machine does not have"),
    (r"launch/tpu\.py|launch/slurm\.py", "needs a TPU pod or a SLURM cluster"),
    (r"^apt-get |slurm_cluster as s|SLURM_CONF|^squeue |lev_slurm",
     "installs Debian packages or runs a local SLURM cluster (root)"),
    (r"lev-compile .*experiments/ladder\.py", "compiles a 200M-1.2B rung for a pod slice "
     "(minutes each; benchmarks/pod_compile.py)"),
    (r"experiments/ladder\.py:\w+_(200m|400m|800m|1\.2b)(?!.*lev-params)",
     "trains a 200M-1.2B rung (a pod's job)"),
)
INSTALL = "python3 -m venv .venv && .venv/bin/pip install -e '.[test]' && "
# The guides under docs/, in the order their commands run (after the README's): every
# docs/*.md is listed (tests/test_readme_commands.py checks it).
DOCS = ("training.md", "reliability.md", "evaluation.md", "results.md", "model.md",
        "scaling-out.md", "data.md", "developing.md")


def doc_files(repo: Path = REPO) -> list[Path]:
  """README.md, then docs/<DOCS>: the files whose commands run, in that order."""
  return [repo / "README.md", *(repo / "docs" / name for name in DOCS)]


def all_commands(repo: Path = REPO) -> list[tuple[str, str]]:
  """(file relative to the repo, command) for every command of doc_files, in order."""
  return [(str(path.relative_to(repo)), command) for path in doc_files(repo)
          for command in readme_commands(path.read_text())]


def readme_commands(text: str) -> list[str]:
  """One Markdown file's commands in order: ```bash lines and ```console "$ " lines, with
  backslash continuations joined and comment lines dropped."""
  commands, block, pending = [], None, ""
  for line in text.splitlines():
    fence = re.match(r"^```(\w*)", line)
    if fence:
      block = None if block else fence.group(1)
      continue
    if block not in ("bash", "console"):
      continue
    if block == "console":
      if not pending and not line.startswith("$ "):
        continue
      line = line[2:] if not pending else line
    if not pending and line.lstrip().startswith("#"):
      continue
    line = pending + line.strip()
    if line.endswith("\\"):
      pending = line[:-1].rstrip() + " "
      continue
    pending = ""
    line = re.sub(r"\s+#.*$", "", line).strip()  # trailing comment
    if line:
      commands.append(line)
  return commands


def skip_reason(command: str) -> str | None:
  if command.startswith("lev-params"):
    return None  # counts parameters of any rung without building it
  for pattern, reason in SKIP:
    if re.search(pattern, command):
      return reason
  return None


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--list", action="store_true", help="print the commands and exit")
  p.add_argument("--venv", default=None, help="an existing venv to reuse (skips installs)")
  p.add_argument("--keep", action="store_true", help="keep the scratch clone")
  p.add_argument("--until", type=int, default=None,
                 help="stop after command N (numbers as --list prints them)")
  args = p.parse_args(argv)
  located = all_commands()
  commands = [c for _, c in located]
  if args.list:
    for i, (path, c) in enumerate(located, 1):
      reason = skip_reason(c)
      print(f"{i:3d}. {path}: {c}" + (f"    [skipped: {reason}]" if reason else ""))
    return 0
  venv = Path(args.venv).resolve() if args.venv else None
  if venv is not None and not (venv / "bin" / "python").exists():
    p.error(f"--venv={args.venv}: no bin/python there")
  scratch = Path(tempfile.mkdtemp(prefix="readme_commands_"))
  clone = scratch / "lev_jax"
  subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True)
  if venv is not None:
    (clone / ".venv").symlink_to(venv)
  env = dict(os.environ, PATH=f"{clone / '.venv' / 'bin'}{os.pathsep}{os.environ['PATH']}")
  failures = 0
  for i, (path, command) in enumerate(located[:args.until], 1):
    reason = skip_reason(command)
    if reason:
      print(f"{i:3d}. skipped ({reason}): {path}: {command}", flush=True)
      continue
    run = command[len(INSTALL):] if venv is not None and command.startswith(INSTALL) else command
    start = time.perf_counter()
    p_ = subprocess.run(["bash", "-c", run], cwd=clone, env=env, capture_output=True,
                        text=True)
    seconds = time.perf_counter() - start
    ok = p_.returncode == 0
    print(f"{i:3d}. {'ok  ' if ok else 'FAIL'} {seconds:7.1f} s  {path}: {command}",
          flush=True)
    if not ok:
      failures += 1
      tail = (p_.stdout + p_.stderr).strip().splitlines()[-8:]
      print(f"     exit status {p_.returncode}; last lines:\n       " + "\n       ".join(tail))
  print(f"{len(commands)} commands, {failures} failed; scratch clone {clone}"
        + ("" if args.keep else " (removed)"))
  if not args.keep:
    subprocess.run(["rm", "-rf", str(scratch)], check=False)
  return 1 if failures else 0


if __name__ == "__main__":
  sys.exit(main())
