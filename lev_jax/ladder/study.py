"""A seeded study: tied vs Leviathan (untied as the ablation, LEV optimiser options as
extra cells) over vocabularies, backbone sizes and corpora, several seeds per cell, with
paired intervals and, over sizes, the fitted trend.

  analysis = analyse(*collect("experiments/fidelity_study.py", "runs/study"), evals)

A study file is a ladder file (lev_jax/ladder/runs.py: `RUNGS` names every run, one run per
(cell, seed); `get_config(run)`); optionally `PIECES = {name: runs of RUNGS}`, parts that
run alone as "FILE:NAME" (`load_study_module`; e.g. one corpus of
experiments/scale_study.py). Its runs may differ only in the factors (`FACTOR_FIELDS`):
the variant (model.embedding), the vocabulary (model.vocab_size), the backbone size (the
shape: model.d_model, n_layers, n_heads, n_kv_heads, head_dim, d_ff; labelled
"d<d_model>-L<n_layers>", which must name one shape), the corpus (data.corpus), the
seed (seed, data.seed) and the options (`OPTION_FIELDS`: issue 25's ablations:
optim.lev_lr_multiplier, clip_mode, lev_warmup_steps, lev_weight_decay,
lev.out_proj_init, id_permutation, permutation_seed, output_norm, n_knots, rank);
`check_factors` refuses anything else (steps, batch, seq_len, data pipeline, LEV's
d_seed or heads, ...) before a run starts, naming the fields. A cell is (variant, vocab,
size, corpus, options); its runs are its seeds. The options label names each option that
differs from base_config's (LEV's n_knots and rank: from the value most of the study's
Leviathan runs hold), e.g. "[rank=32]"; options that act on LEV only are not named for a
model without LEV. Cell labels name the size and the corpus only in a study with several
of them, so the reports of one-size, one-corpus studies (fidelity_study, smoke_study)
read as before.

Each finished run is evaluated once more (`evaluate_run` -> WORKDIR/study_eval.json,
which records the run and the evaluated checkpoint: `study_eval_identity`) on
the validation split and on the held-out test split (lev_jax/cli/eval.py: `lev-eval
--split=test`; the embedded source holds one out with data.test_fraction > 0), under the
log-frequency and the equal-mass buckets (lev_jax/eval/evaluate.py).

What `analyse` computes:
  per cell and split: loss and perplexity, mean ± standard error over seeds
  per comparison (every non-tied cell vs the tied cell of its vocab, size and corpus
    with default options, and every cell that is neither tied nor untied vs the untied
    cell of the same; seed i paired with baseline seed i): the relative perplexity change
    ppl / ppl_baseline - 1, overall and per bucket, as the mean of the per-seed changes
    with a two-sided Student-t interval over them (`t_interval`; n - 1 degrees of
    freedom); tokens to reach the baseline's final validation loss and the tokens ratio
    per seed (lev_jax/ladder/scaling.py, on the eval/loss curves), mean ± se over the
    seeds that reach it
  trend (a series at >= 2 sizes, per vocab and corpus): the least-squares line of the
    per-seed changes against log10 of the backbone (non-embedding) parameter count, the
    slope (change per decade) with a Student-t interval (`linear_fit`, n - 2 degrees
    of freedom)
  gap closed (a Leviathan option cell with an untied cell): per seed the fraction of the
    Leviathan-default-vs-untied perplexity gap the option closes, (ppl_default -
    ppl_option) / (ppl_default - ppl_untied), mean with its Student-t interval
    (`gap_closed`; None with the reason where the default does not trail untied)
  dynamics: per cell, the last logged train/grad_norm/<group> and
    train/update_ratio/<group> of metrics.jsonl (runs.Rung.group_metrics), mean ± se
  selection (validation only): per (vocab, size, corpus) with several Leviathan option
    cells, the one with the lowest mean validation perplexity; the final table reports
    the test split for tied, untied, Leviathan with default options (or a variant's only
    cell there, whatever its options) and the selected Leviathan
A figure that cannot be computed is None next to a reason.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

import ml_collections
import numpy as np
from etils import epath
from scipy import stats

from lev_jax.checkpoint_checks import MANIFEST
from lev_jax.eval import evaluate
from lev_jax.ladder import analysis as ladder_analysis, runs
from lev_jax.workdir import (CHECKPOINTS, STUDY_EVAL_JSON, file_sha256, loads_json,
                             write_json_atomic)

# Config fields a study's runs may differ in, and the factor each belongs to.
# The backbone's shape: the size factor (lev_jax/model.py reads these six fields).
SIZE_FIELDS = ("model.d_model", "model.n_layers", "model.n_heads", "model.n_kv_heads",
               "model.head_dim", "model.d_ff")
# Options (issue 25's ablations), in the order a label names them: the LEV optimiser
# options, LEV's init, id map and output norm, and LEV's capacity (LEV_SHAPE_OPTIONS).
OPTION_FIELDS = ("optim.lev_lr_multiplier", "optim.clip_mode", "lev.out_proj_init",
                 "lev.id_permutation", "lev.permutation_seed", "lev.output_norm",
                 "optim.lev_warmup_steps", "optim.lev_weight_decay", "lev.n_knots",
                 "lev.rank")
# LEV's capacity: labelled against the study's own LEV shape (`option_reference`), not
# base_config's (every small study sets its own). lev.d_seed and lev.n_heads are not
# factors (a study varying them is refused).
LEV_SHAPE_OPTIONS = ("lev.n_knots", "lev.rank")
# Options that act on LEV's parameters only: a model without LEV ignores them, so they
# do not enter its label (a tied baseline stays "default" whatever they are set to).
LEV_ONLY_OPTIONS = tuple(f for f in OPTION_FIELDS if f != "optim.clip_mode")
FACTOR_FIELDS = {
    "name": "label", "model.embedding": "variant", "model.vocab_size": "vocab",
    "seed": "seed", "data.seed": "seed", **dict.fromkeys(OPTION_FIELDS, "options"),
    **dict.fromkeys(SIZE_FIELDS, "size"), "data.corpus": "corpus",
}
VARIANTS = {"tied": "tied", "lev": "leviathan", "untied": "untied"}
SPLITS = ("validation", "test")
SCHEMES = ("log", "equal_mass")
CONFIDENCE = 0.95


class StudyError(ValueError):
  """A study that cannot run or be read; the message names the runs and fields."""


# ---------------------------------------------------------------------------- factors

def flatten(config) -> dict:
  """{dotted field: value} of a ConfigDict (or dict); lists become tuples."""
  out = {}

  def walk(node, prefix):
    for key, value in node.items():
      if isinstance(value, (dict, ml_collections.ConfigDict)):
        walk(value, f"{prefix}{key}.")
      else:
        out[f"{prefix}{key}"] = tuple(value) if isinstance(value, list) else value
  walk(config.to_dict() if isinstance(config, ml_collections.ConfigDict) else config, "")
  return out


def options_label(flat: dict, reference: dict | None = None) -> str:
  """"default", or the options (OPTION_FIELDS) that differ from their reference, e.g.
  "lev_lr_multiplier=3, clip_mode=per_group" (LEV_ONLY_OPTIONS only for LEV models).

  Args:
    flat: one run's `flatten`ed config.
    reference: {LEV_SHAPE_OPTIONS field: the study's value} (`option_reference`); the
      other options' reference is base_config's value. None: LEV's shape is not named.
  """
  from lev_jax.config import base_config
  defaults = flatten(base_config())
  defaults.update(reference if reference is not None
                  else {f: flat.get(f, defaults[f]) for f in LEV_SHAPE_OPTIONS})
  fields = [f for f in OPTION_FIELDS
            if flat.get("model.embedding") == "lev" or f not in LEV_ONLY_OPTIONS]
  changed = [f"{f.rsplit('.', 1)[1]}={flat.get(f)!s}" for f in fields
             if flat.get(f, defaults[f]) != defaults[f]]
  return ", ".join(changed) or "default"


def option_reference(flats: Sequence[dict]) -> dict:
  """{LEV_SHAPE_OPTIONS field: the value most of the study's LEV runs hold} (a tie: the
  first run's in order); base_config's value in a study without LEV runs.

  Args:
    flats: every run's `flatten`ed config, in RUNGS order.
  """
  from lev_jax.config import base_config
  defaults = flatten(base_config())
  levs = [f for f in flats if f.get("model.embedding") == "lev"]
  return {field: Counter(f.get(field, defaults[field]) for f in levs).most_common(1)[0][0]
          if levs else defaults[field] for field in LEV_SHAPE_OPTIONS}


class Factors(NamedTuple):
  """One run's place in a study: its cell (variant, vocab, size, corpus, options) and seed."""
  variant: str
  vocab: int
  size: str
  corpus: str
  options: str
  seed: int

  @property
  def cell(self) -> tuple:
    return tuple(self)[:5]


def size_label(flat: dict) -> str:
  """The backbone's shape in a cell label: "d128-L2" (model.d_model, model.n_layers)."""
  return f"d{flat['model.d_model']}-L{flat['model.n_layers']}"


def cell_of(config, reference: dict | None = None) -> Factors:
  """(variant, vocab, size, corpus, options, seed) of one run's config; `reference` as
  in `options_label` (None: LEV's shape is not named; `cells_of` gives the study's)."""
  flat = flatten(config)
  variant = VARIANTS.get(flat["model.embedding"], flat["model.embedding"])
  return Factors(variant, int(flat["model.vocab_size"]), size_label(flat),
                 str(flat.get("data.corpus", "")), options_label(flat, reference),
                 int(flat["seed"]))


def cells_of(configs: dict) -> dict:
  """{run: Factors} of a study's {run: config}, LEV's shape labelled against the study's
  own (`option_reference`)."""
  reference = option_reference([flatten(c) for c in configs.values()])
  return {run: cell_of(c, reference) for run, c in configs.items()}


def check_factors(configs: dict) -> None:
  """Refuses a study whose runs differ in anything but FACTOR_FIELDS, or that holds
  one (cell, seed) twice.

  Args:
    configs: run name -> its config (ConfigDict).

  Raises:
    StudyError: no runs; a differing non-factor field (every such field named with
      its values and the runs holding them); two runs of the same cell and seed.
  """
  if not configs:
    raise StudyError("the study has no runs (RUNGS is empty)")
  flat = {run: flatten(c) for run, c in configs.items()}
  fields = sorted(set().union(*flat.values()))
  differing = []
  for field in fields:
    if field in FACTOR_FIELDS:
      continue
    by_value = {}
    for run, f in flat.items():
      by_value.setdefault(repr(f.get(field, "<absent>")), []).append(run)
    if len(by_value) > 1:
      shown = "; ".join(f"{value} in {', '.join(runs[:3])}"
                        + (f" (+{len(runs) - 3} more)" if len(runs) > 3 else "")
                        for value, runs in by_value.items())
      differing.append(f"{field} ({shown})")
  if differing:
    raise StudyError(
        f"the study's runs differ in {len(differing)} field(s) that are not factors: "
        + " | ".join(differing) + ". Runs may differ only in "
        + ", ".join(sorted(FACTOR_FIELDS)) + " (variant, vocab, backbone size, corpus, "
        "seed, LEV options): equal tokens and data pipeline in every cell")
  _check_sizes(flat)
  seen = {}
  for run, key in cells_of(configs).items():
    if key in seen:
      raise StudyError(f"runs {seen[key]} and {run} are the same cell and seed {key}")
    seen[key] = run


def _check_sizes(flat: dict) -> None:
  """Refuses two backbone shapes under one size label (same d_model and n_layers, other
  heads, head_dim or d_ff): the label would merge them into one cell."""
  shapes = {}
  for run, f in flat.items():
    shape = tuple(f.get(field) for field in SIZE_FIELDS)
    shapes.setdefault(size_label(f), {}).setdefault(shape, run)
  for label, by_shape in shapes.items():
    if len(by_shape) > 1:
      (a, run_a), (b, run_b) = list(by_shape.items())[:2]
      fields = ", ".join(f"{field} ({x} in {run_a}; {y} in {run_b})"
                         for field, x, y in zip(SIZE_FIELDS, a, b) if x != y)
      raise StudyError(f"runs {run_a} and {run_b} share the size {label} (model.d_model, "
                       f"model.n_layers) but differ in {fields}; a size is one backbone "
                       "shape: give them different d_model or n_layers")


# ---------------------------------------------------------------------------- statistics

def mean_se(values: Sequence[float]) -> dict:
  """{"mean", "se" (sample sd / sqrt(n); None for n < 2), "n"}; mean None for n = 0."""
  x = np.asarray([v for v in values if v is not None], np.float64)
  n = len(x)
  return {"mean": float(x.mean()) if n else None,
          "se": float(x.std(ddof=1) / math.sqrt(n)) if n >= 2 else None, "n": n}


def t_interval(values: Sequence[float], confidence: float = CONFIDENCE) -> dict:
  """The mean of `values` with a two-sided Student-t interval (n - 1 degrees of freedom).

  Args:
    values: per-seed figures, e.g. paired relative changes.
    confidence: coverage of the interval, in (0, 1).

  Returns:
    {"mean", "se", "lo", "hi", "n", "values"}; se, lo and hi are None for n < 2 (no
    spread to estimate), mean is None for n = 0.
  """
  out = mean_se(values)
  out.update(lo=None, hi=None, values=[float(v) for v in values if v is not None])
  if out["se"] is not None:
    half = float(stats.t.ppf(0.5 + confidence / 2, out["n"] - 1)) * out["se"]
    out.update(lo=out["mean"] - half, hi=out["mean"] + half)
  return out


def paired_changes(baseline: Sequence[float], other: Sequence[float]) -> list[float]:
  """other_i / baseline_i - 1 for each pair (seed i of one cell with seed i of its
  baseline).

  Raises:
    StudyError: lengths differ, or a baseline value that is not positive.
  """
  if len(baseline) != len(other):
    raise StudyError(f"paired values need equal lengths; got {len(baseline)} and {len(other)}")
  if any(b <= 0 for b in baseline):
    raise StudyError(f"baseline values must be positive; got {list(baseline)}")
  return [o / b - 1.0 for b, o in zip(baseline, other)]


def gap_closed(default: Sequence[float], option: Sequence[float], untied: Sequence[float],
               seeds: Sequence[int] | None = None, confidence: float = CONFIDENCE) -> dict:
  """The fraction of the Leviathan-vs-untied gap that a Leviathan option closes: per seed
  i, (default_i - option_i) / (default_i - untied_i) (1 = level with untied, 0 = no better
  than the default, < 0 = worse), as a `t_interval` over the seeds.

  Args:
    default, option, untied: per-seed perplexities of the Leviathan default cell, the
      option cell and the untied cell, seed i of each paired.
    seeds: the seeds, to name in a reason (default 0, 1, ...).
    confidence: coverage of the interval, in (0, 1).

  Returns:
    `t_interval`'s dict with "reason": None; or mean, se, lo, hi None, values [] and the
    reason when the default does not trail untied at some seed (no gap to close there).

  Raises:
    StudyError: lengths differ.
  """
  if not len(default) == len(option) == len(untied):
    raise StudyError(f"gap_closed needs equal lengths; got {len(default)}, {len(option)} "
                     f"and {len(untied)}")
  seeds = list(range(len(default))) if seeds is None else list(seeds)
  level = [f"{s} ({d:.2f} vs {u:.2f})" for s, d, u in zip(seeds, default, untied) if d <= u]
  if level:
    out = t_interval([])
    out.update(n=len(default), reason=(
        "the Leviathan default does not trail untied at seed " + ", ".join(level)
        + ": no gap to close"))
    return out
  out = t_interval([(d - o) / (d - u) for d, o, u in zip(default, option, untied)],
                   confidence)
  out["reason"] = None
  return out


def linear_fit(x: Sequence[float], y: Sequence[float], confidence: float = CONFIDENCE
               ) -> dict:
  """Least-squares line y = intercept + slope * x with a two-sided Student-t interval on
  the slope (the textbook standard error sqrt(SSE / (n - 2) / Sxx), n - 2 degrees of
  freedom; as scipy.stats.linregress's, but 0 rather than NaN for points on a line).

  Args:
    x, y: paired observations (e.g. log10 parameters, a per-seed relative change).
    confidence: coverage of the interval, in (0, 1).

  Returns:
    {"slope", "intercept", "se", "lo", "hi", "n", "df", "reason"}: slope and intercept
    None (with the reason) for fewer than 2 distinct x; se, lo, hi None for n < 3 (a
    line through 2 points has no spread to estimate).

  Raises:
    StudyError: x and y of different lengths.
  """
  if len(x) != len(y):
    raise StudyError(f"a fit needs as many x as y; got {len(x)} and {len(y)}")
  n = len(x)
  out = {"slope": None, "intercept": None, "se": None, "lo": None, "hi": None, "n": n,
         "df": max(n - 2, 0), "reason": None}
  if len(set(x)) < 2:
    out["reason"] = f"fewer than 2 distinct sizes ({len(set(x))}) with a finished pair"
    return out
  xs, ys = np.asarray(x, np.float64), np.asarray(y, np.float64)
  dx = xs - xs.mean()
  slope = float(dx @ (ys - ys.mean()) / (dx @ dx))
  intercept = float(ys.mean() - slope * xs.mean())
  out.update(slope=slope, intercept=intercept)
  if n >= 3:  # se = sqrt(SSE / (n - 2) / Sxx); 0 for points on the line
    se = math.sqrt(float(np.sum((ys - intercept - slope * xs) ** 2)) / (n - 2) / float(dx @ dx))
    half = float(stats.t.ppf(0.5 + confidence / 2, n - 2)) * se
    out.update(se=se, lo=slope - half, hi=slope + half)
  return out


# ---------------------------------------------------------------------------- evaluation

def read_eval(workdir) -> dict | None:
  """WORKDIR/study_eval.json, or None when absent or unreadable.

  Raises:
    runs.LadderError: a folder in its place (newcomer pass 11: an IsADirectoryError
      traceback; lev-study reports the run as unreadable with this line).
  """
  path = epath.Path(workdir) / STUDY_EVAL_JSON
  if path.is_dir():
    raise runs.LadderError(f"{path}: is a folder; expected lev-study's evaluation file (move "
                      "it aside)")
  try:
    return loads_json(path.read_text())
  except (FileNotFoundError, json.JSONDecodeError, UnicodeDecodeError):
    return None


def study_eval_problem(ev, steps: int) -> str | None:
  """Why `ev` (a study_eval.json, `evaluate_run`'s) is not lev-study's own evaluation of
  the run's final checkpoint, as a phrase; None when its figures agree.

  There is no metrics.jsonl row to compare with, so its figures are checked against each
  other: its "step" is the run's final step `steps`; per split, both bucket schemes hold
  perplexity = exp(loss) and a loss that is the token-weighted mean of their buckets'
  (runs.bucket_problem); and the two schemes, one evaluation bucketed twice, have the
  same loss and tokens.

  Returns:
    e.g. "its validation log loss 1.6 is not the token-weighted mean of its buckets'
    losses (6.79...)", or None.
  """
  if not isinstance(ev, dict):
    return "not a JSON object"
  if ev.get("step") != steps:
    return f"its step {ev.get('step')!r} is not the run's final step {steps}"
  for split in SPLITS:
    part = ev.get(split)
    if not isinstance(part, dict) or not isinstance(part.get("log"), dict):
      return f"no {split} results"
    results = [(scheme, part[scheme]) for scheme in SCHEMES if part.get(scheme) is not None]
    for scheme, r in results:
      where = f"its {split} {scheme}"
      if not isinstance(r, dict):
        return f"{where} result is not a JSON object"
      try:
        loss, ppl = float(r["loss"]), float(r["perplexity"])
      except (KeyError, TypeError, ValueError):
        return f"{where} result has no numeric loss and perplexity"
      if math.isfinite(loss) and loss < 700 and not math.isclose(ppl, math.exp(loss),
                                                                   rel_tol=1e-9):
        return f"{where} perplexity {ppl} is not exp(loss) = {math.exp(loss):.6g}"
      problem = runs.bucket_problem(r)
      if problem:
        return f"{where} {problem.removeprefix('its ')}"
    if len(results) == 2:
      (_, a), (_, b) = results
      if not (math.isclose(float(a["loss"]), float(b["loss"]), rel_tol=1e-6)
              and a.get("tokens") == b.get("tokens")):
        return (f"its {split} log and equal_mass results (one evaluation bucketed twice) "
                f"differ: loss {a['loss']} vs {b['loss']}, tokens {a.get('tokens')} vs "
                f"{b.get('tokens')}")
  return None


def study_eval_identity(workdir, step: int) -> dict:
  """What ties a study_eval.json to the checkpoint it evaluated (`evaluate_run` records
  it, `study_eval_owner_problem` checks it): {"run": the workdir's folder name (RUN of
  ROOT/RUN), "manifest_sha256": the sha256 of the step's checksum manifest
  WORKDIR/checkpoints/<step>/checksums.json (checkpoint_checks.MANIFEST: the sha256 of
  every file of the step, so another checkpoint has another digest), None without one}.

  Raises:
    OSError: the manifest is there but cannot be read (a folder in its place, no
      permission).
  """
  manifest = epath.Path(workdir) / CHECKPOINTS / str(step) / MANIFEST
  return {"run": epath.Path(workdir).name,
          "manifest_sha256": file_sha256(manifest) if manifest.exists() else None}


def study_eval_owner_problem(ev: dict, workdir) -> str | None:
  """Why `ev` (a study_eval.json whose figures agree: `study_eval_problem`) is not the
  evaluation of this run's checkpoint, as a phrase; None when its identity
  (`study_eval_identity`) is this run's, or when it records none (a file written before
  lev-study recorded it is read as before, as a file without "eval_batches" or "data"
  is: it cannot be checked).

  Returns:
    e.g. "it belongs to another run: it records run 'tied_s1', not tied_s0", or
    "it belongs to another checkpoint: ...", naming the manifest (newcomer pass 13
    (N182): tied_s1's study_eval.json copied over tied_s0's counted one seed twice).
  """
  if "run" not in ev:
    return None
  manifest = epath.Path(workdir) / CHECKPOINTS / str(ev["step"]) / MANIFEST
  try:
    mine = study_eval_identity(workdir, ev["step"])
  except OSError as e:
    return (f"its checkpoint cannot be checked: {manifest} cannot be read "
            f"({e.strerror or e})")
  if ev["run"] != mine["run"]:
    return f"it belongs to another run: it records run {ev['run']!r}, not {mine['run']}"
  if "manifest_sha256" not in ev:  # newcomer pass 14 (S06): "the run trained again"
    return ("it records its run but no manifest_sha256 (lev-study writes both: the file "
            "was edited)")
  recorded = ev.get("manifest_sha256")
  if isinstance(recorded, str) and recorded.lower() == mine["manifest_sha256"]:
    return None  # the same digest in upper case (newcomer pass 15, E09)
  if recorded != mine["manifest_sha256"]:
    current = mine["manifest_sha256"]
    return (f"it belongs to another checkpoint: it records {MANIFEST} "
            + ("absent" if recorded is None else f"sha256 {str(recorded)[:16]}...")
            + f", but this run's {manifest} "
            + ("is absent" if current is None else f"has sha256 {current[:16]}...")
            + " (the run trained again, or its checkpoints replaced)")
  return None


def evaluate_run(workdir, *, eval_batches: int | None = None) -> dict:
  """Validation and test evaluation of a finished run, both bucket schemes; writes and
  returns WORKDIR/study_eval.json: {"step", "run", "manifest_sha256" (what was evaluated:
  `study_eval_identity`), "eval_batches", "validation": {"log", "equal_mass", "data"},
  "test": {...}}, each an `evaluate.evaluate` result and what was evaluated
  (`evaluate.data_record`).

  Args:
    workdir: a finished lev-train workdir (its latest checkpoint is evaluated).
    eval_batches: eval.batches for this evaluation (None: the run's own).

  Raises:
    InferenceError, ConfigError, DataError: from lev_jax.eval.checkpoint_eval (e.g. no test split).
  """
  from lev_jax import inference
  from lev_jax.eval.checkpoint_eval import eval_partition, evaluate_model
  from lev_jax.train import make_eval_step
  im = inference.load(workdir)
  overrides = {"eval.batches": eval_batches} if eval_batches else {}
  step_fn = make_eval_step(eval_partition(im.config), im.config)  # one compile, both splits
  out = {"step": im.step, **study_eval_identity(workdir, im.step),
         "eval_batches": eval_batches or im.config.eval.batches}
  for split in SPLITS:
    r = evaluate_model(im, split=split, overrides=overrides, eval_step=step_fn)
    out[split] = {"log": r["validation"], "equal_mass": r.get("validation_equal_mass"),
                  "data": r.get("data")}
  write_json_atomic(epath.Path(workdir) / STUDY_EVAL_JSON, out)
  return out


# ---------------------------------------------------------------------------- collect

def split_spec(spec) -> tuple[str, str | None]:
  """(the study file, the piece or None) of "FILE" or "FILE:PIECE" (a piece only when
  FILE is a file and the whole spec is not; "FILE:" gives the empty piece "", which
  `load_study_module` refuses)."""
  spec = str(spec)
  path, sep, piece = spec.rpartition(":")
  if sep and not Path(spec).is_file() and Path(path).is_file():
    return path, piece
  return spec, None


def load_study_module(spec):
  """The study module of "FILE" (every run of RUNGS) or "FILE:PIECE" (RUNGS narrowed to
  the file's PIECES[PIECE], in its order; e.g. one corpus of experiments/scale_study.py).

  Raises:
    runs.LadderError: a broken study file (runs.load_ladder).
    StudyError: a piece the file's PIECES (a dict: name -> tuple of runs of RUNGS) lacks
      (an empty one, "FILE:", too), or one naming a run outside RUNGS.
  """
  path, piece = split_spec(spec)
  module = runs.load_ladder(path, kind="study")
  if piece is None:
    return module
  pieces = getattr(module, "PIECES", None)
  if not isinstance(pieces, dict) or piece not in pieces:
    known = ", ".join(map(str, pieces)) if isinstance(pieces, dict) else ""
    what = (f"{path} has no piece {piece!r}" if piece
            else "an empty piece name after ':'")
    raise StudyError(f"--study={spec}: {what}; expected "
                     + (f"one of {known}" if known else "a study file with a PIECES dict "
                        "(name -> runs of RUNGS) to run a piece, or the file alone"))
  chosen = tuple(pieces[piece])
  outside = [r for r in chosen if r not in module.RUNGS]
  if not chosen or outside:
    raise StudyError(f"{path}: PIECES[{piece!r}] must name runs of RUNGS; "
                     + (f"got {', '.join(outside[:3])} outside it" if outside else "it is empty"))
  module.RUNGS = chosen
  return module


def collect(study, root) -> tuple[runs.LadderResult, dict]:
  """(the ladder view of every run, {run: Factors}); `study` is "FILE" or "FILE:PIECE".

  Raises:
    runs.LadderError, StudyError: a broken study file or one whose runs differ in a
      non-factor field.
  """
  module = load_study_module(study)
  configs = {run: module.get_config(run) for run in module.RUNGS}
  check_factors(configs)
  result = runs.collect(module, root, owner="study")
  return result, cells_of(configs)


# ---------------------------------------------------------------------------- analysis

def _split_figures(evals: list[dict], split: str) -> dict:
  rows = [e[split]["log"] for e in evals]
  return {"loss": mean_se([r["loss"] for r in rows]),
          "perplexity": mean_se([r["perplexity"] for r in rows])}


def _bucket_rows(base_evals, other_evals, split, scheme) -> dict:
  """Per bucket: the paired t-interval of the per-seed relative changes (none when a
  pair was evaluated on other data: both record it and the sha256s differ)."""
  for b, o in zip(base_evals, other_evals):
    a_data, o_data = b[split].get("data"), o[split].get("data")
    if a_data and o_data and not evaluate.same_data(a_data, o_data):
      return {"rows": [], "reason": (
          f"evaluated on other data: {evaluate.describe_data(a_data)} vs "
          f"{evaluate.describe_data(o_data)}")}
  pairs = [(b[split][scheme], o[split][scheme]) for b, o in zip(base_evals, other_evals)
           if b[split].get(scheme) and o[split].get(scheme)]
  if not pairs:
    return {"rows": [], "reason": f"no {scheme} buckets in {STUDY_EVAL_JSON}"}
  try:
    per_seed = [evaluate.relative_change(b, o) for b, o in pairs]
  except ValueError as e:
    return {"rows": [], "reason": str(e)}
  rows = []
  for i, first in enumerate(per_seed[0]):
    changes = [seed_rows[i]["change"] for seed_rows in per_seed]
    rows.append({
        "range": first["range"],
        "targets": mean_se([b["buckets"][i]["tokens"] for b, _ in pairs])["mean"],
        "ids": pairs[0][0]["buckets"][i]["ids"],
        "tied_ppl": mean_se([r[i]["baseline"] for r in per_seed])["mean"],
        "other_ppl": mean_se([r[i]["other"] for r in per_seed])["mean"],
        "change": t_interval([c for c in changes if c is not None])})
  return {"rows": rows, "reason": None}


def _efficiency(base_rungs, other_rungs) -> dict:
  per_seed = [ladder_analysis.rung_efficiency(t, o) for t, o in zip(base_rungs, other_rungs)]
  reached = [e for e in per_seed if e["ratio"] is not None]
  return {"per_seed": per_seed, "n": len(per_seed), "n_reached": len(reached),
          "target": mean_se([e["target"] for e in per_seed]),
          "tokens_to_target": mean_se([e["leviathan_tokens"] for e in reached]),
          "ratio": mean_se([e["ratio"] for e in reached])}


def _comparison(cell, base, runs_by_cell, result, evals, shown, kind="tied") -> dict:
  """`cell` vs `base` (the `kind` cell with default options of its vocab, size and
  corpus; None when the study has none), seeds paired."""
  variant, vocab, size, corpus, options = cell
  label = lambda c: _label(c, shown)  # noqa: E731
  out = {"variant": variant, "vocab": vocab, "size": size, "corpus": corpus,
         "options": options, "label": label(cell), "baseline": label(base) if base else None,
         "baseline_variant": kind,
         "seeds": [], "reason": None, "perplexity": {}, "buckets": {}, "efficiency": None}
  if base is None:
    where = "".join(f" {what} {value}" for what, value, show in
                    (("size", size, shown[0]), ("corpus", corpus, shown[1])) if show)
    out["reason"] = f"no {kind} cell with default options at vocab {vocab}{where}"
    return out
  mine, theirs = runs_by_cell.get(cell, {}), runs_by_cell.get(base, {})
  seeds = sorted(s for s in mine if s in theirs and mine[s] in evals and theirs[s] in evals)
  out["seeds"] = seeds
  if not seeds:
    out["reason"] = (f"no seed finished and evaluated in both {label(cell)} and "
                     f"{label(base)}")
    return out
  base_evals = [evals[theirs[s]] for s in seeds]
  other_evals = [evals[mine[s]] for s in seeds]
  for split in SPLITS:
    out["perplexity"][split] = t_interval(paired_changes(
        [e[split]["log"]["perplexity"] for e in base_evals],
        [e[split]["log"]["perplexity"] for e in other_evals]))
    out["buckets"][split] = {scheme: _bucket_rows(base_evals, other_evals, split, scheme)
                             for scheme in SCHEMES}
  out["efficiency"] = _efficiency([result.rung(theirs[s]) for s in seeds],
                                  [result.rung(mine[s]) for s in seeds])
  return out


def _gap_closed(comp, runs_by_cell, evals, shown) -> dict | None:
  """{split: `gap_closed`} of a Leviathan option cell vs untied (seeds evaluated in the
  option, default and untied cells); None for any other comparison, or without an untied
  or a default Leviathan cell of the same vocab, size and corpus."""
  cell = (comp["variant"], comp["vocab"], comp["size"], comp["corpus"])
  if (comp["variant"] != "leviathan" or comp["options"] == "default" or comp["reason"]
      or (*cell, "default") not in runs_by_cell):
    return None
  default, option = runs_by_cell[(*cell, "default")], runs_by_cell[(*cell, comp["options"])]
  untied = runs_by_cell[("untied", *cell[1:], "default")]
  seeds = [s for s in comp["seeds"] if s in default and default[s] in evals]
  if not seeds:
    reason = (f"no seed evaluated in {_label((*cell, 'default'), shown)}, "
              f"{_label((*cell, comp['options']), shown)} and "
              f"{_label(('untied', *cell[1:], 'default'), shown)}")
    return {split: {**t_interval([]), "reason": reason} for split in SPLITS}
  def ppl(of_seed, split):
    return [evals[of_seed[s]][split]["log"]["perplexity"] for s in seeds]
  return {split: gap_closed(ppl(default, split), ppl(option, split), ppl(untied, split),
                            seeds) for split in SPLITS}


def _group_metrics(rows: list[dict]) -> dict:
  """{metrics.jsonl key: mean_se over the rows} of each key of their group_metrics."""
  keys = sorted({k for row in rows for k in row["group_metrics"]})
  return {k: mean_se([row["group_metrics"].get(k) for row in rows]) for k in keys}


def _label(cell, shown=(False, False)) -> str:
  """"leviathan V=8192 [options]"; with shown = (size varies, corpus varies) the size and
  the corpus after the vocab: "leviathan V=8192 d256-L4 foldoc"."""
  variant, vocab, size, corpus, options = cell
  return (f"{variant} V={vocab}" + (f" {size}" if shown[0] else "")
          + (f" {corpus}" if shown[1] else "")
          + ("" if options == "default" else f" [{options}]"))


def _run_row(rung, factors, ev) -> dict:
  variant, vocab, size, corpus, options, seed = factors
  row = {"run": rung.variant, "variant": variant, "vocab": vocab, "size": size,
         "corpus": corpus, "options": options,
         "seed": seed, "status": rung.status, "reason": rung.reason, "step": rung.step,
         "steps": rung.steps, "tokens_per_step": rung.tokens_per_step,
         "tokens": rung.steps * rung.tokens_per_step, "params": rung.params["total"],
         "backbone_params": rung.params["backbone"],
         "train_curve": rung.train_curve, "eval_curve": rung.eval_curve,
         "group_metrics": rung.group_metrics, "evaluated": ev is not None}
  for split in SPLITS:
    r = (ev or {}).get(split, {}).get("log") or {}
    row[f"{split}_loss"], row[f"{split}_ppl"] = r.get("loss"), r.get("perplexity")
  return row


def trends(comparisons: list[dict], backbone: dict) -> list[dict]:
  """The change of each series with size: per (vocab, corpus, variant, options, baseline
  variant) found at >= 2 sizes, a least-squares line of the per-seed relative perplexity
  changes (every finished pair of every size one point) against log10 of the size's
  backbone parameters (the transformer blocks and final norm, lev-params "backbone": the
  non-embedding count, equal for tied, untied and Leviathan of a size).

  Args:
    comparisons: `_comparison` dicts (vs tied and vs untied).
    backbone: {size label: backbone parameter count}.

  Returns:
    [{"vocab", "corpus", "variant", "options", "baseline" (the baseline's variant),
      "x": "log10 backbone parameters", "sizes": [{"size", "backbone_params", "label",
      "seeds", "change": {split: t_interval, or None with no finished pair}}] (smallest
      first), "fit": {split: `linear_fit` (slope = change per decade of parameters)}}]
  """
  groups = {}
  for comp in comparisons:
    key = (comp["vocab"], comp["corpus"], comp["variant"], comp["options"],
           comp["baseline_variant"])
    groups.setdefault(key, []).append(comp)
  out = []
  for (vocab, corpus, variant, options, base), comps in groups.items():
    if len({c["size"] for c in comps}) < 2:
      continue
    comps = sorted(comps, key=lambda c: (backbone[c["size"]], c["size"]))
    entry = {"vocab": vocab, "corpus": corpus, "variant": variant, "options": options,
             "baseline": base, "x": "log10 backbone parameters", "sizes": [], "fit": {}}
    for c in comps:
      entry["sizes"].append({
          "size": c["size"], "backbone_params": backbone[c["size"]], "label": c["label"],
          "seeds": c["seeds"],
          "change": {split: None if c["reason"] else c["perplexity"][split]
                     for split in SPLITS}})
    for split in SPLITS:
      points = [(math.log10(s["backbone_params"]), v) for s in entry["sizes"]
                if s["change"][split] for v in s["change"][split]["values"]]
      entry["fit"][split] = linear_fit([p[0] for p in points], [p[1] for p in points])
    out.append(entry)
  return out


def analyse(result: runs.LadderResult, factors: dict, evals: dict) -> dict:
  """The study's figures as a JSON-ready dict.

  Args:
    result: `collect`'s ladder view; factors: its {run: Factors (variant, vocab, size,
      corpus, options, seed)}.
    evals: {run: study_eval.json} of the finished, evaluated runs.

  Returns:
    {"study", "root", "confidence", "tokens_per_run",
     "sizes": [size labels, smallest backbone first], "corpora": [corpus names],
     "runs": [per run: run, variant, vocab, size, corpus, options, seed, status, reason,
              step, steps, tokens, params (total), backbone_params, curves,
              validation_/test_ loss and ppl],
     "missing": [{"run", "status", "reason"}] (not finished, or not evaluated),
     "cells": [{"variant", "vocab", "size", "corpus", "options", "label", "seeds",
                "validation", "test": {"loss", "perplexity": {"mean", "se", "n"}},
                "group_metrics": {"train/grad_norm/<group>", "train/update_ratio/<group>":
                mean_se over the seeds of the run's last logged value}}],
     "comparisons": [per non-tied cell vs the tied cell with default options of its
                     vocab, size and corpus: {"label", "baseline", "seeds", "reason",
                     "perplexity": {split: t_interval}, "buckets": {split: {scheme:
                     {"rows": [{"range", "targets", "ids", "tied_ppl", "other_ppl",
                     "change": t_interval}], "reason"}}}, "efficiency"}],
     "comparisons_vs_untied": [the same per cell that is neither tied nor untied, vs
                     the untied cell with default options of its vocab, size and corpus;
                     with "gap_closed": {split: `gap_closed`} for a Leviathan option
                     cell (the seeds also evaluated in the Leviathan default cell),
                     None for other cells or without a Leviathan default cell],
     "trend": [per (vocab, corpus, series, baseline) over >= 2 sizes: `_trend`],
     "selection": [per (vocab, size, corpus) with >= 2 Leviathan cells: {"vocab",
                   "size", "corpus", "candidates", "selected", "criterion"}],
     "final": [labels of the cells in the test table, in order]}
    Labels name the size and the corpus only when the study has several of them.
  """
  runs_by_cell = {}
  for run, f in factors.items():
    runs_by_cell.setdefault(Factors(*f).cell, {})[f[-1]] = run
  rows = [_run_row(r, factors[r.variant], evals.get(r.variant)) for r in result.rungs]
  by_run = {row["run"]: row for row in rows}
  backbone = {}
  for row in rows:
    backbone.setdefault(row["size"], row["backbone_params"])
  sizes = sorted(backbone, key=lambda size: (backbone[size], size))
  corpora = list(dict.fromkeys(cell[3] for cell in runs_by_cell))
  shown = (len(sizes) > 1, len(corpora) > 1)
  tokens = sorted({row["tokens"] for row in rows})
  cells = []
  for cell, seeds in runs_by_cell.items():
    done = sorted(s for s, run in seeds.items() if run in evals)
    entry = {"variant": cell[0], "vocab": cell[1], "size": cell[2], "corpus": cell[3],
             "options": cell[4], "label": _label(cell, shown), "seeds": done,
             "n_runs": len(seeds)}
    for split in SPLITS:
      entry[split] = _split_figures([evals[seeds[s]] for s in done], split)
    entry["group_metrics"] = _group_metrics([by_run[seeds[s]] for s in done])
    cells.append(entry)
  comparisons = {"tied": [], "untied": []}
  for cell in runs_by_cell:
    for kind, skip in (("tied", ("tied",)), ("untied", ("tied", "untied"))):
      if cell[0] in skip:
        continue
      base = (kind, *cell[1:4], "default")
      comparisons[kind].append(_comparison(cell, base if base in runs_by_cell else None,
                                           runs_by_cell, result, evals, shown, kind))
  for comp in comparisons["untied"]:
    comp["gap_closed"] = _gap_closed(comp, runs_by_cell, evals, shown)
  selection, final = _select(cells, runs_by_cell, sizes, corpora)
  return {
      "study": result.ladder, "root": result.root, "confidence": CONFIDENCE,
      "tokens_per_run": tokens[0] if len(tokens) == 1 else None,
      "sizes": sizes, "corpora": corpora,
      "runs": rows,
      "missing": [{"run": r["run"], "status": r["status"],
                   "reason": r["reason"] or ("finished; not evaluated" if not r["evaluated"]
                                             else None)}
                  for r in rows if r["status"] != "finished" or not r["evaluated"]],
      "cells": cells, "comparisons": comparisons["tied"],
      "comparisons_vs_untied": comparisons["untied"],
      "trend": trends(comparisons["tied"] + comparisons["untied"], backbone),
      "selection": selection, "final": final,
  }


def _select(cells: list[dict], runs_by_cell: dict, sizes=(), corpora=()
            ) -> tuple[list[dict], list[str]]:
  """Selection on validation, per (vocab, size, corpus), vocab ascending, then corpora
  and sizes in the order given; the cells of the final (test) table."""
  selection, final = [], []
  rank = lambda order, x: order.index(x) if x in order else len(order)  # noqa: E731
  groups = sorted({(c["vocab"], c["size"], c["corpus"]) for c in cells},
                  key=lambda g: (g[0], rank(list(corpora), g[2]), rank(list(sizes), g[1])))
  for group in groups:
    vocab, size, corpus = group
    here = [c for c in cells if (c["vocab"], c["size"], c["corpus"]) == group]
    # A variant's default-options cell, or its only cell at this vocab (e.g. a study
    # that pins lev_lr_multiplier=1 where nothing else is tried): nothing to select.
    sole = lambda c: sum(d["variant"] == c["variant"] for d in here) == 1  # pylint: disable=cell-var-from-loop
    final += [c["label"] for c in here if c["options"] == "default" or sole(c)]
    levs = [c for c in here if c["variant"] == "leviathan"]
    if len(levs) < 2:
      continue
    candidates = [{"label": c["label"], "options": c["options"], "seeds": c["seeds"],
                   "validation_ppl": c["validation"]["perplexity"]} for c in levs]
    ready = [c for c in candidates if c["validation_ppl"]["n"]
             and c["validation_ppl"]["n"] == len(runs_by_cell[("leviathan", *group,
                                                               c["options"])])]
    entry = {"vocab": vocab, "size": size, "corpus": corpus, "candidates": candidates,
             "selected": None, "criterion": "lowest mean validation perplexity over seeds",
             "reason": None}
    if len(ready) < len(candidates):
      entry["reason"] = "not every Leviathan option cell has all its seeds evaluated"
    elif ready:
      best = min(ready, key=lambda c: c["validation_ppl"]["mean"])
      entry["selected"] = best["label"]
      if best["options"] != "default":
        final.append(best["label"])
    selection.append(entry)
  return selection, final
