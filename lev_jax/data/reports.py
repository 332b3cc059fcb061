"""Read reports: what a read of Pile-format files kept, and what it skipped and why.

Every reader (`corpus.expand_files`, `corpus.iter_file`, `corpus.read_documents`, the
streams of `stream`, the preparation of `prepare`) counts into a read report made by
`new_report`: files listed, documents kept, their characters, and the inputs skipped
per reason (`SKIP_REASONS`). The data report of a run (``data_report.json``) holds one
per split. `merge_reports` sums them (shards, files, epochs); `describe_skipped` puts
the skip counts into a message.
"""

from __future__ import annotations

from lev_jax.data.errors import DataError

# Why an input was skipped (counted in a read report's "skipped"): a path that does not
# exist; a glob or folder with no files; a .zst cut short or corrupt (its lines before the
# damage are kept); then per line: not UTF-8, not JSON, no string "text", empty or
# whitespace-only text, a meta.pile_set_name not asked for.
SKIP_REASONS = ("missing_file", "empty_glob", "truncated_file", "bad_utf8", "bad_json",
                "no_text", "empty", "filtered_subset")


def new_report() -> dict:
  """An empty read report.

  Returns:
    ``{"files": 0, "documents": 0, "characters": 0, "skipped": {reason: 0 for each of
    SKIP_REASONS}}``: files listed by `corpus.expand_files`, documents kept, their length in
    characters (Unicode code points, ``len(text)``), and what was skipped per reason:
    paths (``missing_file``, ``empty_glob``), files (``truncated_file``) or lines (the
    others).
  """
  return {"files": 0, "documents": 0, "characters": 0,
          "skipped": dict.fromkeys(SKIP_REASONS, 0)}


def describe_skipped(report: dict) -> str:
  """The non-zero skip counts of a report as ``"bad_json 2, filtered_subset 50"``
  (``"nothing skipped"`` when all are zero), for messages."""
  parts = [f"{reason} {n:,}" for reason, n in report["skipped"].items() if n]
  return ", ".join(parts) or "nothing skipped"


def merge_reports(*reports: dict) -> dict:
  """The field-wise sum of read reports, as a new dict (the inputs are left unchanged).

  Raises:
    DataError: an argument that is not a report made by `new_report`.
  """
  total = new_report()
  for i, report in enumerate(reports):
    try:
      for key in ("files", "documents", "characters"):
        total[key] += int(report[key])
      for reason, count in report["skipped"].items():
        total["skipped"][reason] = total["skipped"].get(reason, 0) + int(count)
    except (KeyError, TypeError, AttributeError, ValueError) as e:
      raise DataError(f"reports[{i}] = {report!r}: expected a read report from "
                      f"new_report() ({type(e).__name__}: {e})") from e
  return total
