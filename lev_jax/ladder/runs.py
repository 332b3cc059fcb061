"""A ladder of runs (tied and Leviathan at several sizes): what each rung wrote, and the
paper's comparisons computed from it.

  result = collect("experiments/smoke_ladder.py", "runs/smoke_ladder")
  analysis = analyse(result)        # plain dict: lev_jax.ladder.report.write_report draws it

A ladder is an experiment file with `RUNGS` (variant names "<kind>_<size>", kind "tied"
or "leviathan") and `get_config(variant)`, e.g. experiments/ladder.py; rung VARIANT is
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
                  lev_jax.checkpoint.latest_config_file); used when present (so
                  `--config.train.steps=...` overrides count), else the ladder's
                  get_config(variant)

What the analysis computes, per size with both twins finished (arXiv 2601.22040;
../shared/LEV.md "Reported results"):
  perplexity tied vs Leviathan and the relative change (paper: -9 % at 1.2B)
  token efficiency: tokens Leviathan needs to reach its tied twin's final eval loss,
    and tied tokens / those tokens (paper: 2.1x), on the eval/loss curves
  the power law L(N) = E + A N^-alpha over the finished tied rungs, and each Leviathan
    rung's effective parameters n_eff (16-84 % interval) and n_eff / N (paper v1:
    1.47-2.11x)
  per frequency-bucket relative perplexity change (paper: -81 % on the rarest tokens)
  downstream accuracies when lev_eval.json is present

N is the TOTAL parameter count (`lev-params` "total": for tied the shared table once,
for Leviathan LEV + untied head), as the paper states model sizes (200M-1.2B, LEV "as
low as 0.2 %" of them; v1 "421M matched a ~725M dense model"). LEV.md does not say the
v1 fit used non-embedding counts, so none is assumed; the non-embedding count
(`backbone`: everything but the input table / LEV and the output head) is reported
beside it. A figure that cannot be computed is None with a reason, never a guess.
"""

from __future__ import annotations

import dataclasses
import json
import math
import types
from pathlib import Path

import ml_collections
from etils import epath

from lev_jax.eval import evaluate
from lev_jax.experiments import ExperimentImportError, load_experiment
from lev_jax.ladder import scaling
from lev_jax.workdir import CHECKPOINTS, EVAL_JSON, LEV_EVAL_JSON, METRICS

KINDS = ("tied", "leviathan")
N_CONVENTION = ("N = total parameters (lev-params 'total': the tied table counted once; "
                "Leviathan = LEV + untied head + backbone), as the paper states model "
                "sizes; non-embedding = backbone only (no input table, LEV or head)")


class LadderError(ValueError):
  """A ladder file or root that cannot be read; the message names it and what was
  expected."""


# ---------------------------------------------------------------------------- loading

def load_ladder(ladder) -> types.ModuleType:
  """The ladder module: a module object, or the path of an experiment file.

  Raises:
    LadderError: no such file, it fails to import, or it lacks `RUNGS` (a non-empty
      tuple of distinct variant names) or `get_config`.
  """
  if isinstance(ladder, types.ModuleType):
    module, where = ladder, getattr(ladder, "__file__", ladder.__name__)
  else:
    path = Path(str(ladder)).expanduser()
    where = str(ladder)
    if not path.is_file():
      raise LadderError(f"ladder {where}: no such file; expected an experiment file with "
                        "RUNGS and get_config(variant), e.g. experiments/smoke_ladder.py")
    try:
      module = load_experiment(path)
    except ExperimentImportError as e:  # the file's own error, named with the file
      cause = e.__cause__
      raise LadderError(f"ladder {where}: failed to import: {type(cause).__name__}: "
                        f"{cause}") from cause
  rungs = getattr(module, "RUNGS", None)
  if not isinstance(rungs, (tuple, list)) or not rungs or not all(
      isinstance(r, str) and r for r in rungs):
    raise LadderError(f"ladder {where}: expected a module-level RUNGS tuple of variant "
                      f"names, e.g. RUNGS = ('tied_s', 'leviathan_s', ...); got {rungs!r}")
  if len(set(rungs)) != len(rungs):
    raise LadderError(f"ladder {where}: RUNGS names a variant twice: {list(rungs)}")
  if not callable(getattr(module, "get_config", None)):
    raise LadderError(f"ladder {where}: no get_config(variant) function")
  return module


def split_variant(variant: str) -> tuple[str, str]:
  """("tied" | "leviathan" | other kind, size) from "<kind>_<size>"."""
  kind, _, size = variant.partition("_")
  return kind, size


# ---------------------------------------------------------------------------- one rung

@dataclasses.dataclass
class Rung:
  """What one rung's workdir holds.

  Attributes:
    variant, kind, size: "tied_m" -> ("tied", "m").
    workdir: ROOT/VARIANT.
    status: "finished", "missing" (no workdir or no metrics), "unfinished", "unreadable"
      (a file that does not parse); `reason` says which, in words.
    steps: train.steps; step: the last step logged (None before any row).
    tokens_per_step: train.global_batch_size * train.seq_len.
    params: lev-params counts {"embedding", "lev", "backbone", "head", "total"}.
    config_source: "checkpoint" (the config stored with the latest checkpoint) or "ladder".
    train_curve, eval_curve: {"tokens": [...], "loss": [...]}, tokens increasing.
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


def _latest_checkpoint_config(workdir: epath.Path) -> tuple[dict | None, str | None]:
  """(the stored config dict, None) of the highest complete checkpoint step, or (None,
  a note) when there is none or it does not parse."""
  from lev_jax.checkpoint import latest_config_file  # imports Orbax: only when reading
  path = latest_config_file(workdir / CHECKPOINTS)
  if path is None:
    return None, None
  try:
    return json.loads(path.read_text()), None
  except FileNotFoundError:
    return None, f"{path}: missing; using the ladder's config"
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    return None, f"{path}: not JSON ({e}); using the ladder's config"


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
  for i, line in enumerate(path.read_text().splitlines(), 1):
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


def _read_json(path: epath.Path, what: str) -> dict:
  try:
    value = json.loads(path.read_text())
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    raise LadderError(f"{path}: {what} is not JSON ({e})") from e
  if not isinstance(value, dict):
    raise LadderError(f"{path}: {what}: expected a JSON object")
  return value


def _check_eval(result: dict, path) -> None:
  for key in ("loss", "perplexity", "step", "buckets", "bucket_edges"):
    if key not in result:
      raise LadderError(f"{path}: no {key!r}; expected an evaluate() result with its step "
                        "(lev_jax/trainer.py writes it)")


def collect_rung(module, variant: str, root: epath.Path) -> Rung:
  """Reads ROOT/VARIANT; never raises for a missing, unfinished or unreadable rung (the
  Rung's status and reason say what is wrong).

  Raises:
    LadderError: get_config(variant) fails (the ladder itself is broken).
  """
  try:
    config = module.get_config(variant)
  except Exception as e:
    raise LadderError(f"ladder: get_config({variant!r}) failed: {type(e).__name__}: {e}") from e
  kind, size = split_variant(variant)
  workdir = root / variant
  notes, source = [], "ladder"
  if workdir.is_dir():
    stored, note = _latest_checkpoint_config(workdir)
    if note:
      notes.append(note)
    if stored is not None:
      try:
        config = ml_collections.ConfigDict(stored)
        config.train.steps  # noqa: B018 (a stored config without the fields is unusable)
        config.model.d_model  # noqa: B018
        source = "checkpoint"
      except (AttributeError, KeyError, TypeError):
        config = module.get_config(variant)
        notes.append(f"{workdir / CHECKPOINTS}: stored config lacks train/model fields; "
                     "using the ladder's config")
  t = config.train
  tokens_per_step = int(t.global_batch_size) * int(t.seq_len)
  rung = Rung(variant=variant, kind=kind, size=size, workdir=str(workdir), status="missing",
              reason=None, steps=int(t.steps), step=None, tokens_per_step=tokens_per_step,
              params=_param_counts(config), config_source=source,
              train_curve={"tokens": [], "loss": []}, eval_curve={"tokens": [], "loss": []},
              notes=notes)
  if not workdir.is_dir():
    rung.reason = f"no workdir {workdir}"
    return rung
  metrics = workdir / METRICS
  if not metrics.exists():
    rung.reason = f"no metrics: {metrics} does not exist (never started?)"
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
    eval_path = workdir / EVAL_JSON
    final = _read_json(eval_path, EVAL_JSON) if eval_path.exists() else None
    if final is not None:
      _check_eval(final, eval_path)
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
  rung.step = max(rung.step or 0, rung.steps)
  rung.final = final
  rung.status = "finished"
  if rung.lev_eval is not None and rung.lev_eval.get("step") not in (None, rung.steps):
    rung.notes.append(f"{LEV_EVAL_JSON} is from step {rung.lev_eval.get('step')}, not the "
                      f"final step {rung.steps}")
  return rung


def collect(ladder, root) -> LadderResult:
  """Reads every rung of `ladder` under `root` (local path or gs://).

  Args:
    ladder: the ladder module, or the path of its experiment file.
    root: the folder holding one workdir per variant.

  Returns:
    A LadderResult with one Rung per variant of RUNGS, in order.

  Raises:
    LadderError: the ladder file is broken (see load_ladder, collect_rung).
  """
  module = load_ladder(ladder)
  root_path = epath.Path(root)
  where = getattr(module, "__file__", None) or str(ladder)
  return LadderResult(ladder=str(ladder) if not isinstance(ladder, types.ModuleType)
                      else where, root=str(root),
                      rungs=[collect_rung(module, v, root_path) for v in module.RUNGS])


# ---------------------------------------------------------------------------- analysis

def _final_loss(rung: Rung) -> float:
  return float(rung.final["loss"])


def _not_ready(rung: Rung | None, variant: str) -> str:
  if rung is None:
    return f"{variant} is not in RUNGS"
  return f"{rung.variant}: {rung.reason}"


def rung_efficiency(tied: Rung, lev: Rung) -> dict:
  """scaling.token_efficiency on the eval curves, with a reason when it has no ratio."""
  out = {"target": _final_loss(tied), "tied_tokens": None, "leviathan_tokens": None,
         "ratio": None, "bound": None, "reason": None}
  for r in (tied, lev):
    if not r.eval_curve["tokens"]:
      out["reason"] = f"{r.variant} has no eval/loss rows in {METRICS}"
      return out
  try:
    eff = scaling.token_efficiency(tied.eval_curve["tokens"], tied.eval_curve["loss"],
                                   lev.eval_curve["tokens"], lev.eval_curve["loss"])
  except scaling.ScalingError as e:
    out["reason"] = str(e)
    return out
  out.update(eff)
  out["target"] = _final_loss(tied)  # eval.json's, equal to the curve's last point
  if eff["ratio"] is None:
    out["reason"] = (f"{lev.variant} never reached {tied.variant}'s final eval loss "
                     f"{out['target']:.4f} within {lev.eval_curve['tokens'][-1]:,.0f} "
                     f"tokens (its final: {_final_loss(lev):.4f})")
  elif eff["leviathan_tokens"] == lev.eval_curve["tokens"][0]:
    out["bound"] = "lower"  # reached by the first eval point: it may have needed fewer
  return out


def _buckets(tied: Rung, lev: Rung) -> dict:
  a, b = tied.final.get("data"), lev.final.get("data")  # eval.json's data records
  if a and b and not evaluate.same_data(a, b):
    return {"rows": [], "reason": (f"evaluated on other data: {tied.variant}: "
                                   f"{evaluate.describe_data(a)}; {lev.variant}: "
                                   f"{evaluate.describe_data(b)}")}
  try:
    rows = evaluate.relative_change(tied.final, lev.final)
  except (ValueError, KeyError, TypeError) as e:
    return {"rows": [], "reason": f"{type(e).__name__}: {e}"}
  for row, b in zip(rows, tied.final["buckets"]):
    row["tokens"] = b.get("tokens")
  return {"rows": rows, "reason": None}


def _downstream(rung: Rung) -> dict:
  if rung.lev_eval is None:
    return {}
  return {task: dict(v) for task, v in (rung.lev_eval.get("downstream") or {}).items()
          if isinstance(v, dict)}


def _fit(tied: list[Rung]) -> tuple[scaling.PowerLawFit | None, dict]:
  points = [{"variant": r.variant, "N": r.params["total"], "loss": _final_loss(r)}
            for r in tied]
  out = {"ok": False, "reason": None, "points": points}
  try:
    fit = scaling.fit_power_law([p["N"] for p in points], [p["loss"] for p in points])
  except scaling.ScalingError as e:
    out["reason"] = str(e)
    return None, out
  out.update(ok=True, E=fit.E, A=fit.A, alpha=fit.alpha, stderr=fit.stderr,
             cov=fit.cov.tolist(), n_points=fit.n_points, residual_rms=fit.residual_rms,
             warnings=_fit_warnings(fit, min(p["loss"] for p in points)))
  return fit, out


def _fit_warnings(fit: scaling.PowerLawFit, min_loss: float) -> list[str]:
  """Why a converged fit may still say little: E pinned at a bound of fit_power_law
  ([0, smallest loss]) or a standard error larger than its parameter."""
  warnings = []
  if fit.E <= 1e-6 * min_loss:
    warnings.append(f"E = {fit.E:.3g} sits at its lower bound 0: these points show no "
                    "loss floor")
  elif fit.E >= min_loss - 1e-6:
    warnings.append(f"E = {fit.E:.4f} sits at its upper bound, the smallest loss")
  se = fit.stderr
  for name, value in (("E", fit.E), ("alpha", fit.alpha)):
    if se[name] > abs(value):
      warnings.append(f"stderr({name}) = {se[name]:.3g} exceeds {name} = {value:.3g}")
  if warnings:
    warnings.append("the fit is poorly constrained: effective parameters and their "
                    "intervals are not meaningful")
  return warnings


def _effective(fit: scaling.PowerLawFit | None, fit_reason: str | None, lev: Rung) -> dict:
  n = lev.params["total"]
  out = {"variant": lev.variant, "size": lev.size, "N": n, "loss": _final_loss(lev),
         "n_eff": None, "lo": None, "hi": None, "ratio": None, "ratio_lo": None,
         "ratio_hi": None, "reason": None, "warning": None}
  if fit is None:
    out["reason"] = f"no power-law fit: {fit_reason}"
    return out
  eff = scaling.effective_params(fit, out["loss"])
  out.update(n_eff=eff["n_eff"], lo=eff["lo"], hi=eff["hi"], ratio=eff["n_eff"] / n,
             ratio_lo=eff["lo"] / n, ratio_hi=eff["hi"] / n)
  if math.isinf(eff["n_eff"]):
    out["reason"] = (f"loss {out['loss']:.4f} is at or below the fitted irreducible loss "
                     f"E = {fit.E:.4f}: no finite N reaches it")
  elif not eff["lo"] <= eff["n_eff"] <= eff["hi"]:
    out["warning"] = ("the 16-84 % interval does not contain the estimate (a skewed or "
                      "unconstrained fit)")
  return out


def _rung_row(r: Rung) -> dict:
  final = r.final or {}
  return {"variant": r.variant, "kind": r.kind, "size": r.size, "status": r.status,
          "reason": r.reason, "workdir": r.workdir, "step": r.step, "steps": r.steps,
          "tokens": None if r.step is None else r.step * r.tokens_per_step,
          "tokens_per_step": r.tokens_per_step, "params": r.params["total"],
          "non_embedding_params": r.params["backbone"], "param_parts": r.params,
          "config_source": r.config_source,
          "final_loss": final.get("loss"), "perplexity": final.get("perplexity"),
          "train_curve": r.train_curve, "eval_curve": r.eval_curve,
          "downstream": _downstream(r) if r.finished else {},
          "lev_eval_step": (r.lev_eval or {}).get("step"), "notes": list(r.notes)}


def analyse(result: LadderResult) -> dict:
  """The paper's comparisons over a collected ladder, as a JSON-ready dict.

  Returns:
    {"ladder", "root", "n_convention",
     "rungs": [per rung: variant, kind, size, status, reason, step, steps, tokens,
               params (N, total), non_embedding_params, final_loss, perplexity,
               train_curve, eval_curve, downstream, notes],
     "missing": [{"variant", "status", "reason"}] for every rung not finished,
     "pairs": [per size with a tied and a leviathan rung: {"size", "tied", "leviathan",
               "tied_loss", "tied_ppl", "leviathan_loss", "leviathan_ppl", "ppl_change"
               (leviathan / tied - 1), "efficiency": {"target", "tied_tokens",
               "leviathan_tokens", "ratio", "bound", "reason"}, "buckets": {"rows",
               "reason"}, "effective": see below, "downstream": {task: {...}},
               "reason"}],
     "fit": {"ok", "reason", "points", and when ok "E", "A", "alpha", "stderr",
             "cov", "n_points", "residual_rms", "warnings" (a parameter at its bound or
             with a stderr larger than itself: a fit that says little)},
     "effective": [per finished Leviathan rung: {"variant", "size", "N", "loss",
                   "n_eff", "lo", "hi" (16th / 84th percentile), "ratio" (n_eff / N),
                   "ratio_lo", "ratio_hi", "reason", "warning"}],
     "downstream_tasks": sorted task names}
    Values that cannot be computed are None next to a "reason".
  """
  rungs = result.rungs
  tied_done = [r for r in rungs if r.kind == "tied" and r.finished]
  fit, fit_out = _fit(tied_done)
  effective = {r.variant: _effective(fit, fit_out["reason"], r)
               for r in rungs if r.kind == "leviathan" and r.finished}
  sizes = []
  for r in rungs:
    if r.kind in KINDS and r.size not in sizes:
      sizes.append(r.size)
  pairs = []
  for size in sizes:
    tied, lev = result.rung(f"tied_{size}"), result.rung(f"leviathan_{size}")
    pair = {"size": size, "tied": f"tied_{size}", "leviathan": f"leviathan_{size}",
            "tied_loss": None, "tied_ppl": None, "leviathan_loss": None,
            "leviathan_ppl": None, "ppl_change": None, "efficiency": None,
            "buckets": None, "effective": None, "downstream": {}, "reason": None}
    if tied is not None and tied.finished:
      pair.update(tied_loss=_final_loss(tied), tied_ppl=float(tied.final["perplexity"]))
    if lev is not None and lev.finished:
      pair.update(leviathan_loss=_final_loss(lev), leviathan_ppl=float(lev.final["perplexity"]),
                  effective=effective[lev.variant])
    not_ready = [_not_ready(r, v) for r, v in ((tied, pair["tied"]), (lev, pair["leviathan"]))
                 if r is None or not r.finished]
    if not_ready:
      pair["reason"] = "; ".join(not_ready)
    else:
      pair["ppl_change"] = pair["leviathan_ppl"] / pair["tied_ppl"] - 1.0
      pair["efficiency"] = rung_efficiency(tied, lev)
      pair["buckets"] = _buckets(tied, lev)
      tied_ds, lev_ds = _downstream(tied), _downstream(lev)
      pair["downstream"] = {task: {"tied": tied_ds.get(task), "leviathan": lev_ds.get(task)}
                            for task in sorted(set(tied_ds) | set(lev_ds))}
    pairs.append(pair)
  rows = [_rung_row(r) for r in rungs]
  return {
      "ladder": result.ladder, "root": result.root, "n_convention": N_CONVENTION,
      "rungs": rows,
      "missing": [{"variant": r.variant, "status": r.status, "reason": r.reason}
                  for r in rungs if not r.finished],
      "pairs": pairs, "fit": fit_out,
      "effective": [effective[r.variant] for r in rungs if r.variant in effective],
      "downstream_tasks": sorted({t for row in rows for t in row["downstream"]}),
  }

