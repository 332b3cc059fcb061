"""benchmarks/maxtext_compare.py without MaxText: its argument checks, the commands it
builds for both sides, the parsing of MaxText's train_compile output and the table."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
import maxtext_compare as mc  # noqa: E402  pylint: disable=wrong-import-position

# train_compile's closing lines as MaxText 0.2.5 prints them (per-operand entries cut).
MAXTEXT_OUTPUT = """\
Starting train_compile.py...
I1202 00:07:11.645202 139909760588672 max_utils.py:835] System Information: Jax Version: 0.12.0
Jitting and compiling train step...
Jitting and compilation complete!
Finished train_compile.py successfully!
Cost analysis: {'utilization27{}': 2.0, 'bytes accessed5{}': 377674752.0, 'bytes accessed': 38583189504.0, 'transcendentals': 4294586112.0, 'flops': 8589680312320.0, 'bytes accessedout{}': 13668208640.0, 'optimal_seconds': 0.032139502465724945, 'bytes accessed0{}': 17652019200.0}
Memory analysis: CompiledMemoryStats(generated_code_size_in_bytes=50006528, argument_size_in_bytes=508363264, output_size_in_bytes=508205376, alias_size_in_bytes=508199424, temp_size_in_bytes=7197244576, host_generated_code_size_in_bytes=0, host_argument_size_in_bytes=0, host_output_size_in_bytes=0, host_alias_size_in_bytes=0, host_temp_size_in_bytes=0)
"""

SHAPE = {"d_model": 768, "n_heads": 12, "n_kv_heads": 12, "head_dim": 64, "d_ff": 2048,
         "vocab": 200_064, "seq_len": 512, "dtype": "bfloat16", "param_dtype": "float32",
         "norm_eps": 1e-5, "rope_theta": 10_000.0, "b1": 0.9, "b2": 0.95, "eps": 1e-8,
         "weight_decay": 0.1, "clip_norm": 1.0, "z_loss": 0.0}


def _args(*extra):
  return mc.parse_args(["--maxtext_python", sys.executable, *extra])


def _error(argv) -> str:
  with pytest.raises(mc.CompareError) as e:
    mc.parse_args(argv)
  return str(e.value)


def test_maxtext_python_is_required_with_one_line():
  proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "maxtext_compare.py")],
                        capture_output=True, text=True, timeout=60)
  assert proc.returncode == 2
  lines = proc.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith("maxtext_compare: error: --maxtext_python "
                                                 "is required")
  assert proc.stdout == ""


@pytest.mark.parametrize("argv, words", [
    (["--maxtext_python", "/nonexistent/python"], "no such executable"),
    (["--ours_python", ","], "--ours_python is empty"),
    (["--ours_python", "/nonexistent/python"], "--ours_python=/nonexistent/python"),
    (["--rung", "untied_200m"], "expected a rung of experiments/ladder.py"),
    (["--n_layers", "0"], "--n_layers=0"),
    (["--global_batch", "66"], "does not split over the 4 chips"),
    (["--topology", "v5p:2x2"], None),  # parsed: 4 chips, no shape check here
    (["--topology", "tpu-8"], "--topology=tpu-8"),
    (["--topology", "v5p-7"], "counts TensorCores"),
    (["--extra_ours", "config.train.loss_impl=chunked"], "expected a lev-compile flag"),
    (["--extra_maxtext", "num_vocab_tiling"], "expected MaxText's key=value"),
    (["--json", "/nonexistent/dir/out.json"], "existing folder"),
    (["--timeout", "0"], "--timeout=0"),
])
def test_bad_arguments_are_one_line(argv, words):
  full = ["--maxtext_python", sys.executable, *argv]
  if words is None:
    mc.parse_args(full)
    return
  message = _error(full)
  assert words in message and "\n" not in message


def test_topology_names():
  assert mc.maxtext_topology("v5p:2x2x1") == "v5p-8"
  assert mc.maxtext_topology("v5p-8") == "v5p-8"
  assert mc.maxtext_topology("v5p:4x4x4") == "v5p-128"
  assert mc.maxtext_topology("v6e:4x4") == "v6e-16"
  assert mc.maxtext_topology("v5litepod-16") == "v5e-16"
  assert mc.topology_chips("v5p-128") == 64


def test_maxtext_overrides_match_our_shape():
  a = _args()
  kv = dict(o.split("=", 1) for o in mc.maxtext_overrides(SHAPE, a, "/tmp/out"))
  assert kv["compile_topology"] == "v5p-8" and kv["compile_topology_num_slices"] == "1"
  assert (kv["base_emb_dim"], kv["base_num_query_heads"], kv["base_num_kv_heads"],
          kv["head_dim"], kv["base_mlp_dim"]) == ("768", "12", "12", "64", "2048")
  assert kv["base_num_decoder_layers"] == "2" and kv["vocab_size"] == "200064"
  assert kv["max_target_length"] == "512" and kv["per_device_batch_size"] == "16"
  assert kv["dtype"] == "bfloat16" and kv["weight_dtype"] == "float32"
  assert kv["attention"] == "dot_product" and kv["ici_fsdp_parallelism"] == "4"
  assert kv["logits_via_embedding"] == "true" and kv["dataset_type"] == "synthetic"
  untied = dict(o.split("=", 1) for o in mc.maxtext_overrides({**SHAPE, "tied": False}, a,
                                                                "/tmp/out"))
  assert untied["logits_via_embedding"] == "false"  # a Leviathan rung: MaxText untied
  assert kv["remat_policy"] == "none" and kv["scan_layers"] == "false"
  assert float(kv["normalization_layer_epsilon"]) == 1e-5
  assert "." in kv["adam_eps"].split("e")[0]  # YAML 1.1 reads "1e-08" as a string
  assert float(kv["adam_eps"]) == 1e-8 and float(kv["adam_b2"]) == 0.95


def test_extra_maxtext_comes_last_and_wins():
  a = _args("--extra_maxtext", "num_vocab_tiling=4",
            "--extra_maxtext", "ici_fsdp_parallelism=-1")
  overrides = mc.maxtext_overrides(SHAPE, a, "/tmp/out")
  assert overrides[-2:] == ["num_vocab_tiling=4", "ici_fsdp_parallelism=-1"]


def test_remat_none_goes_through_the_driver_full_through_stock_train_compile():
  none = _args()
  cmd = mc.maxtext_command(none, mc.maxtext_overrides(SHAPE, none, "/tmp/out"))
  assert cmd[:3] == [sys.executable, str(ROOT / "benchmarks" / "maxtext_compare.py"),
                     mc.DRIVER_FLAG]
  full = _args("--remat", "full")
  cmd = mc.maxtext_command(full, mc.maxtext_overrides(SHAPE, full, "/tmp/out"))
  assert cmd[:3] == [sys.executable, "-m", "maxtext.trainers.pre_train.train_compile"]
  assert "remat_policy=full" in cmd


def test_ours_command():
  a = _args("--extra_ours=--config.train.loss_impl=chunked")
  cmd = mc.ours_command("/py", a, "/tmp/o.json")
  assert cmd[:3] == ["/py", "-m", "lev_jax.cli.compile"]
  for flag in ("--config=experiments/ladder.py:tied_200m", "--config.model.n_layers=2",
               "--config.train.global_batch_size=64", "--config.model.attention=xla",
               "--config.model.scan_layers=False", "--config.model.remat=none",
               "--topology=v5p:2x2x1", "--steps=train", "--json=/tmp/o.json"):
    assert flag in cmd
  assert cmd[-1] == "--config.train.loss_impl=chunked"
  assert "--noestimate_time" not in cmd
  scanned = mc.ours_command("/py", _args("--scan_layers"), "/tmp/o.json")
  assert "--noestimate_time" in scanned and "--config.model.scan_layers=True" in scanned
  splash = _args("--attention=splash")  # the same kernel on both sides
  assert "--config.model.attention=splash" in mc.ours_command("/py", splash, "/tmp/o.json")
  assert "attention=flash" in mc.maxtext_overrides(SHAPE, splash, "/tmp/out")


def test_rung_shape_reads_the_ladder():
  shape = mc.rung_shape("tied_200m")
  assert {k: shape[k] for k in ("d_model", "n_heads", "n_kv_heads", "head_dim", "d_ff",
                                "vocab", "seq_len", "dtype", "param_dtype")} == {
      k: SHAPE[k] for k in ("d_model", "n_heads", "n_kv_heads", "head_dim", "d_ff", "vocab",
                            "seq_len", "dtype", "param_dtype")}


def test_parse_maxtext_output():
  f = mc.parse_maxtext_output(MAXTEXT_OUTPUT)
  assert f["flops"] == 8589680312320.0
  assert f["bytes_accessed"] == 38583189504.0  # the total, not 'bytes accessed5{}'
  assert f["step_s"] == pytest.approx(0.032139502465724945)
  assert f["time_source"] == "cost model"
  assert f["temp_bytes"] == 7197244576 and f["code_bytes"] == 50006528
  assert f["total_bytes"] == 508363264 + 508205376 - 508199424 + 7197244576 + 50006528


def test_parse_maxtext_output_without_a_positive_time_and_with_nan():
  text = (MAXTEXT_OUTPUT.replace("'optimal_seconds': 0.032139502465724945",
                                 "'optimal_seconds': -1.0")
          .replace("'utilization27{}': 2.0", "'utilization27{}': nan"))
  f = mc.parse_maxtext_output(text)
  assert f["step_s"] is None and f["time_source"] == "" and f["flops"] == 8589680312320.0


def test_parse_maxtext_output_names_what_is_missing():
  with pytest.raises(mc.CompareError, match="'Cost analysis:' and 'Memory analysis:'"):
    mc.parse_maxtext_output("Jitting and compiling train step...\nKilled\n")
  no_temp = MAXTEXT_OUTPUT.replace("temp_size_in_bytes=7197244576, ", "")
  with pytest.raises(mc.CompareError, match="temp_size_in_bytes"):
    mc.parse_maxtext_output(no_temp)


def _ours(step_s=0.0365, temp=9_449_000_000, error="", flops=8.359e12):
  record = {"steps": [{"step": "train", "error": error, "compiler_flops": flops,
                       "analytic_flops_per_chip": 8.2866e12,
                       "bytes_accessed": 4.1e10, "step_s": step_s,
                       "time_source": "cost model", "arguments_bytes": 505_000_000,
                       "outputs_bytes": 505_000_000, "alias_bytes": 505_000_000,
                       "temp_bytes": temp, "code_bytes": 40_000_000}]}
  return record


def test_ours_figures_and_ratios():
  ours = mc.ours_figures(_ours())
  maxtext = mc.parse_maxtext_output(MAXTEXT_OUTPUT)
  r = mc.ratios(ours, maxtext)
  assert r["step_s"] == pytest.approx(0.0365 / 0.032139502465724945)
  assert r["temp_bytes"] == pytest.approx(9_449_000_000 / 7197244576)
  assert r["flops"] == pytest.approx(8.359e12 / 8589680312320.0)
  with pytest.raises(mc.CompareError, match="did not compile"):
    mc.ours_figures(_ours(error="RESOURCE_EXHAUSTED"))
  priced = _ours(step_s=0.04)  # lev-compile priced splash; MaxText's flash is unpriced
  priced["steps"][0]["splash_s"] = 0.005
  assert mc.ours_figures(priced)["step_s"] == pytest.approx(0.035)


def test_table_labels_estimates_and_shows_ratios():
  maxtext = dict(mc.parse_maxtext_output(MAXTEXT_OUTPUT), side="MaxText 0.2.5",
                 versions={"jax": "0.12.0", "libtpu": "0.0.50.1"})
  same = dict(mc.ours_figures(_ours()), side="ours",
              versions={"jax": "0.12.0", "libtpu": "0.0.50.1"})
  failed = {"side": "ours", "versions": {"jax": "0.10.2", "libtpu": "0.0.42.1"},
            "error": "exit 1: boom"}
  table = mc.render_table(maxtext, [same, failed])
  lines = table.splitlines()
  assert "compiler ESTIMATE" in lines[0] and lines[1].startswith("|---")
  assert lines[2].startswith("| MaxText 0.2.5 (jax 0.12.0, libtpu 0.0.50.1) | 8.59 | 6.70 |")
  assert lines[3].startswith("| ours (jax 0.12.0, libtpu 0.0.50.1) | 8.36 | 8.80 |")
  assert lines[4] == "| ours / MaxText | 0.97x | 1.31x | 1.29x | 1.14x | 1.06x |"
  assert lines[5] == "| ours (jax 0.10.2, libtpu 0.0.42.1) | " + " | ".join(
      ["failed"] * 5) + " |"
  assert len(lines) == 6  # no ratio row for the failed side
  assert all(line.count("|") == 7 for line in lines)


def test_report_keeps_the_commands_and_the_estimate_label():
  a = _args()
  maxtext = dict(mc.parse_maxtext_output(MAXTEXT_OUTPUT), side="MaxText 0.2.5",
                 versions={"jax": "0.12.0", "libtpu": "0.0.50.1"},
                 command="/mt/python benchmarks/maxtext_compare.py --maxtext_driver x=1",
                 remat="none (driver)", log="/tmp/l")
  ours = dict(mc.ours_figures(_ours()), side="ours", python="/py", log="/tmp/o",
              versions={"jax": "0.12.0", "libtpu": "0.0.50.1"}, command="/py -m lev")
  report = mc.render_report(a, SHAPE, maxtext, [ours])
  assert "ESTIMATE" in report and "never a measurement" in report
  assert "  /mt/python benchmarks/maxtext_compare.py --maxtext_driver x=1" in report
  assert "  /py -m lev" in report
  assert "FSDP 4" in report and "vocab 200,064" in report


def test_a_loop_counted_once_is_flagged_not_compared():
  maxtext = dict(mc.parse_maxtext_output(MAXTEXT_OUTPUT), side="MaxText 0.2.5",
                 versions={"jax": "0.12.0", "libtpu": "0.0.50.1"}, command="mt", log="l")
  chunked = dict(mc.ours_figures(_ours(flops=1.2e12, step_s=0.0099)), side="ours",
                 python="/py", versions={"jax": "0.12.0", "libtpu": "0.0.50.1"},
                 command="/py -m lev", log="l")
  assert mc.model_flops([chunked]) == 8.2866e12
  assert mc.undercounted(chunked, 8.2866e12) and not mc.undercounted(maxtext, 8.2866e12)
  table = mc.render_table(maxtext, [chunked])
  assert "| ours (jax 0.12.0, libtpu 0.0.50.1) [loop counted once: undercount] | 1.20 |" \
      in table
  assert "MaxText 0.2.5 (jax 0.12.0, libtpu 0.0.50.1) |" in table  # not flagged
  # memory ratios stay; the cost model's figures are not comparable
  assert table.splitlines()[-1] == "| ours / MaxText | n/c | 1.31x | 1.29x | n/c | n/c |"
  report = mc.render_report(mc.parse_args(["--maxtext_python", sys.executable]), SHAPE,
                            maxtext, [chunked])
  assert "Model FLOPs per chip (lev_jax/flops.py): 8.29 TFLOP." in report
  assert "counted a loop body once" in report and "undercounts, not comparable" in report


FAKE_PYTHON = '''#!{python}
"""Stands in for MaxText's and our Pythons: versions, train_compile's output, a record."""
import json, sys
args = sys.argv[1:]
if args[0] == "-c":
  print(json.dumps({{d: {{"maxtext": "0.2.5", "lev_jax": "0.1.0", "jax": "0.12.0",
                         "jaxlib": "0.12.0", "libtpu": "0.0.50.1"}}[d] for d in args[2:]}}))
elif "lev_jax.cli.compile" in args:
  path = next(a.split("=", 1)[1] for a in args if a.startswith("--json="))
  json.dump({record}, open(path, "w"))
else:
  sys.stdout.write({output!r})
'''


def test_end_to_end_with_stand_in_pythons(tmp_path):
  fake = tmp_path / "python"
  fake.write_text(FAKE_PYTHON.format(python=sys.executable, record=repr(_ours()),
                                     output=MAXTEXT_OUTPUT))
  fake.chmod(0o755)
  out = tmp_path / "cmp.json"
  proc = subprocess.run(
      [sys.executable, str(ROOT / "benchmarks" / "maxtext_compare.py"),
       "--maxtext_python", str(fake), "--ours_python", str(fake), "--json", str(out)],
      capture_output=True, text=True, timeout=60)
  assert proc.returncode == 0, proc.stdout + proc.stderr
  assert "| ours / MaxText | 0.97x | 1.31x | 1.29x | 1.14x | 1.06x |" in proc.stdout
  assert "--maxtext_driver compile_topology=v5p-8" in proc.stdout
  record = json.loads(out.read_text())
  assert record["maxtext"]["versions"]["maxtext"] == "0.2.5"
  assert record["ratios"][0]["temp_bytes"] == pytest.approx(9_449_000_000 / 7197244576)
  assert record["undercounted"] == {"maxtext": False, "ours": [False]}
  assert "ESTIMATE" in record["estimates"] and record["table"].startswith("| per chip |")
