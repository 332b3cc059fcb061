"""lev-export: export -> load gives the same logits; LEV materialised; HF copy; refusals."""

import os
import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import pytest
from absl import flags
from flax import nnx

from conftest import byte_config
from lev_jax import inference
from lev_jax.cli import export
from lev_jax.data.tokenizer import ByteTokenizer
from lev_jax.model import Decoder

IDS = jnp.asarray(np.random.default_rng(1).integers(0, 259, (2, 9)), jnp.int32)


@nnx.jit
def logits(model):
  return model(IDS)


def lev_export(*args):
  """Runs lev-export's main in this process on fresh flags; returns what it printed."""
  fv = flags.FlagValues()
  export.define_flags(fv)
  fv(["lev-export", *args])
  export.main(["lev-export"], fv)


def snapshot(folder):
  return sorted((os.path.relpath(os.path.join(d, f), folder),
                 os.stat(os.path.join(d, f)).st_mtime_ns, os.stat(os.path.join(d, f)).st_size)
                for d, _, files in os.walk(folder) for f in files)


@pytest.fixture(scope="module")
def source(tmp_path_factory):
  """A Leviathan inference export (step 5) to export from, and its in-memory model."""
  c = byte_config("lev")
  im = inference.InferenceModel(Decoder(c, rngs=nnx.Rngs(0)), c, ByteTokenizer(), step=5,
                                token_counts_V=np.arange(259, dtype=np.int64))
  path = tmp_path_factory.mktemp("src") / "lev"
  inference.save(im, path)
  return path, im


def test_export_then_load_gives_identical_logits(source, tmp_path, capsys, monkeypatch):
  path, im = source
  before = snapshot(path)
  monkeypatch.chdir(tmp_path)
  lev_export(f"--checkpoint={os.path.relpath(path)}", "--output=out")
  printed = capsys.readouterr().out  # paths as given (docs/evaluation.md)
  assert f"step 5 of {os.path.relpath(path)} (lev) -> out\n" in printed
  assert "float32" in printed and " MB" in printed and "token_counts.npy" in printed
  again = inference.load(tmp_path / "out")
  assert again.step == 5 and again.config.model.embedding == "lev"
  np.testing.assert_array_equal(logits(again.model), logits(im.model))
  np.testing.assert_array_equal(again.token_counts_V, im.token_counts_V)
  assert snapshot(path) == before  # the source is only read


def test_materialised_lev_and_hf_copy(source, tmp_path, capsys):
  safetensors_numpy = pytest.importorskip("safetensors.numpy")
  path, im = source
  out = tmp_path / "mat"
  lev_export(f"--checkpoint={path}", f"--output={out}", "--materialize_lev", "--hf")
  printed = capsys.readouterr().out
  assert "lev -> materialised table" in printed and f"hf      {out / 'hf'}" in printed
  mat = inference.load(out)
  assert mat.config.model.embedding == "untied"
  lev_rows_VxD = np.asarray(nnx.jit(lambda lev: lev(jnp.arange(384)))(im.model.embedding.lev))
  table_VxD = np.asarray(mat.model.embedding.table[...])
  np.testing.assert_allclose(table_VxD, lev_rows_VxD, rtol=1e-6, atol=1e-7)
  np.testing.assert_allclose(logits(mat.model), logits(im.model), rtol=1e-5, atol=1e-5)
  tensors = safetensors_numpy.load_file(str(out / "hf" / "model.safetensors"))
  np.testing.assert_allclose(tensors["model.embed_tokens.weight"], table_VxD[:259],
                             rtol=1e-6, atol=1e-7)
  assert (out / "hf" / "config.json").exists() and (out / "hf" / "lev_tokenizer").is_dir()


def test_bad_inputs_are_one_line_exit_2(source, tmp_path, capsys):
  path, _ = source

  def fails(*args, match):
    with pytest.raises(SystemExit) as e:
      lev_export(*args)
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1 and err.startswith("lev-export: error: ")
    assert match in err, err

  fails(f"--checkpoint={tmp_path / 'nowhere'}", f"--output={tmp_path / 'o'}",
        match=f"{tmp_path / 'nowhere'}: no such checkpoint folder")
  fails(f"--checkpoint={path}", match="--output is required")
  (tmp_path / "full").mkdir()
  (tmp_path / "full" / "keep.txt").write_text("mine")
  for overwrite in ((), ("--overwrite",)):  # a folder of the user's: never replaced
    fails(f"--checkpoint={path}", f"--output={tmp_path / 'full'}", *overwrite,
          match="is not empty, not an earlier export (no export.json); expected a new or "
          "empty folder (--overwrite only replaces an earlier export)")
  assert (tmp_path / "full" / "keep.txt").read_text() == "mine"
  (tmp_path / "cb" / "checkpoints").mkdir(parents=True)  # issue 26: a run was replaced
  fails(f"--checkpoint={path}", f"--output={tmp_path / 'cb'}", "--overwrite",
        match="is a training run's folder, not an earlier export")
  before = snapshot(path)
  fails(f"--checkpoint={path}", f"--output={path / 'inside'}", "--overwrite",
        match="the source is never modified")
  fails(f"--checkpoint={path}", f"--output={path.parent}", "--overwrite",
        match="the source is never modified")
  fails(f"--checkpoint={path}", f"--output={tmp_path / 't'}", "--materialize_lev",
        "--step=4", match="holds step 5, not step 4")
  assert snapshot(path) == before and not (tmp_path / "t").exists()
  (tmp_path / "run" / "checkpoints" / "2").mkdir(parents=True)  # another run's step
  (tmp_path / "run" / ".lock").write_text("")
  fails(f"--checkpoint={path}", f"--output={tmp_path / 'run' / 'checkpoints' / '2' / 'e'}",
        match="a run's saved checkpoints (only that run's lev-train writes there)")
  assert os.listdir(tmp_path / "run" / "checkpoints" / "2") == []
  (tmp_path / "full" / "export.json").write_text("{}")  # an earlier export: replaced
  # newcomer pass 8: --overwrite deleted an export nested in it without a word
  fails(f"--checkpoint={path}", f"--output={tmp_path / 'full'}", "--overwrite",
        match=f"--output={tmp_path / 'full'} is an earlier export that also holds "
        "keep.txt, which lev-export did not write; --overwrite replaces the whole folder: "
        "move them aside first")
  (tmp_path / "full" / "keep.txt").unlink()
  (tmp_path / "full" / "lev_eval.json").write_text("{}")  # lev-eval's score of it
  # newcomer pass 9: --overwrite deleted lev-eval's lev_eval.json without a word
  fails(f"--checkpoint={path}", f"--output={tmp_path / 'full'}", "--overwrite",
        match=f"--output={tmp_path / 'full'} is an earlier export that also holds "
        "lev_eval.json, which lev-export did not write (lev_eval.json scores the export "
        "being replaced); --overwrite replaces the whole folder: move them aside first")
  assert (tmp_path / "full" / "lev_eval.json").read_text() == "{}"
  (tmp_path / "full" / "lev_eval.json").unlink()
  lev_export(f"--checkpoint={path}", f"--output={tmp_path / 'full'}", "--overwrite",
             "--dtype=bfloat16")
  assert inference.load(tmp_path / "full").dtype == "bfloat16"
  # newcomer pass 8: an export inside another export, or inside another run's folder
  fails(f"--checkpoint={path}", f"--output={tmp_path / 'full' / 'sub'}",
        match=f"--output={tmp_path / 'full' / 'sub'}: is inside {tmp_path / 'full'}, an "
        "export (only lev-export writes there); expected a path outside it")
  (tmp_path / "other" / "checkpoints").mkdir(parents=True)
  (tmp_path / "other" / "metrics.jsonl").touch()
  fails(f"--checkpoint={path}", f"--output={tmp_path / 'other' / 'exp'}",
        match=f"is inside {tmp_path / 'other'}, a training run's folder (only its "
        "lev-train writes there)")
  assert not (tmp_path / "full" / "sub").exists() and not (tmp_path / "other" / "exp").exists()


def test_command_line_error_is_one_line(tmp_path):
  proc = subprocess.run([sys.executable, "-m", "lev_jax.cli.export",
                         f"--checkpoint={tmp_path / 'missing'}", f"--output={tmp_path / 'o'}"],
                        capture_output=True, text=True, timeout=120,
                        env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
  assert proc.stderr.strip().splitlines() == [
      f"lev-export: error: {tmp_path / 'missing'}: no such checkpoint folder"]


def test_an_export_to_an_output_another_export_is_writing_is_refused(source, tmp_path,
                                                                     capsys):
  from lev_jax import lock
  path, _ = source
  out = tmp_path / "out"
  with lock.hold(out, prog="lev-export", inside=False):
    with pytest.raises(SystemExit) as e:
      lev_export(f"--checkpoint={path}", f"--output={out}")
  err = capsys.readouterr().err
  assert e.value.code == 2 and err.count("\n") == 1, err
  assert err.startswith(f"lev-export: error: {out} is in use by lev-export (pid "
                        f"{os.getpid()}, host "), err
  assert not out.exists() and sorted(os.listdir(tmp_path)) == []


@pytest.mark.parametrize("umask,mode", [(0o022, 0o644), (0o027, 0o640)])
def test_every_exported_file_honours_the_umask(source, tmp_path, capsys, umask, mode):
  pytest.importorskip("safetensors.numpy")
  path, _ = source
  out = tmp_path / "out"
  old = os.umask(umask)
  try:
    lev_export(f"--checkpoint={path}", f"--output={out}", "--hf")
  finally:
    os.umask(old)
  capsys.readouterr()
  modes = {os.path.relpath(os.path.join(d, f), out): oct(os.stat(os.path.join(d, f)).st_mode
                                                         & 0o777)
           for d, _, files in os.walk(out) for f in files}
  assert "hf/model.safetensors" in modes
  assert {p: m for p, m in modes.items() if m != oct(mode)} == {}


def _dead_pid():
  proc = subprocess.Popen(["true"])
  proc.wait()
  return proc.pid


def test_an_export_failing_while_writing_hf_leaves_nothing_under_output(source, tmp_path,
                                                                        monkeypatch):
  """Issue 26.16: a kill during --hf left export.json beside a partial hf/."""
  from lev_jax import hf_export
  path, _ = source
  real = hf_export.save_hf

  def killed(model, config, out_dir, **kwargs):
    os.makedirs(out_dir)
    open(os.path.join(out_dir, "model.safetensors"), "wb").close()  # partial
    raise KeyboardInterrupt
  monkeypatch.setattr(hf_export, "save_hf", killed)
  with pytest.raises(KeyboardInterrupt):
    export.export(str(path), str(tmp_path / "out"), hf=True)
  assert sorted(os.listdir(tmp_path)) == []
  monkeypatch.setattr(hf_export, "save_hf", real)


def test_the_next_export_cleans_up_after_one_killed_midway(source, tmp_path, caplog):
  """Issue 26.16: `.OUT.tmp-*` folders of a killed export were never removed; one of a
  live process is left alone, and an export a kill left aside is put back."""
  import socket
  path, _ = source
  out, host, dead = tmp_path / "out", socket.gethostname(), _dead_pid()
  stale = tmp_path / f".out.tmp-{dead}@{host}-0123abcd"
  live = tmp_path / f".out.tmp-{os.getpid()}@{host}-4567abcd"
  aside = tmp_path / f".out.old-{dead}@{host}-89abcdef"
  for folder in (stale, live, aside):
    folder.mkdir()
  (aside / "export.json").write_text("{}")  # the earlier export, being replaced
  with pytest.raises(ValueError, match="is not empty; pass --overwrite"):
    export.export(str(path), str(out))  # the earlier export is back: not overwritten
  assert sorted(os.listdir(tmp_path)) == sorted(["out", live.name])
  assert (out / "export.json").read_text() == "{}"
  assert f"removed {stale}, left by a killed export (pid {dead})" in caplog.text
  assert f"restored {out} from {aside.name}" in caplog.text


def test_a_symlinked_output_is_refused_before_writing(source, tmp_path, capsys):
  """Newcomer pass 4: --overwrite of a link to an earlier export wrote the export, then
  stopped on "Cannot call rmtree on a symbolic link", leaving .OUT.old-* (a link) that
  broke every later export; a dangling link was replaced after the whole export."""
  import socket
  path, _ = source
  earlier, gone = tmp_path / "earlier", tmp_path / "gone"
  earlier.mkdir()
  (earlier / "export.json").write_text("{}")
  (tmp_path / "link").symlink_to(earlier)
  (tmp_path / "dangling").symlink_to(gone)
  for name, target, what in (("link", earlier, ""),
                             ("dangling", gone, ", which does not exist")):
    with pytest.raises(SystemExit) as e:
      lev_export(f"--checkpoint={path}", f"--output={tmp_path / name}", "--overwrite")
    assert e.value.code == 2 and capsys.readouterr().err == (
        f"lev-export: error: --output={tmp_path / name} is a symbolic link to {target}"
        f"{what}; expected a folder (the export is renamed into place, which would "
        f"replace the link): give --output={target}\n")
  assert sorted(os.listdir(tmp_path)) == ["dangling", "earlier", "link"]
  aside = tmp_path / f".link.old-{_dead_pid()}@{socket.gethostname()}-0123abcd"
  aside.symlink_to(earlier)  # what that export left: the link set aside, a new folder in place
  (tmp_path / "link").unlink()
  (tmp_path / "link").mkdir()
  inference.clean_stale(tmp_path / "link")
  assert not os.path.lexists(aside) and (earlier / "export.json").exists()


def test_an_export_that_cannot_be_written_is_one_line_naming_the_details(
    source, tmp_path, capsys, monkeypatch):
  """Issue 26.14's sibling: a failed parameter write printed Orbax's tracebacks."""
  import errno
  import orbax.checkpoint as ocp
  path, _ = source
  out = tmp_path / "out"

  def disk_full(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")
  monkeypatch.setattr(ocp.StandardCheckpointer, "save", disk_full)
  with pytest.raises(SystemExit):
    lev_export(f"--checkpoint={path}", f"--output={out}")
  err = capsys.readouterr().err
  log = tmp_path / ".out.errors.log"
  assert err == (f"lev-export: error: {out}: the export could not be written, nothing was "
                 "changed there: the parameters could not be written ([Errno 28] No space "
                 f"left on device); details in {log}\n")
  assert sorted(os.listdir(tmp_path)) == [log.name]
  assert "Traceback" in log.read_text()


def test_an_output_that_cannot_be_written_names_the_flag_not_the_lock(source, capsys):
  """Issue 26: an unwritable OUTPUT's folder was reported as the export's internal lock
  file (`[Errno 2] ...: '/proc/.levexp.lock'`): the line names --output."""
  path, _ = source
  with pytest.raises(SystemExit) as e:
    lev_export(f"--checkpoint={path}", "--output=/proc/levexp")  # no file can be made there
  err = capsys.readouterr().err
  assert e.value.code == 2 and err.count("\n") == 1, err
  assert err == ("lev-export: error: --output=/proc/levexp: cannot write in /proc (No such "
                 "file or directory); expected a folder you can write to\n"), err
