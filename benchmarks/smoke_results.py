"""Train the smoke variants on the embedded data and print docs/results.md's table.

  python benchmarks/smoke_results.py [--variants tied,leviathan] [--out runs/smoke_results]

Each variant trains from scratch (experiments/smoke.py, 300 steps) into OUT/<variant>;
the table gives the final validation loss and perplexity, perplexity per training-count
bucket of the target token, and the median logged step time (compile excluded). Also
written to OUT/results.md and OUT/results.json.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "experiments"))

import smoke  # noqa: E402

from lev_jax.trainer import train_and_evaluate  # noqa: E402


def median_step_time(workdir: Path) -> float:
  rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
  times = [r["perf/step_time_s"] for r in rows
           if "perf/step_time_s" in r and "perf/includes_compile" not in r]
  return statistics.median(times)


def table(results: dict) -> str:
  first = next(iter(results.values()))
  ranges = [b["range"] for b in first["buckets"] if b["tokens"]]
  head = ["variant", "val loss", "val ppl", *[f"ppl {r}" for r in ranges], "step s"]
  lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
  for name, r in results.items():
    ppl = {b["range"]: b["perplexity"] for b in r["buckets"]}
    cells = [name, f"{r['loss']:.3f}", f"{r['perplexity']:.1f}",
             *[f"{ppl[x]:.1f}" for x in ranges], f"{r['step_time_s']:.3f}"]
    lines.append("| " + " | ".join(cells) + " |")
  tokens = {b["range"]: b["tokens"] for b in first["buckets"]}
  lines.append("")
  lines.append("Validation targets per bucket (count of the id in the training split): "
               + ", ".join(f"{x}: {tokens[x]:,}" for x in ranges) + ".")
  return "\n".join(lines)


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--variants", default="tied,leviathan")
  p.add_argument("--out", default="runs/smoke_results")
  args = p.parse_args()
  out = Path(args.out)
  results = {}
  for variant in args.variants.split(","):
    workdir = out / variant
    shutil.rmtree(workdir, ignore_errors=True)
    result = train_and_evaluate(smoke.get_config(variant), workdir)
    result["step_time_s"] = median_step_time(workdir)
    results[variant] = result
  text = table(results)
  print(text)
  out.mkdir(parents=True, exist_ok=True)
  (out / "results.md").write_text(text + "\n")
  (out / "results.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
  main()
