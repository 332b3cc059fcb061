"""lev-study's report (lev_jax/ladder/study_report.py, study_plots.py) on a hand-made
analysis: a bucket under reporting.MIN_BUCKET_TARGETS test targets is n/a in report.md and
not drawn."""

import math

import pytest

from matplotlib.container import BarContainer

from lev_jax.ladder import reporting, study_plots, study_report
from lev_jax.ladder.study import SCHEMES
from test_ladder_plots import assert_texts_apart_and_inside, drawn_figure


def analysis_with_a_tiny_bucket():
  rows = [{"range": "[0,10)", "targets": 2.0, "ids": 5, "tied_ppl": 100.0, "other_ppl": 190.0,
           "change": {"mean": 0.9, "lo": 0.5, "hi": 1.3}},
          {"range": "[10,inf)", "targets": 500.0, "ids": 250, "tied_ppl": 20.0,
           "other_ppl": 18.0, "change": {"mean": -0.1, "lo": -0.2, "hi": 0.0}}]
  comp = {"label": "leviathan V=259", "baseline": "tied V=259", "reason": None, "vocab": 259,
          "variant": "leviathan", "options": "default",
          "buckets": {"test": {s: {"rows": rows, "reason": None} for s in SCHEMES}}}
  return {"cells": [], "comparisons": [comp], "final": [comp["label"]]}


def test_a_bucket_under_the_minimum_count_is_neither_drawn_nor_reported(tmp_path,
                                                                        monkeypatch):
  analysis = analysis_with_a_tiny_bucket()
  md = "\n".join(study_report._bucket_section(analysis))
  assert f"n/a (2 test targets < {reporting.MIN_BUCKET_TARGETS})" in md
  assert "+90.0 %" not in md and "-10.0 % [-20.0, +0.0]" in md
  fig = drawn_figure(study_plots.plot_freq_buckets, analysis, tmp_path / "b.png",
                     monkeypatch)
  assert_texts_apart_and_inside(fig)
  for ax in fig.axes:
    (bars,) = [c for c in ax.containers if isinstance(c, BarContainer)]
    tiny, kept = (p.get_height() for p in bars.patches)
    assert math.isnan(tiny) and kept == -10.0
    assert str(reporting.MIN_BUCKET_TARGETS) in ax.get_xlabel()


def test_a_scale_study_reports_each_corpus_by_size_and_the_fitted_slope(tmp_path):
  """Issue 25.2: the per corpus x size table with the changes vs tied and vs untied, the
  slope rows, trend.csv; a one-size, one-corpus study gets none of it."""
  import csv
  from lev_jax.ladder import study
  from test_ladder_study import _fake_study
  analysis = study.analyse(*_fake_study(
      lambda variant, size, corpus, seed: {"tied": 100.0, "untied": 80.0}.get(
          variant, 80.0 * (1.5 if size == "d32-L2" else 1.2) * (1 + 0.01 * seed))))
  md = "\n".join(study_report._trend_section(analysis))
  assert "### foldoc, vocab 259" in md and "### python_docs, vocab 259" in md
  row = next(l for l in md.splitlines() if "| leviathan V=259 d64-L4 foldoc |" in l)
  assert "| -3.5 % [" in row and "| +20.6 % [" in row  # vs tied; vs untied: +20, +21.2 %
  assert "| leviathan | untied | -30.1 pp / decade [" in md
  rows = study_report.trend_rows(analysis)
  fit = next(r for r in rows if r["row"] == "fit" and r["series"] == "leviathan"
             and r["baseline"] == "untied" and r["corpus"] == "foldoc" and r["split"] == "test")
  assert fit["slope_per_decade"] == pytest.approx(-0.3015) and fit["slope_n"] == 4
  single = {**analysis, "sizes": ["d32-L2"], "corpora": ["foldoc"]}
  assert study_report._trend_section(single) == []


def test_the_trend_plot_of_one_corpus_keeps_its_texts_inside(tmp_path, monkeypatch):
  """One corpus is one 5-inch panel: the title wraps instead of running off the figure."""
  from lev_jax.ladder import study
  from test_ladder_study import _fake_study
  analysis = study.analyse(*_fake_study(lambda variant, size, corpus, seed: 90.0 + seed))
  analysis["trend"] = [t for t in analysis["trend"] if t["corpus"] == "foldoc"]
  fig = drawn_figure(study_plots.plot_trend, analysis, tmp_path / "t.png", monkeypatch)
  assert_texts_apart_and_inside(fig)
  assert len(fig.axes) == 1 and len(fig.axes[0].get_legend().get_texts()) == 3



def test_a_study_with_nothing_run_draws_no_empty_legend(tmp_path):
  """Newcomer pass 4: `lev-study` on an empty ROOT printed matplotlib's "No artists with
  labels found to put in legend" warning (a panel with nothing drawn)."""
  import warnings  # noqa: PLC0415
  cell = {"label": "tied V=259", "vocab": 259, "variant": "tied", "options": "default"}
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    study_plots.plot_loss_vs_tokens({"cells": [cell], "runs": []}, tmp_path / "l.png")
  assert (tmp_path / "l.png").read_bytes()[:4] == b"\x89PNG"


def test_a_trend_with_no_finished_pair_is_drawn_on_a_linear_axis_with_a_note(tmp_path):
  """Newcomer pass 9: `lev-study --study=experiments/smoke_ladder.py` on an empty ROOT
  (a ladder file is a one-seed study) failed in "Data cannot be log-scaled because all
  values are <= 0": its trend panels had series but no point."""
  import warnings  # noqa: PLC0415
  from lev_jax.ladder import study
  from test_ladder_study import _fake_study
  result, factors, _ = _fake_study(lambda variant, size, corpus, seed: 90.0)
  for rung in result.rungs:
    rung.status, rung.final = "missing", None
  analysis = study.analyse(result, factors, {})
  assert analysis["trend"] and all(not s["change"]["test"] for t in analysis["trend"]
                                   for s in t["sizes"])
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    fig = study_plots.plot_trend(analysis, tmp_path / "t.png")
    study_plots.plot_loss_vs_tokens(analysis, tmp_path / "l.png")
  assert (tmp_path / "t.png").read_bytes()[:4] == b"\x89PNG"
  for ax in fig.axes:
    assert ax.get_xscale() == "linear"
    assert "no finished pair yet" in [t.get_text() for t in ax.texts]
