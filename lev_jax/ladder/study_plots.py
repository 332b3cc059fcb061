"""The study report's PNGs (lev_jax/ladder/study_report.py).

  plot_loss_vs_tokens(analysis, "loss_vs_tokens.png")  # validation loss over tokens per
                                                       # vocabulary: mean over seeds with
                                                       # ± se bars, each seed faint
  plot_freq_buckets(analysis, "freq_buckets.png")      # relative perplexity change per
                                                       # bucket on the test split with the
                                                       # 95 % intervals, per vocabulary
                                                       # and scheme
  plot_trend(analysis, "trend.png")                    # change vs backbone parameters per
                                                       # corpus, fitted line (several sizes)

A study with several sizes or corpora gets one panel per (vocabulary, size) column and
corpus row in the first two.

`analysis` is lev_jax.ladder.study.analyse's dict. Colour = cell options and variant
(tab10); buckets under MIN_BUCKET_TARGETS test targets are not drawn. The Agg canvas and
the token axis are lev_jax/ladder/plots.py's.
"""

from __future__ import annotations

import math

from lev_jax.ladder.plots import count_axis, figure, legend
from lev_jax.ladder.reporting import MIN_BUCKET_TARGETS, too_few_targets
from lev_jax.ladder.study import SCHEMES


def _series(variant: str, options: str) -> str:
  """A cell's legend name without its vocabulary: 'leviathan [clip_mode=per_group]'."""
  return variant if options == "default" else f"{variant} [{options}]"


def _colours(labels):
  """{legend name: tab10 colour}, in the order given."""
  from matplotlib import colormaps
  cmap = colormaps["tab10"]
  return {label: cmap(i % 10) for i, label in enumerate(labels)}


def _grid(cells, sizes, corpora):
  """(columns [(vocab, size)], rows [corpus]) of the panels: one column per vocabulary and
  size, one row per corpus; sizes and corpora in the order given (the study's)."""
  rank = lambda order, x: order.index(x) if x in order else len(order)  # noqa: E731
  columns = sorted({(c["vocab"], c.get("size")) for c in cells},
                   key=lambda k: (k[0], rank(list(sizes), k[1])))
  rows = sorted({c.get("corpus") for c in cells}, key=lambda x: rank(list(corpora), x))
  return columns, rows


def _title(vocab, size, corpus, analysis) -> str:
  """'vocab 8192', with ', d256-L4' and ', foldoc' when the study has several."""
  return (f"vocab {vocab}" + (f", {size}" if len(analysis.get("sizes", ())) > 1 else "")
          + (f", {corpus}" if len(analysis.get("corpora", ())) > 1 else ""))


def plot_loss_vs_tokens(analysis, path) -> None:
  """loss_vs_tokens.png: one panel per vocabulary and size (columns) and corpus (rows);
  per cell, the mean validation loss over seeds at each token count with ± se bars, and
  each seed's curve faint; saved to `path`."""
  import numpy as np
  columns, corpora = _grid(analysis["cells"], analysis.get("sizes", ()),
                           analysis.get("corpora", ()))
  fig = figure(4.2 * max(len(columns), 1), 4.2 * max(len(corpora), 1))
  axes = np.array(fig.subplots(max(len(corpora), 1), max(len(columns), 1),
                               squeeze=False))
  if len(corpora) == 1:
    axes = axes[0]  # one row: the axes in the order a single-row study always drew them
  options = sorted({(c["variant"], c["options"]) for c in analysis["cells"]})
  colours = _colours([_series(v, o) for v, o in options])
  panels = [(vocab, size, corpus) for corpus in corpora for vocab, size in columns]
  for ax, (vocab, size, corpus) in zip(axes.flat, panels):
    for variant, opts in options:
      runs = [r for r in analysis["runs"] if r["vocab"] == vocab and r["variant"] == variant
              and r["options"] == opts and r["eval_curve"]["tokens"]
              and r.get("size") == size and r.get("corpus") == corpus]
      if not runs:
        continue
      colour = colours[_series(variant, opts)]
      for r in runs:
        ax.plot(r["eval_curve"]["tokens"], r["eval_curve"]["loss"], "-", color=colour,
                lw=0.6, alpha=0.3)
      by_tokens = {}
      for r in runs:
        for t, l in zip(r["eval_curve"]["tokens"], r["eval_curve"]["loss"]):
          by_tokens.setdefault(t, []).append(l)
      ts = sorted(by_tokens)
      means = [float(np.mean(by_tokens[t])) for t in ts]
      ses = [float(np.std(by_tokens[t], ddof=1) / math.sqrt(len(by_tokens[t])))
             if len(by_tokens[t]) > 1 else 0.0 for t in ts]
      ax.errorbar(ts, means, yerr=ses, fmt="o-" if variant == "tied" else "s--",
                  color=colour, ms=3.5, lw=1.4, capsize=2, label=_series(variant, opts))
    if _drawn(ax):
      ax.set_xscale("log")
      count_axis(ax.xaxis)
    else:
      _note(ax, "no evaluation logged yet")
    ax.set_title(_title(vocab, size, corpus, analysis))
    ax.set_xlabel("training tokens")
    ax.set_ylabel("validation loss (nats / token)")
    ax.grid(True, which="both", alpha=0.3)
    legend(ax, fontsize=7)
  fig.suptitle("Validation loss vs tokens: mean over seeds ± se (each seed faint)")
  fig.savefig(path, dpi=110)


def plot_freq_buckets(analysis, path):
  """freq_buckets.png: per comparison, the test-split change per bucket with its 95 %
  interval; a bucket of fewer than MIN_BUCKET_TARGETS test targets is not drawn (the
  x label says so). Returns the matplotlib Figure (also saved to `path`)."""
  import numpy as np
  comps = {c["label"]: c for c in analysis["comparisons"]}
  finals = [comps[l] for l in analysis["final"] if l in comps and not comps[l]["reason"]]
  columns, corpora = _grid(finals, analysis.get("sizes", ()), analysis.get("corpora", ()))
  fig = figure(4.6 * max(len(columns), 1), 7.5 * max(len(corpora), 1))
  axes = np.array(fig.subplots(len(SCHEMES) * max(len(corpora), 1), max(len(columns), 1),
                               squeeze=False))
  if not finals:
    axes[0, 0].text(0.5, 0.5, "no comparison with finished, evaluated seeds",
                    ha="center", transform=axes[0, 0].transAxes)
  colours = _colours(sorted({_series(c["variant"], c["options"]) for c in finals}))
  panels = [(row, corpus, j, vocab, size) for row, corpus in enumerate(corpora)
            for j, (vocab, size) in enumerate(columns)]
  for row, corpus, j, vocab, size in panels:
    here = [c for c in finals if c["vocab"] == vocab and c.get("size") == size
            and c.get("corpus") == corpus]
    for i, scheme in enumerate(SCHEMES):
      ax = axes[row * len(SCHEMES) + i, j]
      width = 0.8 / max(len(here), 1)
      ranges, omitted = [], False
      for k, comp in enumerate(here):
        rows = comp["buckets"]["test"][scheme]["rows"]
        ranges = ranges or [r["range"] for r in rows]
        omitted = omitted or any(too_few_targets(r["targets"]) for r in rows)
        rows = [r if not too_few_targets(r["targets"]) else
                {**r, "change": {"mean": None, "lo": None, "hi": None}} for r in rows]
        mean = [100 * r["change"]["mean"] if r["change"]["mean"] is not None else np.nan
                for r in rows]
        err = [[100 * (r["change"]["mean"] - r["change"]["lo"]) if r["change"]["lo"]
                is not None else np.nan for r in rows],  # n = 1: no bar
               [100 * (r["change"]["hi"] - r["change"]["mean"]) if r["change"]["hi"]
                is not None else np.nan for r in rows]]
        key = _series(comp["variant"], comp["options"])
        ax.bar(np.arange(len(rows)) + (k - (len(here) - 1) / 2) * width, mean, width,
               yerr=err, capsize=2, color=colours[key], label=key)
      ax.axhline(0, color="k", lw=0.8)
      ax.set_xticks(np.arange(len(ranges)), ranges, rotation=30, fontsize=7)
      if omitted:
        ax.set_xlabel(f"not drawn: < {MIN_BUCKET_TARGETS} test targets", fontsize=7)
      ax.set_title(f"{_title(vocab, size, corpus, analysis)}, {scheme} buckets", fontsize=9)
      ax.set_ylabel("ppl change vs tied (%)")
      ax.grid(True, axis="y", alpha=0.3)
      legend(ax, fontsize=7)
  fig.suptitle("Per-bucket perplexity change vs tied, test split\n(95 % t-intervals; "
               "rarest tokens left)", fontsize=10)  # two lines: one vocab is 4.6 in wide
  fig.savefig(path, dpi=110)
  return fig


def _drawn(ax) -> bool:
  """Whether `ax` holds data at a positive x (a log x axis needs some: matplotlib raises
  "Data cannot be log-scaled" when saving one without). Its data limits say: a
  horizontal reference line (axhline) spans the axes, not the data, and adds none."""
  x1 = ax.dataLim.x1
  return math.isfinite(x1) and x1 > 0


def _note(ax, text: str) -> None:
  """`text` in the middle of an empty panel (its x axis stays linear)."""
  ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, fontsize=9)


def plot_trend(analysis, path):
  """trend.png: one panel per corpus (and vocabulary); per trend series (e.g. leviathan
  vs untied), the test-split change at each size against the backbone parameters (log
  axis): each seed a faint dot, the mean with its 95 % interval, the fitted line.
  Returns the matplotlib Figure (also saved to `path`)."""
  import numpy as np
  trends = analysis.get("trend", [])
  groups = list(dict.fromkeys((t["vocab"], t["corpus"]) for t in trends))
  fig = figure(5.0 * max(len(groups), 1), 4.4)
  axes = np.atleast_1d(fig.subplots(1, max(len(groups), 1)))
  names = lambda t: f"{_series(t['variant'], t['options'])} vs {t['baseline']}"  # noqa: E731
  colours = _colours(list(dict.fromkeys(names(t) for t in trends)))
  for ax, (vocab, corpus) in zip(axes, groups):
    for t in (t for t in trends if (t["vocab"], t["corpus"]) == (vocab, corpus)):
      colour = colours[names(t)]
      done = [s for s in t["sizes"] if s["change"]["test"]]
      for s in done:
        ax.plot([s["backbone_params"]] * len(s["change"]["test"]["values"]),
                [100 * v for v in s["change"]["test"]["values"]], ".", color=colour,
                alpha=0.35)
      x = [s["backbone_params"] for s in done]
      mean = [100 * s["change"]["test"]["mean"] for s in done]
      err = [[100 * (s["change"]["test"]["mean"] - s["change"]["test"]["lo"])
              if s["change"]["test"]["lo"] is not None else 0.0 for s in done],
             [100 * (s["change"]["test"]["hi"] - s["change"]["test"]["mean"])
              if s["change"]["test"]["hi"] is not None else 0.0 for s in done]]
      fit = t["fit"]["test"]
      label = names(t) + (f": {100 * fit['slope']:+.1f} pp/decade"
                          if fit["slope"] is not None else "")
      ax.errorbar(x, mean, yerr=err, fmt="o", color=colour, ms=4, capsize=3, label=label)
      if fit["slope"] is not None and x:
        xs = np.geomspace(min(x), max(x), 20)
        ax.plot(xs, 100 * (fit["intercept"] + fit["slope"] * np.log10(xs)), "-",
                color=colour, lw=1.2)
    ax.axhline(0, color="k", lw=0.8)
    if _drawn(ax):
      ax.set_xscale("log")
      count_axis(ax.xaxis)
    else:  # newcomer pass 9: a log axis with no point failed the whole report
      _note(ax, "no finished pair yet")
    ax.set_title(f"{corpus}, vocab {vocab}", fontsize=9)
    ax.set_xlabel("backbone (non-embedding) parameters")
    ax.set_ylabel("test ppl change (%)")
    ax.grid(True, which="both", alpha=0.3)
    legend(ax, fontsize=7)
  if not groups:
    axes[0].text(0.5, 0.5, "no series at two sizes", ha="center",
                 transform=axes[0].transAxes)
  fig.suptitle("Change vs baseline with size, test split\n(seeds faint; mean with 95 % "
               "t-interval;\nleast-squares line in log10 parameters)", fontsize=9)  # three
  # lines: one corpus is 5 in wide
  fig.savefig(path, dpi=110)
  return fig
