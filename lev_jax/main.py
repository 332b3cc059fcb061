"""`lev-train`: train a Leviathan or tied model from one command.

  lev-train                                   # default: smoke Leviathan on embedded data
  lev-train --config=experiments/smoke.py:tied --workdir=runs/tied --config.train.steps=50

Flags follow ml_collections.config_flags: any field can be overridden with
--config.<section>.<field>=value. Without --workdir the run goes to ./runs/<config.name>.
Re-running the same command on the same workdir resumes from its latest checkpoint.
"""

from __future__ import annotations

import sys

from absl import app, flags, logging
from ml_collections import config_flags

from lev_jax import experiments_dir
from lev_jax.checkpoint import CheckpointMismatchError
from lev_jax.config import ConfigError
from lev_jax.data import DataError

DEFAULT_CONFIG = str(experiments_dir() / "smoke.py") + ":leviathan"


def _define_flags():
  config_flags.DEFINE_config_file(
      "config", DEFAULT_CONFIG, "Experiment file and variant, e.g. experiments/smoke.py:tied.")
  flags.DEFINE_string("workdir", None, "Output directory (default ./runs/<config.name>).")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  from lev_jax.trainer import train_and_evaluate  # after flags: keeps --help fast
  config = flags.FLAGS.config
  workdir = flags.FLAGS.workdir or f"runs/{config.name}"
  logging.info("config %s -> workdir %s", config.name, workdir)
  try:
    result = train_and_evaluate(config, workdir)
  except (ConfigError, DataError, CheckpointMismatchError, FileNotFoundError) as e:
    print(f"lev-train: error: {e}", file=sys.stderr)
    sys.exit(2)
  if result is not None:
    print(f"lev-train: {config.name} step {result['step']}: validation loss "
          f"{result['loss']:.4f}, perplexity {result['perplexity']:.2f} -> {workdir}/eval.json")


def run():
  _define_flags()
  app.run(main)


if __name__ == "__main__":
  run()
