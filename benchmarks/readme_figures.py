"""Regenerate every measured figure of the docs, in one command, and print the tables.

  python benchmarks/readme_figures.py                         # every section, in order
  python benchmarks/readme_figures.py --sections smoke,ladder # some of them
  python benchmarks/readme_figures.py --list                  # sections and their cost

Each section runs the repo's own command for one table of the docs (docs/results.md,
and the console block of docs/evaluation.md; the same command the docs name beside it;
the README's headline table quotes them) under ROOT (default runs/readme_figures), then
prints the table as that command wrote it, under a header with the commit, the Python /
jax / platform versions and the CPU count, and the file#heading where that table lives
(DOCS below), to paste it there. Training sections resume: re-running the same command
after an interruption continues where it stopped, and a finished run is not retrained.
Logs of every command go to ROOT/logs/SECTION.log; the printed tables also go to
ROOT/figures.md.

Sections (wall time measured on our 2-core CPU, nothing else running):
  smoke     benchmarks/smoke_results.py: tied, untied, Leviathan on the default data
            (3 x 300 steps; ~10 min)
  commands  lev-eval, lev-export, lev-sample on the smoke runs (the console block of
            docs/evaluation.md; needs `smoke`; ~1 min)
  ladder    lev-ladder --ladder=experiments/smoke_ladder.py --run (8 rungs; ~11 min)
  step_time benchmarks/step_time.py --reps 5 (~10 min) and benchmarks/lev_core.py
  studies   lev-study on experiments/smoke_study.py (9 runs, ~50 min) and
            experiments/fidelity_study.py (33 runs, ~50 min)
  scale     lev-study on experiments/scale_study.py, one corpus after the other (3 x 36
            runs; about an hour per corpus, see the file), then the whole study's report
  ablations lev-study on experiments/ablation_study.py, corpus by corpus (42 + 18 + 18
            runs, 27 of them the scale study's, reused: run `scale` first; ~2.5 h), then
            the whole ablation study's report
  drills    benchmarks/drills.py: kill -9, SIGTERM, bit flips, bad inputs (~5 min)
  pod_compile benchmarks/lev_tpu_estimate.py (LEV alone, vectorized and fused cores),
            then benchmarks/pod_compile.py: every ladder rung, tied and Leviathan,
            compiled by lev-compile for v5p-128 (with time estimates) and v5p-32
            (memory); needs the tpu-aot extra; compiler estimates, not measurements
            (~60 min)

Seeded figures: the smoke table and the ladder are single runs of seed 0 (the docs
say so); the studies give mean ± standard error over 3 seeds. Times and ratios depend
on the machine; losses and perplexities do not: the data, the tokenizer and the
training are deterministic on CPU (the tests check resume = straight run bitwise), and
the same float32 bits on any x86-64 CPU with AVX2 and FMA and any core count
(lev_jax/portable.py; benchmarks/cpu_portability.py checks it).
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PY = sys.executable


def _py(*args: str) -> list[str]:
  return [PY, *args]


def _smoke(root: Path) -> list[list[str]]:
  return [_py("benchmarks/smoke_results.py", "--variants", "tied,untied,leviathan",
              "--out", str(root / "smoke"))]


def _commands(root: Path) -> list[list[str]]:
  smoke = root / "smoke"
  export = root / "exports" / "smoke_leviathan"
  return [
      _py("-m", "lev_jax.cli.eval", f"--checkpoint={smoke / 'tied'}"),
      _py("-m", "lev_jax.cli.eval", f"--checkpoint={smoke / 'leviathan'}",
          f"--baseline={smoke / 'tied'}"),
      _py("-m", "lev_jax.cli.export", f"--checkpoint={smoke / 'leviathan'}", f"--output={export}",
          "--dtype=bfloat16", "--materialize_lev", "--hf", "--overwrite"),
      _py("-m", "lev_jax.cli.sample", f"--checkpoint={export}", "--prompt=The history of",
          "--max_new_tokens=32", "--temperature=0.8", "--top_p=0.9", "--seed=1"),
  ]


def _ladder(root: Path) -> list[list[str]]:
  return [_py("-m", "lev_jax.cli.ladder", "--ladder=experiments/smoke_ladder.py",
              f"--root={root / 'smoke_ladder'}", "--run")]


def _step_time(root: Path) -> list[list[str]]:
  del root
  return [_py("benchmarks/step_time.py", "--reps", "5"), _py("benchmarks/lev_core.py")]


def _studies(root: Path) -> list[list[str]]:
  return [_py("-m", "lev_jax.cli.study", f"--study=experiments/{name}.py",
              f"--root={root / name}", "--run")
          for name in ("smoke_study", "fidelity_study")]


def _scale(root: Path) -> list[list[str]]:
  """One lev-study per corpus (a piece each, so that one corpus's report exists before
  the next starts), then the whole study's report (nothing left to train)."""
  study = "experiments/scale_study.py"
  pieces = ("foldoc", "debian_books", "python_docs")  # the file's PIECES, in its order
  return [_py("-m", "lev_jax.cli.study", f"--study={study}" + (f":{p}" if p else ""),
              f"--root={root / 'scale_study'}", "--run") for p in (*pieces, None)]


def _ablations(root: Path) -> list[list[str]]:
  """One lev-study per corpus piece of experiments/ablation_study.py under the scale
  study's root (its tied, untied and Leviathan runs are the baselines, reused), then the
  whole ablation study's report into ROOT/scale_study/report_ablation."""
  study = "experiments/ablation_study.py"
  pieces = ("ablation_debian_books", "ablation_foldoc", "ablation_python_docs")
  scale_root = root / "scale_study"
  return [*(_py("-m", "lev_jax.cli.study", f"--study={study}:{p}", f"--root={scale_root}",
                "--run") for p in pieces),
          _py("-m", "lev_jax.cli.study", f"--study={study}", f"--root={scale_root}",
              f"--report_dir={scale_root / 'report_ablation'}", "--run")]


def _drills(root: Path) -> list[list[str]]:
  return [_py("benchmarks/drills.py", f"--root={root / 'drills'}")]


def _pod_compile(root: Path) -> list[list[str]]:
  out = root / "pod_compile"
  lev = [out / f"lev_v5p_4096_{impl}.json" for impl in ("vectorized", "fused")]
  return [*(_py("benchmarks/lev_tpu_estimate.py", f"--impl={impl}", f"--json={path}")
            for impl, path in zip(("vectorized", "fused"), lev)),
          _py("benchmarks/pod_compile.py", "--topologies=v5p-128,v5p-32",
              "--memory_only=v5p-32", f"--lev_estimate={','.join(map(str, lev))}",
              f"--out={out}")]


# name -> (commands, the files whose tables are printed after them)
SECTIONS = {
    "smoke": (_smoke, lambda r: [r / "smoke" / "results.md"]),
    "commands": (_commands, lambda r: []),
    "ladder": (_ladder, lambda r: [r / "smoke_ladder" / "report" / "report.md"]),
    "step_time": (_step_time, lambda r: []),
    "studies": (_studies, lambda r: [r / n / "report" / "report.md"
                                     for n in ("smoke_study", "fidelity_study")]),
    "scale": (_scale, lambda r: [r / "scale_study" / "report" / "report.md"]),
    "ablations": (_ablations, lambda r: [r / "scale_study" / "report_ablation" /
                                         "report.md"]),
    "drills": (_drills, lambda r: []),
    "pod_compile": (_pod_compile, lambda r: [r / "pod_compile" / "table.md"]),
}


# name -> where its figures live in the docs (file#anchor, relative to the repository)
DOCS = {
    "smoke": "docs/results.md#measured-smoke-tied-vs-untied-vs-leviathan-on-the-embedded-data",
    "commands": "docs/evaluation.md#after-training-evaluate-export-sample-scaling-curves",
    "ladder": "docs/results.md#measured-the-smoke-ladder-tied-vs-leviathan",
    "step_time": "docs/results.md#measured-train-step-time-tied-vs-leviathan",
    "studies": "docs/results.md#measured-leviathan-vs-tied-at-cpu-scale-seeded-study",
    "scale": "docs/results.md#measured-the-scale-trend-on-real-prose-issue-25",
    "ablations": "docs/results.md#ablations-of-lev-at-d192-l3-on-each-corpus",
    "drills": "docs/reliability.md#reliability-what-protects-a-run",
    "pod_compile": "docs/results.md#every-rung-on-its-slice-compiler-figures-estimates-labelled",
}


def provenance() -> str:
  """One line: commit (+dirty), Python, jax, platform, CPUs, date (UTC)."""
  def git(*args):
    return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True
                          ).stdout.strip()
  commit = git("rev-parse", "--short=12", "HEAD") or "unknown"
  dirty = " (+ uncommitted changes)" if git("status", "--porcelain", "--untracked-files=no") else ""
  import jax  # pylint: disable=import-outside-toplevel
  return (f"commit {commit}{dirty}; CPython {platform.python_version()}; jax "
          f"{jax.__version__} on {jax.devices()[0].platform}; {platform.system()} "
          f"{platform.machine()}, {os.cpu_count()} CPUs; "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")


def _tables(markdown: str) -> str:
  """The first table of a report (with the paragraph line before it)."""
  lines = markdown.splitlines()
  start = next((i for i, l in enumerate(lines) if l.startswith("|")), None)
  if start is None:
    return markdown
  end = start
  while end < len(lines) and lines[end].startswith("|"):
    end += 1
  return "\n".join(lines[start:end])


def run_section(name: str, root: Path, out) -> int:
  commands, outputs = SECTIONS[name]
  log = root / "logs" / f"{name}.log"
  log.parent.mkdir(parents=True, exist_ok=True)
  status, text = 0, []
  start = time.perf_counter()
  with open(log, "a", encoding="utf-8") as f:
    for argv in commands(root):
      f.write(f"$ {' '.join(argv)}\n")
      f.flush()
      p = subprocess.run(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=f, text=True)
      f.write(p.stdout)
      text.append(f"$ {' '.join(a if a != PY else 'python' for a in argv)}\n{p.stdout}")
      status = status or p.returncode
  minutes = (time.perf_counter() - start) / 60
  out(f"\n## {name} ({minutes:.1f} min{'' if status == 0 else f'; exit status {status}'})\n\n"
      f"In the docs: {DOCS[name]}\n")
  if name in ("commands", "ladder", "step_time", "drills"):  # ladder: lev-ladder's summary
    out("```console\n" + "\n".join(text).rstrip() + "\n```")
  for path in outputs(root):
    out(f"{path.relative_to(root)}:\n\n" + (_tables(path.read_text()) if path.exists()
                                            else "(missing: the command failed)"))
  return status


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--sections", default=",".join(SECTIONS),
                 help=f"comma-separated subset of {', '.join(SECTIONS)} (default: all)")
  p.add_argument("--root", default="runs/readme_figures", help="output folder (resumable)")
  p.add_argument("--list", action="store_true", help="list the sections and exit")
  args = p.parse_args(argv)
  if args.list:
    print(__doc__.split("Sections")[1].split("Seeded")[0].strip())
    return 0
  names = [s for s in args.sections.split(",") if s]
  unknown = [s for s in names if s not in SECTIONS]
  if unknown or not names:
    p.error(f"--sections={args.sections}: unknown {', '.join(unknown) or '(none given)'}; "
            f"expected a comma-separated subset of {', '.join(SECTIONS)}")
  root = Path(args.root).resolve()
  root.mkdir(parents=True, exist_ok=True)
  report = open(root / "figures.md", "a", encoding="utf-8")

  def out(text: str) -> None:
    print(text, flush=True)
    report.write(text + "\n")
    report.flush()

  out(f"# Figures of the docs\n\n{provenance()}")
  status = 0
  for name in names:
    status = run_section(name, root, out) or status
  report.close()
  return status


if __name__ == "__main__":
  sys.exit(main())
