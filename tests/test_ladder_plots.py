"""The ladder report's plots (lev_jax/ladder/plots.py): no text over text or outside its
axes. The helpers here are shared with the study's plots (test_ladder_study_report.py) and
the bucket test in test_ladder_report.py."""

import json
from pathlib import Path

from lev_jax import workdir
from lev_jax.ladder import plots, reporting

DOCS_ANALYSIS = Path(__file__).resolve().parent.parent / "docs" / "smoke_ladder" / "analysis.json"


def drawn_figure(plot, analysis, path, monkeypatch):
  """The matplotlib Figure `plot(analysis, path)` draws (its module's `figure`, captured:
  lev_jax.ladder.plots', which lev_jax.ladder.study_plots imports)."""
  import sys
  module = sys.modules[plot.__module__]
  made = []
  make = module.figure
  monkeypatch.setattr(module, "figure", lambda *a: made.append(make(*a)) or made[-1])
  plot(analysis, path)
  assert len(made) == 1
  made[0].canvas.draw()
  return made[0]


def text_boxes(fig):
  """[(text, window extent)] of every visible, non-empty text artist `fig` draws (a tick
  label beyond its axis' view limits is an artist matplotlib does not draw)."""
  from matplotlib.text import Text
  renderer = fig.canvas.get_renderer()
  undrawn = set()
  for ax in fig.axes:
    for axis in (ax.xaxis, ax.yaxis):
      lo, hi = sorted(axis.get_view_interval())
      for tick in [*axis.get_major_ticks(), *axis.get_minor_ticks()]:
        if not lo <= tick.get_loc() <= hi:
          undrawn |= {id(tick.label1), id(tick.label2)}
  return [(t.get_text(), t.get_window_extent(renderer)) for t in fig.findobj(Text)
          if t.get_visible() and t.get_text().strip() and id(t) not in undrawn]


def assert_texts_apart_and_inside(fig):
  boxes = text_boxes(fig)
  figure_box = fig.bbox
  for i, (text, box) in enumerate(boxes):
    assert (box.x0 >= figure_box.x0 - 1 and box.x1 <= figure_box.x1 + 1 and
            box.y0 >= figure_box.y0 - 1 and box.y1 <= figure_box.y1 + 1), (text, box)
    for other, other_box in boxes[i + 1:]:
      assert not box.overlaps(other_box), f"{text!r} overlaps {other!r}"
  renderer = fig.canvas.get_renderer()
  for ax in fig.axes:  # free text in an axes (annotations, bar labels) stays inside it
    inside = ax.get_window_extent(renderer)
    for t in ax.texts:
      if t.get_visible() and t.get_text().strip():
        box = t.get_window_extent(renderer)
        assert (box.x0 >= inside.x0 and box.x1 <= inside.x1 and box.y0 >= inside.y0 and
                box.y1 <= inside.y1), f"{t.get_text()!r} leaves its axes"


def test_scaling_fit_labels_neither_overlap_nor_cross_the_plot(tmp_path, monkeypatch):
  """The smoke ladder's analysis (docs/): two Leviathan rungs' n_eff close together, one
  at the right edge, and the fit line through them."""
  analysis = workdir.loads_json(DOCS_ANALYSIS.read_text())  # strict JSON: "inf" as text
  fig = drawn_figure(plots.plot_scaling_fit, analysis, tmp_path / "fit.png", monkeypatch)
  assert_texts_apart_and_inside(fig)
  renderer = fig.canvas.get_renderer()
  (ax,) = fig.axes
  legends = [*fig.legends, *([ax.get_legend()] if ax.get_legend() else [])]
  assert legends
  for legend in legends:  # nothing drawn in the axes can cross the legend's text
    assert not legend.get_window_extent(renderer).overlaps(ax.get_window_extent(renderer))
  legend_text = " ".join(t for t, _ in text_boxes(fig))
  for e in analysis["effective"]:  # which point is which is still said
    assert f"{e['size']}: n_eff = {reporting.ratio_text(e['ratio'])} N" in legend_text
