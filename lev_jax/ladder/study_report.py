"""A seeded study as tables and plots: Markdown, two CSVs, JSON, two PNGs.

  paths = write_report(study.analyse(...), "runs/study/report", command="lev-study ...")

Writes into out_dir (created if needed):
  report.md           the final table on the test split (mean ± standard error over
                      seeds, relative change vs tied with its 95 % t-interval over the
                      paired per-seed changes), the selection of the LEV optimiser options
                      on the validation split, every cell on validation, frequency buckets
                      (equal-mass and log) on the test split, tokens to reach tied's
                      final loss, the runs, and how it was produced
  study.csv           one row per cell (an empty cell = not computable)
  buckets.csv         one row per (comparison, split, scheme, bucket)
  analysis.json       the analysis dict as given (+ "produced")
  loss_vs_tokens.png  validation loss over tokens per vocabulary: mean over seeds with
                      ± se bars, each seed faint
  freq_buckets.png    relative perplexity change per bucket on the test split with the
                      95 % intervals, per vocabulary and scheme
A study with Leviathan option cells and an untied cell also gets a "gap closed" section
(per option cell: its change vs untied, the fraction of the Leviathan default's gap to
untied it closes on validation and test, LEV's final grad_norm/lev and update_ratio/lev).
A study over several backbone sizes or corpora (e.g. experiments/scale_study.py) also
gets a "Scale trend" section (per corpus x size: test perplexity, change vs tied and vs
untied; the fitted slope per decade of backbone parameters), and with several sizes:
  trend.csv           per (series, baseline, split): one row per size, one fit row
  trend.png           change vs backbone parameters per corpus: each seed, the mean
                      with its 95 % interval, the fitted line

The plots are lev_jax/ladder/study_plots.py's; number text, tables, provenance and the
paper's figures (arXiv 2601.22040 via ../shared/LEV.md) are lev_jax/ladder/reporting.py's,
shared with the ladder report (`lev-ladder`).
"""

from __future__ import annotations

from pathlib import Path

from lev_jax.ladder import study_plots
from lev_jax.ladder.reporting import (MIN_BUCKET_TARGETS, PAPER, begin_report, count,
                                      csv_value, num, provenance_lines, table,
                                      too_few_targets, write_csv)
from lev_jax.ladder.study import SCHEMES, SPLITS
from lev_jax.workdir import (ANALYSIS_JSON, BUCKETS_CSV, FREQ_BUCKETS_PNG, LOSS_VS_TOKENS_PNG,
                             REPORT_MD, STUDY_CSV, TREND_CSV, TREND_PNG)

CELL_COLUMNS = (
    "label", "variant", "vocab", "options", "seeds", "runs", "validation_ppl",
    "validation_ppl_se", "test_ppl", "test_ppl_se", "validation_change",
    "validation_change_lo", "validation_change_hi", "test_change", "test_change_lo",
    "test_change_hi", "tokens_to_target", "tokens_to_target_se", "token_ratio",
    "token_ratio_se", "seeds_reaching_target", "selected", "in_final_table", "reason")
TREND_COLUMNS = ("row", "vocab", "corpus", "series", "baseline", "split", "size",
                 "backbone_params", "seeds", "change", "change_lo", "change_hi",
                 "slope_per_decade", "slope_lo", "slope_hi", "slope_n", "reason")
BUCKET_COLUMNS = ("label", "vocab", "split", "scheme", "range", "targets", "ids", "tied_ppl",
                  "other_ppl", "change", "change_lo", "change_hi", "seeds")


# ---------------------------------------------------------------------------- text

def pm(ms: dict | None, digits: int = 2) -> str:
  """'189.76 ± 1.23 (n=3)' from a mean_se dict; 'n/a' without a mean."""
  if not ms or ms.get("mean") is None:
    return "n/a"
  se = f" ± {ms['se']:.{digits}f}" if ms.get("se") is not None else ""
  return f"{ms['mean']:.{digits}f}{se} (n={ms['n']})"


def interval(iv: dict | None) -> str:
  """'-4.1 % [-9.0, +0.8]' (percent, 95 % t-interval) from a t_interval dict."""
  if not iv or iv.get("mean") is None:
    return "n/a"
  text = f"{100 * iv['mean']:+.1f} %"
  if iv.get("lo") is not None:
    text += f" [{100 * iv['lo']:+.1f}, {100 * iv['hi']:+.1f}]"
  else:
    text += " (n=1: no interval)"
  return text


def _ratio(ms: dict) -> str:
  """'1.28x ± 0.05 (n=3)' from a mean_se dict of token ratios."""
  if ms["mean"] is None:
    return "n/a"
  se = f" ± {ms['se']:.2f}" if ms["se"] is not None else ""
  return f"{ms['mean']:.2f}x{se} (n={ms['n']})"


def _by_label(analysis) -> tuple[dict, dict]:
  return ({c["label"]: c for c in analysis["cells"]},
          {c["label"]: c for c in analysis["comparisons"]})


def _selected(analysis) -> set:
  return {s["selected"] for s in analysis["selection"] if s["selected"]}


# ---------------------------------------------------------------------------- Markdown

def _final_section(analysis) -> list[str]:
  cells, comps = _by_label(analysis)
  conf = f"{100 * analysis['confidence']:.0f} %"
  out = ["## Final table (test split)", "",
         f"Perplexity on the held-out test split, mean ± standard error over seeds; change "
         f"= the mean over seeds of ppl / ppl(tied, same seed) - 1 with its {conf} Student-t "
         "interval over those paired changes. Cells: tied, untied and Leviathan with default "
         "options at each vocabulary, and the Leviathan options selected on the validation "
         f"split (next section). Paper: {PAPER['ppl']}.", ""]
  rows = []
  for label in analysis["final"]:
    c, comp = cells[label], comps.get(label)
    change = "baseline" if c["variant"] == "tied" and c["options"] == "default" else (
        interval(comp["perplexity"].get("test")) if comp and not comp["reason"]
        else f"n/a ({comp['reason'] if comp else 'no comparison'})")
    rows.append([label, f"{len(c['seeds'])} / {c['n_runs']}", pm(c["test"]["perplexity"]),
                 change, pm(c["validation"]["perplexity"])])
  return out + table(["cell", "seeds done", "test ppl", f"change vs tied ({conf} CI)",
                       "validation ppl"], rows) + [""]


def slope_text(fit: dict | None) -> str:
  """'+12.3 pp / decade [+1.0, +23.6] (n=12)' from a linear_fit dict (slope x 100)."""
  if not fit or fit.get("slope") is None:
    return f"n/a ({fit['reason']})" if fit and fit.get("reason") else "n/a"
  text = f"{100 * fit['slope']:+.1f} pp / decade"
  if fit.get("lo") is not None:
    text += f" [{100 * fit['lo']:+.1f}, {100 * fit['hi']:+.1f}]"
  else:
    text += " (2 points: no interval)"
  return text + f" (n={fit['n']})"


def _change_text(comp, split) -> str:
  if comp is None:
    return "baseline"
  return (interval(comp["perplexity"].get(split)) if not comp["reason"]
          else f"n/a ({comp['reason']})")


def _trend_section(analysis) -> list[str]:
  """Per corpus (and vocab): every cell per size on test with its changes vs tied and vs
  untied, then the fitted slope of each series. Empty for a study of one size and one
  corpus."""
  if len(analysis.get("sizes", ())) < 2 and len(analysis.get("corpora", ())) < 2:
    return []
  _, vs_tied = _by_label(analysis)
  vs_untied = {c["label"]: c for c in analysis.get("comparisons_vs_untied", [])}
  conf = f"{100 * analysis['confidence']:.0f} %"
  out = ["## Scale trend (test split)", "",
         "Per corpus and backbone size: perplexity on the held-out test split (mean ± se "
         "over seeds) and the change vs the tied and vs the untied cell of the same size "
         f"and corpus (mean over seeds of the paired ppl / ppl(baseline) - 1, {conf} "
         "Student-t interval). Trend: a least-squares line of every seed's change against "
         "log10 of the size's backbone parameters (the non-embedding count: transformer "
         "blocks and final norm, lev-params \"backbone\"), slope in percentage points of "
         f"change per tenfold parameters with its {conf} t-interval (n - 2 degrees of "
         "freedom; n = seed pairs over all sizes); a negative slope = the cell gains on "
         "its baseline with size.", ""]
  cells = analysis["cells"]
  sizes = list(analysis.get("sizes", ()))
  params = {r["size"]: r["backbone_params"] for r in analysis["runs"]}
  for vocab in sorted({c["vocab"] for c in cells}):
    for corpus in analysis.get("corpora", ()):
      here = [c for c in cells if c["vocab"] == vocab and c["corpus"] == corpus]
      if not here:
        continue
      out += [f"### {corpus}, vocab {vocab}", ""]
      rows = []
      for size in sizes:
        for c in (c for c in here if c["size"] == size):
          rows.append([size, count(params.get(size)), c["label"],
                       f"{len(c['seeds'])} / {c['n_runs']}", pm(c["test"]["perplexity"]),
                       _change_text(vs_tied.get(c["label"]), "test")
                       if c["variant"] != "tied" else "baseline",
                       _change_text(vs_untied.get(c["label"]), "test")
                       if c["variant"] not in ("tied", "untied") else
                       ("baseline" if c["variant"] == "untied" else "")])
      out += table(["size", "backbone params", "cell", "seeds done", "test ppl",
                     f"vs tied ({conf} CI)", f"vs untied ({conf} CI)"], rows) + [""]
      fits = [t for t in analysis.get("trend", [])
              if t["vocab"] == vocab and t["corpus"] == corpus]
      if fits:
        out += table(["series", "vs", "slope, test", "slope, validation"],
                     [[t["variant"] + ("" if t["options"] == "default"
                                       else f" [{t['options']}]"), t["baseline"],
                       slope_text(t["fit"]["test"]), slope_text(t["fit"]["validation"])]
                      for t in fits]) + [""]
  if analysis.get("trend"):
    out += [f"![change vs size]({TREND_PNG})", ""]
  return out


def gap_text(gap: dict | None) -> str:
  """'+45.0 % [+10.2, +79.8]' of a gap_closed dict (percent of the gap); 'n/a (why)'."""
  if not gap or gap.get("mean") is None:
    return f"n/a ({gap['reason']})" if gap and gap.get("reason") else "n/a"
  return interval(gap)


def _dynamics_text(cell: dict, key: str) -> str:
  ms = cell.get("group_metrics", {}).get(key)
  return pm(ms, 4) if ms else "n/a"


def _gap_section(analysis) -> list[str]:
  """Per Leviathan option cell: the change vs untied and the fraction of the Leviathan
  default's gap to untied it closes, with LEV's final gradient norm and update ratio.
  Empty without a Leviathan option cell that has an untied cell."""
  gaps = [c for c in analysis.get("comparisons_vs_untied", []) if c.get("gap_closed")]
  if not gaps:
    return []
  cells, _ = _by_label(analysis)
  conf = f"{100 * analysis['confidence']:.0f} %"
  out = ["## Leviathan options vs untied: the gap closed", "",
         "Per Leviathan option cell: the change vs the untied cell (as in the scale trend) "
         "and the fraction of the Leviathan default's gap to untied that the option closes, "
         "per seed (ppl(default) - ppl(option)) / (ppl(default) - ppl(untied)) (100 % = "
         f"level with untied, 0 = no better than the default), mean with its {conf} "
         "Student-t interval over the seeds; n/a where the default does not trail untied. "
         "LEV's dynamics: the last logged train/grad_norm/lev and train/update_ratio/lev "
         "(metrics.jsonl), mean ± se over seeds.", ""]
  rows = []
  for comp in gaps:
    default_label = comp["label"].replace(f" [{comp['options']}]", "")
    if default_label in cells and not any(r[0] == default_label for r in rows):
      d = cells[default_label]
      rows.append([default_label, pm(d["validation"]["perplexity"]), "", "reference",
                   "reference", _dynamics_text(d, "train/grad_norm/lev"),
                   _dynamics_text(d, "train/update_ratio/lev")])
    c = cells[comp["label"]]
    rows.append([comp["label"], pm(c["validation"]["perplexity"]),
                 _change_text(comp, "validation"), gap_text(comp["gap_closed"]["validation"]),
                 gap_text(comp["gap_closed"]["test"]), _dynamics_text(c, "train/grad_norm/lev"),
                 _dynamics_text(c, "train/update_ratio/lev")])
  return out + table(["cell", "validation ppl", f"vs untied, validation ({conf} CI)",
                       "gap closed, validation", "gap closed, test", "grad_norm/lev",
                       "update_ratio/lev"], rows) + [""]


def _selection_section(analysis) -> list[str]:
  out = ["## Selection of the LEV optimiser options (validation split)", ""]
  if not analysis["selection"]:
    return out + ["No vocabulary has more than one Leviathan cell: nothing to select.", ""]
  _, comps = _by_label(analysis)
  out += ["Chosen by the lowest mean validation perplexity over seeds; the test split is "
          "not looked at here.", ""]
  rows = []
  for s in analysis["selection"]:
    for cand in s["candidates"]:
      comp = comps.get(cand["label"])
      rows.append([str(s["vocab"]), cand["options"], pm(cand["validation_ppl"]),
                   interval(comp["perplexity"].get("validation")) if comp and not comp["reason"]
                   else "n/a",
                   "**selected**" if cand["label"] == s["selected"] else (s["reason"] or "")])
  return out + table(["vocab", "options", "validation ppl", "change vs tied (95 % CI)",
                       ""], rows) + [""]


def _validation_section(analysis) -> list[str]:
  _, comps = _by_label(analysis)
  rows = []
  for c in analysis["cells"]:
    comp = comps.get(c["label"])
    change = ("baseline" if comp is None else
              interval(comp["perplexity"].get("validation")) if not comp["reason"]
              else f"n/a ({comp['reason']})")
    rows.append([c["label"], f"{len(c['seeds'])} / {c['n_runs']}",
                 pm(c["validation"]["loss"], 4), pm(c["validation"]["perplexity"]), change])
  return (["## Every cell (validation split)", ""]
          + table(["cell", "seeds done", "validation loss", "validation ppl",
                    "change vs tied (95 % CI)"], rows) + [""])


def _bucket_section(analysis) -> list[str]:
  _, comps = _by_label(analysis)
  out = ["## Token-frequency buckets (test split)", "",
         "Perplexity per bucket of target tokens by the id's count in the training split "
         "(equal-mass: each bucket ~1/n of the training tokens; log: fixed edges); "
         "tied / other ppl are means over seeds, change as in the final table; n/a for a "
         f"bucket of fewer than {MIN_BUCKET_TARGETS} test targets (noise; not drawn "
         "either). "
         f"Paper: {PAPER['buckets']}.", ""]
  for label in analysis["final"]:
    comp = comps.get(label)
    if comp is None:
      continue
    out += [f"### {label} vs {comp['baseline']}", ""]
    if comp["reason"]:
      out += [f"n/a ({comp['reason']})", ""]
      continue
    for scheme in SCHEMES:
      b = comp["buckets"]["test"][scheme]
      if b["reason"]:
        out += [f"{scheme}: n/a ({b['reason']})", ""]
        continue
      out += table([f"{scheme} bucket", "test targets", "ids", "tied ppl", "other ppl",
                     "change (95 % CI)"],
                    [[r["range"], count(r["targets"]), str(r["ids"]),
                      num(r["tied_ppl"], 2), num(r["other_ppl"], 2),
                      _bucket_change(r)] for r in b["rows"]]) + [""]
  return out + [f"![frequency buckets]({FREQ_BUCKETS_PNG})", ""]


def _bucket_change(row: dict) -> str:
  """A bucket's change with its interval, or n/a under MIN_BUCKET_TARGETS test targets."""
  if too_few_targets(row["targets"]):
    return f"n/a ({count(row['targets'])} test targets < {MIN_BUCKET_TARGETS})"
  return interval(row["change"])


def _efficiency_section(analysis) -> list[str]:
  rows = []
  for comp in analysis["comparisons"]:
    e = comp["efficiency"]
    if e is None:
      rows.append([comp["label"], "n/a", "n/a", "n/a", f"n/a ({comp['reason']})"])
      continue
    tokens = e["tokens_to_target"]
    rows.append([comp["label"], pm(e["target"], 4), f"{e['n_reached']} / {e['n']}",
                 (f"{count(tokens['mean'])}" + (f" ± {count(tokens['se'])}"
                                                 if tokens["se"] is not None else ""))
                 if tokens["mean"] is not None else "not reached",
                 _ratio(e["ratio"])])
  out = ["## Tokens to reach tied's final loss (validation curves)", "",
         "Per seed: tokens the cell needs to reach its tied twin's final validation loss "
         "(first crossing of eval/loss, interpolated in log tokens; lev_jax.ladder.scaling), and "
         "tied tokens / those tokens; mean ± se over the seeds that reach it. "
         f"Paper: {PAPER['efficiency']}.", ""]
  out += table(["cell", "target (tied final loss)", "seeds reaching it", "tokens to target",
                 "tokens ratio"], rows)
  return out + ["", f"![loss vs tokens]({LOSS_VS_TOKENS_PNG})", ""]


def _runs_section(analysis) -> list[str]:
  rows = [[r["run"], r["status"], f"{r['step'] if r['step'] is not None else '-'} / "
           f"{r['steps']}", count(r["tokens"]), f"{r['params']:,}",
           num(r["validation_ppl"], 2), num(r["test_ppl"], 2),
           r["reason"] or ""] for r in analysis["runs"]]
  out = ["## Runs", ""] + table(["run", "status", "step", "tokens", "N (total)",
                                  "validation ppl", "test ppl", "notes"], rows) + [""]
  if analysis["missing"]:
    out += ["### Missing, unfinished or not evaluated", ""]
    out += [f"- `{m['run']}`: {m['reason']}" for m in analysis["missing"]] + [""]
  return out


def markdown(analysis, produced: dict) -> str:
  n_done = sum(r["status"] == "finished" and r["evaluated"] for r in analysis["runs"])
  tokens = analysis["tokens_per_run"]
  name = Path(str(analysis["study"])).name
  stem, piece = name.split(".py:", 1) if ".py:" in name else (Path(name).stem, None)
  lines = [f"# Study report: {stem}" + (f" (piece {piece})" if piece else ""), "",
           "Tied embeddings vs Leviathan (LEV input + untied head; arXiv 2601.22040), the "
           "untied ablation and LEV optimiser options, seeds paired across cells, from "
           f"`{analysis['root']}`: {n_done} of {len(analysis['runs'])} runs finished and "
           f"evaluated; {count(tokens) if tokens else 'n/a'} training tokens per run. "
           "Figures that cannot be computed read n/a with the reason.", ""]
  lines += _final_section(analysis)
  lines += _trend_section(analysis)
  lines += _gap_section(analysis)
  lines += _selection_section(analysis)
  lines += _validation_section(analysis)
  lines += _bucket_section(analysis)
  lines += _efficiency_section(analysis)
  lines += _runs_section(analysis)
  lines += provenance_lines(produced, "lev_jax.ladder.study_report.write_report", [
      f"study: `{analysis['study']}`; root: `{analysis['root']}`",
      f"every figure: `{ANALYSIS_JSON}`; per cell: `{STUDY_CSV}`; per bucket: `{BUCKETS_CSV}`"
      + (f"; per size and fitted slope: `{TREND_CSV}`" if analysis.get("trend") else "")])
  return "\n".join(lines)


# ---------------------------------------------------------------------------- CSV

def cell_rows(analysis) -> list[dict]:
  """One dict per cell (CELL_COLUMNS), as written to study.csv."""
  _, comps = _by_label(analysis)
  selected, final = _selected(analysis), set(analysis["final"])
  rows = []
  for c in analysis["cells"]:
    comp = comps.get(c["label"])
    row = {"label": c["label"], "variant": c["variant"], "vocab": c["vocab"],
           "options": c["options"], "seeds": len(c["seeds"]), "runs": c["n_runs"],
           "selected": c["label"] in selected, "in_final_table": c["label"] in final}
    for split in SPLITS:
      ppl = c[split]["perplexity"]
      row[f"{split}_ppl"], row[f"{split}_ppl_se"] = ppl["mean"], ppl["se"]
      iv = (comp or {}).get("perplexity", {}).get(split) or {}
      row[f"{split}_change"] = iv.get("mean")
      row[f"{split}_change_lo"], row[f"{split}_change_hi"] = iv.get("lo"), iv.get("hi")
    if comp is not None:
      row["reason"] = comp["reason"]
      e = comp["efficiency"]
      if e is not None:
        row.update(tokens_to_target=e["tokens_to_target"]["mean"],
                   tokens_to_target_se=e["tokens_to_target"]["se"],
                   token_ratio=e["ratio"]["mean"], token_ratio_se=e["ratio"]["se"],
                   seeds_reaching_target=e["n_reached"])
    rows.append({k: csv_value(row.get(k)) for k in CELL_COLUMNS})
  return rows


def bucket_rows(analysis) -> list[dict]:
  """One dict per (comparison, split, scheme, bucket) (BUCKET_COLUMNS)."""
  rows = []
  for comp in analysis["comparisons"]:
    for split, schemes in comp["buckets"].items():
      for scheme, b in schemes.items():
        for r in b["rows"]:
          ch = r["change"]
          rows.append({k: csv_value(v) for k, v in {
              "label": comp["label"], "vocab": comp["vocab"], "split": split,
              "scheme": scheme, "range": r["range"], "targets": r["targets"],
              "ids": r["ids"], "tied_ppl": r["tied_ppl"], "other_ppl": r["other_ppl"],
              "change": ch["mean"], "change_lo": ch["lo"], "change_hi": ch["hi"],
              "seeds": ch["n"]}.items()})
  return rows


def trend_rows(analysis) -> list[dict]:
  """TREND_COLUMNS rows: per trend and split, one "size" row per size (its change with
  the interval), then one "fit" row (the slope per decade of backbone parameters)."""
  rows = []
  for t in analysis.get("trend", []):
    series = t["variant"] + ("" if t["options"] == "default" else f" [{t['options']}]")
    base = {"vocab": t["vocab"], "corpus": t["corpus"], "series": series,
            "baseline": t["baseline"]}
    for split in SPLITS:
      for s in t["sizes"]:
        ch = s["change"][split] or {}
        rows.append({**base, "row": "size", "split": split, "size": s["size"],
                     "backbone_params": s["backbone_params"], "seeds": ch.get("n"),
                     "change": ch.get("mean"), "change_lo": ch.get("lo"),
                     "change_hi": ch.get("hi")})
      fit = t["fit"][split]
      rows.append({**base, "row": "fit", "split": split, "slope_per_decade": fit["slope"],
                   "slope_lo": fit["lo"], "slope_hi": fit["hi"], "slope_n": fit["n"],
                   "reason": fit["reason"]})
  return [{k: csv_value(r.get(k)) for k in TREND_COLUMNS} for r in rows]


def write_report(analysis: dict, out_dir, *, command: str | None = None) -> dict:
  """Writes report.md, study.csv, buckets.csv, analysis.json and two PNGs into out_dir.

  Args:
    analysis: lev_jax.ladder.study.analyse's result.
    out_dir: folder (created if needed; local).
    command: the command line to cite under "How this was produced".

  Returns:
    {"report", "csv", "buckets_csv", "json", "loss_vs_tokens", "freq_buckets"}: paths;
    with "trend_csv" and "trend" too for a study over several backbone sizes.
  """
  names = {"report": REPORT_MD, "csv": STUDY_CSV, "buckets_csv": BUCKETS_CSV,
           "json": ANALYSIS_JSON, "loss_vs_tokens": LOSS_VS_TOKENS_PNG,
           "freq_buckets": FREQ_BUCKETS_PNG}
  if analysis.get("trend"):
    names.update(trend_csv=TREND_CSV, trend=TREND_PNG)
  paths, produced = begin_report(out_dir, names, analysis, command)
  write_csv(paths["csv"], CELL_COLUMNS, cell_rows(analysis))
  write_csv(paths["buckets_csv"], BUCKET_COLUMNS, bucket_rows(analysis))
  study_plots.plot_loss_vs_tokens(analysis, paths["loss_vs_tokens"])
  study_plots.plot_freq_buckets(analysis, paths["freq_buckets"])
  if analysis.get("trend"):
    write_csv(paths["trend_csv"], TREND_COLUMNS, trend_rows(analysis))
    study_plots.plot_trend(analysis, paths["trend"])
  paths["report"].write_text(markdown(analysis, produced))
  return {k: str(v) for k, v in paths.items()}
