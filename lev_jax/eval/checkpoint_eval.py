"""Evaluate one checkpoint: validation perplexity and its frequency buckets, a baseline
comparison on the same batches, zero-shot tasks; what `lev-eval` computes and writes.

  from lev_jax.eval.checkpoint_eval import evaluate_checkpoint
  result = evaluate_checkpoint("runs/smoke_leviathan", split="test",
                               baseline="runs/smoke_tied/lev_eval.json")

The result is the JSON object `lev-eval` writes (see lev_jax/cli/eval.py for its
fields). Buckets are by each id's count in the training split (arXiv 2601.22040, Sec. 5).
A baseline is compared only when it was evaluated on the same batches (equal
``data.sha256``), unless allow_different_data.
"""

from __future__ import annotations

import copy
import os

from etils import epath

from lev_jax.checkpoint_checks import SHAPE_FIELD_NAMES
from lev_jax.config import ConfigError, check_platform, validate
from lev_jax.workdir import (DATA_REPORT, EVAL_JSON, LEV_EVAL_JSON, TOKEN_COUNTS, TOKENIZER,
                             is_prepared_data, loads_json, read_small_text)


# The train fields an evaluation reads (rows of seq_len tokens); the others, and the
# optim section, only shape training.
_TRAIN_FIELDS_READ = ("train.seq_len",)
# Fields outside those sections that only training reads (newcomer pass 20, N31, N32;
# 22, V26): the seed of the initialisation, the remat of the backward pass, the window
# that shuffles the training stream (data.seed also orders a jsonl_stream's files).
_TRAINING_ONLY = ("seed", "model.remat", "lev.remat", "data.shuffle_buffer")


def training_only(field: str) -> bool:
  """Whether `field` (dotted, without "config.") is read by training alone, so an
  evaluation's override of it would have no effect: the optim section, train fields
  other than seq_len, the seed and the remat switches. lev-eval refuses such overrides
  and its flag hints never propose them (lev_jax/cli/common.py)."""
  return (field.startswith("optim.") or field in _TRAINING_ONLY
          or (field.startswith("train.") and field not in _TRAIN_FIELDS_READ))


def apply_overrides(config, overrides: dict):
  """The checkpoint's config with `overrides` applied; shape fields are refused.

  Raises:
    ConfigError: an override of a field in checkpoint_checks.SHAPE_FIELDS, of the optim
      section, of a train field evaluation does not read or of another training-only
      field (seed, remat), an invalid resulting config, or one this platform cannot run
      (config.check_platform; the field named).
  """
  for field, value in overrides.items():
    if field in SHAPE_FIELD_NAMES:
      raise ConfigError(f"--config.{field}: the model's shape comes from the checkpoint "
                        "and cannot be overridden")
    if training_only(field):
      # newcomer pass 19 (A80, A82): accepted, and without effect
      what = (f"the {field.split('.')[0]} section has" if field.startswith(("optim.",
                                                                          "train."))
              else "it has")
      raise ConfigError(f"--config.{field}: an evaluation does not train, so {what} no "
                        "effect here; expected data.* or eval.* overrides")
    node, *path, leaf = [config, *field.split(".")]
    for part in path:
      node = node[part]
    node[leaf] = value
  config = validate(config, allow_unknown=True)  # a stored config: config.from_dict
  from lev_jax import target  # pylint: disable=import-outside-toplevel  # jax
  check_platform(config, target.platform())  # pass 20, N34: float16 on a CPU
  return config


def _eval_batches(config, tokenizer, validation_override: bool, split: str):
  """(batches, training token counts or None, `evaluate.data_record`) of the
  configured validation split, or straight from given files (named `split`); see
  `data.evaluation_batches` (config is not changed)."""
  from lev_jax.data import evaluation_batches
  files = list(config.data.validation_files) if validation_override else None
  return evaluation_batches(config, tokenizer, files=files, split=split)


def eval_partition(config):
  """`train.partition` for evaluating `config`'s model on the devices present, whatever
  mesh it was trained on (a checkpoint or export of a 4-device or multi-slice run
  evaluates on one device, as lev-sample and lev-export load it).

  The first that fits: config.mesh (the training layout, when it fits these devices);
  every device on the fsdp axis (the other axes 1); the first device alone. A fallback
  is logged with the reason.

  Raises:
    ShardingError: config.mesh.rules lacks a rule (no mesh can help).
  """
  from absl import logging
  from lev_jax.sharding import ShardingError
  from lev_jax.train import partition
  try:
    return partition(config)
  except ShardingError as e:
    reason = e
  present = copy.deepcopy(config)
  with present.unlocked():
    present.mesh.update(data=1, fsdp=-1, tensor=1, dcn_data=1, dcn_fsdp=1, dcn_tensor=1)
  try:
    part = partition(present)
  except ShardingError:  # e.g. eval.batch_size does not divide over these devices
    part = partition(present, _one_device_mesh(present))
  logging.info("evaluating on a mesh of the %d device(s) present, %s: the training mesh "
               "does not fit them (%s)", part.mesh.size, dict(part.mesh.shape), reason)
  return part


def _one_device_mesh(config):
  import jax
  from lev_jax.sharding import make_mesh
  return make_mesh(config.mesh, devices=jax.devices()[:1])


def _training_counts(im, data_counts_V):
  """The training split's token counts the buckets use: those saved beside the
  checkpoint (im.token_counts_V), checked against `data_counts_V` (what config.data gives
  now) when both exist; else whichever exists; None when neither does.

  Raises:
    ConfigError: the two differ (the saved file edited, or the training data changed
      since the run), naming the file and how many ids differ.
  """
  from absl import logging
  import numpy as np
  saved = im.token_counts_V
  if saved is None:
    return data_counts_V
  path = os.path.join(os.fspath(im.source), TOKEN_COUNTS)
  if data_counts_V is not None:
    data = np.asarray(data_counts_V)
    if saved.shape != data.shape or not np.array_equal(saved, data):
      n = int(np.sum(saved != data)) if saved.shape == data.shape else None
      what = (f"{n:,} of {data.size:,} ids' counts differ, sums {int(saved.sum()):,} vs "
              f"{int(data.sum()):,}" if n is not None
              else f"shape {saved.shape} vs {data.shape}")
      raise ConfigError(
          f"{path}: the saved training token counts differ from those of the training "
          f"split config.data gives now ({what}): the file was edited, the run's "
          f"{TOKENIZER}/ was replaced (the data is tokenized with it), or the training "
          "data changed since the run; expected them equal (restore what was changed; "
          "delete the file only to bucket by the data's counts)")
  logging.info("frequency buckets from %s (%s training tokens)", path, f"{int(saved.sum()):,}")
  return saved


def perplexity(im, config, validation_override: bool = False, eval_step=None, *,
               split: str = "validation", check_data=None) -> dict:
  """{"validation", "validation_equal_mass"?, "data"}: `evaluate` results for `im` (one
  pass) and what was evaluated (`evaluate.data_record`).

  eval_step: a `train.make_eval_step` of `eval_partition(config)` to reuse (one compilation
  for several splits); None builds one. split: the name recorded for
  validation_override files ("validation" or "test"). check_data: called with the data
  record once the batches are built, before any evaluation (it may raise).

  Raises:
    ConfigError / DataError: bad data settings, or no token counts for the buckets.
  """
  import jax
  from flax import nnx
  from lev_jax.eval.evaluate import equal_mass_edges, evaluate_schemes
  from lev_jax.train import make_eval_step
  batches, counts, record = _eval_batches(config, im.tokenizer, validation_override, split)
  if check_data is not None:
    check_data(record)
  counts = _training_counts(im, counts)
  if counts is None:
    raise ConfigError(f"{im.source}: no {TOKEN_COUNTS} beside the checkpoint; "
                      "frequency buckets need the training split's counts")
  schemes = {"log": list(config.eval.freq_bucket_edges)}
  if config.eval.equal_mass_buckets:
    schemes["equal_mass"] = equal_mass_edges(counts, config.eval.equal_mass_buckets)
  part = eval_partition(config)  # the devices present, not the training job's
  params = jax.device_put(nnx.state(im.model, nnx.Param), part.state_sharding["params"])
  results = evaluate_schemes(eval_step or make_eval_step(part, config), params, batches,
                             counts, schemes)
  out = {"validation": results["log"]}
  if "equal_mass" in results:
    out["validation_equal_mass"] = results["equal_mass"]
  out["data"] = record
  return out


def _read_baseline(baseline_path, allow_different_data: bool = False) -> tuple[dict, str]:
  """(the baseline's lev_eval.json, its path), read before any evaluation.

  Raises:
    ConfigError: no such file or folder, not a regular file (a device, a pipe), no
      lev_eval.json in the folder, unreadable (more than workdir.SMALL_FILE_LIMIT
      bytes, not UTF-8, not JSON), or holding no validation result (lev-train's
      eval.json named as such); a folder's lev_eval.json recording another checkpoint;
      or (unless
      allow_different_data) not recording the data it was evaluated on.
  """
  path = epath.Path(baseline_path)
  if not path.exists():
    raise ConfigError(f"--baseline={baseline_path}: no such file or folder (expected "
                      f"another run's {LEV_EVAL_JSON}, or the folder holding it)")
  folder = None
  if path.is_dir():
    if "://" not in os.fspath(path) and is_prepared_data(path):  # newcomer pass 10
      raise ConfigError(f"--baseline={baseline_path}: is prepared data (lev-prepare-data's "
                        f"output), not a run; expected another run's {LEV_EVAL_JSON}, or "
                        "the run or export folder holding it")
    folder, path = path, path / LEV_EVAL_JSON
  local = "://" not in os.fspath(path)
  if local and os.path.exists(path) and not os.path.isfile(path):  # /dev/zero never ends
    raise ConfigError(f"--baseline={baseline_path}: {path} is not a regular file; expected "
                      f"another run's {LEV_EVAL_JSON}, or the folder holding it")
  try:
    base = loads_json(read_small_text(path))
  except (OSError, ValueError) as e:  # too large, not UTF-8, not JSON
    raise ConfigError(f"--baseline={baseline_path}: cannot read a {LEV_EVAL_JSON} ({e}); "
                      "run lev-eval on the baseline first") from e
  if not isinstance(base, dict) or "validation" not in base:
    if path.name == EVAL_JSON and isinstance(base, dict) and "perplexity" in base:
      raise ConfigError(f"--baseline={baseline_path}: is lev-train's {EVAL_JSON}, which "
                        "holds no per-bucket result; expected the baseline's "
                        f"{LEV_EVAL_JSON} (run lev-eval --checkpoint={path.parent} first), "
                        "or the folder holding it")
    raise ConfigError(f"--baseline={path}: it holds no validation result to compare with "
                      f"(expected a {LEV_EVAL_JSON} written by lev-eval)")
  validation = base.get("validation")
  if path.name == DATA_REPORT:  # newcomer pass 15 (V02, V02b: a KeyError with
    raise ConfigError(  # --allow_different_data)
        f"--baseline={baseline_path}: is lev-train's {DATA_REPORT} (the data a run read), "
        f"not a lev-eval result; expected the baseline's {LEV_EVAL_JSON} (run lev-eval "
        f"--checkpoint={path.parent} first), or the folder holding it")
  if isinstance(validation, dict) and "log" in validation and "test" in base:
    raise ConfigError(f"--baseline={baseline_path}: {path} is a lev-study evaluation "
                      f"(study_eval.json: validation and test, bucketed twice), not a "
                      f"lev-eval result; expected the baseline's {LEV_EVAL_JSON} (run "
                      f"lev-eval --checkpoint={path.parent} first)")  # newcomer pass 14 (S08)
  recorded = base.get("checkpoint")
  if (folder is not None and isinstance(recorded, str) and "://" not in recorded
      and local and os.path.realpath(recorded) != os.path.realpath(folder)):
    raise ConfigError(f"--baseline={baseline_path}: {path} is the result of {recorded}, "
                      f"not of this folder (lev-eval --output put it there); expected the "
                      f"folder's own (lev-eval --checkpoint={folder})")
  if not all(isinstance(base.get(key), dict) and "bucket_edges" in base[key]
             for key in ("validation", "validation_equal_mass") if key in base):
    raise ConfigError(f"--baseline={path}: its validation result holds no buckets "
                      f"(bucket_edges); expected a {LEV_EVAL_JSON} written by lev-eval")
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
  from lev_jax.eval.evaluate import describe_data, same_data
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
  from lev_jax.eval.evaluate import relative_change, same_data
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
  from lev_jax.eval import downstream
  from lev_jax.eval.scoring import Scorer
  files = _downstream_files(config)
  if not files:
    return {}
  scorer = Scorer(im.model, im.tokenizer, max_len=config.train.seq_len,
                  batch_size=config.eval.batch_size)
  options = {"piqa": {"labels": config.eval.downstream.piqa_labels or None}}
  return downstream.evaluate_tasks(scorer, files, limit=config.eval.downstream_limit or None,
                                   options=options, progress=True)  # minutes: a bar each


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
    from lev_jax.data.embedded import DEFAULT_CORPUS, write_embedded_corpus
    paths = write_embedded_corpus(os.path.expanduser(d.cache_dir), d.validation_fraction,
                                  d.test_fraction, corpus=d.get("corpus", DEFAULT_CORPUS))
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
    ConfigError, DataError, DownstreamError: as `evaluate_checkpoint`; ConfigError for
      nothing to evaluate (no perplexity_too and no config.eval.downstream file).
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
    if not all(isinstance(f, (str, os.PathLike)) and os.fspath(f).strip()
               for f in validation_files):
      raise ConfigError(f"--config.data.validation_files = {tuple(validation_files)!r}: "
                        "expected non-empty paths, globs or folders (JSONL/text files)")
    with config.unlocked():
      config.data.validation_files = tuple(validation_files)
  validation_override = validation_files is not None
  if not _downstream_files(config) and not perplexity_too:  # a ConfigError now, not after
    raise ConfigError("--noperplexity and no downstream task (every "
                      "config.eval.downstream.<task> file is empty): nothing to evaluate; "
                      "give one, e.g. --config.eval.downstream.piqa=piqa/valid.jsonl, or "
                      "leave out --noperplexity")
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
