"""Experiment files: where the repo's live and how any one is imported.

An experiment file is a plain Python file (experiments/smoke.py, experiments/ladder.py,
a user's own) with `get_config(variant) -> ml_collections.ConfigDict`; a ladder or study
file also has `RUNGS`. `lev-train --config=FILE:VARIANT` reads one through
ml_collections' config_flags; everything else (the ladder and study drivers, experiment
files building on each other, tests, benchmarks) imports one with `load_experiment`:

  from lev_jax.experiments import experiments_dir, load_experiment
  smoke = load_experiment(experiments_dir() / "smoke.py")
  config = smoke.get_config("leviathan")

Files are imported by path (they need not be on sys.path, and experiments/ is not a
package): each call executes the file afresh, as config_flags does.
"""

from __future__ import annotations

import importlib.util
import os
import stat
import types
from pathlib import Path


class ExperimentImportError(ImportError):
  """An experiment file that exists but fails to import (its own error is chained)."""


class NotAnExperimentFile(ValueError):
  """A path that exists but is not a Python file (`file_problem`); `.problem` says what
  it is."""

  def __init__(self, path, problem: str):
    super().__init__(f"{path}: {problem}")
    self.problem = problem


def file_problem(path) -> str | None:
  """What keeps `path` (str or Path, `~` expanded) from being imported as an experiment
  file, as a phrase for `<flag>=<path>: <phrase>`: "no such file", "is a dangling
  symbolic link to TARGET", "is a folder", "is a character device, not a regular file"
  (/dev/zero; also block devices, pipes, sockets), "not a Python file (no .py suffix)"
  (importlib has no loader for another suffix); None for an existing .py file."""
  path = os.path.expanduser(os.fspath(path))
  if not os.path.exists(path):
    if os.path.islink(path):
      return f"is a dangling symbolic link to {os.readlink(path)}"
    return "no such file"
  mode = os.stat(path).st_mode
  if stat.S_ISDIR(mode):
    return "is a folder"
  if not stat.S_ISREG(mode):
    kind = ("a character device" if stat.S_ISCHR(mode) else "a block device"
            if stat.S_ISBLK(mode) else "a named pipe" if stat.S_ISFIFO(mode) else "a socket")
    return f"is {kind}, not a regular file"
  if not path.endswith(".py"):
    return "not a Python file (no .py suffix)"
  return None


def experiments_dir() -> Path:
  """The repo's experiments/ folder (next to the package in a source checkout)."""
  return Path(__file__).resolve().parent.parent / "experiments"


def load_experiment(path) -> types.ModuleType:
  """The experiment file at `path` (str or Path), imported as a fresh module.

  Raises:
    FileNotFoundError: nothing at `path` (named).
    NotAnExperimentFile: something else than a .py file there (`file_problem`: a
      folder, /dev/zero, a dangling link, FILE.txt).
    ExperimentImportError: the file raised while being imported; the message names
      the file and the file's own error, which is chained.
  """
  path = Path(os.path.expanduser(os.fspath(path)))
  problem = file_problem(path)
  if problem == "no such file":
    raise FileNotFoundError(f"{path}: no such experiment file")
  if problem:
    raise NotAnExperimentFile(path, problem)
  spec = importlib.util.spec_from_file_location(f"lev_jax_experiment_{path.stem}", path)
  module = importlib.util.module_from_spec(spec)
  try:
    spec.loader.exec_module(module)
  except Exception as e:  # the file's own error, named with the file
    raise ExperimentImportError(f"{path}: failed to import: {type(e).__name__}: {e}") from e
  return module


def set_study_budget(config, *, steps: int, global_batch_size: int, seq_len: int,
                     eval_every: int, test_fraction: float) -> None:
  """Gives a study run (experiments/*_study.py) its training budget, in place.

  `steps` optimizer steps of `global_batch_size` x `seq_len` tokens, one checkpoint (at
  the end; kept alone), a log line every 8 steps and a 2,048-target validation every
  `eval_every` steps, 8 warm-up steps, and `test_fraction` of the documents held out as
  the test split. Every study shares these settings so their runs differ only in what
  each study varies.
  """
  t = config.train
  t.steps, t.global_batch_size, t.seq_len = steps, global_batch_size, seq_len
  t.log_every = 8
  t.eval_every = eval_every
  t.checkpoint_every = steps
  t.keep_checkpoints = 1
  config.data.test_fraction = test_fraction
  config.optim.warmup_steps = 8
  config.eval.batches, config.eval.batch_size = 2, 8  # 2,048 targets per eval
