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
import types
from pathlib import Path


class ExperimentImportError(ImportError):
  """An experiment file that exists but fails to import (its own error is chained)."""


def experiments_dir() -> Path:
  """The repo's experiments/ folder (next to the package in a source checkout)."""
  return Path(__file__).resolve().parent.parent / "experiments"


def load_experiment(path) -> types.ModuleType:
  """The experiment file at `path` (str or Path), imported as a fresh module.

  Raises:
    FileNotFoundError: no file at `path` (named).
    ExperimentImportError: the file raised while being imported; the message names
      the file and the file's own error, which is chained.
  """
  path = Path(os.path.expanduser(os.fspath(path)))
  if not path.is_file():
    raise FileNotFoundError(f"{path}: no such experiment file")
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
