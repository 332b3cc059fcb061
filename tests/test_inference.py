"""Loading for inference from a workdir or an export; params-only export; LEV materialised."""

import json
import logging
import re
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from conftest import byte_config, write_workdir
from lev_jax import inference
from lev_jax.data.tokenizer import ByteTokenizer

IDS = jnp.asarray(np.random.default_rng(0).integers(0, 259, (2, 7)), jnp.int32)
# One pytest-xdist worker runs this file (--dist loadgroup): its module fixtures (a
# workdir, an export, workdir templates) are built once.
pytestmark = pytest.mark.xdist_group("inference")


@nnx.jit
def logits(model):
  return model(IDS)


@pytest.fixture(scope="module")
def lev_workdir(tmp_path_factory):
  path = tmp_path_factory.mktemp("workdir")
  state = write_workdir(path, byte_config("lev"))
  return path, state


@pytest.fixture(scope="module")
def tied_workdir(tmp_path_factory):
  """copy(dst, steps=(1,)) -> dst: a copy of a tied `write_workdir` (no tokenizer
  fingerprint recorded), written once per `steps`; tests damage their copies."""
  written = {}

  def copy(dst, steps=(1,)):
    if steps not in written:
      written[steps] = tmp_path_factory.mktemp("tied_workdir")
      write_workdir(written[steps], byte_config("tied"), steps=steps)
    shutil.copytree(written[steps], dst, dirs_exist_ok=True)
    return dst

  return copy


def test_workdir_loads_the_latest_or_a_chosen_step(lev_workdir):
  path, state = lev_workdir
  im = inference.load(path)
  assert im.step == 2 and im.tokenizer == ByteTokenizer() and im.token_counts_V is None
  want = jax.tree.leaves(state["params"])
  got = jax.tree.leaves(jax.tree.map(np.asarray, nnx.state(im.model)))
  assert all(np.array_equal(a, b) for a, b in zip(want, got))
  assert inference.load(path, step=1).step == 1
  with pytest.raises(inference.InferenceError, match=r"no checkpoint at step 3; steps: \[1, 2\]"):
    inference.load(path, step=3)


def test_export_reload_gives_identical_logits_and_never_touches_the_source(lev_workdir, tmp_path):
  path, _ = lev_workdir
  im = inference.load(path)
  im.token_counts_V = np.arange(259, dtype=np.int64)
  before = sorted(p.name for p in (path / "checkpoints").iterdir())
  info = inference.save(im, tmp_path / "export")
  assert info["format"] == inference.EXPORT_FORMAT and info["step"] == 2
  assert not any((tmp_path / "export" / "params").glob("**/opt_state*"))
  again = inference.load(tmp_path / "export")
  np.testing.assert_array_equal(logits(again.model), logits(im.model))
  np.testing.assert_array_equal(again.token_counts_V, im.token_counts_V)
  assert sorted(p.name for p in (path / "checkpoints").iterdir()) == before
  with pytest.raises(inference.InferenceError, match="exists"):
    inference.save(im, tmp_path / "export")
  assert [p.name for p in tmp_path.iterdir()] == ["export"]  # no temporary left behind


def test_materialised_lev_table_equals_lev_at_every_id_and_gives_the_same_logits(
    lev_workdir, tmp_path):
  im = inference.load(lev_workdir[0])
  inference.save(im, tmp_path / "x", materialize_lev=True)
  mat = inference.load(tmp_path / "x")
  assert mat.config.model.embedding == "untied"
  assert json.loads((tmp_path / "x" / "export.json").read_text())["embedding"] == "lev"
  # One program: op by op, LEV's forward pass compiled ~3 s of small programs.
  lev_rows = nnx.jit(lambda m: m.embedding.lev(jnp.arange(384)))(im.model)
  np.testing.assert_allclose(mat.model.embedding.table[...], lev_rows, rtol=1e-6, atol=1e-7)
  np.testing.assert_allclose(logits(mat.model), logits(im.model), rtol=1e-5, atol=1e-5)
  assert not any("lev" in "/".join(map(str, p)) for p, _ in nnx.to_flat_state(nnx.state(mat.model)))
  with pytest.raises(inference.InferenceError, match="only a 'lev' model"):
    inference.lev_to_table(mat.model, mat.config)


def test_export_dtype_is_applied_and_recorded(tmp_path):
  from lev_jax.train import create_model
  c = byte_config("tied")
  im = inference.InferenceModel(create_model(c), c, ByteTokenizer(), step=3)
  info = inference.save(im, tmp_path / "bf16", dtype="bfloat16")
  assert info["dtype"] == "bfloat16" and info["bytes"] == 2 * info["params"]
  half = inference.load(tmp_path / "bf16")
  assert {x.dtype for x in jax.tree.leaves(nnx.state(half.model))} == {
      jnp.dtype("bfloat16")}
  np.testing.assert_allclose(logits(half.model), logits(im.model), atol=0.1)


def test_a_run_s_replaced_tokenizer_is_named(tied_workdir, tmp_path):
  """Newcomer pass 8: another dataset's tokenizer/ copied into a run was blamed on its
  intact token_counts.npy (with the advice to delete it); the run's data_report.json
  records the fingerprint it trained with."""
  tied_workdir(tmp_path)
  fingerprint = ByteTokenizer().fingerprint
  report = tmp_path / "data_report.json"
  from lev_jax.checkpoint import CheckpointReader
  with CheckpointReader(tmp_path / "checkpoints") as reader:  # the step's run (checked first)
    run = reader.saved_progress(reader.all_steps()[-1])["run"]
  report.write_text(json.dumps({"source": "embedded", "tokenizer_fingerprint": fingerprint,
                                "run": run}))
  assert inference.load(tmp_path).tokenizer == ByteTokenizer()
  report.write_text(json.dumps({"source": "embedded", "tokenizer_fingerprint": "0" * 64,
                                "run": run}))
  with pytest.raises(inference.InferenceError, match=re.escape(
      f"{tmp_path / 'tokenizer'}: tokenizer fingerprint {fingerprint[:16]} differs from "
      f"{'0' * 16}, the one this run trained with ({report}): the folder was replaced (or "
      "that file edited); restore it")):
    inference.load(tmp_path)


def test_the_checkpoint_s_record_checks_the_tokenizer_when_data_report_is_unreadable(
    tmp_path, caplog):
  """Newcomer passes 10 and 11: with data_report.json unreadable and another dataset's
  tokenizer/ copied in, lev-sample decoded with it after a warning (and lev-eval blamed
  token_counts.npy); each checkpoint step's progress item records the fingerprint too."""
  fingerprint = ByteTokenizer().fingerprint
  good, swapped = tmp_path / "good", tmp_path / "swapped"
  for path, recorded in ((good, fingerprint), (swapped, "0" * 64)):
    write_workdir(path, byte_config("tied"), steps=(1,), tokenizer_fingerprint=recorded)
    (path / "data_report.json").write_text("garbage")
  # newcomer pass 16 (J09b): the step itself is now refused (its run and model cannot be
  # checked against an unreadable record); with the record deleted it loads with a
  # warning, and the tokenizer is still checked against the step's own record
  with pytest.raises(inference.InferenceError, match=(
      re.escape(f"{good / 'data_report.json'}: cannot be read ("))):
    inference.load(good)
  for path in (good, swapped):
    (path / "data_report.json").unlink()
  with caplog.at_level(logging.WARNING):
    assert inference.load(good).tokenizer == ByteTokenizer()
  assert f"{good / 'data_report.json'} is missing" in caplog.text
  with pytest.raises(inference.InferenceError, match=re.escape(
      f"{swapped / 'tokenizer'}: tokenizer fingerprint {fingerprint[:16]} differs from "
      f"{'0' * 16}, the one this run trained with (recorded in "
      f"{swapped / 'checkpoints' / '1' / 'progress'}): the folder was replaced; restore it")):
    inference.load(swapped)


def test_bad_input_is_one_clear_error(lev_workdir, tmp_path):
  path, _ = lev_workdir
  cases = [
      (dict(path=tmp_path / "none"), "no such checkpoint folder"),
      (dict(path=tmp_path), "neither a training workdir"),
      (dict(path=path, dtype="int8"), "dtype = 'int8': expected one of"),
      (dict(path=path, expect_config=byte_config("tied")),
       "model.embedding: checkpoint 'lev', this run 'tied'"),
  ]
  for kwargs, message in cases:
    with pytest.raises(inference.InferenceError, match=message):
      inference.load(**kwargs)
  # issue 26: a step folder, the checkpoints folder, a run that has saved nothing yet
  step_dir = next(p for p in (path / "checkpoints").iterdir() if p.name.isdigit())
  for folder, message in ((step_dir, f"{step_dir}: a checkpoint step folder; give the "
                           f"run's folder and the step: --checkpoint={path} "
                           f"--step={step_dir.name}"),
                          (path / "checkpoints", f"--checkpoint={path} "),
                          (tmp_path / "young", "a training run with no complete "
                           "checkpoint yet (no checkpoints/; it is still starting")):
    (tmp_path / "young").mkdir(exist_ok=True)
    (tmp_path / "young" / ".lock").touch()
    with pytest.raises(inference.InferenceError, match=re.escape(message)):
      inference.load(folder)
  (tmp_path / "empty" / "checkpoints").mkdir(parents=True)  # newcomer pass 4: as above
  said = (f"{tmp_path / 'empty'}: a training run with no complete checkpoint yet (none in "
          "checkpoints/; it is still starting or compiling, or stopped before its first save)")
  with pytest.raises(inference.InferenceError, match=f"^{re.escape(said)}$"):
    inference.load(tmp_path / "empty")
  assert inference.step_error(tmp_path / "empty", 3) == said
  # newcomer pass 4: an export without export.json was "a training run with no checkpoint"
  (tmp_path / "exp" / "params").mkdir(parents=True)
  (tmp_path / "exp" / "config.json").write_text("{}")
  with pytest.raises(inference.InferenceError, match=re.escape(
      f"{tmp_path / 'exp'}: looks like an export missing its export.json (it holds "
      "config.json, params/; lev-export writes export.json last")):
    inference.load(tmp_path / "exp")
  # newcomer pass 5: lev-prepare-data's output was "a run still compiling"
  (tmp_path / "prep" / "tokenizer").mkdir(parents=True)
  (tmp_path / "prep" / "token_counts.npy").touch()
  (tmp_path / "prep" / "dataset_info.json").write_text("{}")
  with pytest.raises(inference.InferenceError, match=re.escape(
      f"{tmp_path / 'prep'}: prepared data (lev-prepare-data's output: dataset_info.json), "
      "not a training workdir")):
    inference.load(tmp_path / "prep")
  (tmp_path / "exp" / "export.json").write_bytes(b"\xff{}")  # was a bare codec line
  with pytest.raises(inference.InferenceError, match=re.escape(
      f"{tmp_path / 'exp' / 'export.json'}: unreadable export file (not UTF-8 text (byte "
      "0xff at offset 0))")):
    inference.load(tmp_path / "exp")


# Orbax reads the arrays of a step in one asyncio.gather (jax_array_handlers), which
# raises at the first array whose tensorstore open fails; asyncio_utils.run_sync then
# closes its event loop while the other arrays' tensorstore futures are pending, and
# their completion callbacks (tensorstore's C++ threads) find the loop closed:
# "RuntimeError: Event loop is closed" through sys.unraisablehook, which pytest reports
# as a PytestUnraisableExceptionWarning. The cause is inside Orbax / tensorstore; lev_jax
# has already turned the restore's own error into the one line this test checks.
_ORBAX_CLOSED_LOOP = pytest.mark.filterwarnings(
    "ignore:(?s)Exception ignored in.*Event loop is closed:"
    "pytest.PytestUnraisableExceptionWarning")


@pytest.mark.parametrize("damage,match", [
    ("delete", r"checkpoints/2: state/manifest.ocdbt is missing"),
    ("flip", r"checkpoints/2: state/manifest.ocdbt differs from its checksum"),
    pytest.param("delete_unsigned",
                 r"checkpoints/2 cannot be read: it is incomplete or corrupt .*",
                 marks=_ORBAX_CLOSED_LOOP),
])
def test_a_damaged_step_is_named_with_the_steps_that_remain(tied_workdir, tmp_path, damage,
                                                           match, caplog):
  from lev_jax.checkpoint_checks import MANIFEST
  tied_workdir(tmp_path, steps=(1, 2))
  target = tmp_path / "checkpoints" / "2" / "state" / "manifest.ocdbt"
  if damage == "flip":
    data = bytearray(target.read_bytes())
    data[len(data) // 2] ^= 0x01
    target.write_bytes(bytes(data))
  else:
    target.unlink()
  if damage == "delete_unsigned":  # a checkpoint without checksums (an older run)
    (tmp_path / "checkpoints" / "2" / MANIFEST).unlink()
  with pytest.raises(inference.InferenceError, match=match + r".*other steps: \[1\]"):
    inference.load(tmp_path)
  # lev-eval, lev-sample and lev-export all load here: an unverified step is named
  assert ("checkpoints/2 has no checksum manifest" in caplog.text) == (
      damage == "delete_unsigned")
  assert inference.load(tmp_path, step=1).step == 1


def test_save_never_writes_over_or_around_its_source(lev_workdir, tmp_path):
  path, _ = lev_workdir
  im = inference.load(path)
  for out in (path, path / "export", path.parent):  # is, inside, holds the source
    with pytest.raises(inference.InferenceError, match="inside it or holds it"):
      inference.save(im, out, overwrite=True)
  assert inference.load(path).step == 2


@pytest.fixture(scope="module")
def tied_export(tmp_path_factory):
  """A tied export (step 3, with token counts) to copy and damage."""
  from lev_jax.train import create_model
  c = byte_config("tied")
  im = inference.InferenceModel(create_model(c), c, ByteTokenizer(), step=3,
                                token_counts_V=np.arange(259, dtype=np.int64))
  path = tmp_path_factory.mktemp("tied") / "export"
  inference.save(im, path)
  return path


def _copy(export, dst):
  shutil.copytree(export, dst)
  return dst


def _edit_json(path, **changes):
  """Changes fields of a JSON file; for export.json, also drops its record digest (as
  an export from before it), so that the check under test is the one that speaks."""
  data = json.loads(path.read_text())
  data.update(changes)
  data.pop("record_sha256", None)
  path.write_text(json.dumps(data))
  return data


AGAIN = "export the checkpoint again"


def test_an_export_records_checksums_and_a_damaged_file_is_named(tied_export, tmp_path,
                                                                  caplog):
  """Newcomer pass 9: flipped bytes in an export's params/ gave `validation loss nan`
  (exit 0) and lev-sample decoded from it; export.json now records every file's sha256."""
  info = json.loads((tied_export / "export.json").read_text())
  listed = set(info["checksums"]["sha256"])
  assert {"config.json", "token_counts.npy", "tokenizer/tokenizer.json"} <= listed
  assert any(f.startswith("params/") for f in listed) and "export.json" not in listed
  assert info["tokenizer_fingerprint"] == ByteTokenizer().fingerprint
  assert inference.load(tied_export).step == 3 and "unverified" not in caplog.text
  flipped = _copy(tied_export, tmp_path / "flipped")
  target = max((p for p in (flipped / "params").rglob("*") if p.is_file()),
               key=lambda p: p.stat().st_size)  # the largest: an array chunk
  data = bytearray(target.read_bytes())
  data[len(data) // 2] ^= 0x01
  target.write_bytes(bytes(data))
  with pytest.raises(inference.InferenceError, match="^" + re.escape(
      f"{target}: differs from the sha256 export.json records; the file was changed or "
      f"damaged after the export: {AGAIN}") + "$"):
    inference.load(flipped)
  gone = _copy(tied_export, tmp_path / "gone")
  (gone / "tokenizer" / "tokenizer.json").unlink()
  with pytest.raises(inference.InferenceError, match=re.escape(
      f"{gone / 'tokenizer' / 'tokenizer.json'}: missing; export.json lists it (deleted "
      f"after the export): {AGAIN}")):
    inference.load(gone)
  (gone / "token_counts.npy").unlink()  # lev-eval's advice for counts the data contradicts
  (gone / "tokenizer" / "tokenizer.json").write_bytes(
      (tied_export / "tokenizer" / "tokenizer.json").read_bytes())
  assert inference.load(gone).token_counts_V is None
  added = _copy(tied_export, tmp_path / "added")
  (added / "params" / "extra").write_text("x")
  with pytest.raises(inference.InferenceError, match=re.escape(
      f"{added / 'params' / 'extra'}: not in the checksums export.json records")):
    inference.load(added)
  (added / "params" / "extra").unlink()
  (added / "lev_eval.json").write_text("{}")  # lev-eval's default output: not read back
  assert inference.load(added).step == 3


def test_an_export_from_before_checksums_loads_with_one_warning(tied_export, tmp_path,
                                                                caplog):
  old = _copy(tied_export, tmp_path / "old")
  info = json.loads((old / "export.json").read_text())
  del info["checksums"], info["tokenizer_fingerprint"], info["record_sha256"]
  (old / "export.json").write_text(json.dumps(info))
  assert inference.load(old).step == 3 and inference.load(old).step == 3
  assert caplog.text.count(f"export {old}: export.json records no checksums (made by an "
                           "older lev_jax); its files are read unverified") == 1


def test_an_edited_export_record_is_refused(tied_export, tmp_path):
  """Newcomer pass 10: export.json's "step" edited 6 -> 60 was reported as step 60."""
  edited = _copy(tied_export, tmp_path / "edited")
  info = json.loads((edited / "export.json").read_text())
  info["step"] = 60
  (edited / "export.json").write_text(json.dumps(info))
  with pytest.raises(inference.InferenceError, match=re.escape(
      f"{edited / 'export.json'}: its fields differ from the digest it records "
      "(record_sha256): the file was edited after the export; export the checkpoint "
      "again")):
    inference.load(edited)


def test_an_export_with_non_finite_parameters_is_refused(tmp_path):
  """Newcomer pass 9: a NaN model evaluated to `validation loss nan` with exit 0."""
  from lev_jax.train import create_model
  c = byte_config("tied")
  model = create_model(c)
  model.final_norm.scale[...] = model.final_norm.scale[...].at[0].set(jnp.nan)
  inference.save(inference.InferenceModel(model, c, ByteTokenizer(), step=1), tmp_path / "e")
  with pytest.raises(inference.InferenceError, match="^" + re.escape(
      f"export {tmp_path / 'e'}: parameter final_norm/scale holds NaN or infinite values; "
      "expected a finite model") + ".*$"):
    inference.load(tmp_path / "e")


@pytest.mark.filterwarnings("error::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.parametrize("checksums", [True, False])
def test_an_export_config_edited_to_other_shapes_is_one_line(tied_export, tmp_path,
                                                             checksums):
  """Newcomer pass 9: d_model 32 -> 64 in config.json was the right line, then Orbax's
  pending reads printed "Event loop is closed" tracebacks; the shapes config.json gives
  are now compared with params/'s stored ones before any array is read."""
  edited = _copy(tied_export, tmp_path / "edited")
  if not checksums:  # an export from before them: the shapes alone find the edit
    info = json.loads((edited / "export.json").read_text())
    del info["checksums"], info["record_sha256"]
    (edited / "export.json").write_text(json.dumps(info))
  config = json.loads((edited / "config.json").read_text())
  config["model"]["d_model"] = 64
  (edited / "config.json").write_text(json.dumps(config))
  with pytest.raises(inference.InferenceError, match="^" + re.escape(
      f"{edited / 'config.json'}: its model shapes differ from those stored in "
      f"{edited / 'params'}/ (") + r"[a-z_/0-9]+: stored \(.*\), expected \(.*\) \(and \d+ "
      r"more\)\): the config was edited after the export; restore it or export the "
      r"checkpoint again$"):
    inference.load(edited)
  if checksums:  # an edit that keeps the shapes: the checksum names it
    config["model"]["d_model"] = 32
    config["name"] = "renamed"
    (edited / "config.json").write_text(json.dumps(config))
    with pytest.raises(inference.InferenceError, match=re.escape(
        f"{edited / 'config.json'}: ") + ".*edited after the export: restore it or "
        "export the checkpoint again$"):
      inference.load(edited)


def test_an_export_s_replaced_tokenizer_is_named(tied_export, tmp_path):
  """Newcomer pass 9: another corpus's tokenizer/ in an export was blamed on its intact
  token_counts.npy; export.json records the fingerprint the export was made with."""
  swapped = _copy(tied_export, tmp_path / "swapped")
  _edit_json(swapped / "export.json", tokenizer_fingerprint="0" * 64)  # as another's
  with pytest.raises(inference.InferenceError, match="^" + re.escape(
      f"{swapped / 'tokenizer'}: tokenizer fingerprint "
      f"{ByteTokenizer().fingerprint[:16]} differs from {'0' * 16}, the one "
      f"{swapped / 'export.json'} records: the folder was replaced (or that file edited); "
      f"restore it or {AGAIN}") + "$"):
    inference.load(swapped)


def test_a_run_s_unreadable_data_report_says_the_tokenizer_is_unchecked_and_is_refused(
    tied_workdir, tmp_path, caplog):
  """Newcomer pass 9: a garbage data_report.json turned the tokenizer check off silently;
  pass 16 (J09b-d): and the run and model checks too, so another run's step loaded."""
  tied_workdir(tmp_path)
  report = tmp_path / "data_report.json"
  for garbage, why in (("{not json", "Expecting property name"),
                       ("[1, 2]", "it holds list, not a JSON object")):
    caplog.clear()
    report.write_text(garbage)
    with pytest.raises(inference.InferenceError, match=re.escape(
        f"{report}: cannot be read (") + ".*" + re.escape(why)):
      inference.load(tmp_path)
  caplog.clear()
  report.unlink()  # a run from before data_report.json: nothing to say
  inference.load(tmp_path)
  assert "cannot be read" not in caplog.text


def test_a_manifest_replaced_by_a_folder_is_named_as_the_manifest(tied_workdir, tmp_path):
  """Newcomer pass 11: checksums.json a folder was reported as the step's config being
  unreadable."""
  tied_workdir(tmp_path)
  manifest = tmp_path / "checkpoints" / "1" / "checksums.json"
  manifest.unlink()
  manifest.mkdir()
  with pytest.raises(inference.InferenceError, match=re.escape(
      f"{manifest}: the checksum manifest is unreadable (a folder in its place)")):
    inference.load(tmp_path)
