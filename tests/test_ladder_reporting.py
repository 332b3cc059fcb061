"""What both reports share (lev_jax/ladder/reporting.py): number text, Markdown tables, CSV
cells, and the opening of a report folder."""

import csv
import json

from lev_jax import workdir
from lev_jax.ladder import reporting


def test_numbers_read_as_the_reports_print_them():
  assert reporting.count(1234567) == "1.23M" and reporting.count(None) == "n/a"
  assert reporting.count(float("inf")) == "inf" and reporting.count(512) == "512"
  assert reporting.pct(-0.0412) == "-4.1 %" and reporting.pct(None) == "n/a"
  assert reporting.ratio_text(1.4712) == "1.47x" and reporting.ratio_text(12345.0) == "1.23e+04x"
  assert reporting.na("why") == "n/a (why)" and reporting.na(None) == "n/a"
  assert reporting.num(1.23456) == "1.2346" and reporting.num(None, 2) == "n/a"


def test_a_bucket_under_the_minimum_is_n_a_with_its_count():
  few = reporting.MIN_BUCKET_TARGETS - 1
  assert reporting.too_few_targets(few) and not reporting.too_few_targets(0)
  assert not reporting.too_few_targets(None)
  assert reporting.bucket_change_text(-0.5, few) == (
      f"n/a ({few} validation targets < {reporting.MIN_BUCKET_TARGETS})")
  assert reporting.bucket_change_text(None, 100) == "n/a (no validation targets)"
  assert reporting.bucket_change_text(-0.5, 100) == "-50.0 %"


def test_table_cells_cannot_split_a_row():
  lines = reporting.table(["a", "b"], [["x|y", "two\nlines"]])
  assert lines == ["| a | b |", "|---|---|", "| x\\|y | two lines |"]


def test_begin_report_writes_the_analysis_with_its_provenance(tmp_path):
  paths, produced = reporting.begin_report(
      tmp_path / "new" / "out", {"json": "analysis.json", "csv": "x.csv"},
      {"x": float("inf")}, "lev-ladder --root=r")
  assert paths["csv"] == tmp_path / "new" / "out" / "x.csv" and not paths["csv"].exists()
  text = paths["json"].read_text()  # strict JSON: the infinity is the text "inf"
  assert json.loads(text)["x"] == "inf"
  assert workdir.loads_json(text) == {"x": float("inf"), "produced": produced}
  assert produced["command"] == "lev-ladder --root=r" and produced["date"].endswith("+00:00")
  reporting.write_csv(paths["csv"], ["a", "b"],
                      [{"a": reporting.csv_value(None), "b": reporting.csv_value(-float("inf"))}])
  with open(paths["csv"]) as f:
    assert list(csv.DictReader(f)) == [{"a": "", "b": "-inf"}]
  section = reporting.provenance_lines({"date": "d", "git_commit": "abc", "git_dirty": True},
                                       "default", ["extra"])
  assert "- command: `default`" in section
  assert "- git commit: abc (with uncommitted changes)" in section
  assert "- extra" in section
