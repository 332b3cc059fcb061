"""What the ladder report (report.py) and the study report (study_report.py) share.

Number text ('1.23M', '+4.1 %', '1.47x', 'n/a (why)'), Markdown tables, CSV cells and
files, the "How this was produced" provenance, the opening of a report folder (its paths
and analysis.json), the paper's figures quoted beside ours, and MIN_BUCKET_TARGETS.

  paths, produced = begin_report(out_dir, {"report": REPORT_MD, "json": ANALYSIS_JSON},
                                 analysis, command)

Paper figures are from arXiv 2601.22040 via ../shared/LEV.md.
"""

from __future__ import annotations

import csv
import datetime as dt
import math
import subprocess
from pathlib import Path

from lev_jax.workdir import json_text

PAPER = {
    "ppl": "-9 % validation perplexity at 1.2B",
    "efficiency": "2.1x fewer tokens to the tied baseline's final loss at 1.2B",
    "effective": "v1: effective parameters 1.47x to 2.11x (421M matched a ~725M dense model)",
    "buckets": "-81 % on the rarest tokens, near 0 % on the most frequent",
    "downstream": "all six zero-shot tasks improve; LAMBADA perplexity -30 %",
}
# A bucket's perplexity change over fewer validation targets than this is noise (a
# bucket of 1 target can show the largest change of all): it is reported as n/a and not
# drawn, in report.md and freq_buckets.png alike, by both reports.
MIN_BUCKET_TARGETS = 50


# ---------------------------------------------------------------------------- numbers

def na(reason) -> str:
  """'n/a (reason)', or 'n/a' without one."""
  return f"n/a ({reason})" if reason else "n/a"


def count(x) -> str:
  """1234567 -> '1.23M' (parameters, tokens); None -> 'n/a'; infinity -> 'inf'."""
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
  """x with `digits` decimals; None -> 'n/a'."""
  return "n/a" if x is None else f"{x:.{digits}f}"


def pct(x) -> str:
  """A relative change as a signed percentage: -0.0412 -> '-4.1 %'; None -> 'n/a'."""
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
  return "n/a (no validation targets)" if change is None else pct(change)


# ---------------------------------------------------------------------------- Markdown

def _cell(x) -> str:
  """Markdown table cell text: pipes would split the cell."""
  return str(x).replace("|", "\\|").replace("\n", " ")


def table(header, rows) -> list[str]:
  """A Markdown table's lines: `header` (strings), then one line per row of cells."""
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


# ---------------------------------------------------------------------------- files

def csv_value(x):
  """A CSV cell: None -> '' (not computable), infinities -> 'inf' / '-inf', else x."""
  if x is None:
    return ""
  if isinstance(x, float) and math.isinf(x):
    return "inf" if x > 0 else "-inf"
  return x


def write_csv(path, columns, rows) -> None:
  """A CSV file: a header of `columns`, then one line per dict in `rows`."""
  with open(path, "w", newline="") as f:
    w = csv.DictWriter(f, fieldnames=columns)
    w.writeheader()
    w.writerows(rows)


def report_files_error(out_dir, names) -> str | None:
  """The one line when a file the report writes into `out_dir` (`names`: file names) is
  there as something else than a regular file (a folder: newcomer pass 12 found the
  report half rewritten before an IsADirectoryError), else None."""
  for name in names:
    path = Path(out_dir) / name
    if path.exists() and not path.is_file():
      kind = "a folder" if path.is_dir() else "not a regular file"
      return f"{path}: is {kind}; expected the report's {name} file (move it aside)"
  return None


def begin_report(out_dir, names: dict, analysis: dict,
                 command: str | None) -> tuple[dict, dict]:
  """Opens a report folder: creates out_dir and writes the analysis to names["json"].

  Args:
    out_dir: folder (created if needed; local).
    names: {key: file name} of every file the report writes; must hold "json".
    analysis: the analysis dict, written as JSON with "produced" added.
    command: the command line to cite under "How this was produced".

  Returns:
    ({key: out_dir / name}, produced): paths and provenance(command).
  Raises:
    ValueError: one of those files is there as a folder (`report_files_error`); checked
      before anything is written.
  """
  problem = report_files_error(out_dir, names.values())
  if problem:
    raise ValueError(problem)
  out = Path(out_dir)
  out.mkdir(parents=True, exist_ok=True)
  paths = {key: out / name for key, name in names.items()}
  produced = provenance(command)
  paths["json"].write_text(json_text({**analysis, "produced": produced}))
  return paths, produced
