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
                           LAMBADA's perplexity), from lev_jax.downstream
Buckets are by each id's count in the training split (arXiv 2601.22040, Sec. 5).

A --baseline is compared only when it was evaluated on the same batches (equal
``data.sha256``); otherwise, or when its lev_eval.json predates the record, lev-eval
stops before evaluating or writing anything, unless --allow_different_data.
"""

from __future__ import annotations

import copy
import json
import os
import sys

from absl import flags, logging
from etils import epath
from ml_collections import config_flags

from lev_jax import cli
from lev_jax.checkpoint import SHAPE_FIELDS
from lev_jax.config import DTYPES, ConfigError, base_config, validate
from lev_jax.workdir import LEV_EVAL_JSON, TOKEN_COUNTS, write_json_atomic

PROG = "lev-eval"


def _define_flags():
  flags.DEFINE_string("checkpoint", None, "A lev-train workdir or a lev-export folder.")
  flags.DEFINE_integer("step", None, "Checkpoint step (default: the latest).")
  flags.DEFINE_enum("dtype", None, list(DTYPES),
                    "Parameter dtype for evaluation (default: as stored).")
  flags.DEFINE_enum("split", "validation", ["validation", "test"],
                    "validation: data.validation_files (or the embedded split); "
                    "test: data.test_files (or the embedded source's test split, "
                    "data.test_fraction > 0).")
  flags.DEFINE_string("baseline", None, f"Another run's {LEV_EVAL_JSON} (or its folder): "
                      "adds the per-bucket relative perplexity change against it.")
  flags.DEFINE_bool("allow_different_data", False, "Compare with a --baseline evaluated "
                    "on other data (other files, split, token count or tokenizer), or "
                    f"whose {LEV_EVAL_JSON} does not record its data.")
  flags.DEFINE_string("output", None, f"Result file (default CHECKPOINT/{LEV_EVAL_JSON}).")
  flags.DEFINE_bool("perplexity", True, "Evaluate validation perplexity and buckets.")
  config_flags.DEFINE_config_dict(
      "config", base_config(), "Overrides of the checkpoint's config, as "
      "--config.<section>.<field>=value (data, eval; not the model's shape).")


def _overrides() -> dict:
  """{dotted field: value} of the --config.* flags given on the command line."""
  fl = flags.FLAGS
  return {name[len("config."):]: fl[name].value for name in fl
          if name.startswith("config.") and fl[name].present}


def apply_overrides(config, overrides: dict):
  """The checkpoint's config with `overrides` applied; shape fields are refused.

  Raises:
    ConfigError: an override of a field in checkpoint.SHAPE_FIELDS, or an invalid
      resulting config (the field named).
  """
  shape = {f"{section}.{f}" for section, fields in SHAPE_FIELDS.items() for f in fields}
  for field, value in overrides.items():
    if field in shape:
      raise ConfigError(f"--config.{field}: the model's shape comes from the checkpoint "
                        "and cannot be overridden")
    node, *path, leaf = [config, *field.split(".")]
    for part in path:
      node = node[part]
    node[leaf] = value
  return validate(config)


def _eval_batches(config, tokenizer, validation_override: bool, split: str):
  """(batches, training token counts or None, `evaluate.data_record`) of the
  configured validation split, or straight from given files (named `split`); see
  `data.evaluation_batches` (config is not changed)."""
  from lev_jax.data import evaluation_batches
  files = list(config.data.validation_files) if validation_override else None
  return evaluation_batches(config, tokenizer, files=files, split=split)


def perplexity(im, config, validation_override: bool = False, eval_step=None, *,
               split: str = "validation", check_data=None) -> dict:
  """{"validation", "validation_equal_mass"?, "data"}: `evaluate` results for `im` (one
  pass) and what was evaluated (`evaluate.data_record`).

  eval_step: a `train.make_eval_step` of `partition(config)` to reuse (one compilation
  for several splits); None builds one. split: the name recorded for
  validation_override files ("validation" or "test"). check_data: called with the data
  record once the batches are built, before any evaluation (it may raise).

  Raises:
    ConfigError / DataError: bad data settings, or no token counts for the buckets.
  """
  import jax
  from flax import nnx
  from lev_jax.evaluate import equal_mass_edges, evaluate_schemes
  from lev_jax.train import make_eval_step, partition
  batches, counts, record = _eval_batches(config, im.tokenizer, validation_override, split)
  if check_data is not None:
    check_data(record)
  counts = im.token_counts_V if im.token_counts_V is not None else counts
  if counts is None:
    raise ConfigError(f"{im.source}: no {TOKEN_COUNTS} beside the checkpoint; "
                      "frequency buckets need the training split's counts")
  schemes = {"log": list(config.eval.freq_bucket_edges)}
  if config.eval.equal_mass_buckets:
    schemes["equal_mass"] = equal_mass_edges(counts, config.eval.equal_mass_buckets)
  part = partition(config)
  params = jax.device_put(nnx.state(im.model, nnx.Param), part.state_sharding["params"])
  results = evaluate_schemes(eval_step or make_eval_step(part), params, batches, counts,
                             schemes)
  out = {"validation": results["log"]}
  if "equal_mass" in results:
    out["validation_equal_mass"] = results["equal_mass"]
  out["data"] = record
  return out


def _read_baseline(baseline_path, allow_different_data: bool = False) -> tuple[dict, str]:
  """(the baseline's lev_eval.json, its path), read before any evaluation.

  Raises:
    ConfigError: missing, unreadable, or holding no validation result; or (unless
      allow_different_data) not recording the data it was evaluated on.
  """
  path = epath.Path(baseline_path)
  if path.is_dir():
    path = path / LEV_EVAL_JSON
  try:
    base = json.loads(path.read_text())
  except (OSError, json.JSONDecodeError) as e:
    raise ConfigError(f"--baseline={baseline_path}: cannot read a {LEV_EVAL_JSON} ({e}); "
                      "run lev-eval on the baseline first") from e
  if not isinstance(base, dict) or "validation" not in base:
    raise ConfigError(f"--baseline={path}: it holds no validation result to compare with")
  if not isinstance(base.get("data"), dict) and not allow_different_data:
    raise ConfigError(f"--baseline={path}: it does not record the data it was evaluated "
                      "on (written by an older lev-eval); re-run lev-eval on the baseline, "
                      "or pass --allow_different_data")
  return base, os.fspath(path)


def check_same_data(base: dict, path: str, record: dict,
                    allow_different_data: bool = False) -> None:
  """Refuses a baseline evaluated on other batches than `record` (another split, other
  files, token count, tokenizer or segment masking: another ``data.sha256``).

  Raises:
    ConfigError: the data differ and not allow_different_data (both named).
  """
  from lev_jax.evaluate import describe_data, same_data
  if not same_data(base.get("data"), record) and not allow_different_data:
    raise ConfigError(f"--baseline={path}: evaluated on other data than this run "
                      f"(baseline: {describe_data(base.get('data'))}; this run: "
                      f"{describe_data(record)}); evaluate both on the same data, or pass "
                      "--allow_different_data")


def relative_changes(result: dict, base: dict, path: str) -> dict:
  """{"baseline": path, "same_data": bool, scheme: evaluate.relative_change rows}
  against another run (same_data: equal `evaluate.data_record` sha256s).

  Raises:
    ConfigError: the two runs' buckets have different edges (the baseline named).
  """
  from lev_jax.evaluate import relative_change, same_data
  out = {"baseline": path, "same_data": same_data(base.get("data"), result.get("data"))}
  for key in ("validation", "validation_equal_mass"):
    if key in result and key in base:
      try:
        out[key] = relative_change(base[key], result[key])
      except ValueError as e:
        raise ConfigError(f"--baseline={path}: {e}") from e
  return out


def _downstream_files(config) -> dict:
  """{task: file} of config.eval.downstream (piqa_labels is PIQA's option, not a task).

  Raises:
    ConfigError: piqa_labels without piqa (it would be ignored).
  """
  d = config.eval.downstream
  files = {k: v for k, v in d.items() if v and k != "piqa_labels"}
  if d.piqa_labels and "piqa" not in files:
    raise ConfigError(f"--config.eval.downstream.piqa_labels={d.piqa_labels}: "
                      "config.eval.downstream.piqa is empty; give the PIQA data file too")
  return files


def downstream_tasks(im, config) -> dict:
  """Zero-shot results for every task with a file in config.eval.downstream.

  Raises:
    ConfigError: piqa_labels without piqa. DownstreamError: a bad task file.
  """
  from lev_jax import downstream
  from lev_jax.scoring import Scorer
  files = _downstream_files(config)
  if not files:
    return {}
  scorer = Scorer(im.model, im.tokenizer, max_len=config.train.seq_len,
                  batch_size=config.eval.batch_size)
  options = {"piqa": {"labels": config.eval.downstream.piqa_labels or None}}
  return downstream.evaluate_tasks(scorer, files, limit=config.eval.downstream_limit or None,
                                   options=options, progress=True)  # minutes: a bar each


def _print_summary(out: dict) -> None:
  from lev_jax.evaluate import coverage
  v = out.get("validation")
  if v:
    print(f"{PROG}: step {out['step']}: {out['split']} loss {v['loss']:.4f}, "
          f"perplexity {v['perplexity']:.2f} over {v['tokens']} tokens")
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


def heldout_test_files(config) -> tuple:
  """The files of the test split: data.test_files, or for the embedded source with
  data.test_fraction > 0 its test shard (`embedded.write_embedded_corpus`).

  Raises:
    ConfigError: no test split (naming both fields).
  """
  d = config.data
  if d.test_files:
    return tuple(d.test_files)
  if d.source == "embedded" and d.get("test_fraction", 0.0) > 0:
    from lev_jax.data.embedded import write_embedded_corpus
    paths = write_embedded_corpus(os.path.expanduser(d.cache_dir), d.validation_fraction,
                                  d.test_fraction)
    return (os.fspath(paths["test"]),)
  raise ConfigError("--split=test: config.data.test_files is empty" + (
      " and config.data.test_fraction = 0 (the embedded source holds out a test split "
      "only with data.test_fraction > 0)" if d.source == "embedded" else ""))


def evaluate_checkpoint(checkpoint, *, step=None, dtype=None, split="validation",
                        baseline=None, overrides: dict | None = None,
                        perplexity_too: bool = True,
                        allow_different_data: bool = False) -> dict:
  """Everything `lev-eval` computes for one checkpoint (see the module docstring).

  Raises:
    InferenceError, ConfigError, DataError, DownstreamError (ValueErrors): a bad
      checkpoint, override, split, baseline, data or task file, named in the message;
      a baseline evaluated on other data, or not recording its data (ConfigError,
      unless allow_different_data), before any evaluation.
  """
  from lev_jax import inference
  if baseline and perplexity_too:  # a refused baseline costs no checkpoint load
    _read_baseline(baseline, allow_different_data)
  im = inference.load(checkpoint, step=step, dtype=dtype)
  return evaluate_model(im, split=split, baseline=baseline, overrides=overrides,
                        perplexity_too=perplexity_too,
                        allow_different_data=allow_different_data)


def evaluate_model(im, *, split="validation", baseline=None, overrides: dict | None = None,
                   perplexity_too: bool = True, eval_step=None,
                   allow_different_data: bool = False) -> dict:
  """`evaluate_checkpoint` on a loaded `inference.InferenceModel` (evaluate several
  splits of one checkpoint without loading it again, sharing `eval_step`: see
  `perplexity`); `im.config` is not changed.

  Raises:
    ConfigError, DataError, DownstreamError: as `evaluate_checkpoint`.
  """
  overrides = dict(overrides or {})
  # Other validation files are read straight from disk (see _eval_batches): they need
  # neither data.source nor data.train_files, so they are not applied to the config.
  validation_files = overrides.pop("data.validation_files", None)
  config = apply_overrides(copy.deepcopy(im.config), overrides)
  if split == "test":
    validation_files = heldout_test_files(config)
  if validation_files is not None:
    if isinstance(validation_files, str):
      validation_files = [validation_files]
    if not validation_files:
      raise ConfigError("--config.data.validation_files is empty")
    with config.unlocked():
      config.data.validation_files = tuple(validation_files)
  validation_override = validation_files is not None
  _downstream_files(config)  # a ConfigError now, not after the perplexity
  base = (_read_baseline(baseline, allow_different_data) if baseline and perplexity_too
          else None)
  check = (None if base is None else
           lambda record: check_same_data(*base, record, allow_different_data))
  out = {"checkpoint": im.source, "step": im.step, "split": split,
         "embedding": config.model.embedding}
  if perplexity_too:
    out.update(perplexity(im, config, validation_override, eval_step, split=split,
                          check_data=check))
    if base is not None:
      out["relative_change"] = relative_changes(out, *base)
  results = downstream_tasks(im, config)
  if results:
    out["downstream"] = results
  return out


def _check_output_writable(output: str | None, checkpoint: str) -> None:
  """One line, before any evaluation, when the result file's folder cannot be written
  (e.g. a read-only checkpoint folder: --output elsewhere)."""
  if "://" not in checkpoint and os.path.exists(checkpoint) and not os.path.isdir(checkpoint):
    cli.fail(PROG, f"--checkpoint={checkpoint}: is a file, not a folder (expected a "
             "lev-train workdir or a lev-export folder)")
  path = epath.Path(output or os.path.join(checkpoint, LEV_EVAL_JSON))
  folder = path.parent
  if "://" in str(folder) or not folder.exists():
    return  # a missing checkpoint folder is reported by the load, naming it
  if not os.access(folder, os.W_OK | os.X_OK):
    flag = "--output" if output else f"--output (default {path})"
    cli.fail(PROG, f"{flag}: {folder} is not writable; pass --output=PATH in a writable "
             "folder")


def main(argv):
  if len(argv) > 1:
    cli.fail(PROG, f"unexpected arguments: {' '.join(argv[1:])}")
  cli.quiet_library_logs()
  fl = flags.FLAGS
  if not fl.checkpoint:
    cli.fail(PROG, "--checkpoint is required (a lev-train workdir or a lev-export folder)")
  _check_output_writable(fl.output, fl.checkpoint)  # before minutes of evaluation
  try:
    out = evaluate_checkpoint(fl.checkpoint, step=fl.step, dtype=fl.dtype, split=fl.split,
                              baseline=fl.baseline, overrides=_overrides(),
                              perplexity_too=fl.perplexity,
                              allow_different_data=fl.allow_different_data)
  except (ValueError, FileNotFoundError) as e:  # every error of ours is a ValueError
    cli.fail(PROG, cli.first_line(e))
  # As the user gave it (relative stays relative), as _check_output_writable checked it.
  path = epath.Path(fl.output or os.path.join(fl.checkpoint, LEV_EVAL_JSON))
  write_json_atomic(path, out)
  _print_summary(out)
  print(f"{PROG}: wrote {path}", file=sys.stderr)


def run():
  cli.define_or_exit(PROG, _define_flags)
  cli.run(PROG, main, __name__)


if __name__ == "__main__":
  run()
