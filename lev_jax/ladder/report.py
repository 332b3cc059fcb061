"""A ladder analysis as the paper shows it: Markdown tables, PNG plots, a CSV, JSON.

  paths = write_report(analyse(collect(ladder, root)), "runs/smoke_ladder/report")

Writes into out_dir (created if needed):
  report.md            perplexity per size (tied vs Leviathan, relative change), token
                       efficiency, power-law fit with standard errors and effective
                       parameters, frequency-bucket table, downstream table (when
                       lev_eval.json exists), missing rungs, and how it was produced
  ladder.csv           one row per rung (an empty cell = not computable; the reason is in
                       report.md and the `reason` column)
  analysis.json        the analysis dict as given (+ "produced"); Infinity where n_eff
                       is unbounded
  loss_vs_tokens.png   train and eval loss over tokens, all rungs (tied solid, Leviathan
                       dashed, log x)
  scaling_fit.png      tied final losses, the fitted L(N) = E + A N^-alpha, Leviathan
                       rungs placed at their effective N with the 16-84 % interval
                       (colour = size; names and n_eff / N in the legend below)
  freq_buckets.png     relative perplexity change per token-frequency bucket, per size
                       (buckets under MIN_BUCKET_TARGETS validation targets: n/a, undrawn)

The plots are lev_jax/ladder/plots.py's; number text, tables, provenance and the paper's
figures (arXiv 2601.22040 via ../shared/LEV.md) are lev_jax/ladder/reporting.py's,
shared with the study report (lev_jax/ladder/study_report.py).
"""

from __future__ import annotations

import math
from pathlib import Path

from lev_jax.ladder import plots
from lev_jax.ladder.reporting import (MIN_BUCKET_TARGETS, PAPER, begin_report,
                                      bucket_change_text, count, csv_value, na, num, pct,
                                      provenance_lines, ratio_text, table, write_csv)
from lev_jax.workdir import (ANALYSIS_JSON, EVAL_JSON, FREQ_BUCKETS_PNG, LADDER_CSV,
                             LEV_EVAL_JSON, LOSS_VS_TOKENS_PNG, REPORT_MD, SCALING_FIT_PNG)

CSV_COLUMNS = ("variant", "kind", "size", "status", "step", "steps", "tokens", "params",
               "non_embedding_params", "final_eval_loss", "perplexity",
               "ppl_change_vs_tied", "target_loss", "tokens_to_target", "efficiency",
               "n_eff", "n_eff_lo", "n_eff_hi", "n_eff_ratio", "reason")


# ---------------------------------------------------------------------------- CSV

def csv_rows(analysis) -> tuple[list[str], list[dict]]:
  """(columns, one dict per rung) as written to ladder.csv."""
  tasks = analysis["downstream_tasks"]
  columns = [*CSV_COLUMNS, *(f"acc_{t}" for t in tasks)]
  by_lev = {p["leviathan"]: p for p in analysis["pairs"]}
  eff = {e["variant"]: e for e in analysis["effective"]}
  rows = []
  for r in analysis["rungs"]:
    row = {"variant": r["variant"], "kind": r["kind"], "size": r["size"],
           "status": r["status"], "step": r["step"], "steps": r["steps"],
           "tokens": r["tokens"], "params": r["params"],
           "non_embedding_params": r["non_embedding_params"],
           "final_eval_loss": r["final_loss"], "perplexity": r["perplexity"],
           "reason": r["reason"]}
    pair = by_lev.get(r["variant"])
    if pair is not None:
      row["ppl_change_vs_tied"] = pair["ppl_change"]
      if pair["efficiency"]:
        row.update(target_loss=pair["efficiency"]["target"],
                   tokens_to_target=pair["efficiency"]["leviathan_tokens"],
                   efficiency=pair["efficiency"]["ratio"])
    e = eff.get(r["variant"])
    if e is not None:
      row.update(n_eff=e["n_eff"], n_eff_lo=e["lo"], n_eff_hi=e["hi"], n_eff_ratio=e["ratio"])
    for t in tasks:
      row[f"acc_{t}"] = (r["downstream"].get(t) or {}).get("acc")
    rows.append({c: csv_value(row.get(c)) for c in columns})
  return columns, rows


# ---------------------------------------------------------------------------- Markdown

def _ppl_section(analysis) -> list[str]:
  rows = []
  by_variant = {r["variant"]: r for r in analysis["rungs"]}
  for p in analysis["pairs"]:
    t, l = by_variant.get(p["tied"]), by_variant.get(p["leviathan"])
    rows.append([p["size"], count(t["params"]) if t else "n/a",
                 count(l["params"]) if l else "n/a", num(p["tied_loss"]),
                 num(p["leviathan_loss"]), num(p["tied_ppl"], 2), num(p["leviathan_ppl"], 2),
                 pct(p["ppl_change"]) if p["ppl_change"] is not None else na(p["reason"])])
  out = ["## Validation perplexity", "",
         f"Final validation loss and perplexity ({EVAL_JSON}) of each tied rung and its "
         f"Leviathan twin; change = leviathan / tied - 1. Paper: {PAPER['ppl']}.", ""]
  return out + table(["size", "N tied", "N leviathan", "tied loss", "leviathan loss",
                       "tied ppl", "leviathan ppl", "ppl change"], rows) + [""]


def _efficiency_section(analysis) -> list[str]:
  rows = []
  for p in analysis["pairs"]:
    e = p["efficiency"]
    if e is None:
      rows.append([p["size"], "n/a", "n/a", "n/a", na(p["reason"])])
      continue
    ratio = (f"{e['ratio']:.2f}x" + (" (lower bound: reached at the first eval)"
                                     if e["bound"] == "lower" else "")
             if e["ratio"] is not None else na(e["reason"]))
    rows.append([p["size"], num(e["target"]), count(e["tied_tokens"]),
                 count(e["leviathan_tokens"]) if e["leviathan_tokens"] is not None
                 else "not reached", ratio])
  out = ["## Token efficiency", "",
         "Tokens Leviathan needs to reach its tied twin's final validation loss (first "
         "crossing of the eval/loss curve, interpolated in log tokens), and tied tokens / "
         f"Leviathan tokens. Paper: {PAPER['efficiency']}.", ""]
  out += table(["size", "target (tied final loss)", "tied tokens",
                 "leviathan tokens to target", "ratio"], rows)
  return out + ["", f"![loss vs tokens]({LOSS_VS_TOKENS_PNG})", ""]


def _fit_section(analysis) -> list[str]:
  fit = analysis["fit"]
  out = ["## Scaling fit", "",
         f"L(N) = E + A N^-alpha fitted to the finished tied rungs' final validation loss "
         "(lev_jax.ladder.scaling.fit_power_law, weighted least squares). "
         f"{analysis['n_convention']}.",
         ""]
  if not fit["ok"]:
    out += [f"**No fit: {fit['reason']}**", ""]
  else:
    se = fit["stderr"]
    out += table(["parameter", "value", "stderr"], [
        ["E (nats)", f"{fit['E']:.4f}", f"{se['E']:.4f}"],
        ["A", f"{fit['A']:.4g}", f"{se['A']:.3g}"],
        ["alpha", f"{fit['alpha']:.4f}", f"{se['alpha']:.4f}"],
    ])
    out += ["", f"{fit['n_points']} points; residual RMS {fit['residual_rms']:.4f} nats. "
            "With 3 parameters, 4 points leave one degree of freedom: treat the errors "
            "as rough.", ""]
    if fit.get("warnings"):
      out += [f"**Warning: {'; '.join(fit['warnings'])}.**", ""]
  out += ["### Effective parameters", "",
          "N a tied model on the fitted curve needs to reach each Leviathan rung's final "
          "loss (16-84 % interval from the fit's covariance) and n_eff / N (N = the "
          f"Leviathan rung's own total). Paper: {PAPER['effective']}.", ""]
  rows = []
  for e in analysis["effective"]:
    if e["n_eff"] is None or math.isinf(e["n_eff"]):
      rows.append([e["size"], count(e["N"]), num(e["loss"]), na(e["reason"]), "n/a", "n/a",
                   ""])
      continue
    if e.get("warning"):  # an interval that misses its estimate carries no information
      interval, ratio = "n/a (see note)", ratio_text(e["ratio"])
    else:
      interval = f"{count(e['lo'])} - {count(e['hi'])}"
      ratio = (f"{ratio_text(e['ratio'])} ({ratio_text(e['ratio_lo'])} - "
               f"{ratio_text(e['ratio_hi'])})")
    rows.append([e["size"], count(e["N"]), num(e["loss"]), count(e["n_eff"]), interval,
                 ratio, e.get("warning") or ""])
  if not rows:
    rows.append(["n/a", "n/a", "n/a", na("no finished Leviathan rung"), "n/a", "n/a", ""])
  out += table(["size", "N leviathan", "final loss", "n_eff", "16-84 %", "n_eff / N",
                 "note"], rows)
  return out + ["", f"![scaling fit]({SCALING_FIT_PNG})", ""]


def _bucket_section(analysis) -> list[str]:
  out = ["## Token-frequency buckets", "",
         "Validation perplexity per bucket of target tokens, by the target id's count in "
         "the training split; change = leviathan / tied - 1 (evaluate.relative_change), "
         f"n/a for a bucket of fewer than {MIN_BUCKET_TARGETS} validation targets "
         f"(noise; not drawn either). Paper: {PAPER['buckets']}.", ""]
  pairs = [p for p in analysis["pairs"] if p["buckets"] is not None]
  if not pairs:
    return out + ["n/a (no size with both twins finished)", ""]
  ranges = []
  for p in pairs:
    for row in p["buckets"]["rows"]:
      if row["range"] not in ranges:
        ranges.append(row["range"])
  rows = []
  for rng in ranges:
    cells = [rng]
    for p in pairs:
      row = next((r for r in p["buckets"]["rows"] if r["range"] == rng), None)
      if p["buckets"]["reason"]:
        cells.append(na(p["buckets"]["reason"]))
      elif row is None:
        cells.append("n/a (no validation targets)")
      else:
        cells.append(bucket_change_text(row["change"], row.get("tokens")))
    rows.append(cells)
  out += table(["bucket", *(f"change {p['size']}" for p in pairs)], rows) + [""]
  largest = pairs[-1]
  if largest["buckets"]["rows"]:
    out += [f"Largest size ({largest['size']}) in detail:", ""]
    out += table(["bucket", "validation targets", "tied ppl", "leviathan ppl", "change"], [
        [r["range"], str(r.get("tokens", "n/a")), num(r["baseline"], 2), num(r["other"], 2),
         bucket_change_text(r["change"], r.get("tokens"))]
        for r in largest["buckets"]["rows"]]) + [""]
  return out + [f"![frequency buckets]({FREQ_BUCKETS_PNG})", ""]


def _downstream_section(analysis) -> list[str]:
  out = ["## Downstream (zero-shot)", ""]
  tasks = analysis["downstream_tasks"]
  if not tasks:
    return out + [f"No {LEV_EVAL_JSON} in any finished rung: run `lev-eval` on each workdir "
                  "for this table.", ""]
  out += [f"Accuracy from each rung's {LEV_EVAL_JSON} (± stderr); change in points. "
          f"Paper: {PAPER['downstream']}.", ""]

  def acc(v, key="acc"):
    if not v or v.get(key) is None:
      return "n/a"
    se = v.get(f"{key}_stderr")
    return f"{100 * v[key]:.1f}" + (f" ± {100 * se:.1f}" if se is not None else "")

  rows = []
  for task in tasks:
    for p in analysis["pairs"]:
      d = p["downstream"].get(task)
      if d is None:
        continue
      t, l = d["tied"], d["leviathan"]
      change = (f"{100 * (l['acc'] - t['acc']):+.1f}"
                if t and l and t.get("acc") is not None and l.get("acc") is not None else "n/a")
      rows.append([task, p["size"], acc(t), acc(l), change, acc(t, "acc_norm"),
                   acc(l, "acc_norm")])
  return out + table(["task", "size", "tied acc %", "leviathan acc %", "change (points)",
                       "tied acc_norm %", "leviathan acc_norm %"], rows) + [""]


def _rungs_section(analysis) -> list[str]:
  rows = []
  for r in analysis["rungs"]:
    note = r["reason"] or ""
    if r["notes"]:
      note = "; ".join([n for n in [note] if n] + r["notes"])
    rows.append([r["variant"], r["status"], f"{r['step'] if r['step'] is not None else '-'}"
                 f" / {r['steps']}", count(r["tokens"]), f"{r['params']:,}",
                 f"{r['non_embedding_params']:,}", num(r["final_loss"]),
                 num(r["perplexity"], 2), note])
  out = ["## Rungs", ""]
  out += table(["variant", "status", "step", "tokens", "N (total)", "non-embedding",
                 "final loss", "ppl", "notes"], rows) + [""]
  if analysis["missing"]:
    out += ["### Missing or unfinished rungs", ""]
    out += [f"- `{m['variant']}`: {m['reason']}" for m in analysis["missing"]] + [""]
  return out


def markdown(analysis, produced: dict) -> str:
  """report.md's text: every section, then "How this was produced" from `produced`
  (reporting.provenance's dict)."""
  n_done = sum(r["status"] == "finished" for r in analysis["rungs"])
  name = Path(str(analysis["ladder"])).stem
  lines = [f"# Ladder report: {name}", "",
           "Tied-embedding baselines vs Leviathan (LEV input embedding + untied head; arXiv "
           f"2601.22040), from `{analysis['root']}`: {n_done} of "
           f"{len(analysis['rungs'])} rungs finished. Figures that cannot be computed read "
           "n/a with the reason.", ""]
  lines += _ppl_section(analysis)
  lines += _efficiency_section(analysis)
  lines += _fit_section(analysis)
  lines += _bucket_section(analysis)
  lines += _downstream_section(analysis)
  lines += _rungs_section(analysis)
  lines += provenance_lines(produced, "lev_jax.ladder.report.write_report", [
      f"ladder: `{analysis['ladder']}`; root: `{analysis['root']}`",
      f"every figure: `{ANALYSIS_JSON}`; one row per rung: `{LADDER_CSV}`"])
  return "\n".join(lines)


def write_report(analysis: dict, out_dir, *, command: str | None = None) -> dict:
  """Writes report.md, ladder.csv, analysis.json and three PNGs into out_dir.

  Args:
    analysis: lev_jax.ladder.analysis.analyse's result.
    out_dir: folder (created if needed; local).
    command: the command line to cite under "How this was produced".

  Returns:
    {"report", "csv", "json", "loss_vs_tokens", "scaling_fit", "freq_buckets"}: paths.
  """
  paths, produced = begin_report(out_dir, {
      "report": REPORT_MD, "csv": LADDER_CSV, "json": ANALYSIS_JSON,
      "loss_vs_tokens": LOSS_VS_TOKENS_PNG, "scaling_fit": SCALING_FIT_PNG,
      "freq_buckets": FREQ_BUCKETS_PNG}, analysis, command)
  write_csv(paths["csv"], *csv_rows(analysis))
  plots.plot_loss_vs_tokens(analysis, paths["loss_vs_tokens"])
  plots.plot_scaling_fit(analysis, paths["scaling_fit"])
  plots.plot_freq_buckets(analysis, paths["freq_buckets"])
  paths["report"].write_text(markdown(analysis, produced))
  return {k: str(v) for k, v in paths.items()}
