"""A ladder of runs (tied and Leviathan at several sizes): what each rung wrote.

  result = collect("experiments/smoke_ladder.py", "runs/smoke_ladder")
  analysis = lev_jax.ladder.analysis.analyse(result)   # the paper's comparisons

A ladder is an experiment file with `RUNGS` (variant names "<kind>_<size>", kind "tied"
or "leviathan": `load_ladder` refuses other names, e.g. a study file's) and
`get_config(variant)`, e.g. experiments/ladder.py; rung VARIANT is
trained into ROOT/VARIANT (`lev-train --config=LADDER:VARIANT --workdir=ROOT/VARIANT`).

What is read from each workdir (lev_jax/trainer.py writes it):
  metrics.jsonl   train/loss over tokens (train/tokens_seen) and eval/loss at eval steps
                  (tokens = step * train.global_batch_size * train.seq_len); after a
                  resume a step can appear twice: the later row wins
  eval.json       the final validation (loss, perplexity, frequency buckets); the rung is
                  finished when its "step" equals train.steps
  lev_eval.json   optional (`lev-eval`): {"step", "validation", "downstream": {task:
                  {"acc", "acc_stderr", "acc_norm", "acc_norm_stderr", "n", ...}}}
  checkpoints/<step>/config  the config the run was trained with (read without Orbax:
                  lev_jax.checkpoint.latest_config_file); used when present, else the
                  ladder's get_config(variant); it must equal the rung's config
                  (get_config(variant) with lev-ladder's --train_flags) in every field
                  that decides results, else the rung is "other config", left out. A
                  finished rung needs it at its final step: without checkpoints/ (or
                  that step's readable config) it is "unverified", left out

Each rung's parameter counts are lev-params' (lev_jax.params.count_params, on an
abstract model). A rung that is missing, unfinished or unreadable is a Rung with that
status and the reason in words, never an exception; lev_jax/ladder/study.py reads a
seeded study through the same functions.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import types
from collections.abc import Mapping
from pathlib import Path

import ml_collections
from etils import epath

from lev_jax.checkpoint_checks import (SHAPE_FIELD_NAMES, config_differences, misnamed_step,
                                       not_a_step, renamed_step, result_fields,
                                       run_shape_problem)
from lev_jax.experiments import ExperimentImportError, NotAnExperimentFile, load_experiment
from lev_jax.workdir import (CHECKPOINTS, EVAL_JSON, JAX_CACHE, LEV_EVAL_JSON, METRICS,
                             REPORT, eval_record_problem, loads_json)

# A ladder's kinds of rung, "<kind>_<size>" (lev_jax/ladder/analysis.py pairs them per size).
KINDS = ("tied", "leviathan")
# Per-group optimizer figures of metrics.jsonl (lev_jax/trainer.py) kept at their last value.
GROUP_METRICS = ("train/grad_norm/", "train/update_ratio/")


class LadderError(ValueError):
  """A ladder file or root that cannot be read; the message names it and what was
  expected."""


# ---------------------------------------------------------------------------- loading

def load_ladder(ladder, kind: str = "ladder") -> types.ModuleType:
  """The ladder module: a module object, or the path of an experiment file. `kind`
  ("ladder" or "study") words the errors for lev-ladder or lev-study.

  Raises:
    LadderError: no such file (or FILE.py:PIECE given to lev-ladder), not a .py file
      (experiments.file_problem), it fails to import, or it lacks `RUNGS` (a non-empty
      tuple of distinct variant names, each a folder name the root does not reserve:
      `folder_name_problem`) or `get_config`; for a ladder ("ladder"), a RUNGS name that
      is not KIND_SIZE with KIND tied or leviathan (`variant_name_problem`: e.g. a study
      file's "leviathan-lr3_s0" given to lev-ladder, whose pairs would all be n/a); a
      path is named with its flag (`--ladder=PATH`, `--study=PATH`); a ladder's rung
      without its partner of the other kind at the same size.
  """
  if isinstance(ladder, types.ModuleType):
    module, where = ladder, f"{kind} {getattr(ladder, '__file__', ladder.__name__)}"
  else:
    path = Path(str(ladder)).expanduser()
    where = f"--{kind}={ladder}"  # the flag: lev-ladder's --ladder, lev-study's --study
    expected = ("a .py study file with RUNGS and get_config(run), e.g. "
                "experiments/fidelity_study.py" if kind == "study" else "a .py experiment "
                "file with RUNGS and get_config(variant), e.g. experiments/smoke_ladder.py")
    try:
      module = load_experiment(path)
    except FileNotFoundError:
      head, colon, _ = str(ladder).rpartition(":")
      if colon and kind == "ladder" and os.path.isfile(os.path.expanduser(head)):
        raise LadderError(f"{where}: lev-ladder runs every variant of a ladder file and "
                          f"takes no :PIECE (lev-study's --study=FILE.py:PIECE does); "
                          f"expected --ladder={head}, or for one variant lev-train "
                          f"--config={head}:VARIANT --workdir=ROOT/VARIANT") from None
      raise LadderError(f"{where}: no such file; expected {expected}") from None
    except NotAnExperimentFile as e:  # a folder, /dev/zero, FILE.txt, a dangling link
      raise LadderError(f"{where}: {e.problem}; expected {expected}") from None
    except ExperimentImportError as e:  # the file's own error, named with the file
      cause = e.__cause__
      raise LadderError(f"{where}: failed to import: {type(cause).__name__}: "
                        f"{cause}") from cause
  rungs = getattr(module, "RUNGS", None)
  if not isinstance(rungs, (tuple, list)) or not rungs or not all(
      isinstance(r, str) and r for r in rungs):
    example = ("run names, e.g. RUNGS = ('tied_s0', 'leviathan_s0', ...) (a study file "
               "such as experiments/smoke_study.py)" if kind == "study" else
               "variant names, e.g. RUNGS = ('tied_s', 'leviathan_s', ...)")
    raise LadderError(f"{where}: expected a module-level RUNGS tuple of {example}; "
                      f"got {rungs!r}")
  name = "run" if kind == "study" else "variant"
  if len(set(rungs)) != len(rungs):
    raise LadderError(f"{where}: RUNGS names a {name} twice: {list(rungs)}")
  for rung in rungs:
    problem = folder_name_problem(rung)
    if problem:
      raise LadderError(f"{where}: RUNGS names a {name} {rung!r}: {problem}; each name is "
                        f"the folder ROOT/NAME its run trains in, so rename it")
  odd = [rung for rung in rungs if kind == "ladder" and variant_name_problem(rung)]
  if odd:  # newcomer pass 13 (N185): a study file read as a ladder of n/a pairs
    more = f" and {len(odd) - 3} more" if len(odd) > 3 else ""
    study = (getattr(module, "__file__", module.__name__)
             if isinstance(ladder, types.ModuleType) else ladder)
    raise LadderError(
        f"{where}: RUNGS holds {', '.join(map(repr, odd[:3]))}{more}, "
        f"{'which is' if len(odd) == 1 else 'which are'} not KIND_SIZE with KIND "
        f"{' or '.join(KINDS)} (a ladder pairs tied_SIZE with leviathan_SIZE, e.g. "
        f"'tied_200m', 'leviathan_200m' in experiments/ladder.py); a study file? use "
        f"lev-study --study={study}")
  if not callable(getattr(module, "get_config", None)):
    raise LadderError(f"{where}: no get_config(variant) function")
  if kind == "ladder":  # newcomer pass 14 (R02): "2 of 2 rungs finished", nothing paired
    alone = [f"{r} without {partner}" for r in rungs
             for partner in [partner_of(r)] if partner not in rungs]
    if alone:
      raise LadderError(f"{where}: RUNGS has {' and '.join(alone)}: a ladder compares "
                        "tied_SIZE with leviathan_SIZE at each size, so each needs its "
                        "partner")
  return module


def partner_of(variant: str) -> str:
  """leviathan_SIZE for tied_SIZE and the other way round (KINDS)."""
  kind, size = split_variant(variant)
  return f"{KINDS[1 - KINDS.index(kind)]}_{size}"


def folder_name_problem(name: str) -> str | None:
  """Why a RUNGS name cannot be its run's folder under the root, or None.

  The root also holds the report (ROOT/report, ROOT/report_PIECE for a study's piece)
  and the shared compilation cache (ROOT/jax_cache, workdir.JAX_CACHE): a run of such a
  name would train into them. A name is one plain path component."""
  if name in (".", "..") or name.startswith("~") or "/" in name or os.sep in name or "\0" in name:
    return "not one plain folder name"
  if name == JAX_CACHE:
    return f"the root's shared compilation cache folder ({JAX_CACHE} is reserved)"
  if name == REPORT or name.startswith(REPORT + "_"):
    return (f"the root's report folder ({REPORT} and {REPORT}_PIECE are reserved for "
            f"lev-ladder's and lev-study's reports)")
  return None


def checked_config(module, variant: str, where: str | None = None) -> ml_collections.ConfigDict:
  """module.get_config(variant), once it is a ConfigDict holding every section of
  base_config() (collect_rung reads train, model and lev; lev-train needs them all).

  where: how the errors name the file (default: the module's file).

  Raises:
    LadderError: get_config fails, returns something else than a ConfigDict (e.g. an
      int), or a ConfigDict without a section, in one line naming the file and variant.
  """
  from lev_jax.config import article, base_config  # pylint: disable=import-outside-toplevel
  where = where or getattr(module, "__file__", None) or "ladder"
  try:
    config = module.get_config(variant)
  except Exception as e:
    raise LadderError(f"{where}: get_config({variant!r}) failed: {type(e).__name__}: "
                      f"{e}") from e
  expected = ("expected an ml_collections.ConfigDict (config.base_config() with fields "
              "changed, as experiments/smoke_ladder.py builds them)")
  if not isinstance(config, ml_collections.ConfigDict):
    raise LadderError(f"{where}: get_config({variant!r}) returned "
                      f"{article(type(config).__name__)}; {expected}")
  sections = [k for k, v in base_config().items() if isinstance(v, ml_collections.ConfigDict)]
  absent = [k for k in sections
            if not isinstance(config.get(k, None), ml_collections.ConfigDict)]
  if absent:
    raise LadderError(f"{where}: get_config({variant!r}) returned a config without its "
                      f"{', '.join(absent)} section{'s' if len(absent) > 1 else ''}; "
                      f"{expected}")
  return config


def split_variant(variant: str) -> tuple[str, str]:
  """("tied" | "leviathan" | other kind, size) from "<kind>_<size>"."""
  kind, _, size = variant.partition("_")
  return kind, size


def variant_name_problem(variant: str) -> str | None:
  """Why `variant` is not a ladder rung's name KIND_SIZE (KIND one of KINDS, SIZE not
  empty), or None. lev-ladder pairs tied_SIZE with leviathan_SIZE; a study's run names
  (lev_jax/ladder/study.py: "leviathan-lr3_s0", "untied_s0") are not rungs."""
  kind, size = split_variant(variant)
  if kind not in KINDS:
    return f"its kind {kind!r} is not {' or '.join(KINDS)}"
  if not size:
    return "no _SIZE after its kind"
  return None


# ---------------------------------------------------------------------------- one rung

@dataclasses.dataclass
class Rung:
  """What one rung's workdir holds.

  Attributes:
    variant, kind, size: "tied_m" -> ("tied", "m").
    workdir: ROOT/VARIANT.
    status: "finished", "missing" (no workdir or no metrics), "unfinished", "unreadable"
      (a file that does not parse, or a file in place of the workdir), "other config" (a
      finished run whose stored config differs from the rung's, get_config(variant) with
      lev-ladder's --train_flags, in its model shape, checkpoint_checks.SHAPE_FIELDS,
      or in another field that decides results, `result_fields`), "unverified"
      (eval.json at the final step but no readable stored config of that step:
      checkpoints/ deleted, so another run copied there would pass); `reason` says
      which, in words.
    steps: train.steps; step: the last step logged (None before any row).
    tokens_per_step: train.global_batch_size * train.seq_len.
    params: lev-params counts {"embedding", "lev", "backbone", "head", "total"}.
    config_source: "checkpoint" (the config stored with the latest checkpoint) or "ladder".
    train_curve, eval_curve: {"tokens": [...], "loss": [...]}, tokens increasing.
    group_metrics: {"train/grad_norm/<group>" or "train/update_ratio/<group>": its last
      finite logged value} (the optimizer groups: lev, backbone, head, ...).
    final: eval.json (finished rungs); lev_eval: lev_eval.json or None.
    notes: things worth knowing that do not stop the analysis.
  """

  variant: str
  kind: str
  size: str
  workdir: str
  status: str
  reason: str | None
  steps: int
  step: int | None
  tokens_per_step: int
  params: dict
  config_source: str
  train_curve: dict
  eval_curve: dict
  final: dict | None = None
  lev_eval: dict | None = None
  notes: list = dataclasses.field(default_factory=list)
  group_metrics: dict = dataclasses.field(default_factory=dict)

  @property
  def finished(self) -> bool:
    return self.status == "finished"


@dataclasses.dataclass
class LadderResult:
  """Every rung of a ladder, in RUNGS order."""

  ladder: str
  root: str
  rungs: list

  def rung(self, variant: str) -> Rung | None:
    return next((r for r in self.rungs if r.variant == variant), None)


_PARAM_CACHE: dict = {}


def _param_counts(config: ml_collections.ConfigDict) -> dict:
  """lev-params' counts, cached by the shape-deciding sections (abstract model build)."""
  from lev_jax.params import count_params  # imports the model (jax, flax) only when used
  key = json.dumps([config.model.to_dict(), config.lev.to_dict()], sort_keys=True,
                   default=str)
  if key not in _PARAM_CACHE:
    _PARAM_CACHE[key] = count_params(config)
  return dict(_PARAM_CACHE[key])


def _latest_checkpoint_config(workdir: epath.Path) -> tuple[dict | None, str | None,
                                                             int | None]:
  """(the stored config dict, None, its step) of the highest complete checkpoint step,
  or (None, why not, the step or None): no checkpoints/, no step in it, a config file
  missing or not JSON (the phrase names the path)."""
  from lev_jax.checkpoint import latest_config_file  # imports Orbax: only when reading
  folder = workdir / CHECKPOINTS
  if not folder.is_dir():
    return None, f"{folder}: missing", None
  path = latest_config_file(folder)
  if path is None:
    return None, f"{folder}: holds no checkpoint", None
  step = int(path.parent.parent.name)
  try:
    return json.loads(path.read_text()), None, step
  except FileNotFoundError:
    return None, f"{path}: missing", step
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    return None, f"{path}: not JSON ({e})", step


def _renamed_latest(folder: epath.Path) -> str | None:
  """The line when a checkpoints folder's steps are misnamed: a file or an empty folder
  named like a step (checkpoint_checks.not_a_step), no step but one under another name
  (6.bak, 06: checkpoint_checks.misnamed_step), or a latest step folder whose
  manifest records another step (a copy named 12 beside 6, or 6 renamed 12:
  checkpoint_checks.renamed_step; newcomer pass 13); None otherwise."""
  from lev_jax.checkpoint import latest_config_file  # imports Orbax: only when reading
  odd = not_a_step(folder)  # a file or an empty folder named like a step (newcomer pass 13)
  if odd:
    return odd
  latest = latest_config_file(folder)
  return misnamed_step(folder) if latest is None else renamed_step(latest.parent.parent)


def _foreign_step(workdir: epath.Path, step: int | None) -> str | None:
  """checkpoint_checks.run_shape_problem of the rung's latest step (its stored config and
  progress item read as plain JSON: <step>/config/metadata, <step>/progress/metadata),
  or None: a step of another run (another model, or another run of the same model) in
  the rung's checkpoints/, which lev-eval and lev-train refuse."""
  if step is None:
    return None
  step_dir = workdir / CHECKPOINTS / str(step)
  def read(item):
    try:
      value = json.loads((step_dir / item / "metadata").read_text())
    except (OSError, ValueError):
      return None
    return value if isinstance(value, dict) else None
  saved = read("config")
  if saved is None:
    return None
  return run_shape_problem(workdir, saved, f"checkpoint {step_dir}", read("progress"))


def _as_number(value) -> float:
  """metrics.jsonl stores non-finite values as strings ("nan", "inf")."""
  return float(value)


def read_metrics(path: epath.Path) -> list[dict]:
  """The rows of a metrics.jsonl.

  Raises:
    LadderError: a line that is not a JSON object with an integer "step" (names the
      file and line).
  """
  rows = []
  for i, line in enumerate(_read_text(path, "a run's metrics.jsonl file").splitlines(), 1):
    if not line.strip():
      continue
    try:
      row = json.loads(line)
    except json.JSONDecodeError as e:
      raise LadderError(f"{path}:{i}: not JSON ({e.msg}: column {e.colno})") from e
    if not isinstance(row, dict) or not isinstance(row.get("step"), int):
      raise LadderError(f"{path}:{i}: expected a JSON object with an integer 'step'")
    rows.append(row)
  return rows


def _curve(rows: list[dict], key: str, tokens_of) -> tuple[dict, int]:
  """{"tokens", "loss"} from the rows holding `key` (the last row of a step wins),
  sorted by step; and how many non-finite values were left out."""
  by_step = {}
  for row in rows:
    if key in row:
      by_step[row["step"]] = row
  tokens, losses, dropped = [], [], 0
  for step in sorted(by_step):
    row = by_step[step]
    try:
      loss, t = _as_number(row[key]), float(tokens_of(row))
    except (TypeError, ValueError):
      dropped += 1
      continue
    if not (math.isfinite(loss) and math.isfinite(t)) or t <= 0:
      dropped += 1
      continue
    tokens.append(t)
    losses.append(loss)
  return {"tokens": tokens, "loss": losses}, dropped


def last_values(rows: list[dict], prefixes: tuple[str, ...]) -> dict:
  """{key: its value in the last row (highest step; the later of a repeated step) where
  it is finite} for the keys starting with one of `prefixes`."""
  out = {}
  for row in sorted(rows, key=lambda r: r["step"]):  # stable: a resumed step's later row wins
    for key, value in row.items():
      if key.startswith(prefixes):
        try:
          number = _as_number(value)
        except (TypeError, ValueError):
          continue
        if math.isfinite(number):
          out[key] = number
  return out


def _read_text(path: epath.Path, expected: str) -> str:
  """The text of a run's file; a folder or an unreadable file in its place is a
  LadderError naming it (newcomer pass 11: IsADirectoryError tracebacks)."""
  if path.is_dir():
    raise LadderError(f"{path}: is a folder; expected {expected} (move it aside)")
  try:
    return path.read_text()
  except OSError as e:
    raise LadderError(f"{path}: cannot be read ({e.strerror or e})") from e


def _read_json(path: epath.Path, what: str) -> dict:
  try:
    value = loads_json(_read_text(path, f"the run's {what} file"))
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    raise LadderError(f"{path}: {what} is not JSON ({e})") from e
  if not isinstance(value, dict):
    raise LadderError(f"{path}: {what}: expected a JSON object")
  return value


def _bucket_nll(bucket: dict) -> float | None:
  """A bucket's mean NLL: its "loss", else log of its "perplexity"; None without either."""
  if bucket.get("loss") is not None:
    return _as_number(bucket["loss"])
  if bucket.get("perplexity") is not None:
    ppl = _as_number(bucket["perplexity"])
    return math.log(ppl) if ppl > 0 else math.nan
  return None


def bucket_problem(result: dict, rel_tol: float = 1e-6) -> str | None:
  """Why an evaluate() result's figures do not agree with each other, or None.

  lev_jax/eval/evaluate.py computes the overall loss as the token-weighted mean of its
  buckets' mean NLL (every target falls in one bucket), so with the buckets' "tokens"
  and "loss" (or "perplexity") the overall "loss" must be sum(tokens * loss) /
  sum(tokens), within `rel_tol`; a bucket's perplexity must be exp(its loss). Buckets
  without tokens, or a result without buckets or tokens, are not checked.

  Returns:
    e.g. "its loss 5.0 is not the token-weighted mean of its buckets' losses (6.79...)".
  """
  buckets = result.get("buckets")
  if not isinstance(buckets, list):
    return None
  total = weighted = 0.0
  try:
    for b in buckets:
      if not isinstance(b, dict) or not b.get("tokens"):
        continue
      nll = _bucket_nll(b)
      if nll is None:
        continue
      if (b.get("loss") is not None and b.get("perplexity") is not None
          and math.isfinite(nll) and nll < 700 and not math.isclose(
              _as_number(b["perplexity"]), math.exp(nll), rel_tol=1e-9)):
        return (f"its bucket {b.get('range')} perplexity {b['perplexity']} is not "
                f"exp(loss) = {math.exp(nll):.6g}")
      total += _as_number(b["tokens"])
      weighted += _as_number(b["tokens"]) * nll
    loss = _as_number(result["loss"])
  except (TypeError, ValueError, KeyError):
    return "its buckets' tokens, loss and perplexity are not all numbers"
  if total <= 0 or not (math.isfinite(weighted) and math.isfinite(loss)):
    return None
  mean = weighted / total
  if not math.isclose(loss, mean, rel_tol=rel_tol, abs_tol=1e-12):
    return (f"its loss {loss} is not the token-weighted mean of its buckets' losses "
            f"({mean:.10g})")
  return None


def _check_eval(result: dict, path, rows: list[dict]) -> None:
  """Raises LadderError when `result` (eval.json) lacks a field of an evaluate() result,
  its perplexity is not exp(loss), it is not the evaluation metrics.jsonl's `rows`
  recorded at its step (workdir.eval_record_problem), or its loss is not the
  token-weighted mean of its buckets' (`bucket_problem`): an edited file, the report
  would quote it."""
  for key in ("loss", "perplexity", "step", "buckets", "bucket_edges"):
    if key not in result:
      raise LadderError(f"{path}: no {key!r}; expected an evaluate() result with its step "
                        "(lev_jax/trainer.py writes it)")
  try:
    loss, ppl = _as_number(result["loss"]), _as_number(result["perplexity"])
  except (TypeError, ValueError):
    raise LadderError(f"{path}: loss {result['loss']!r}, perplexity {result['perplexity']!r}:"
                      " expected numbers") from None
  if math.isfinite(loss) and loss < 700 and not math.isclose(ppl, math.exp(loss),
                                                               rel_tol=1e-9):
    raise LadderError(f"{path}: perplexity {ppl} is not exp(loss) = {math.exp(loss):.6g} "
                      f"(loss {loss}): the file was edited; expected lev-train's own result "
                      "(delete it and re-run lev-train on the run to evaluate again)")
  problem = eval_record_problem(result, rows)
  if problem:  # newcomer pass 8: a consistent edit of loss and perplexity
    raise LadderError(f"{path}: {problem}: one of the two files was edited or replaced "
                      f"(from another run?); expected lev-train's own pair (put back the "
                      "one that changed; a re-run of lev-train evaluates again into "
                      f"{path.name} but keeps {METRICS}'s rows)")  # newcomer pass 13
  problem = bucket_problem(result)
  if problem:  # newcomer pass 9: eval.json and metrics.jsonl's row edited to agree
    raise LadderError(f"{path}: {problem}: the file was edited; expected lev-train's own "
                      "result (delete it and re-run lev-train on the run to evaluate again)")


def collect_rung(module, variant: str, root: epath.Path,
                 expected: ml_collections.ConfigDict | None = None,
                 owner: str = "ladder") -> Rung:
  """Reads ROOT/VARIANT; never raises for a missing, unfinished or unreadable rung (the
  Rung's status and reason say what is wrong).

  owner: "ladder" or "study" (lev-study's runs), as the reasons name it.
  expected: the config the rung is meant to be trained with (get_config(variant) with
    lev-ladder's --train_flags applied); None: get_config(variant). A finished run
    whose stored config differs from it in any field that decides results
    (checkpoint_checks.result_fields: not its name, logging, saving or cache folders)
    is "other config", left out of the analysis.

  Raises:
    LadderError: get_config(variant) fails or returns no full config (the ladder itself
      is broken; `checked_config`).
  """
  config = checked_config(module, variant) if expected is None else expected
  kind, size = split_variant(variant)
  workdir = root / variant
  notes, source, ladder_config, other, settings = [], "ladder", config, [], []
  unchecked = None  # why the stored config cannot be checked: a finished run is unverified
  if workdir.is_dir():
    stored, unchecked, stored_step = _latest_checkpoint_config(workdir)
    if unchecked and stored_step is not None:  # a checkpoint whose config is unreadable
      notes.append(f"{unchecked}; using the {owner}'s config")
    if stored is not None:
      try:
        config = ml_collections.ConfigDict(stored)
        config.train.steps  # noqa: B018 (a stored config without the fields is unusable)
        config.model.d_model  # noqa: B018
        source = "checkpoint"
        # every field that decides results (newcomer pass 7: a 6-step run under a
        # 300-step rung's name was "finished"), the model's shape named first
        diffs = config_differences(stored, ladder_config, result_fields(ladder_config),
                                   stored_only=True)
        other = [d for d in diffs if d.split(":", 1)[0] in SHAPE_FIELD_NAMES]
        settings = [d for d in diffs if d not in other]
      except (AttributeError, KeyError, TypeError):
        config, source, other, settings = ladder_config, "ladder", [], []
        unchecked = f"{workdir / CHECKPOINTS}: stored config lacks train/model fields"
        notes.append(f"{unchecked}; using the {owner}'s config")
      else:
        if stored_step != int(config.train.steps):
          unchecked = (f"{workdir / CHECKPOINTS}: its latest checkpoint is step "
                       f"{stored_step}, not the final step {config.train.steps}")
  t = config.train
  tokens_per_step = int(t.global_batch_size) * int(t.seq_len)
  rung = Rung(variant=variant, kind=kind, size=size, workdir=str(workdir), status="missing",
              reason=None, steps=int(t.steps), step=None, tokens_per_step=tokens_per_step,
              params=_param_counts(config), config_source=source,
              train_curve={"tokens": [], "loss": []}, eval_curve={"tokens": [], "loss": []},
              notes=notes)
  member = "rung" if owner == "ladder" else "run"  # newcomer pass 8: a study's "rung"
  if workdir.exists() and not workdir.is_dir():  # newcomer pass 13 (N173): "no workdir"
    rung.status = "unreadable"
    rung.reason = (f"{workdir}: is {'a file' if workdir.is_file() else 'not a folder'}; "
                   f"expected the {member}'s workdir folder (move it aside)")
    return rung
  if not workdir.is_dir():
    rung.reason = f"no workdir {workdir}"
    return rung
  metrics = workdir / METRICS
  if not metrics.exists():
    from lev_jax.checkpoint import latest_config_file  # imports Orbax: only when reading
    latest = latest_config_file(workdir / CHECKPOINTS)
    rung.reason = (f"no metrics: {metrics} does not exist (never started?)" if not latest
                   else  # newcomer pass 16 (J21): a finished rung's deleted metrics
                   f"no metrics: {metrics} is missing although the {member} holds "
                   f"{latest.parent.parent} (deleted?); re-run lev-train "
                   f"on --workdir={workdir} with the {member}'s config to write its "
                   "evaluation again")
    return rung
  try:
    rows = read_metrics(metrics)
    rung.train_curve, dropped_train = _curve(
        rows, "train/loss",
        lambda r: r.get("train/tokens_seen", r["step"] * tokens_per_step))
    rung.eval_curve, dropped_eval = _curve(rows, "eval/loss",
                                           lambda r: r["step"] * tokens_per_step)
    for n, what in ((dropped_train, "train/loss"), (dropped_eval, "eval/loss")):
      if n:
        rung.notes.append(f"{n} non-finite {what} value(s) left out of the curve")
    rung.step = max((r["step"] for r in rows), default=None)
    rung.group_metrics = last_values(rows, GROUP_METRICS)
    eval_path = workdir / EVAL_JSON
    final = _read_json(eval_path, EVAL_JSON) if eval_path.exists() else None
    if final is not None:
      _check_eval(final, eval_path, rows)
    lev_eval_path = workdir / LEV_EVAL_JSON
    if lev_eval_path.exists():
      rung.lev_eval = _read_json(lev_eval_path, LEV_EVAL_JSON)
      if not isinstance(rung.lev_eval.get("downstream", {}), dict):
        raise LadderError(f"{lev_eval_path}: 'downstream' must be an object "
                          "{task: {acc, acc_stderr, ...}}")
  except LadderError as e:
    rung.status, rung.reason = "unreadable", str(e)
    return rung
  if not rows:
    rung.reason = f"no metrics: {metrics} is empty (never reached a log step)"
    return rung
  if final is None or final.get("step") != rung.steps:
    rung.status = "unfinished"
    if rung.step == rung.steps:  # trained to the end, but the final evaluation is absent
      rung.reason = (f"step {rung.step} of {rung.steps} reached but {eval_path} "
                     f"{'is missing' if final is None else 'is from step ' + str(final.get('step'))}"
                     ": re-run lev-train on it to evaluate")
    else:
      rung.reason = f"not finished: step {rung.step} of {rung.steps}"
    return rung
  if not math.isfinite(_as_number(final["loss"])):
    rung.status = "unreadable"
    rung.reason = f"{eval_path}: final loss is {final['loss']} (diverged?)"
    return rung
  renamed = _renamed_latest(workdir / CHECKPOINTS) if unchecked else None
  if renamed:  # newcomer pass 12: "holds no checkpoint ... train the rung there"
    rung.status = "unverified"
    rung.reason = f"{renamed}; the {member} is left out until then"
    return rung
  if unchecked:  # newcomer pass 9: checkpoints/ deleted, another run's files copied in
    rung.status = "unverified"
    rung.reason = (f"{unchecked}, so the config it was trained with cannot be checked "
                   f"against the {owner}'s {variant}: left out; move {workdir} aside and "
                   f"train the {member} there")
    return rung
  foreign = _foreign_step(workdir, stored_step)
  if foreign:  # newcomer pass 15: another run's step of the same shape, summarised
    rung.status = "unverified"
    rung.reason = f"{foreign}; the {member} is left out until then"
    return rung
  if other or settings:  # newcomer passes 6 and 7: another run summarised as the rung
    diffs = other or settings
    more = f" and {len(diffs) - 4} more" if len(diffs) > 4 else ""
    listed = "; ".join(d.replace("this run", owner) for d in diffs[:4])
    rung.status = "other config"
    rung.reason = (f"{workdir} holds a model of another shape than the {owner}'s {variant} "
                   f"({listed}{more}): left out; move it aside and train the {member} "
                   "there" if other else
                   f"{workdir} was trained with other settings than the {owner}'s {variant} "
                   f"({listed}{more}): left out; if --train_flags made them, give the same "
                   f"--train_flags here; else move it aside and train the {member} there")
    return rung
  rung.step = max(rung.step or 0, rung.steps)
  rung.final = final
  rung.status = "finished"
  if rung.lev_eval is not None and rung.lev_eval.get("step") not in (None, rung.steps):
    rung.notes.append(f"{LEV_EVAL_JSON} is from step {rung.lev_eval.get('step')}, not the "
                      f"final step {rung.steps}")
  return rung


def collect(ladder, root, expected: Mapping[str, ml_collections.ConfigDict] | None = None,
            owner: str = "ladder") -> LadderResult:
  """Reads every rung of `ladder` under `root` (local path or gs://).

  Args:
    ladder: the ladder module, or the path of its experiment file.
    root: the folder holding one workdir per variant.
    expected: {variant: the config it is meant to be trained with} for variants whose
      config is not get_config(variant) (lev-ladder's --train_flags applied); see
      collect_rung.
    owner: "ladder" or "study": the word the reasons use for `ladder` (its variants are
      "rungs" or "runs").

  Returns:
    A LadderResult with one Rung per variant of RUNGS, in order.

  Raises:
    LadderError: the ladder file is broken (see load_ladder, collect_rung).
  """
  module = load_ladder(ladder, "study" if owner == "study" else "ladder")
  root_path = epath.Path(root)
  where = getattr(module, "__file__", None) or str(ladder)
  return LadderResult(ladder=str(ladder) if not isinstance(ladder, types.ModuleType)
                      else where, root=str(root),
                      rungs=[collect_rung(module, v, root_path, (expected or {}).get(v), owner)
                             for v in module.RUNGS])
