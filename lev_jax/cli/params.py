"""`lev-params`: parameter counts by part, for any config, without allocating the model.

`lev-params --config=experiments/ladder.py:leviathan_1.2b` prints embedding (input
table), LEV, backbone, head and total; for a `lev` model it also builds the tied twin
(same config, model.embedding='tied') and shows that Leviathan - tied = LEV count, and
for configs with a `label_params` it shows the deviation from the label
(lev_jax/params.py).
"""

from __future__ import annotations

from ml_collections import config_flags

from lev_jax.cli import common
from lev_jax.config import ConfigError
from lev_jax.experiments import experiments_dir
from lev_jax.params import report


def main(argv):
  if len(argv) > 1:
    common.fail_unexpected("lev-params", argv[1:])
  common.quiet_library_logs()
  try:
    print(report(common.config_or_exit("lev-params")))
  except ConfigError as e:
    common.fail("lev-params", str(e))


def run():
  common.define_or_exit("lev-params", lambda: config_flags.DEFINE_config_file(
      "config", str(experiments_dir() / "smoke.py") + ":leviathan", "Experiment file[:variant]."))
  common.run("lev-params", main, __name__)


if __name__ == "__main__":
  run()
