"""lev-compile: the command's table, JSON, exit status and one-line errors.

Runs lev-compile as `python -m lev_jax.cli.compile ARGS` runs it (sys.argv, its `run`,
its exit status, stdout and stderr), each run in a child forked from one driver process
(`python tests/test_cli_compile.py`, started once for this file) that imported jax and
lev_jax once: a fresh Python would import them again for every run (~2.5 CPU-s each),
and what the imports print is added to every run's output as it would be. The compiling
cases need libtpu (`pip install -e '.[tpu-aot]'`) and skip without it.
"""

import atexit
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path

import pytest

# One pytest-xdist worker runs this file (--dist loadgroup): the driver starts once.
pytestmark = pytest.mark.xdist_group("cli_compile")

REPO = Path(__file__).resolve().parent.parent
TIMEOUT_S = 600  # a run still going after this is killed (SIGALRM): exit status -14
needs_libtpu = pytest.mark.skipif(
    importlib.util.find_spec("libtpu") is None,
    reason="libtpu is not installed (pip install -e '.[tpu-aot]'; .ci/run installs it)")


def _point(fd: int, path: str, mode: int) -> None:
  """File descriptor `fd` (0, 1, 2) opened on `path` instead."""
  opened = os.open(path, mode)
  os.dup2(opened, fd)
  os.close(opened)


def _serve():
  """The driver: imports what every lev-compile run imports (no backend started, so
  forking stays safe), then for each line of stdin (a JSON list of arguments) forks a
  child that runs lev-compile with them from the repository, and answers one JSON line:
  its exit status, stdout and stderr."""
  sys.path.insert(0, str(REPO))  # this checkout's lev_jax, as `python -m` from REPO
  os.chdir(REPO)
  reply = os.fdopen(os.dup(1), "w")
  # Not a TemporaryDirectory: its clean-up is an atexit function, which each child runs.
  tmp = tempfile.mkdtemp(prefix="lev_compile_driver_")
  try:
    # What importing prints (a warning, a C++ log line) a fresh process would print too.
    start = {name: os.path.join(tmp, f"import.{name}") for name in ("stdout", "stderr")}
    saved = [os.dup(1), os.dup(2)]
    for fd, name in ((1, "stdout"), (2, "stderr")):
      _point(fd, start[name], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    # pylint: disable=import-outside-toplevel,unused-import
    import jax
    import jax.experimental.pallas.tpu
    import jax.experimental.topologies
    from jax.experimental.pallas.ops.tpu import splash_attention
    from lev_jax import aot, gpu_targets, sharding, topology, train
    from lev_jax.cli import compile as compile_cli
    from lev_jax.config import validate
    # pylint: enable=import-outside-toplevel,unused-import
    sys.stdout.flush()
    sys.stderr.flush()
    for fd, old in zip((1, 2), saved):
      os.dup2(old, fd)
    for line in sys.stdin:
      out = {name: os.path.join(tmp, name) for name in ("stdout", "stderr")}
      for name in out:
        with open(start[name], "rb") as src, open(out[name], "wb") as dst:
          dst.write(src.read())
      sys.stdout.flush()
      sys.stderr.flush()
      pid = os.fork()
      if pid == 0:  # the child: lev-compile with these arguments
        signal.alarm(TIMEOUT_S)
        _point(0, os.devnull, os.O_RDONLY)
        for fd, name in ((1, "stdout"), (2, "stderr")):
          _point(fd, out[name], os.O_WRONLY | os.O_APPEND)
        sys.argv = [compile_cli.__file__, *json.loads(line)]
        code = 0
        try:
          compile_cli.run()
        except SystemExit as e:
          code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        except BaseException:  # pylint: disable=broad-except
          traceback.print_exc()
          code = 1
        try:  # a process's end, less the interpreter's finalisation
          atexit._run_exitfuncs()  # pylint: disable=protected-access
        finally:
          for stream in (sys.stdout, sys.stderr):
            stream.flush()
          os._exit(code)
      _, status = os.waitpid(pid, 0)
      texts = {}
      for name, path in out.items():
        with open(path, errors="replace") as f:
          texts[name] = f.read()
      reply.write(json.dumps({"returncode": os.waitstatus_to_exitcode(status), **texts})
                  + "\n")
      reply.flush()
  finally:
    shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture(scope="module")
def driver():
  proc = subprocess.Popen([sys.executable, __file__], stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE, text=True, cwd=REPO,
                          env=dict(os.environ, JAX_PLATFORMS="cpu"))
  yield proc
  proc.stdin.close()
  proc.wait(timeout=60)


@pytest.fixture
def lev_compile(driver):
  """lev_compile(*args): `python -m lev_jax.cli.compile *args` from the repository, as a
  CompletedProcess (returncode, stdout, stderr)."""
  def run(*args):
    driver.stdin.write(json.dumps(list(args)) + "\n")
    driver.stdin.flush()
    answer = driver.stdout.readline()
    assert answer, f"the lev-compile driver ended (exit status {driver.poll()})"
    r = json.loads(answer)
    return subprocess.CompletedProcess(["lev-compile", *args], r["returncode"], r["stdout"],
                                       r["stderr"])
  return run


def _one_error_line(proc) -> str:
  assert proc.returncode == 2, proc.stderr[-2000:]
  lines = [l for l in proc.stderr.splitlines() if l.strip()]
  assert len(lines) == 1, proc.stderr[-2000:]
  assert lines[0].startswith("lev-compile: error: ")
  return lines[0]


@pytest.mark.parametrize("args,needle", [
    (["--topology=v9-8"], "unknown TPU generation 'v9'"),
    (["--topology=v5p-128", "--steps=train,backward"], "--steps=train,backward: expected"),
    (["--json="], "--json is empty (an unset shell variable?); expected a JSON file"),
    (["--json=/no/such/folder/c.json"], "folder /no/such/folder does not exist"),
    (["--config=experiments/smoke.py:tied", "--config.model.d_model=-1"], "d_model"),
    # newcomer pass 6: nan passed absl's bounds
    (["--min_free=nan"], "flag --min_free=nan: expected a fraction in [0.0, 0.99], not nan"),
])
def test_bad_input_is_one_line_before_anything_is_compiled(args, needle, tmp_path,
                                                          lev_compile):
  proc = lev_compile(*args)
  assert needle in _one_error_line(proc)
  assert not list(tmp_path.iterdir())


def test_a_json_path_under_a_file_says_it_is_a_file(tmp_path, capsys):
  # newcomer pass 7: "folder .../afile does not exist or is not writable"
  from lev_jax.cli import compile as compile_cli
  (tmp_path / "afile").write_text("x")
  for path in (tmp_path / "afile" / "x.json", tmp_path / "afile" / "sub" / "x.json"):
    with pytest.raises(SystemExit):
      compile_cli._check_outputs(json_path=str(path), dump_hlo=None)
    assert capsys.readouterr().err == (
        f"lev-compile: error: --json={path}: {tmp_path / 'afile'} is a file, not a folder; "
        "expected a file in an existing folder you can write to\n")


def test_an_output_inside_a_saved_checkpoint_is_one_line(tmp_path, capsys):
  from lev_jax.cli import compile as compile_cli
  (tmp_path / "run" / "checkpoints" / "4").mkdir(parents=True)
  (tmp_path / "run" / "token_counts.npy").write_bytes(b"")  # a run's workdir
  for flag in ("json", "dump_hlo"):
    path = str(tmp_path / "run" / "checkpoints" / "4" / "c")
    with pytest.raises(SystemExit) as e:
      compile_cli._check_outputs(**{"json_path" if flag == "json" else flag: path,
                                    "dump_hlo" if flag == "json" else "json_path": None})
    assert e.value.code == 2
    assert capsys.readouterr().err.startswith(
        f"lev-compile: error: --{flag}={path}: is inside {tmp_path / 'run' / 'checkpoints'}")
  (tmp_path / "exp").mkdir()  # newcomer pass 9: --json inside an export passed
  (tmp_path / "exp" / "export.json").write_text("{}")
  with pytest.raises(SystemExit):
    compile_cli._check_outputs(json_path=str(tmp_path / "exp" / "c.json"), dump_hlo=None)
  assert capsys.readouterr().err.startswith(
      f"lev-compile: error: --json={tmp_path / 'exp' / 'c.json'}: is inside "
      f"{tmp_path / 'exp'}, an export (only lev-export writes there)")


def test_a_topology_error_names_the_flag():
  """`--topology=v5e:3x3` is named as typed (lev_jax.topology says `topology 'NAME'`)."""
  from lev_jax.cli.compile import flag_named
  assert flag_named("topology 'v5e:3x3': shape 3x3 is not ...", "v5e:3x3") == (
      "--topology=v5e:3x3: shape 3x3 is not ...")
  assert flag_named("topology v5e:2x2 (shape v5e:2x2, x1 slices): ...", "v5e:2x2") == (
      "--topology=v5e:2x2 (shape v5e:2x2, x1 slices): ...")
  assert flag_named("mesh ... topology 'x'", "x") == "mesh ... topology 'x'"


@pytest.mark.skipif(importlib.util.find_spec("jax_plugins") is not None
                    and importlib.util.find_spec("jax_plugins.xla_cuda12") is not None,
                    reason="the CUDA plugin is installed here")
def test_a_gpu_target_without_the_cuda_plugin_names_the_install(lev_compile):
  line = _one_error_line(lev_compile("--topology=h100-8", "--config=experiments/smoke.py:tied"))
  assert "the CUDA plugin for compiling for a GPU is not installed" in line
  assert "pip install 'jax-cuda12-plugin==" in line


@needs_libtpu
def test_a_fitting_config_prints_the_table_and_writes_the_json(tmp_path, lev_compile):
  out, hlo = tmp_path / "compile.json", tmp_path / "hlo"
  proc = lev_compile("--config=experiments/smoke.py:tied", "--topology=v5p:2x2x1",
                     f"--json={out}", f"--dump_hlo={hlo}", "--min_free=0.5",  # leaves > half
                     "--config.model.n_layers=1",  # the smoke shape, one layer: 35 % less CPU
                     # splash with segment ids and grouped-query heads (2 a key head),
                     # split over tensor = 2 in its shard_map (the test_attention case)
                     "--config.data.segment_masking=True", "--config.model.n_kv_heads=2",
                     "--config.mesh.tensor=2")
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "lev-compile: smoke_tied on v5p:2x2x1 (4 x TPU v5" in proc.stdout
  assert "mesh data 1 x fsdp 2 x tensor 2" in proc.stdout
  program = ("loss dense, logits float32, attention splash (auto), model.remat none, "
             "float32 compute")  # the smoke config: auto -> splash on a TPU
  assert f"lev-compile: {program}\n" in proc.stdout
  assert proc.stdout.count("compiler ESTIMATE") == 2
  record = json.loads(out.read_text())
  assert record["program"] == program
  assert record["chips"] == 4 and record["compiler"].startswith("libtpu ") and record["jax"]
  train, evaluate = record["steps"]
  assert (train["step"], evaluate["step"]) == ("train", "eval")
  assert train["fits"] and train["total_bytes"] == (
      train["arguments_bytes"] + train["outputs_bytes"] - train["alias_bytes"]
      + train["temp_bytes"] + train["code_bytes"])
  assert train["tokens"] == 16 * 128 and 0 < train["mfu"] < 1
  for step in (train, evaluate):  # the cost model prices no Mosaic kernel: splash added
    assert 0 < step["splash_s"] < step["step_s"]
    assert "splash attention at its model FLOPs at the peak bf16 rate" in step["time_source"]
  # forward + backward (3x the forward) of the same 16 sequences as the eval batch
  assert train["splash_s"] == pytest.approx(3 * evaluate["splash_s"], rel=1e-6)
  assert sorted(p.name for p in tmp_path.iterdir()) == ["compile.json", "hlo"]
  for step in ("train", "eval"):  # XLA's dumps of each step, kept: Mosaic kernels in both
    (dump,) = (hlo / step).glob(f"*jit_{step}_step*after_optimizations.txt")
    assert "tpu_custom_call" in dump.read_text(), step


@needs_libtpu
def test_a_config_that_cannot_fit_exits_2_naming_shortfall_buffers_and_levers(
    tmp_path, lev_compile):
  out = tmp_path / "oom.json"
  proc = lev_compile("--config=experiments/smoke.py:tied", "--topology=v5e:2x2",
                     "--steps=train", "--config.model.vocab_size=65536",
                     "--config.model.n_layers=1", "--config.train.seq_len=512",
                     "--config.train.global_batch_size=1024", f"--json={out}")
  line = _one_error_line(proc)
  assert "the train step of smoke_tied does not fit v5e:2x2: needs " in line
  assert "GiB available (short by " in line and "largest buffers: " in line
  assert "levers: train.grad_accum_steps (now 1), model.remat (now none)" in line
  assert json.loads(out.read_text())["steps"][0]["fits"] is False


def test_min_free_refuses_a_step_that_leaves_too_little_hbm():
  """--min_free (the refusal line, its figures against the HBM that may be used): the
  CLI's exit-2 path is the not-fitting test's above; a compile is not needed here."""
  from lev_jax import aot
  from lev_jax.config import base_config
  from lev_jax.topology import GiB, parse_topology
  c = base_config()
  c.name = "smoke_tied"
  step = aot.StepReport(step="eval", device_kind="TPU v5 lite", chips=4, hbm_bytes=16 * GiB,
                        tokens=1, analytic_flops=1.0, compile_s=1.0,
                        arguments_bytes=int(0.15 * GiB), temp_bytes=int(0.5 * GiB))
  assert step.fits and aot.short_steps([step]) == [] == aot.short_steps([step], 0.95)
  assert aot.short_steps([step], 0.99) == [step]
  line = aot.shortfall_line(step, parse_topology("v5e:2x2"), c, 0.99)
  assert "the eval step of smoke_tied leaves less than 99% of HBM free on v5e:2x2: " in line
  assert ("needs 0.65 GiB per chip, 0.16 GiB usable (16.00 GiB HBM with 99% kept free) "
          "(short by 0.49 GiB)") in line


@needs_libtpu
def test_a_mesh_that_does_not_divide_the_slice_is_one_line(lev_compile):
  proc = lev_compile("--config=experiments/smoke.py:tied", "--topology=v5p:2x2x1",
                     "--config.mesh.tensor=3")
  assert "(1, -1, 3) does not divide 4 devices" in _one_error_line(proc)


def test_without_config_the_default_it_compiles_is_named_first(monkeypatch):
  """Issue 26: lev-compile without --config compiled the 200M default without saying
  so; the line logged before compiling names the default (file, variant, config name)."""
  from absl import flags
  from ml_collections import config_flags
  from lev_jax.cli import compile as compile_cli
  default = f"{REPO / 'experiments' / 'smoke.py'}:tied"
  fv = flags.FlagValues()
  monkeypatch.setattr(sys, "argv", ["lev-compile"])
  config_flags.DEFINE_config_file("config", default, flag_values=fv)
  fv(["lev-compile"])
  assert compile_cli.default_config_note(fv["config"], fv.config, "v5p-128") == (
      f"no --config: compiling the default, {default} (smoke_tied), for "
      "--topology=v5p-128")
  fv(["lev-compile", f"--config={default}"])
  assert compile_cli.default_config_note(fv["config"], fv.config, "v5p-128") is None


if __name__ == "__main__":
  _serve()


@pytest.mark.parametrize("rung,topology_name,program", [
    # The ladder's own slice: the dense loss, no remat (4,096 tokens a chip).
    ("tied_200m", "v5p-128", "loss dense (auto), logits bfloat16, attention splash (auto), "
     "model.remat none (auto), bfloat16 compute"),
    # 4 chips at the same global batch: the chunked loss in o200k's 24 vocab chunks and
    # dots_no_batch (issue 24's <= 20 GiB target: 14.65 GiB of temporaries, compiled).
    ("tied_200m", "v5p:2x2x1", "loss chunked (auto) in vocab chunks of 8,336 ids, logits "
     "bfloat16, attention splash (auto), model.remat dots_no_batch (auto), bfloat16 compute"),
])
def test_the_program_line_names_every_auto_choice(rung, topology_name, program):
  """program_line resolves train.loss_impl, train.loss_vocab_chunk, model.attention and
  model.remat for the slice, without compiling anything."""
  sys.path.insert(0, str(REPO))
  from lev_jax.cli.compile import program_line  # pylint: disable=import-outside-toplevel
  from lev_jax.experiments import load_experiment  # pylint: disable=import-outside-toplevel
  from lev_jax.topology import parse_topology  # pylint: disable=import-outside-toplevel
  config = load_experiment(REPO / "experiments" / "ladder.py").get_config(rung)
  assert program_line(config, parse_topology(topology_name)) == program
