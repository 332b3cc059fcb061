"""lev-ladder's report: Markdown tables, CSV rows, valid PNGs, honest n/a entries."""

import csv
import json
import math
import struct
from pathlib import Path

import pytest

from lev_jax import workdir
from lev_jax.ladder import plots, reporting
from lev_jax.ladder.analysis import analyse
from lev_jax.ladder.runs import collect
from lev_jax.ladder.report import CSV_COLUMNS, write_report
from test_ladder_plots import DOCS_ANALYSIS, assert_texts_apart_and_inside, drawn_figure
from test_ladder_runs import SHIFT, build_ladder

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def png_size(path) -> tuple[int, int]:
  """(width, height) from a PNG's IHDR chunk, after checking the signature."""
  data = path.read_bytes()
  assert data[:8] == PNG_SIGNATURE, path
  assert data[12:16] == b"IHDR"
  return struct.unpack(">II", data[16:24])


@pytest.fixture(scope="module")
def report(tmp_path_factory):
  tmp = tmp_path_factory.mktemp("report")
  ladder, root, _ = build_ladder(tmp, unfinished=("leviathan_d",))
  analysis = analyse(collect(ladder, root))
  paths = write_report(analysis, tmp / "out", command="lev-ladder --ladder=x --root=y")
  return analysis, {k: Path(v) for k, v in paths.items()}


def test_every_file_is_written_and_the_plots_are_real_pngs(report):
  _, paths = report
  assert set(paths) == {"report", "csv", "json", "loss_vs_tokens", "scaling_fit", "freq_buckets"}
  for key in ("loss_vs_tokens", "scaling_fit", "freq_buckets"):
    width, height = png_size(paths[key])
    assert width >= 600 and height >= 300, (key, width, height)
    assert paths[key].stat().st_size > 10_000  # drawn, not an empty canvas
  saved = json.loads(paths["json"].read_text())
  assert saved["produced"]["command"] == "lev-ladder --ladder=x --root=y"


def test_csv_has_one_row_per_rung_and_the_efficiency(report):
  analysis, paths = report
  with open(paths["csv"]) as f:
    reader = csv.DictReader(f)
    rows = list(reader)
  assert reader.fieldnames == [*CSV_COLUMNS, "acc_piqa"]
  assert [r["variant"] for r in rows] == [r["variant"] for r in analysis["rungs"]]
  by = {r["variant"]: r for r in rows}
  assert float(by["leviathan_a"]["efficiency"]) == pytest.approx(SHIFT, rel=0.01)
  assert float(by["leviathan_b"]["n_eff_ratio"]) > 1
  assert float(by["leviathan_a"]["acc_piqa"]) == 0.64 and by["leviathan_b"]["acc_piqa"] == ""
  assert int(by["tied_c"]["params"]) > int(by["tied_c"]["non_embedding_params"]) > 0
  # Not computable -> empty cell, with the reason in its own column.
  assert by["leviathan_d"]["status"] == "unfinished" and by["leviathan_d"]["efficiency"] == ""
  assert by["leviathan_d"]["final_eval_loss"] == ""
  assert by["leviathan_d"]["reason"] == "not finished: step 40 of 100"
  assert by["tied_a"]["efficiency"] == ""  # a tied rung has no twin to reach


def test_markdown_reads_like_the_papers_tables(report):
  analysis, paths = report
  md = paths["report"].read_text()
  for heading in ("## Validation perplexity", "## Token efficiency", "## Scaling fit",
                  "### Effective parameters", "## Token-frequency buckets",
                  "## Downstream (zero-shot)", "## Rungs", "### Missing or unfinished rungs",
                  "## How this was produced"):
    assert f"\n{heading}\n" in md, heading
  assert "| size | N tied | N leviathan | tied loss | leviathan loss | tied ppl |" in md
  assert "| 2.10x |" in md
  assert "| E (nats) | 1.5000 |" in md and "| alpha | 0.3000 |" in md
  assert "| piqa | a | 60.0 ± 1.1 | 64.0 ± 1.1 | +4.0 |" in md
  # about -50 % (LEV_BUCKET_PPL / TIED_BUCKET_PPL) per size; write_rung scales each
  # rung's buckets to agree with its loss
  changes = [p["buckets"]["rows"][1]["change"] for p in analysis["pairs"][:3]]
  assert all(-0.6 < c < -0.4 for c in changes)
  assert "| [1,10) | " + " | ".join(f"{100 * c:+.1f} %" for c in changes) + " |" in md
  assert "- `leviathan_d`: not finished: step 40 of 100" in md
  assert "n/a (leviathan_d: not finished: step 40 of 100)" in md
  for image in ("loss_vs_tokens.png", "scaling_fit.png", "freq_buckets.png"):
    assert f"]({image})" in md  # relative: the report folder can be moved whole
  assert "- command: `lev-ladder --ladder=x --root=y`" in md and "- git commit: " in md
  assert "None" not in md and "nan" not in md.lower().replace("nats", "")
  assert "total parameters" in md  # the N convention is stated


def test_too_few_points_and_no_downstream_still_give_a_full_report(tmp_path):
  ladder, root, _ = build_ladder(tmp_path, sizes={"a": 16, "b": 32, "c": 48}, downstream=False)
  analysis = analyse(collect(ladder, root))
  paths = write_report(analysis, tmp_path / "out")
  md = open(paths["report"]).read()
  assert "**No fit: a power-law fit L(N) = E + A N^-alpha needs at least 4 rungs" in md
  assert "| n/a (no power-law fit: a power-law fit" in md
  assert "No lev_eval.json in any finished rung" in md
  assert "| 2.10x |" in md  # token efficiency does not need the fit
  for key in ("loss_vs_tokens", "scaling_fit", "freq_buckets"):
    assert png_size(Path(paths[key]))[0] > 0
  with open(paths["csv"]) as f:
    rows = list(csv.DictReader(f))
  assert len(rows) == 6 and all(r["n_eff"] == "" for r in rows)


# --- tiny buckets: neither drawn nor reported ---------------------------------------

def test_a_bucket_under_the_minimum_count_is_neither_drawn_nor_reported(tmp_path,
                                                                        monkeypatch):
  from lev_jax.ladder import report
  analysis = workdir.loads_json(DOCS_ANALYSIS.read_text())  # strict JSON: "inf" as text
  tiny = analysis["pairs"][-1]["buckets"]["rows"][3]  # l, [100,1000)
  tiny.update(tokens=1, change=0.9)  # one target: the tallest bar of all, were it drawn
  assert 1 < reporting.MIN_BUCKET_TARGETS
  fig = drawn_figure(plots.plot_freq_buckets, analysis, tmp_path / "b.png", monkeypatch)
  assert_texts_apart_and_inside(fig)
  (ax,) = fig.axes
  ranges = [t.get_text() for t in ax.get_xticklabels()]
  heights = {(bars.get_label(), ranges[j]): patch.get_height()
             for bars in ax.containers for j, patch in enumerate(bars.patches)}
  assert math.isnan(heights.get(("l", tiny["range"]), math.nan))
  assert max(abs(h) for h in heights.values() if not math.isnan(h)) < 90
  assert str(reporting.MIN_BUCKET_TARGETS) in ax.get_xlabel()  # says why a bar is missing
  md = "\n".join(report._bucket_section(analysis))
  assert f"n/a (1 validation targets < {reporting.MIN_BUCKET_TARGETS})" in md
  assert "+90.0 %" not in md
  big = [r for r in analysis["pairs"][-1]["buckets"]["rows"] if r is not tiny
         and r["change"] is not None and r["tokens"] >= reporting.MIN_BUCKET_TARGETS]
  assert big and all(f"{100 * r['change']:+.1f} %" in md for r in big)  # these are reported
