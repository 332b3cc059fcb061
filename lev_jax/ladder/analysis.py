"""A collected ladder's comparisons, as the paper makes them (arXiv 2601.22040;
../shared/LEV.md "Reported results").

  analysis = analyse(lev_jax.ladder.runs.collect(ladder, root))
  # plain, JSON-ready dict: lev_jax.ladder.report.write_report writes and draws it

What it computes, per size with both twins finished:
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

import math

from lev_jax.eval import evaluate
from lev_jax.ladder import scaling
from lev_jax.ladder.runs import KINDS, LadderResult, Rung
from lev_jax.workdir import METRICS

N_CONVENTION = ("N = total parameters (lev-params 'total': the tied table counted once; "
                "Leviathan = LEV + untied head + backbone), as the paper states model "
                "sizes; non-embedding = backbone only (no input table, LEV or head)")


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
