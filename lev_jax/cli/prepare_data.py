"""`lev-prepare-data`: Pile-format JSONL -> ArrayRecord shards for data.source='prepared'.

  lev-prepare-data --config=experiments/ladder.py:tied_1.2b [--workers=N] [--overwrite]
      [--config.data.prepared_dir=gs://bucket/pile-o200k]
  lev-prepare-data --config=experiments/smoke.py:leviathan --config.data.source=prepared
      --config.data.train_files="('/data/pile/train/*.jsonl.zst',)"
      --config.data.validation_files="('/data/pile/val.jsonl.zst',)"
      --config.data.prepared_dir=/data/pile-prepared

Reads config.data (train/validation/test files, tokenizer, prepare_format, strict,
pile_set_names, prepare_workers = --workers; with data.source = 'embedded' it prepares
the embedded corpus, so set data.source for your own files) and writes the dataset `lev_jax.data.prepared`
describes, one shard per input file, in parallel. Re-running the same command resumes
an interrupted preparation (finished shards are kept) and does nothing for a finished
one; a folder holding another run's dataset is an error unless --overwrite. Then train
with --config.data.source=prepared --config.data.prepared_dir=<the same folder>.

One preparation per folder: it holds PARENT/.NAME.lock beside the folder
(lev_jax.lock), and a second one on the same folder stops at once naming the holder;
--force_unlock removes a lock left by a run on another host that is gone; --nolock
prepares without the lock (a filesystem without flock).
"""

from __future__ import annotations

import contextlib

from absl import flags, logging
from ml_collections import config_flags

from lev_jax import lock as workdir_lock
from lev_jax.cli import common
from lev_jax.config import ConfigError, validate
from lev_jax.data.errors import DataError

PROG = "lev-prepare-data"


def _define_flags():
  config_flags.DEFINE_config_file(
      "config", None, "Experiment file and variant, e.g. experiments/ladder.py:tied_1.2b.")
  common.define_path("output_dir", None, "Dataset folder (default config.data.prepared_dir).",
                     what="the dataset folder, or leave the flag out for "
                     "config.data.prepared_dir")
  flags.DEFINE_integer("workers", None, "Worker processes (default "
                       "config.data.prepare_workers, 0 = one per CPU core).", lower_bound=0)
  flags.DEFINE_bool("overwrite", False, "Replace a folder holding another preparation "
                    "run's dataset (finished or not).")
  flags.DEFINE_bool("force_unlock", False, "Remove the folder's lock when it was left by a "
                    "run on another host that is gone (see lev_jax/lock.py).")
  flags.DEFINE_bool("lock", True, workdir_lock.LOCK_FLAG_HELP)


def summary(report: dict) -> str:
  """The lines `lev-prepare-data` prints: per split documents, tokens and skipped lines
  by reason; the folder; seconds and tokens per second of this call."""
  tok = report["tokenizer"]
  state = "already prepared" if report.get("already_prepared") else "prepared"
  lines = [f"{PROG}: {state} {report['output_dir']} (run {report['run_id']}, "
           f"{report['format']} records, {tok['name']} tokenizer, {tok['vocab_size']:,} ids)"]
  for split, r in report["splits"].items():
    skipped = ", ".join(f"{k}={v:,}" for k, v in r["skipped"].items() if v) or "none"
    lines.append(f"  {split:<10} {r['files']:>6,} files {r['documents']:>14,} documents "
                 f"{r['tokens']:>16,} tokens (no eos)  skipped: {skipped}")
  seconds = report["seconds"]
  rate = report["written_tokens"] / seconds if seconds > 0 else 0.0
  lines.append(f"  {seconds:.1f} s, {report['written_shards']} shard(s) written, "
               f"{rate:,.0f} tokens/s")
  return "\n".join(lines)


def main(argv):
  if len(argv) > 1:
    common.fail_unexpected(PROG, argv[1:])
  common.quiet_library_logs()
  if flags.FLAGS.config is None:
    common.fail(PROG, "--config is required, e.g. --config=experiments/ladder.py:tied_1.2b")
  config = common.config_or_exit(PROG)
  from lev_jax.data.prepare import prepare  # after flags: keeps --help fast
  if flags.FLAGS.output_dir:  # the dataset's folder, as config.data.prepared_dir would be
    config.data.prepared_dir = flags.FLAGS.output_dir
  try:
    validate(config)  # before the folder or its lock is created
    output_dir = flags.FLAGS.output_dir or config.data.prepared_dir
    flag = "--output_dir" if flags.FLAGS.output_dir else "config.data.prepared_dir"
    inside = output_dir and (common.checkpoint_tree_error(flag, output_dir)
                             or common.within_owned_folder_error(flag, output_dir))
    if inside:
      common.fail(PROG, inside)
    # The lock sits beside the folder: --overwrite removes the folder itself.
    lock = (workdir_lock.hold(output_dir, prog=PROG, inside=False,
                              force_unlock=flags.FLAGS.force_unlock,
                              enabled=flags.FLAGS.lock)
            if output_dir else contextlib.nullcontext())  # none: prepare() says so
    with lock:
      report = prepare(config, output_dir=flags.FLAGS.output_dir,
                       workers=flags.FLAGS.workers, overwrite=flags.FLAGS.overwrite)
  except workdir_lock.WorkdirLockError as e:  # the lock file beside the folder: name it
    cause = e.__cause__ if isinstance(e.__cause__, OSError) else None
    name = "--output_dir" if flags.FLAGS.output_dir else "config.data.prepared_dir"
    common.fail(PROG, (cause and common.output_path_error(name, output_dir, cause))
                or str(e))
  except (ConfigError, DataError) as e:
    common.fail(PROG, str(e))
  logging.info("%s: report %s/report.json", PROG, report["output_dir"])
  print(summary(report))


def run():
  common.define_or_exit("lev-prepare-data", _define_flags)
  common.run(PROG, main, __name__, interrupted="{cause}; finished shards are "
             "kept: run the same command again to resume")


if __name__ == "__main__":
  run()
