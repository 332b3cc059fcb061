"""benchmarks/device_check.py: its tiny CPU mode runs every section end to end and
writes strict JSON with finite figures and the Markdown tables (the GPU run takes the
same code path at the ladder's shapes)."""

import math
import os
import subprocess
import sys
from pathlib import Path

from lev_jax.workdir import loads_json

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "device_check.py"
# Smaller than --tiny's 4 x 64 tokens (the sections and steps are the same; the six
# train steps compile and run in ~30 % less CPU).
BATCH, SEQ_LEN = 2, 16


def _finite(x) -> bool:
  return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _check_timed(r: dict, what: str):
  assert "error" not in r, f"{what}: {r['error']}"
  for key in ("step_s", "tokens_per_s", "model_tflops_per_s", "first_step_s", "init_s"):
    assert _finite(r[key]) and r[key] > 0, f"{what}: {key} = {r.get(key)!r}"
  assert r["reps"] >= 2 and len(r["step_s_all"]) == r["reps"], what
  assert r["mfu"] is None, f"{what}: a CPU has no known peak, so no MFU"
  assert r["warmup_losses"] and all(_finite(x) for x in r["warmup_losses"]), what
  assert r["model_flops_per_step"] > 0 and r["tokens_per_step"] == BATCH * SEQ_LEN, what


def test_tiny_cpu_mode_writes_every_section(tmp_path):
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  proc = subprocess.run(
      [sys.executable, str(SCRIPT), "--tiny", "--platform", "cpu", "--out", str(tmp_path),
       "--layers", "1", "--batch", str(BATCH), "--seq_len", str(SEQ_LEN)],
      cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
  data = loads_json((tmp_path / "device_check.json").read_text())

  assert data["status"] == "complete", data["budget_notes"]
  on = data["measured_on"]
  assert on["platform"] == "cpu" and on["jax"] and on["device_kind"]
  assert "not accelerator figures" in on["note"]
  assert data["settings"]["tiny"] is True and _finite(data["elapsed_s"])

  smoke = data["tied_vs_leviathan"]["smoke"]
  _check_timed(smoke["tied"], "tied")
  _check_timed(smoke["leviathan"], "leviathan")
  assert smoke["leviathan"]["lev_impl"] == "fused"
  assert "LEV:" in smoke["leviathan"]["lev_plan"]
  assert _finite(smoke["leviathan_over_tied"]) and smoke["leviathan_over_tied"] > 0

  dt = data["dtype"]
  assert set(dt["losses"]) == {"bfloat16", "float32"}
  for losses in dt["losses"].values():
    assert len(losses) == dt["steps"] and all(_finite(x) for x in losses)
  assert _finite(dt["final_rel_diff"]) and 0 <= dt["final_rel_diff"] <= dt["max_rel_diff"]
  # Same init and batches: the two dtypes start within bf16's rounding of each other.
  assert abs(dt["losses"]["bfloat16"][0] / dt["losses"]["float32"][0] - 1) < 1e-2

  impl = data["lev_impl"]["smoke"]
  _check_timed(impl["fused"], "fused")
  _check_timed(impl["pallas"], "pallas (interpreted on a CPU)")
  _check_timed(impl["vectorized"], "vectorized")
  assert impl["base"] == "fused"  # the smoke config's core
  for core in ("pallas", "vectorized"):
    assert _finite(impl[f"{core}_over_fused"])
    # same init, same batch, same LEV maths
    assert impl[f"{core}_first_loss_abs_diff"] < 1e-3

  md = (tmp_path / "device_check.md").read_text()
  assert "1 x cpu" in md and "not accelerator figures" in md
  for title in ("## Tied vs Leviathan", "## bf16 vs float32",
                "## LEV cores: fused, vectorized, Pallas"):
    assert title in md
  assert "| smoke | smoke.py:leviathan |" in md and "| smoke | pallas |" in md
