"""The ladder report's PNGs (lev_jax/ladder/report.py), and the canvas both reports use.

  plot_loss_vs_tokens(analysis, "loss_vs_tokens.png")  # train and eval loss over tokens,
                                                       # all rungs (tied solid, Leviathan
                                                       # dashed, log x)
  plot_scaling_fit(analysis, "scaling_fit.png")        # tied final losses, the fitted
                                                       # L(N) = E + A N^-alpha, Leviathan
                                                       # at its effective N (16-84 %)
  plot_freq_buckets(analysis, "freq_buckets.png")      # relative perplexity change per
                                                       # frequency bucket, per size

`analysis` is lev_jax.ladder.analysis.analyse's dict. Colour = size throughout; buckets under
MIN_BUCKET_TARGETS validation targets are not drawn. `figure` and `count_axis` are shared
with the study's plots (lev_jax/ladder/study_plots.py).

Plots use matplotlib's Agg canvas directly (no pyplot state, no display needed;
https://matplotlib.org/stable/gallery/user_interfaces/canvasagg.html); matplotlib is
imported inside the functions, so importing this module stays cheap.
"""

from __future__ import annotations

import math

from lev_jax.ladder.reporting import MIN_BUCKET_TARGETS, count, ratio_text, too_few_targets


def figure(width, height):
  """A matplotlib Figure of width x height inches on an Agg canvas (constrained layout)."""
  from matplotlib.backends.backend_agg import FigureCanvasAgg
  from matplotlib.figure import Figure
  fig = Figure(figsize=(width, height), layout="constrained")
  FigureCanvasAgg(fig)
  return fig


def _size_colours(sizes):
  """{size: viridis colour}, smallest darkest."""
  from matplotlib import colormaps
  cmap = colormaps["viridis"]
  n = max(len(sizes) - 1, 1)
  return {s: cmap(0.85 * i / n) for i, s in enumerate(sizes)}


def _sizes(analysis) -> list[str]:
  """Every size in the analysis: the paired ones in order, then any unpaired."""
  sizes = [p["size"] for p in analysis["pairs"]]
  for r in analysis["rungs"]:
    if r["size"] not in sizes:
      sizes.append(r["size"])
  return sizes


def count_axis(axis) -> None:
  """Log axis ticks at 1, 2, 5 x 10^k labelled '2k', '5M', ... (no crowded minor labels)."""
  from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter
  axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
  axis.set_major_formatter(FuncFormatter(lambda x, _: count(x)))
  axis.set_minor_formatter(NullFormatter())


def legend(ax, **kwargs) -> None:
  """ax.legend(**kwargs) when `ax` holds a labelled artist; nothing otherwise (a panel
  with nothing drawn: matplotlib would warn "No artists with labels found to put in
  legend")."""
  if ax.get_legend_handles_labels()[0]:
    ax.legend(**kwargs)


def _style(kind):
  """Line style of a rung kind: tied solid, leviathan dashed, anything else dotted."""
  return {"tied": "-", "leviathan": "--"}.get(kind, ":")


def plot_loss_vs_tokens(analysis, path) -> None:
  """loss_vs_tokens.png: train (left) and validation (right) loss over training tokens,
  every rung (colour = size, tied solid, Leviathan dashed, log x), saved to `path`."""
  from matplotlib.lines import Line2D
  fig = figure(11, 4.2)
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
    count_axis(ax.xaxis)
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
  fig = figure(7.5, 6.4)
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
  count_axis(ax.xaxis)
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
  fig = figure(8, 4.5)
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
    legend(ax, title="size", fontsize=8)
    ax.grid(True, axis="y", alpha=0.3)
  ax.set_title("Per-bucket perplexity change (rarest tokens left)")
  fig.savefig(path, dpi=110)
  return fig
