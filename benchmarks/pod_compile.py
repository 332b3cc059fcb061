"""Every ladder rung, tied and Leviathan, compiled for the TPU slices users run it on.

  python benchmarks/pod_compile.py                                  # v5p-128 and v5p-32
  python benchmarks/pod_compile.py --topologies v5p-128 --rungs tied_1.2b,leviathan_1.2b
  python benchmarks/pod_compile.py --out runs/pod_compile --table    # the table only
  python benchmarks/pod_compile.py --memory_only v5p-32              # no time estimate there

Each cell is one `lev-compile --steps=train --json=OUT/TOPOLOGY/RUNG.json` run in its
own process (the rung's config from experiments/ladder.py unchanged, libtpu installed:
`pip install -e '.[tpu-aot]'`); a cell whose JSON exists is not compiled again, so an
interrupted run resumes. Then one Markdown table (OUT/table.md): per rung and slice,
the per-chip memory and its share of HBM, Leviathan's memory and estimated step time
against its tied twin's, the estimated step time, tokens/s and MFU, and the estimated
time to the rung's token budget (train.steps x the step estimate).

Every time, rate and MFU here is XLA:TPU's cost-model ESTIMATE for a program compiled
on this CPU host, not a measurement on a TPU. Memory is the compiler's own buffer
assignment (what the chip would have to hold).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

DEFAULT_TOPOLOGIES = ("v5p-128", "v5p-32")


def _ladder():
  from lev_jax.experiments import load_experiment  # pylint: disable=import-outside-toplevel
  return load_experiment(REPO / "experiments" / "ladder.py")


def compile_cell(rung: str, topology: str, out: Path, estimate_time: bool = True,
                 overrides: tuple[str, ...] = (), name: str = "") -> dict:
  """Runs lev-compile for one rung on one slice (once); returns its JSON record.

  overrides: extra `--config.x=y` flags, the cell then stored as `name`
  (OUT/TOPOLOGY/RUNG/NAME.json) instead of OUT/TOPOLOGY/RUNG.json."""
  path = out / topology / (f"{rung}/{name}.json" if name else f"{rung}.json")
  if not path.exists():
    path.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "lev_jax.cli.compile",
         f"--config=experiments/ladder.py:{rung}", f"--topology={topology}", "--steps=train",
         f"--json={path}", f"--{'' if estimate_time else 'no'}estimate_time", *overrides],
        cwd=REPO, capture_output=True, text=True)
    took = time.perf_counter() - start
    print(f"{rung}{' ' + name if name else ''} on {topology}: exit {proc.returncode} in "
          f"{took:.0f} s"
          + (f": {proc.stderr.strip().splitlines()[-1]}" if proc.returncode else ""),
          flush=True)
    if not path.exists():
      raise RuntimeError(f"lev-compile wrote no {path}: {proc.stderr[-2000:]}")
  return json.loads(path.read_text())


def _hours(seconds: float) -> str:
  return f"{seconds / 3600:.1f} h" if seconds >= 3600 else f"{seconds / 60:.0f} min"


def _step_estimate(rec: dict) -> tuple[float | None, str]:
  """(seconds, how) of a cell's estimated step, or (None, why not)."""
  step = rec["steps"][0]
  if "loop-free" in step["time_source"]:
    return step["step_s"], "loop-free compile"
  return None, "not estimated"


def table(records: dict, ladder) -> str:
  """Markdown: one row per (topology, rung) with Leviathan's ratios to its tied twin."""
  from lev_jax import flops  # pylint: disable=import-outside-toplevel
  rows = ["| slice | rung | per chip (GiB) | of HBM | vs tied (memory) | step (s, est.) "
          "| vs tied (step) | tokens/s (est.) | MFU (est.) | to token budget (est.) |",
          "|---|---|---|---|---|---|---|---|---|---|"]
  for (topology, rung), rec in records.items():
    step = rec["steps"][0]
    twin = records.get((topology, f"tied_{rung.split('_', 1)[1]}"))
    if not step["fits"]:
      rows.append(f"| {topology} | {rung} | does not fit: {step['error'][:80]} |"
                  " | | | | | | |")
      continue
    mem_ratio = step_ratio = ""
    if twin and twin["steps"][0]["fits"] and not rung.startswith("tied"):
      mem_ratio = f"{step['total_bytes'] / twin['steps'][0]['total_bytes']:.3f}x"
    seconds, how = _step_estimate(rec)
    steps = ladder.get_config(rung).train.steps
    cells = ["n/a"] * 4
    if seconds:
      twin_s = _step_estimate(twin)[0] if twin else None
      step_ratio = f"{seconds / twin_s:.3f}x" if twin_s and twin is not rec else ""
      mfu = flops.mfu(step["analytic_flops"], seconds, rec["chips"], step["device_kind"])
      cells = [f"{seconds:.3f} ({how})", f"{step['tokens'] / seconds:,.0f}",
               f"{mfu:.1%}" if mfu else "n/a", f"{_hours(steps * seconds)}"]
    rows.append(
        f"| {topology} ({rec['chips']} chips) | {rung} | {step['total_bytes'] / 2**30:.2f} "
        f"| {step['hbm_fraction']:.0%} | {mem_ratio} | {cells[0]} | {step_ratio} | "
        f"{cells[1]} | {cells[2]} | {cells[3]} ({steps:,} steps) |")
  return "\n".join(rows)


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--topologies", default=",".join(DEFAULT_TOPOLOGIES))
  p.add_argument("--rungs", default="", help="comma-separated (default: every ladder rung)")
  p.add_argument("--out", default="runs/pod_compile", help="output folder (resumable)")
  p.add_argument("--memory_only", default="", help="comma-separated topologies compiled "
                 "for memory only (lev-compile --noestimate_time: no step-time estimate)")
  p.add_argument("--lev_estimate", default="", help="comma-separated JSONs of benchmarks/"
                 "lev_tpu_estimate.py, quoted above the table (LEV alone, per core)")
  p.add_argument("--table", action="store_true", help="only print the table of the cells "
                 "already compiled")
  args = p.parse_args(argv)
  ladder = _ladder()
  rungs = [r for r in args.rungs.split(",") if r] or list(ladder.RUNGS)
  unknown = [r for r in rungs if r not in ladder.RUNGS]
  if unknown:
    p.error(f"--rungs: unknown {', '.join(unknown)}; expected some of "
            f"{', '.join(ladder.RUNGS)}")
  out = Path(args.out).resolve()
  records = {}
  for topology in [t for t in args.topologies.split(",") if t]:
    for rung in rungs:
      path = out / topology / f"{rung}.json"
      if args.table and not path.exists():
        continue
      estimate = topology not in args.memory_only.split(",")
      records[(topology, rung)] = compile_cell(rung, topology, out, estimate)
  first = next(iter(records.values()), None)
  header = (f"Compiled with jax {first['jax']}, {first['compiler']} on a CPU host; "
            "times, tokens/s and MFU are XLA:TPU cost-model ESTIMATES, not measurements."
            if first else "Nothing compiled yet.")
  for path in [Path(x) for x in args.lev_estimate.split(",") if x]:
    lev = json.loads(path.read_text())
    header += (f" LEV alone, {lev['impl']} core ({lev['rows']:,} rows on one chip, "
               f"{lev['rung']}'s LEV, forward + backward, loops unrolled): "
               f"{lev['loop_free']['step_s'] * 1e3:.1f} ms estimated, "
               f"{lev['loop_free']['bytes_accessed'] / 1e9:.1f} GB accessed.")
  text = header + "\n\n" + table(records, ladder) + "\n"
  out.mkdir(parents=True, exist_ok=True)
  (out / "table.md").write_text(text)
  print(text)
  return 0


if __name__ == "__main__":
  sys.exit(main())
