"""lev_jax/metrics.py: metrics.jsonl on resume."""

from absl import logging

from lev_jax.metrics import truncate_metrics


def test_a_damaged_row_is_named_and_kept_beside(tmp_path, monkeypatch):
  """Issue 26: a row cut mid-line was dropped without a word, its text lost."""
  warned = []
  monkeypatch.setattr(logging, "warning", lambda msg, *a: warned.append(msg % a))
  (tmp_path / "metrics.jsonl").write_text('{"step": 5}\n{"step": 10, "train/lo\n{"step": 12}\n')
  assert truncate_metrics(tmp_path, 10) == 2
  assert (tmp_path / "metrics.jsonl").read_text() == '{"step": 5}\n'
  assert (tmp_path / "metrics.jsonl.damaged").read_text() == '{"step": 10, "train/lo\n'
  assert len(warned) == 1 and "metrics.jsonl: dropped 1 unreadable line(s) (line 2;" in warned[0]
