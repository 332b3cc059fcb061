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

Plots use matplotlib's Agg canvas directly (no pyplot state, no display needed;
https://matplotlib.org/stable/gallery/user_interfaces/canvasagg.html). Paper figures
quoted for reference are from arXiv 2601.22040 via ../shared/LEV.md.
"""

from __future__ import annotations

import csv
import datetime as dt
import json
import math
import subprocess
from pathlib import Path

from lev_jax.workdir import (ANALYSIS_JSON, EVAL_JSON, FREQ_BUCKETS_PNG, LADDER_CSV,
                             LEV_EVAL_JSON, LOSS_VS_TOKENS_PNG, REPORT_MD, SCALING_FIT_PNG)

PAPER = {
    "ppl": "-9 % validation perplexity at 1.2B",
    "efficiency": "2.1x fewer tokens to the tied baseline's final loss at 1.2B",
    "effective": "v1: effective parameters 1.47x to 2.11x (421M matched a ~725M dense model)",
    "buckets": "-81 % on the rarest tokens, near 0 % on the most frequent",
    "downstream": "all six zero-shot tasks improve; LAMBADA perplexity -30 %",
}
# A bucket's perplexity change over fewer validation targets than this is noise (a
# bucket of 1 target can show the largest change of all): it is reported as n/a and not
# drawn, in report.md and freq_buckets.png alike (and in lev_jax/ladder/study_report.py).
MIN_BUCKET_TARGETS = 50
CSV_COLUMNS = ("variant", "kind", "size", "status", "step", "steps", "tokens", "params",
               "non_embedding_params", "final_eval_loss", "perplexity",
               "ppl_change_vs_tied", "target_loss", "tokens_to_target", "efficiency",
               "n_eff", "n_eff_lo", "n_eff_hi", "n_eff_ratio", "reason")


# ---------------------------------------------------------------------------- formatting

def _na(reason) -> str:
  return f"n/a ({reason})" if reason else "n/a"


def _count(x) -> str:
  """1234567 -> '1.23M' (parameters, tokens)."""
  if x is None:
    return "n/a"
  if math.isinf(x):
    return "inf"
  if abs(x) >= 1e15:
    return f"{x:.3g}"
  for div, unit in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k")):
    if abs(x) >= div:
      return f"{x / div:.3g}{unit}"
  return f"{x:.3g}"


def num(x, digits=4) -> str:
  return "n/a" if x is None else f"{x:.{digits}f}"


def _pct(x) -> str:
  return "n/a" if x is None else f"{x * 100:+.1f} %"


def ratio_text(x) -> str:
  """n_eff / N and token ratios: '1.47x'; huge or unbounded values stay readable."""
  if x is None:
    return "n/a"
  if math.isinf(x):
    return "inf"
  return f"{x:.2f}x" if abs(x) < 1000 else f"{x:.3g}x"


def too_few_targets(targets) -> bool:
  """Whether a bucket of `targets` validation targets (None: unknown) is too small to
  report its change: 0 < targets < MIN_BUCKET_TARGETS (0 has no change at all)."""
  return targets is not None and 0 < targets < MIN_BUCKET_TARGETS


def bucket_change_text(change, targets) -> str:
  """A bucket's change for report.md: '-12.3 %', or why it is n/a."""
  if too_few_targets(targets):
    return f"n/a ({targets} validation targets < {MIN_BUCKET_TARGETS})"
  return "n/a (no validation targets)" if change is None else _pct(change)


def _cell(x) -> str:
  """Markdown table cell text: pipes would split the cell."""
  return str(x).replace("|", "\\|").replace("\n", " ")


def _table(header, rows) -> list[str]:
  out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
  out += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
  return out


def provenance(command: str | None = None) -> dict:
  """{"command", "date" (UTC, ISO 8601), "git_commit" (None outside a git checkout),
  "git_dirty"} for the report's "how it was produced"."""
  repo = Path(__file__).resolve().parent.parent
  commit = dirty = None
  try:
    commit = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True,
                            text=True, timeout=10, check=True).stdout.strip() or None
    status = subprocess.run(["git", "-C", str(repo), "status", "--porcelain",
                             "--untracked-files=no"], capture_output=True, text=True,
                            timeout=10, check=True).stdout
    dirty = bool(status.strip())
  except (OSError, subprocess.SubprocessError):
    pass
  return {"command": command,
          "date": dt.datetime.now(dt.timezone.utc).replace(microsecond=0).isoformat(),
          "git_commit": commit, "git_dirty": dirty}


# ---------------------------------------------------------------------------- plots

def _figure(width, height):
  from matplotlib.backends.backend_agg import FigureCanvasAgg
  from matplotlib.figure import Figure
  fig = Figure(figsize=(width, height), layout="constrained")
  FigureCanvasAgg(fig)
  return fig


def _size_colours(sizes):
  from matplotlib import colormaps
  cmap = colormaps["viridis"]
  n = max(len(sizes) - 1, 1)
  return {s: cmap(0.85 * i / n) for i, s in enumerate(sizes)}


def _sizes(analysis) -> list[str]:
  sizes = [p["size"] for p in analysis["pairs"]]
  for r in analysis["rungs"]:
    if r["size"] not in sizes:
      sizes.append(r["size"])
  return sizes


def _count_axis(axis) -> None:
  """Log axis ticks at 1, 2, 5 x 10^k labelled '2k', '5M', ... (no crowded minor labels)."""
  from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter
  axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
  axis.set_major_formatter(FuncFormatter(lambda x, _: _count(x)))
  axis.set_minor_formatter(NullFormatter())


def _style(kind):
  return {"tied": "-", "leviathan": "--"}.get(kind, ":")


def plot_loss_vs_tokens(analysis, path) -> None:
  from matplotlib.lines import Line2D
  fig = _figure(11, 4.2)
  ax_train, ax_eval = fig.subplots(1, 2)
  colours = _size_colours(_sizes(analysis))
  drawn = 0
  for r in analysis["rungs"]:
    style, colour = _style(r["kind"]), colours[r["size"]]
    unfinished = "" if r["status"] == "finished" else " (unfinished)"
    if r["train_curve"]["tokens"]:
      ax_train.plot(r["train_curve"]["tokens"], r["train_curve"]["loss"], style, color=colour,
                    lw=1.2, alpha=0.85)
      drawn += 1
    if r["eval_curve"]["tokens"]:
      ax_eval.plot(r["eval_curve"]["tokens"], r["eval_curve"]["loss"], style, color=colour,
                   marker="o" if r["kind"] == "tied" else "s", ms=3.5, lw=1.4,
                   label=r["variant"] + unfinished)
  for ax, title in ((ax_train, "train loss"), (ax_eval, "validation loss (eval/loss)")):
    ax.set_xscale("log")
    _count_axis(ax.xaxis)
    ax.set_xlabel("training tokens")
    ax.set_ylabel("loss (nats / token)")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
  if not drawn:
    ax_train.text(0.5, 0.5, "no finished or started rung", ha="center",
                  transform=ax_train.transAxes)
  handles = [Line2D([], [], color=c, lw=2, label=s) for s, c in colours.items()]
  handles += [Line2D([], [], color="k", ls="-", label="tied"),
              Line2D([], [], color="k", ls="--", label="leviathan")]
  ax_train.legend(handles=handles, fontsize=8, title="size", title_fontsize=8)
  fig.suptitle("Loss vs training tokens: tied (solid) vs Leviathan (dashed)")
  fig.savefig(path, dpi=110)


def plot_scaling_fit(analysis, path):
  """scaling_fit.png: tied final losses, the fit, Leviathan at its own and effective N.

  Colour = size; which point is which, and each n_eff / N, is in the legend below the
  axes (no free text in the axes: labels of nearby points would overlap each other, the
  edge and the fit line). Returns the matplotlib Figure (also saved to `path`).
  """
  import numpy as np
  from matplotlib.lines import Line2D
  fig = _figure(7.5, 6.4)
  ax = fig.subplots()
  colours = _size_colours(_sizes(analysis))
  size_of = {r["variant"]: r["size"] for r in analysis["rungs"]}
  fit = analysis["fit"]
  tied = fit["points"]
  xs = [p["N"] for p in tied]
  for p in tied:
    ax.plot([p["N"]], [p["loss"]], "o", color=colours.get(size_of.get(p["variant"]), "C0"),
            ms=7)
  lev = list(analysis["effective"])
  for e in lev:
    ax.plot([e["N"]], [e["loss"]], "s", mfc="none", color=colours.get(e["size"], "C3"), ms=7)
  finite = [e for e in lev if e["n_eff"] is not None and math.isfinite(e["n_eff"])]
  # The axis spans the points and the estimates; an interval reaching beyond it (an
  # unconstrained fit can give 1e300) is cut at the edge and marked with an arrowhead.
  all_x = xs + [e["N"] for e in lev] + [e["n_eff"] for e in finite]
  all_x += [e[k] for e in finite for k in ("lo", "hi")
            if math.isfinite(e[k]) and e[k] > 0 and 0.1 * min(all_x) < e[k] < 10 * max(all_x)]
  grey = "0.35"
  handles = [Line2D([], [], marker="o", ls="", color=grey, ms=7, label="tied (final eval loss)"),
             Line2D([], [], marker="s", ls="", mfc="none", color=grey, ms=7,
                    label="leviathan at its own N")]
  if fit["ok"] and all_x:
    left, right = min(all_x) / 1.3, max(all_x) * 1.3
    grid = np.geomspace(left, right, 200)
    se = fit["stderr"]
    handles += ax.plot(grid, fit["E"] + fit["A"] * grid ** -fit["alpha"], ":", color=grey,
                       label=(f"fit E + A N^-alpha: E={fit['E']:.3f}±{se['E']:.3g}, "
                              f"alpha={fit['alpha']:.3f}±{se['alpha']:.3g}"))
    for e in finite:
      colour = colours.get(e["size"], "C3")
      # The 16-84 % interval of the sampled n_eff; a skewed spread need not contain
      # the point estimate, so it is drawn as its own bar (no error-bar arithmetic).
      lo, hi = min(max(e["lo"], left), right), max(min(e["hi"], right), left)
      ax.plot([lo, hi], [e["loss"], e["loss"]], "-", color=colour, lw=2.5, alpha=0.45,
              solid_capstyle="butt")
      if e["lo"] < left:
        ax.plot([lo], [e["loss"]], "<", color=colour, alpha=0.6)
      if e["hi"] > right:
        ax.plot([hi], [e["loss"]], ">", color=colour, alpha=0.6)
      ax.plot([e["n_eff"]], [e["loss"]], "s", color=colour, ms=7)
      ax.annotate("", xy=(e["n_eff"], e["loss"]), xytext=(e["N"], e["loss"]),
                  arrowprops={"arrowstyle": "->", "color": colour, "alpha": 0.6})
    if finite:
      handles.append(Line2D([], [], marker="s", color=grey, ms=7, lw=2.5, alpha=0.8,
                            label="leviathan at its effective N (bar: 16-84 %)"))
    if any(e["lo"] < left or e["hi"] > right for e in finite):
      handles.append(Line2D([], [], marker=">", ls="", color=grey, alpha=0.6,
                            label="interval runs beyond the axis"))
    ax.set_xlim(left, right)
    title = "Scaling fit over the tied rungs; Leviathan at effective N"
    if fit.get("warnings"):
      title += "\n(poorly constrained fit: see report.md)"
    ax.set_title(title, fontsize=10)
  else:
    import textwrap
    ax.set_title("no power-law fit:\n" + textwrap.fill(fit["reason"] or "no tied rungs", 70),
                 fontsize=9)
  ratio = {e["size"]: e for e in lev}
  for size, colour in colours.items():
    e = ratio.get(size)
    text = (f"n_eff = {ratio_text(e['ratio'])} N" if e and e["ratio"] is not None
            and e["n_eff"] is not None and math.isfinite(e["n_eff"]) else "n_eff n/a")
    handles.append(Line2D([], [], marker="s", ls="", color=colour, ms=7,
                          label=f"{size}: {text}"))
  ax.set_xscale("log")
  _count_axis(ax.xaxis)
  ax.set_xlabel("N (total parameters)")
  ax.set_ylabel("final validation loss (nats / token)")
  ax.grid(True, which="both", alpha=0.3)
  fig.legend(handles=handles, loc="outside lower center", ncols=2, fontsize=8)
  fig.savefig(path, dpi=110)
  return fig


def plot_freq_buckets(analysis, path):
  """freq_buckets.png: the relative perplexity change per bucket and size; a bucket
  with fewer than MIN_BUCKET_TARGETS validation targets is not drawn (the x label says
  so). Returns the matplotlib Figure (also saved to `path`)."""
  import numpy as np
  fig = _figure(8, 4.5)
  ax = fig.subplots()
  pairs = [p for p in analysis["pairs"] if p["buckets"] and p["buckets"]["rows"]]

  def drawn(row) -> bool:
    return row["change"] is not None and not too_few_targets(row.get("tokens"))

  omitted = any(too_few_targets(row.get("tokens")) for p in pairs for row in p["buckets"]["rows"])
  ranges = []
  for p in pairs:
    for row in p["buckets"]["rows"]:
      if drawn(row) and row["range"] not in ranges:
        ranges.append(row["range"])
  if not pairs or not ranges:
    ax.text(0.5, 0.5, "no size with both twins finished and bucket data", ha="center",
            transform=ax.transAxes)
    ax.set_axis_off()
  else:
    colours = _size_colours(_sizes(analysis))
    width = 0.8 / len(pairs)
    x = np.arange(len(ranges))
    all_heights = [0.0]
    for i, p in enumerate(pairs):
      change = {row["range"]: 100 * row["change"] for row in p["buckets"]["rows"] if drawn(row)}
      heights = [change.get(r, np.nan) for r in ranges]
      all_heights += [h for h in heights if not np.isnan(h)]
      bars = ax.bar(x + (i - (len(pairs) - 1) / 2) * width, heights, width, label=p["size"],
                    color=colours[p["size"]])
      ax.bar_label(bars, labels=["" if np.isnan(h) else f"{h:+.0f}" for h in heights],
                   fontsize=7, padding=2)
    ax.axhline(0, color="k", lw=0.8)
    lo, hi = min(all_heights), max(all_heights)
    pad = 0.12 * max(hi - lo, 1.0)
    ax.set_ylim(lo - pad, hi + pad)
    ax.set_xticks(x, ranges)
    ax.set_xlabel("token frequency bucket (count in the training split)" + (
        f"\nnot drawn: buckets with fewer than {MIN_BUCKET_TARGETS} validation targets"
        if omitted else ""))
    ax.set_ylabel("perplexity change, leviathan vs tied (%)")
    ax.legend(title="size", fontsize=8)
    ax.grid(True, axis="y", alpha=0.3)
  ax.set_title("Per-bucket perplexity change (rarest tokens left)")
  fig.savefig(path, dpi=110)
  return fig


# ---------------------------------------------------------------------------- CSV

def _csv_value(x):
  if x is None:
    return ""
  if isinstance(x, float) and math.isinf(x):
    return "inf" if x > 0 else "-inf"
  return x


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
    rows.append({c: _csv_value(row.get(c)) for c in columns})
  return columns, rows


def write_csv(analysis, path) -> None:
  columns, rows = csv_rows(analysis)
  with open(path, "w", newline="") as f:
    w = csv.DictWriter(f, fieldnames=columns)
    w.writeheader()
    w.writerows(rows)


# ---------------------------------------------------------------------------- Markdown

def _ppl_section(analysis) -> list[str]:
  rows = []
  by_variant = {r["variant"]: r for r in analysis["rungs"]}
  for p in analysis["pairs"]:
    t, l = by_variant.get(p["tied"]), by_variant.get(p["leviathan"])
    rows.append([p["size"], _count(t["params"]) if t else "n/a",
                 _count(l["params"]) if l else "n/a", num(p["tied_loss"]),
                 num(p["leviathan_loss"]), num(p["tied_ppl"], 2), num(p["leviathan_ppl"], 2),
                 _pct(p["ppl_change"]) if p["ppl_change"] is not None else _na(p["reason"])])
  out = ["## Validation perplexity", "",
         f"Final validation loss and perplexity ({EVAL_JSON}) of each tied rung and its "
         f"Leviathan twin; change = leviathan / tied - 1. Paper: {PAPER['ppl']}.", ""]
  return out + _table(["size", "N tied", "N leviathan", "tied loss", "leviathan loss",
                       "tied ppl", "leviathan ppl", "ppl change"], rows) + [""]


def _efficiency_section(analysis) -> list[str]:
  rows = []
  for p in analysis["pairs"]:
    e = p["efficiency"]
    if e is None:
      rows.append([p["size"], "n/a", "n/a", "n/a", _na(p["reason"])])
      continue
    ratio = (f"{e['ratio']:.2f}x" + (" (lower bound: reached at the first eval)"
                                     if e["bound"] == "lower" else "")
             if e["ratio"] is not None else _na(e["reason"]))
    rows.append([p["size"], num(e["target"]), _count(e["tied_tokens"]),
                 _count(e["leviathan_tokens"]) if e["leviathan_tokens"] is not None
                 else "not reached", ratio])
  out = ["## Token efficiency", "",
         "Tokens Leviathan needs to reach its tied twin's final validation loss (first "
         "crossing of the eval/loss curve, interpolated in log tokens), and tied tokens / "
         f"Leviathan tokens. Paper: {PAPER['efficiency']}.", ""]
  out += _table(["size", "target (tied final loss)", "tied tokens",
                 "leviathan tokens to target", "ratio"], rows)
  return out + ["", f"![loss vs tokens]({LOSS_VS_TOKENS_PNG})", ""]


def _fit_section(analysis) -> list[str]:
  fit = analysis["fit"]
  out = ["## Scaling fit", "",
         f"L(N) = E + A N^-alpha fitted to the finished tied rungs' final validation loss "
         f"(lev_jax.ladder.scaling.fit_power_law, weighted least squares). {analysis['n_convention']}.",
         ""]
  if not fit["ok"]:
    out += [f"**No fit: {fit['reason']}**", ""]
  else:
    se = fit["stderr"]
    out += _table(["parameter", "value", "stderr"], [
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
      rows.append([e["size"], _count(e["N"]), num(e["loss"]), _na(e["reason"]), "n/a", "n/a",
                   ""])
      continue
    if e.get("warning"):  # an interval that misses its estimate carries no information
      interval, ratio = "n/a (see note)", ratio_text(e["ratio"])
    else:
      interval = f"{_count(e['lo'])} - {_count(e['hi'])}"
      ratio = (f"{ratio_text(e['ratio'])} ({ratio_text(e['ratio_lo'])} - "
               f"{ratio_text(e['ratio_hi'])})")
    rows.append([e["size"], _count(e["N"]), num(e["loss"]), _count(e["n_eff"]), interval,
                 ratio, e.get("warning") or ""])
  if not rows:
    rows.append(["n/a", "n/a", "n/a", _na("no finished Leviathan rung"), "n/a", "n/a", ""])
  out += _table(["size", "N leviathan", "final loss", "n_eff", "16-84 %", "n_eff / N",
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
        cells.append(_na(p["buckets"]["reason"]))
      elif row is None:
        cells.append("n/a (no validation targets)")
      else:
        cells.append(bucket_change_text(row["change"], row.get("tokens")))
    rows.append(cells)
  out += _table(["bucket", *(f"change {p['size']}" for p in pairs)], rows) + [""]
  largest = pairs[-1]
  if largest["buckets"]["rows"]:
    out += [f"Largest size ({largest['size']}) in detail:", ""]
    out += _table(["bucket", "validation targets", "tied ppl", "leviathan ppl", "change"], [
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
  return out + _table(["task", "size", "tied acc %", "leviathan acc %", "change (points)",
                       "tied acc_norm %", "leviathan acc_norm %"], rows) + [""]


def _rungs_section(analysis) -> list[str]:
  rows = []
  for r in analysis["rungs"]:
    note = r["reason"] or ""
    if r["notes"]:
      note = "; ".join([n for n in [note] if n] + r["notes"])
    rows.append([r["variant"], r["status"], f"{r['step'] if r['step'] is not None else '-'}"
                 f" / {r['steps']}", _count(r["tokens"]), f"{r['params']:,}",
                 f"{r['non_embedding_params']:,}", num(r["final_loss"]),
                 num(r["perplexity"], 2), note])
  out = ["## Rungs", ""]
  out += _table(["variant", "status", "step", "tokens", "N (total)", "non-embedding",
                 "final loss", "ppl", "notes"], rows) + [""]
  if analysis["missing"]:
    out += ["### Missing or unfinished rungs", ""]
    out += [f"- `{m['variant']}`: {m['reason']}" for m in analysis["missing"]] + [""]
  return out


def markdown(analysis, produced: dict) -> str:
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


def provenance_lines(produced: dict, default_command: str, extra: list[str]) -> list[str]:
  """The "How this was produced" section of a report: command, date, commit, `extra`."""
  commit = produced.get("git_commit")
  if commit and produced.get("git_dirty"):
    commit += " (with uncommitted changes)"
  return (["## How this was produced", "",
           f"- command: `{produced.get('command') or default_command}`",
           f"- date: {produced['date']}",
           f"- git commit: {commit or 'n/a (not a git checkout)'}"]
          + [f"- {line}" for line in extra] + [""])


def write_report(analysis: dict, out_dir, *, command: str | None = None) -> dict:
  """Writes report.md, ladder.csv, analysis.json and three PNGs into out_dir.

  Args:
    analysis: lev_jax.ladder.runs.analyse's result.
    out_dir: folder (created if needed; local).
    command: the command line to cite under "How this was produced".

  Returns:
    {"report", "csv", "json", "loss_vs_tokens", "scaling_fit", "freq_buckets"}: paths.
  """
  out = Path(out_dir)
  out.mkdir(parents=True, exist_ok=True)
  paths = {"report": out / REPORT_MD, "csv": out / LADDER_CSV, "json": out / ANALYSIS_JSON,
           "loss_vs_tokens": out / LOSS_VS_TOKENS_PNG, "scaling_fit": out / SCALING_FIT_PNG,
           "freq_buckets": out / FREQ_BUCKETS_PNG}
  produced = provenance(command)
  paths["json"].write_text(json.dumps({**analysis, "produced": produced}, indent=1))
  write_csv(analysis, paths["csv"])
  plot_loss_vs_tokens(analysis, paths["loss_vs_tokens"])
  plot_scaling_fit(analysis, paths["scaling_fit"])
  plot_freq_buckets(analysis, paths["freq_buckets"])
  paths["report"].write_text(markdown(analysis, produced))
  return {k: str(v) for k, v in paths.items()}
