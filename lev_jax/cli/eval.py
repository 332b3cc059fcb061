"""`lev-eval`: evaluate a checkpoint: perplexity, frequency buckets, zero-shot tasks.

  lev-eval --checkpoint=runs/smoke_leviathan                      # latest step
  lev-eval --checkpoint=runs/smoke_leviathan --step=200 --split=test
  lev-eval --checkpoint=exports/leviathan --baseline=runs/smoke_tied/lev_eval.json
  lev-eval --checkpoint=runs/x --config.eval.downstream.piqa=piqa/valid.jsonl \\
           --config.eval.downstream.hellaswag=hellaswag/hellaswag_val.jsonl

The checkpoint is a `lev-train` workdir or a `lev-export` folder. Its own config decides
the model and the data; any `--config.<section>.<field>=value` given here overrides
that config for this evaluation (the data, `eval.*`), never the model's shape (an
override of a shape field is refused). `--config.data.validation_files=...` evaluates
on other Pile-format JSONL files (read in order, packed like the validation split).

Writes `--output` (default CHECKPOINT/lev_eval.json) with:
  validation               loss, perplexity, tokens, and per-bucket perplexity under
                           the log-frequency edges (eval.freq_bucket_edges)
  validation_equal_mass    the same under equal-mass buckets (eval.equal_mass_buckets)
  data                     what was evaluated (evaluate.data_record): split, files,
                           sha256 of the batches, N tokens evaluated of the split's M
  relative_change          with --baseline: per bucket, perplexity / baseline - 1
  downstream               per task: acc, acc_norm, their standard errors, n (and
                           LAMBADA's perplexity), from lev_jax.eval.downstream
Buckets are by each id's count in the training split (arXiv 2601.22040, Sec. 5).

A --baseline is compared only when it was evaluated on the same batches (equal
``data.sha256``); otherwise, or when its lev_eval.json predates the record, lev-eval
stops before evaluating or writing anything, unless --allow_different_data.
"""

from __future__ import annotations

import json
import os
import sys

from absl import flags
from etils import epath
from ml_collections import config_flags

from lev_jax.cli import common
from lev_jax.config import DTYPES, base_config
from lev_jax.eval.checkpoint_eval import evaluate_checkpoint
from lev_jax.workdir import LEV_EVAL_JSON, is_prepared_data, read_small_text, write_json_atomic

PROG = "lev-eval"


def _define_flags():
  common.define_path("checkpoint", None, "A lev-train workdir or a lev-export folder.",
                     what="a lev-train workdir or a lev-export folder")
  flags.DEFINE_integer("step", None, "Checkpoint step (default: the latest).")
  flags.DEFINE_enum("dtype", None, list(DTYPES),
                    "Parameter dtype for evaluation (default: as stored).")
  flags.DEFINE_enum("split", "validation", ["validation", "test"],
                    "validation: data.validation_files (or the embedded split); "
                    "test: data.test_files (or the embedded source's test split, "
                    "data.test_fraction > 0).")
  common.define_path("baseline", None, f"Another run's {LEV_EVAL_JSON} (or its folder): "
                     "adds the per-bucket relative perplexity change against it.",
                     what=f"another run's {LEV_EVAL_JSON} or its folder")
  flags.DEFINE_bool("allow_different_data", False, "Compare with a --baseline evaluated "
                    "on other data (other files, split, token count or tokenizer), or "
                    f"whose {LEV_EVAL_JSON} does not record its data.")
  common.define_path("output", None, f"Result file (default CHECKPOINT/{LEV_EVAL_JSON}).",
                     what=f"the result file, or leave the flag out for CHECKPOINT/{LEV_EVAL_JSON}")
  flags.DEFINE_bool("perplexity", True, "Evaluate validation perplexity and buckets.")
  config_flags.DEFINE_config_dict(
      "config", base_config(), "Overrides of the checkpoint's config, as "
      "--config.<section>.<field>=value (data, eval; not the model's shape).")


def _overrides() -> dict:
  """{dotted field: value} of the --config.* flags given on the command line (named from
  argv too: ml_collections leaves `present` unset for an empty tuple, `=()`, which was
  then ignored without a word; newcomer pass 11)."""
  fl = flags.FLAGS
  given = {field for _, field in common.override_fields(sys.argv)}
  return {name[len("config."):]: fl[name].value for name in fl
          if name.startswith("config.") and (fl[name].present or name[len("config."):] in given)}


def _print_summary(out: dict) -> None:
  from lev_jax.eval.evaluate import coverage
  v = out.get("validation")
  if v:
    print(f"{PROG}: step {out['step']}: {out['split']} loss {v['loss']:.4f}, "
          f"perplexity {v['perplexity']:.2f} over {v['tokens']:,} predicted tokens")
    if out.get("data"):
      print(f"  {coverage(out['data'])}")
    for key in ("validation", "validation_equal_mass"):
      if key in out:  # each bucket's target tokens: a bucket of 3 says little
        rows = ", ".join(f"{b['range']} {b['perplexity']:.1f} ({b['tokens']:,} tokens)"
                         for b in out[key]["buckets"] if b["perplexity"] is not None)
        print(f"  {out[key]['bucket_scheme']} buckets (training count): {rows}")
  change = out.get("relative_change", {})
  if change and not change.get("same_data", True):
    print("  vs baseline: evaluated on other data than the baseline "
          "(--allow_different_data): the changes below mix model and data")
  for key, rows in change.items():
    if key in ("validation", "validation_equal_mass"):
      tokens = [b["tokens"] for b in out[key]["buckets"]]
      print(f"  vs baseline ({key}): " + ", ".join(
          f"{r['range']} {100 * r['change']:+.1f}% ({n:,} tokens)"
          for r, n in zip(rows, tokens) if r["change"] is not None))
  for task, r in out.get("downstream", {}).items():
    figures = [f"{key} {_pm(r[key], r.get(key + '_stderr'))}"
               for key in ("acc", "acc_norm", "perplexity") if r.get(key) is not None]
    print(f"  {task}: {', '.join(figures)} (n={r['n']})")


def _pm(value: float, stderr: float | None) -> str:
  """'0.6667 ± 0.3333', or the value alone when there is no standard error (n < 2)."""
  return f"{value:.4f}" + (f" ± {stderr:.4f}" if stderr is not None else "")


# The keys every result lev-eval writes holds (evaluate_checkpoint): what marks one.
RESULT_KEYS = ("checkpoint", "step", "split")


def _is_lev_eval_result(path) -> bool:
  """Whether the existing file `path` is a result lev-eval wrote (RESULT_KEYS in a JSON
  object), which a new evaluation may replace; a user's other file is never replaced.
  At most workdir.SMALL_FILE_LIMIT bytes are read (a larger file is not one)."""
  try:
    data = json.loads(read_small_text(path))
  except (OSError, ValueError):  # not UTF-8, not JSON, too large
    return False
  return isinstance(data, dict) and all(k in data for k in RESULT_KEYS)


def _check_output_not_baseline(output: str | None, checkpoint: str,
                               baseline: str | None) -> None:
  """One line when the result would be written over the --baseline it is compared with
  (newcomer pass 15, V06: the baseline's result was replaced without a word)."""
  if not baseline or "://" in checkpoint or "://" in baseline or "://" in (output or ""):
    return
  path = os.path.realpath(output or os.path.join(checkpoint, LEV_EVAL_JSON))
  base = os.path.expanduser(baseline)
  base = os.path.realpath(os.path.join(base, LEV_EVAL_JSON) if os.path.isdir(base) else base)
  if path == base:
    flag = f"--output={output}" if output else f"--output (default {path})"
    common.fail(PROG, f"{flag}: is the --baseline file; the result would replace the "
                "baseline it is compared with: give another --output")


def _check_output_writable(output: str | None, checkpoint: str) -> None:
  """One line, before any evaluation, when the result file cannot be written: a folder
  given as --output, a missing --output folder (e.g. a typo), or a folder that cannot
  be written (e.g. a read-only checkpoint folder: --output elsewhere), a path inside
  a saved checkpoint (common.checkpoint_tree_error), an existing file that is not an
  earlier lev-eval result (`_is_lev_eval_result`), or what common.output_file_error
  refuses (a device such as /dev/full, a dangling symbolic link, a folder such as /proc
  in which no file can be created)."""
  if "://" not in checkpoint and os.path.exists(checkpoint) and not os.path.isdir(checkpoint):
    common.fail(PROG, f"--checkpoint={checkpoint}: is a file, not a folder (expected a "
             "lev-train workdir or a lev-export folder)")
  path = epath.Path(output or os.path.join(checkpoint, LEV_EVAL_JSON))
  folder = path.parent
  flag = f"--output={output}" if output else f"--output (default {path})"
  if "://" in str(folder):
    return
  if "://" not in checkpoint and is_prepared_data(checkpoint):  # newcomer pass 9: its
    common.fail(PROG, f"--checkpoint={checkpoint}: is prepared data (lev-prepare-data's "
                "output), not a checkpoint; expected a lev-train workdir or a lev-export "
                "folder")  # default --output in it was named instead
  inside = output and (common.checkpoint_tree_error("--output", output)
                       or common.within_owned_folder_error("--output", output,
                                                           own=checkpoint))
  if inside:  # newcomer pass 9: into another run's or export's folder
    common.fail(PROG, inside)
  if path.is_dir() and not output:  # newcomer pass 13: a path inside it was suggested
    common.fail(PROG, f"{flag}: is a folder; expected lev-eval's result file there (move "
                "the folder aside, or pass --output=FILE)")
  if path.is_dir():
    common.fail(PROG, f"{flag}: is a folder; expected the result file's path, e.g. "
                f"{path / LEV_EVAL_JSON}")
  problem = common.output_file_error(flag, os.fspath(path))  # /dev/full, a dangling link
  if problem:  # before reading it (a device never ends), or the folder's missing-line
    common.fail(PROG, problem)
  if path.is_file() and not _is_lev_eval_result(path):
    common.fail(PROG, f"{flag}: is an existing file that is not a lev-eval result (a JSON "
                f"object with {', '.join(RESULT_KEYS)}); expected a new path or an earlier "
                "lev-eval result to replace")
  if not folder.exists():
    if output:  # a missing checkpoint folder is reported by the load, naming it
      common.fail(PROG, f"{flag}: folder {folder} does not exist; expected a file in an "
                  "existing folder you can write to")
    return
  if not os.access(folder, os.W_OK | os.X_OK):
    common.fail(PROG, f"{flag}: {folder} is not writable; pass --output=PATH in a writable "
             "folder")


def main(argv):
  if len(argv) > 1:
    common.fail_unexpected(PROG, argv[1:])
  common.quiet_library_logs()
  fl = flags.FLAGS
  if not fl.checkpoint:
    common.fail(PROG, "--checkpoint is required (a lev-train workdir or a lev-export folder)")
  _check_output_writable(fl.output, fl.checkpoint)  # before minutes of evaluation
  _check_output_not_baseline(fl.output, fl.checkpoint, fl.baseline)
  common.backend_or_exit(PROG)  # JAX_PLATFORMS naming a backend this machine lacks
  try:
    out = evaluate_checkpoint(fl.checkpoint, step=fl.step, dtype=fl.dtype, split=fl.split,
                              baseline=fl.baseline, overrides=_overrides(),
                              perplexity_too=fl.perplexity,
                              allow_different_data=fl.allow_different_data)
  except (ValueError, FileNotFoundError) as e:  # every error of ours is a ValueError
    common.fail(PROG, common.first_line(e))
  # As the user gave it (relative stays relative), as _check_output_writable checked it.
  path = epath.Path(fl.output or os.path.join(fl.checkpoint, LEV_EVAL_JSON))
  write_json_atomic(path, out)
  _print_summary(out)
  print(f"{PROG}: wrote {path}", file=sys.stderr)


def run():
  common.define_or_exit(PROG, _define_flags)
  common.run(PROG, main, __name__)


if __name__ == "__main__":
  run()
