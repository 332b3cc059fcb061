"""A trained model ready for inference, from a training workdir or an inference export.

Two layouts are read:

  training workdir (lev-train)     WORKDIR/checkpoints/<step>/{state, config}
                                   WORKDIR/tokenizer/        (save_tokenizer)
                                   WORKDIR/token_counts.npy  (int64 [V], training split)
  inference export (lev-export)    DIR/params/               (Orbax, parameters only)
                                   DIR/config.json           (the experiment config)
                                   DIR/tokenizer/, DIR/token_counts.npy
                                   DIR/export.json           (written last: complete)

`save` writes the second from either: parameters only (no optimizer state, no data
position), cast to a chosen dtype, and optionally with LEV *materialised*: the LEV
generator evaluated once at every id into a plain V x D input table, so inference needs
no generator (the model becomes `model.embedding = "untied"` with the same head; its
logits equal the LEV model's). The export (with what `also` adds, e.g. lev-export's
hf/) is written into a temporary folder beside it and renamed into place when complete:
a failed export never leaves a half-written folder under the requested name, and the
source checkpoint is only read. An export killed midway (kill -9) leaves that temporary
(`.NAME.tmp-<pid>@<host>-<hex>`), or, killed while replacing an earlier export, that one
aside (`.NAME.old-...`): the next export to NAME cleans them up (`clean_stale`).

export.json records the sha256 and size of every file written before it ("checksums",
as a checkpoint step's checksums.json) and the tokenizer's fingerprint
("tokenizer_fingerprint"). Loading an export checks them before restoring (hashing the
files it reads at every load: params/, config.json, tokenizer/, token_counts.npy, not
hf/), then the shapes config.json gives against params/'s stored ones, then that every
restored value is finite: a damaged, edited or swapped file is one InferenceError line
naming it. An export made before the checksums were recorded loads with a warning.

The folder names are lev_jax.workdir's; every Orbax read and write is
lev_jax.checkpoint's (`CheckpointReader`, `write_params`, `read_params`). Source: Flax
NNX docs, "nnx.split / nnx.merge".
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import hashlib
import json
import logging
import os
import socket
import uuid

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from etils import epath
from flax import nnx

from lev_jax import checkpoint
from lev_jax.checkpoint import error_line
from lev_jax.checkpoint_checks import (MANIFEST, SHAPE_FIELDS, CheckpointCorruptError,
                                       config_differences, file_digests, misnamed_step,
                                       not_a_step, run_record_missing, run_shape_problem,
                                       step_files, verify_manifest)
from lev_jax.config import DTYPES, ConfigError, from_dict
from lev_jax.data.files import read_npy, npy_bytes, write_bytes_atomic
from lev_jax.data.tokenizer_files import load_tokenizer, save_tokenizer
from lev_jax.embeddings import input_table
from lev_jax.lock import _pid_running
from lev_jax.model import Decoder
from lev_jax.workdir import (CHECKPOINTS, DATA_REPORT, EXPORT_CONFIG, EXPORT_JSON,
                             EXPORT_PARAMS, HF, LOCK, PREPARED_INFO, RUN_OUTPUTS,
                             TOKEN_COUNTS, TOKENIZER, file_sha256, is_prepared_data,
                             loads_json, read_small_text, write_json_atomic)

EXPORT_FORMAT = "lev_jax.inference/1"

# The export's folders whose every file `load` reads and export.json must list.
_CHECKED_FOLDERS = (EXPORT_PARAMS, TOKENIZER)

_warned_unverified: set[str] = set()  # exports already warned about (once per process)


class InferenceError(ValueError):
  """A checkpoint or export that cannot be loaded as asked (path, step, config, dtype)."""


@dataclasses.dataclass
class InferenceModel:
  """A model with what inference needs beside it.

  Attributes:
    model: the Decoder; parameters in `dtype`.
    config: the experiment config it was trained with (for a materialised export,
      `model.embedding = "untied"`; `export.json` records the original).
    tokenizer: encode / decode / eos_id / vocab_size (lev_jax.data.tokenizer).
    step: the optimizer step of the checkpoint.
    token_counts_V: int64 [vocab_size] training-split count of each id, or None when
      the source has none (then frequency buckets cannot be formed).
    source: the path it was loaded from.
    dtype: the parameters' dtype name.
  """

  model: Decoder
  config: ml_collections.ConfigDict
  tokenizer: object
  step: int
  token_counts_V: np.ndarray | None = dataclasses.field(default=None, repr=False)
  source: str = ""
  dtype: str = "float32"


def _path(path) -> epath.Path:
  p = epath.Path(os.path.expanduser(os.fspath(path)))
  return p if "://" in os.fspath(p) else p.absolute()  # Orbax needs absolute paths


def _check_dtype(dtype: str | None) -> None:
  if dtype is not None and dtype not in DTYPES:
    raise InferenceError(f"dtype = {dtype!r}: expected one of {', '.join(DTYPES)}")


def _cast(params, dtype: str | None):
  if dtype is None:
    return params
  want = jnp.dtype(dtype)
  return jax.tree.map(
      lambda x: x.astype(want) if jnp.issubdtype(x.dtype, jnp.floating) else x, params)


def _abstract(config: ml_collections.ConfigDict):
  """(graphdef, abstract params) of `config`'s Decoder, no memory allocated."""
  model = nnx.eval_shape(lambda: Decoder(config, rngs=nnx.Rngs(0)))
  return nnx.split(model, nnx.Param)


def _config_from_json(data: dict, where) -> ml_collections.ConfigDict:
  """The stored config over `base_config()` (`config.from_dict`)."""
  try:
    return from_dict(data, where)
  except ConfigError as e:
    raise InferenceError(str(e)) from e


def _check_expected(saved: dict, expect: ml_collections.ConfigDict | None, where) -> None:
  if expect is None:
    return
  diffs = config_differences(saved, expect, SHAPE_FIELDS)
  if diffs:
    raise InferenceError(f"{where} does not match the given config's model shape: "
                         + "; ".join(diffs))


def _check_run_tokenizer(folder: epath.Path, tokenizer, checkpoint_record: tuple | None = None
                         ) -> None:
  """A run's tokenizer/ is the one it trained with: its fingerprint equals the one the
  checkpoint's progress item records (`checkpoint_record`: (fingerprint, step folder),
  written by lev-train with each step since it was recorded) and the one its
  data_report.json records (written by lev-train; runs from before either was recorded,
  and exports, have none and are not checked). A workdir's unreadable data_report.json
  never gets here: `checkpoint_checks.run_shape_problem` refuses its steps first.

  Raises:
    InferenceError: they differ (newcomer pass 8: another dataset's tokenizer/ copied
      in was blamed on an intact token_counts.npy; pass 10: with data_report.json
      unreadable too, lev-sample decoded with it), naming both fingerprints.
  """
  if checkpoint_record is not None and checkpoint_record[0] != tokenizer.fingerprint:
    raise InferenceError(
        f"{folder / TOKENIZER}: tokenizer fingerprint {tokenizer.fingerprint[:16]} differs "
        f"from {checkpoint_record[0][:16]}, the one this run trained with (recorded in "
        f"{checkpoint_record[1]}): the folder was replaced; restore it (a lev-train of the "
        "run's own config writes it again)")
  report_path = folder / DATA_REPORT
  if not report_path.exists():  # a run from before data_report.json: nothing to compare
    return
  try:
    recorded = loads_json(read_small_text(report_path)).get("tokenizer_fingerprint")
  except (OSError, ValueError, AttributeError):  # a workdir's was refused before this
    return  # (checkpoint_checks.run_shape_problem); an export writes none of its own
  if isinstance(recorded, str) and recorded != tokenizer.fingerprint:
    raise InferenceError(
        f"{folder / TOKENIZER}: tokenizer fingerprint {tokenizer.fingerprint[:16]} differs "
        f"from {recorded[:16]}, the one this run trained with ({report_path}): the folder "
        "was replaced (or that file edited); restore it (a lev-train of the run's own "
        "config writes both again)")


def _tokenizer_and_counts(folder: epath.Path, config: ml_collections.ConfigDict,
                          checkpoint_record: tuple | None = None):
  """The tokenizer and counts saved beside a checkpoint; else rebuilt from the data.
  checkpoint_record: see `_check_run_tokenizer`."""
  counts_path = folder / TOKEN_COUNTS
  if (folder / TOKENIZER).exists():
    tokenizer = load_tokenizer(folder / TOKENIZER)
    _check_run_tokenizer(folder, tokenizer, checkpoint_record)
    counts = read_npy(counts_path) if counts_path.exists() else None
    return tokenizer, counts
  from lev_jax import data as data_lib  # an older workdir: rebuild from the data config
  logging.warning("%s has no tokenizer/ folder; rebuilding the tokenizer from config.data",
                  folder)
  bundle = data_lib.load(config)
  return bundle.tokenizer, bundle.token_counts_V


def _not_a_workdir(root: epath.Path) -> str:
  """Why `root` (an existing folder with no checkpoints/ and no export.json) cannot be
  loaded: a step folder or the checkpoints/ folder itself (name the workdir and --step),
  an export whose export.json is missing (its params/; what it holds named), prepared
  data (lev-prepare-data's), a training run that has saved no checkpoint yet, or
  neither a workdir nor an export."""
  if root.name.isdigit() and root.parent.name == CHECKPOINTS:
    return (f"{root}: a checkpoint step folder; give the run's folder and the step: "
            f"--checkpoint={root.parent.parent} --step={root.name}")
  if root.name == CHECKPOINTS:
    return (f"{root}: the checkpoints folder; give the run's folder: "
            f"--checkpoint={root.parent} (--step for a step other than the latest)")
  if (root / EXPORT_PARAMS).exists():  # only lev-export writes params/
    held = sorted(p.name + "/" * p.is_dir() for p in root.iterdir()
                  if not p.name.startswith("."))
    return (f"{root}: looks like an export missing its {EXPORT_JSON} (it holds "
            f"{', '.join(held)}; lev-export writes {EXPORT_JSON} last: the export did not "
            "finish or the file was deleted); export the checkpoint again")
  if is_prepared_data(root):  # it holds tokenizer/ and token_counts.npy too
    return (f"{root}: prepared data (lev-prepare-data's output: {PREPARED_INFO}), not a "
            f"training workdir (no {CHECKPOINTS}/) or an inference export (no "
            f"{EXPORT_JSON}); expected a lev-train workdir or a lev-export folder")
  if any((root / name).exists() for name in (LOCK, *RUN_OUTPUTS)):
    return _no_checkpoint_yet(root, f"no {CHECKPOINTS}/")
  return (f"{root}: neither a training workdir (no {CHECKPOINTS}/) nor an inference "
          f"export (no {EXPORT_JSON})")


def _no_checkpoint_yet(root: epath.Path, detail: str) -> str:
  """The line for a training run `root` with no complete checkpoint (`detail`: no
  checkpoints/, or none complete in it)."""
  return (f"{root}: a training run with no complete checkpoint yet ({detail}; it is still "
          "starting or compiling, or stopped before its first save)")


def _load_workdir(root: epath.Path, step: int | None, dtype, expect) -> InferenceModel:
  ckpt_dir = root / CHECKPOINTS
  if not ckpt_dir.exists():
    raise InferenceError(_not_a_workdir(root))
  odd = not_a_step(ckpt_dir)  # before Orbax lists an empty folder as the latest step
  if odd:
    raise InferenceError(odd)
  with checkpoint.CheckpointReader(ckpt_dir) as reader:  # never saves or deletes
    steps = reader.all_steps()
    if not steps:
      raise InferenceError(misnamed_step(ckpt_dir) or  # newcomer pass 11: "still starting"
                           _no_checkpoint_yet(root, f"none in {CHECKPOINTS}/"))
    if step is None:
      step = steps[-1]
    elif step not in steps:
      raise InferenceError(f"{ckpt_dir}: no checkpoint at step {step}; steps: {steps}")
    where = f"checkpoint {ckpt_dir / str(step)}"
    others = [s for s in steps if s != step]
    hint = f"; other steps: {others} (--step)" if others else ""
    try:  # the checksums written at save (checkpoint_checks.MANIFEST), then the config item
      if not verify_manifest(ckpt_dir / str(step)):
        logging.warning("%s has no checksum manifest (%s: written by an older lev_jax, or "
                        "deleted); reading it unverified", where, MANIFEST)
      saved = reader.saved_config(step)
    except CheckpointCorruptError as e:
      raise InferenceError(f"{e}{hint}") from None
    except Exception as e:  # a deleted or damaged config item: any Orbax error type
      raise InferenceError(f"{where}: its config cannot be read ({error_line(e)}){hint}"
                           ) from e
    _check_expected(saved, expect, where)
    try:  # its run id; a damaged progress item is named below, with the parameters
      progress = reader.saved_progress(step)
    except Exception:  # pylint: disable=broad-except  # any Orbax error type
      progress = None
    problem = run_shape_problem(root, saved, where, progress)  # passes 13, 14: a foreign step
    if problem:
      raise InferenceError(problem)
    missing = run_record_missing(root)
    if missing:
      logging.warning("%s", missing)
    config = _config_from_json(saved, where)
    graphdef, abstract = _abstract(config)
    try:  # parameters only: the optimizer state is never read
      params = reader.params(step, abstract)
      fingerprint = reader.saved_progress(step).get("tokenizer_fingerprint")
    except Exception as e:  # tensorstore / Orbax errors of a damaged step are of any type
      raise InferenceError(f"{where} cannot be read: it is incomplete or corrupt "
                           f"({error_line(e)}){hint}") from e
  _check_finite(params, where)
  params = _cast(params, dtype)
  record = ((fingerprint, ckpt_dir / str(step) / "progress")
            if isinstance(fingerprint, str) else None)
  tokenizer, counts = _tokenizer_and_counts(root, config, record)
  return InferenceModel(nnx.merge(graphdef, params), config, tokenizer, step, counts,
                        os.fspath(root), dtype or config.model.param_dtype)


def _read_json(path: epath.Path):
  """The JSON in an export's small file `path` (workdir.read_small_text).

  Raises:
    InferenceError: `PATH: unreadable export file (why)`: missing, too large, not UTF-8,
      not JSON.
  """
  try:
    return json.loads(read_small_text(path))
  except (OSError, ValueError) as e:
    raise InferenceError(f"{path}: unreadable export file ({e})") from e


def _export_files(folder: epath.Path) -> dict[str, epath.Path]:
  """{path relative to `folder`: path} of every file of an export (but export.json and
  what other commands add at its top level, e.g. lev-eval's lev_eval.json, which are
  never read back), recursively (`checkpoint_checks.step_files`)."""
  return {rel: p for rel, p in step_files(folder).items()
          if "/" in rel or rel in (EXPORT_CONFIG, TOKEN_COUNTS)}


def _checksums(folder: epath.Path) -> dict:
  """export.json's "checksums" of `folder`: {"sha256": {file: hex}, "bytes": {file: size}}
  (`checkpoint_checks.file_digests`, a checkpoint manifest's layout)."""
  return file_digests(_export_files(folder))


def _verify_export(root: epath.Path, info: dict, config_json: bool) -> None:
  """Checks the files `load` reads (all but hf/) against export.json's "checksums":
  config.json alone (`config_json`; checked after `_check_export_shapes`, so an edit
  that changed the model's shapes is named as such) or every other one. An export
  without them (made by an older lev_jax) is a warning, once per process.

  Raises:
    InferenceError: the checksums are not {file: hex digest}, a listed file is missing
      (token_counts.npy aside: without it the data's counts are used), its size or
      sha256 differs, or a file of params/ or tokenizer/ is not listed: one line naming
      the file and saying to export the checkpoint again.
  """
  record = root / EXPORT_JSON
  sums = info.get("checksums")
  if sums is None:
    if os.fspath(root) not in _warned_unverified:
      _warned_unverified.add(os.fspath(root))
      logging.warning("export %s: %s records no checksums (made by an older lev_jax); "
                      "its files are read unverified: export the checkpoint again to add "
                      "them", root, EXPORT_JSON)
    return
  expected = sums.get("sha256") if isinstance(sums, dict) else None
  sizes = sums.get("bytes", {}) if isinstance(sums, dict) else None
  if (not isinstance(expected, dict) or not expected or not isinstance(sizes, dict)
      or not all(isinstance(k, str) and isinstance(v, str) for k, v in expected.items())):
    raise InferenceError(f"{record}: \"checksums\" is not lev-export's {{\"sha256\": "
                         "{file: hex}, \"bytes\": {file: size}}; export the checkpoint again")
  again = "export the checkpoint again"
  unlisted = sorted(rel for rel in _export_files(root) if not config_json
                    and rel.split("/")[0] in _CHECKED_FOLDERS and rel not in expected)
  if unlisted:
    raise InferenceError(f"{root / unlisted[0]}: not in the checksums {EXPORT_JSON} records "
                         f"(added after the export, or the folder replaced); {again}")
  for rel, digest in sorted(expected.items()):
    if rel.split("/")[0] == HF or (rel == EXPORT_CONFIG) != config_json:  # hf/: not read
      continue
    f = root / rel
    edited = (f"edited after the export: restore it or {again}" if rel == EXPORT_CONFIG
              else f"the file was changed or damaged after the export: {again}")
    if not f.exists() and rel == TOKEN_COUNTS:  # deleted on purpose: lev-eval's advice
      continue  # when it differs from the data's counts (the data's are used then)
    if not f.exists():
      raise InferenceError(f"{f}: missing; {EXPORT_JSON} lists it (deleted after the "
                           f"export): {again}")
    if rel in sizes and f.stat().length != sizes[rel]:  # first: no file is read
      raise InferenceError(f"{f}: {f.stat().length} bytes, {EXPORT_JSON} records "
                           f"{sizes[rel]}; {edited}")
    if file_sha256(f) != digest:
      raise InferenceError(f"{f}: differs from the sha256 {EXPORT_JSON} records; {edited}")


def _record_digest(info: dict) -> str:
  """sha256 of export.json's other fields (sorted JSON): "record_sha256", so that an
  edit of the record itself (newcomer pass 10: "step" 6 -> 60 was reported as step 60)
  is found; the files are covered by "checksums"."""
  fields = {k: v for k, v in info.items() if k != "record_sha256"}
  return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()


def _check_record(root: epath.Path, info: dict) -> None:
  """Raises InferenceError when export.json's "record_sha256" (exports from before it
  have none) is not the digest of its other fields: the record was edited."""
  recorded = info.get("record_sha256")
  if recorded is not None and recorded != _record_digest(info):
    raise InferenceError(f"{root / EXPORT_JSON}: its fields differ from the digest it "
                         "records (record_sha256): the file was edited after the export; "
                         "export the checkpoint again")


def _check_export_tokenizer(root: epath.Path, info: dict) -> None:
  """The export's tokenizer/ is the one it was exported with: its fingerprint equals
  export.json's "tokenizer_fingerprint" (exports made before it was recorded are not
  checked; a tokenizer/ that cannot be loaded is left to the checksums, then to
  `_tokenizer_and_counts`, which name its file).

  Raises:
    InferenceError: they differ (a tokenizer/ of another corpus copied in), naming
      tokenizer/, export.json and both fingerprints.
  """
  recorded = info.get("tokenizer_fingerprint")
  if not isinstance(recorded, str) or not (root / TOKENIZER).exists():
    return
  try:
    found = load_tokenizer(root / TOKENIZER).fingerprint
  except Exception:  # a damaged tokenizer/: the checksums name the file
    return
  if found != recorded:
    raise InferenceError(
        f"{root / TOKENIZER}: tokenizer fingerprint {found[:16]} differs from "
        f"{recorded[:16]}, the one {root / EXPORT_JSON} records: the folder was replaced "
        "(or that file edited); restore it or export the checkpoint again")


def _check_finite(params, where: str) -> None:
  """Raises InferenceError naming the first parameter holding a NaN or infinity."""
  bad = checkpoint.nonfinite_leaves(params)
  if bad:
    more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
    raise InferenceError(f"{where}: parameter {bad[0].removesuffix('/value')}{more} holds "
                         "NaN or infinite values; expected a finite model (a run that "
                         "diverged, or damaged files)")


@contextlib.contextmanager
def _damaged_export_params(root: epath.Path, what: str):
  """Any error of the Orbax read in the block (tensorstore / Orbax errors of a damaged
  export are of any type) -> InferenceError "PARAMS: WHAT: the export is incomplete or
  corrupt (...); export the checkpoint again"."""
  try:
    yield
  except Exception as e:  # pylint: disable=broad-except
    raise InferenceError(f"{root / EXPORT_PARAMS}: {what}: the export is incomplete or "
                         f"corrupt ({error_line(e)}); export the checkpoint again") from e


def _check_export_shapes(root: epath.Path, abstract) -> None:
  """The shapes config.json gives fit params/'s stored ones (Orbax metadata only).

  Raises:
    InferenceError: they differ (config.json edited), naming the first differing
      parameter; or params/'s metadata cannot be read (incomplete or corrupt).
  """
  with _damaged_export_params(root, "cannot read the parameters' metadata"):
    diffs = checkpoint.params_shape_differences(root / EXPORT_PARAMS, abstract)
  if diffs:
    more = f" (and {len(diffs) - 1} more)" if len(diffs) > 1 else ""
    raise InferenceError(
        f"{root / EXPORT_CONFIG}: its model shapes differ from those stored in "
        f"{root / EXPORT_PARAMS}/ ({diffs[0].replace('/value:', ':')}{more}): the config "
        "was edited after the export; restore it or export the checkpoint again")


def _load_export(root: epath.Path, step: int | None, dtype, expect) -> InferenceModel:
  info = _read_json(root / EXPORT_JSON)
  saved = _read_json(root / EXPORT_CONFIG)
  if not isinstance(info, dict):
    raise InferenceError(f"{root / EXPORT_JSON}: holds no JSON object; expected "
                         "lev-export's record")
  if info.get("format") != EXPORT_FORMAT:
    raise InferenceError(f"{root / EXPORT_JSON}: format = {info.get('format')!r}; "
                         f"expected {EXPORT_FORMAT!r}")
  _check_record(root, info)
  if step is not None and step != info["step"]:
    raise InferenceError(f"{root}: the export holds step {info['step']}, not step {step}")
  if expect is not None and info.get("materialized_lev"):
    expect = ml_collections.ConfigDict(expect.to_dict())
    expect.model.embedding = "untied"  # the materialised table replaced LEV
  _check_export_tokenizer(root, info)  # before the checksums: a swap named as such
  _verify_export(root, info, config_json=False)
  _check_expected(saved, expect, f"export {root}")
  config = _config_from_json(saved, root / EXPORT_CONFIG)
  graphdef, abstract = _abstract(config)
  _check_export_shapes(root, abstract)
  _verify_export(root, info, config_json=True)  # an edit that kept the shapes
  with _damaged_export_params(root, "cannot restore the parameters"):
    params = checkpoint.read_params(root / EXPORT_PARAMS, abstract)
  _check_finite(params, f"export {root}")
  params = _cast(params, dtype)
  tokenizer, counts = _tokenizer_and_counts(root, config)
  return InferenceModel(nnx.merge(graphdef, params), config, tokenizer, info["step"], counts,
                        os.fspath(root), dtype or info["dtype"])


def load(path, *, step: int | None = None, dtype: str | None = None,
         expect_config: ml_collections.ConfigDict | None = None) -> InferenceModel:
  """Loads a model for inference from a training workdir or an inference export.

  Args:
    path: a `lev-train` workdir (latest complete checkpoint unless `step`) or a
      `lev-export` folder (local or gs://).
    step: the checkpoint step (workdir); for an export, must equal its step.
    dtype: "float32" | "bfloat16" | "float16" for the parameters; None keeps them.
    expect_config: when given, the checkpoint's model shape must equal this config's
      (`checkpoint_checks.SHAPE_FIELDS`).
  Returns:
    InferenceModel.
  Raises:
    InferenceError: no such folder, no checkpoint / step, unreadable or invalid stored
      config, shape mismatch with `expect_config` (every differing field named),
      parameters that do not fit the stored config, a file that differs from the
      checksums (a step's checksums.json; an export's export.json: every file `load`
      reads is hashed at each load, about 2 s per GiB), an export's tokenizer/ whose
      fingerprint differs from export.json's, or a parameter holding NaN or infinity.
  """
  _check_dtype(dtype)
  root = _path(path)
  problem = source_error(root)
  if problem:
    raise InferenceError(problem)
  if (root / EXPORT_JSON).exists():
    return _load_export(root, step, dtype, expect_config)
  return _load_workdir(root, step, dtype, expect_config)


def source_error(path) -> str | None:
  """Why `path` cannot be loaded, from its folder alone (what `load` raises first):
  no such folder, or a folder that is neither a training workdir (with checkpoints/)
  nor an export (with export.json), e.g. a step folder (`_not_a_workdir`); None when it
  is one of them (its steps and files are checked by `load`)."""
  root = _path(path)
  if not root.exists():
    return f"{root}: no such checkpoint folder"
  if (root / EXPORT_JSON).exists() or (root / CHECKPOINTS).exists():
    return None
  return _not_a_workdir(root)


def step_error(path, step: int | None) -> str | None:
  """Why `step` cannot be loaded from the local checkpoint `path` (one `source_error`
  accepts), from its step list alone (what `load` checks before reading anything): an
  export holding another step, a workdir without that complete step (its steps listed);
  None when it is there, for step None (the latest), or an export.json `load` will
  report as unreadable."""
  if step is None:
    return None
  root = _path(path)
  if (root / EXPORT_JSON).exists():
    try:
      saved = _read_json(root / EXPORT_JSON).get("step")
    except (InferenceError, AttributeError):
      return None
    return None if saved == step else f"{root}: the export holds step {saved}, not step {step}"
  ckpt_dir = root / CHECKPOINTS
  with checkpoint.CheckpointReader(ckpt_dir) as reader:  # never saves or deletes
    steps = reader.all_steps()
  if not steps:
    return _no_checkpoint_yet(root, f"none in {CHECKPOINTS}/")
  if step not in steps:
    return f"{ckpt_dir}: no checkpoint at step {step}; steps: {steps}"
  return None


def lev_to_table(model: Decoder, config: ml_collections.ConfigDict):
  """A Leviathan model -> the same model with LEV replaced by its V x D table.

  Returns:
    (model, config): `config.model.embedding = "untied"`; the input table is
    ``LEV.table()`` (float32 [V_padded, D], LEV at every id, cast to the parameters'
    dtype) and the output head is the Leviathan head, unchanged. Logits are those of
    the LEV model (LEV.md "The map": the embedding of an id depends on the id only).
  Raises:
    InferenceError: the model is not a `lev` model.
  """
  if config.model.embedding != "lev":
    raise InferenceError(f"model.embedding = {config.model.embedding!r}: only a 'lev' "
                         "model can be materialised")
  out = ml_collections.ConfigDict(config.to_dict())
  out.model.embedding = "untied"
  graphdef, abstract = _abstract(out)
  pure = nnx.to_pure_dict(nnx.state(model, nnx.Param))
  head = pure["embedding"]["head"]
  pure["embedding"] = {"table": input_table(model.embedding).astype(head.dtype),
                       "head": head}
  nnx.replace_by_pure_dict(abstract, pure)
  return nnx.merge(graphdef, abstract), out


def check_not_source(source, out_dir) -> None:
  """Refuses an export folder that is the source checkpoint, inside it or holds it:
  writing (or, with overwrite, replacing) it would change the source.

  Raises:
    InferenceError: naming both folders. URLs are compared as strings (equality only).
  """
  src, out = os.fspath(source), os.fspath(out_dir)
  if "://" in src or "://" in out:
    overlap = src.rstrip("/") == out.rstrip("/")
  else:
    src, out = (os.path.realpath(os.path.expanduser(p)) for p in (src, out))
    inside = lambda child, parent: child == parent or child.startswith(
        parent.rstrip(os.sep) + os.sep)
    overlap = inside(out, src) or inside(src, out)
  if overlap:
    raise InferenceError(f"{out_dir} is the checkpoint {source}, inside it or holds it; "
                         "the source is never modified: choose a folder elsewhere")


def _aside(out: epath.Path, kind: str) -> epath.Path:
  """A new folder name beside `out`: .NAME.<kind>-<pid>@<host>-<hex> (see the module)."""
  return out.parent / (f".{out.name}.{kind}-{os.getpid()}@{socket.gethostname()}-"
                       f"{uuid.uuid4().hex[:8]}")


def _dead_owner(folder: epath.Path, prefix: str) -> int | None:
  """The pid that made `folder` (`_aside`; its name starts with `prefix`) when it ran on
  this host and is gone."""
  owner = folder.name[len(prefix):].rsplit("-", 1)[0]  # <pid>@<host>
  pid, _, host = owner.partition("@")
  if not pid.isdigit() or host != socket.gethostname() or _pid_running(int(pid)):
    return None
  return int(pid)


def clean_stale(out_dir) -> list[str]:
  """Removes what exports to `out_dir` killed midway left beside it; returns a line for
  each thing done (each is also logged as a warning).

  Only folders made by a process of this host that is no longer running are touched:
  `.NAME.tmp-*` (an export not yet renamed into place) is removed; `.NAME.old-*` (the
  earlier export being replaced) is removed when NAME exists (the new one was renamed in
  place), else renamed back to NAME (the kill came between the two renames: nothing is
  lost). Those of a live process, of another host or without an owner in the name (made
  by an earlier lev_jax) are left alone. A `.NAME.old-*` that is a symbolic link (an
  earlier lev_jax set aside a linked NAME, then failed to remove it) is unlinked, its
  target untouched.
  """
  out = _path(out_dir)
  done = []
  if not out.parent.is_dir():
    return done
  for kind in ("tmp", "old"):
    prefix = f".{out.name}.{kind}-"
    for folder in sorted(out.parent.glob(prefix + "*")):
      pid = _dead_owner(folder, prefix)
      if pid is None:
        continue
      if kind == "old" and not out.exists():
        folder.rename(out)
        done.append(f"restored {out} from {folder.name}, left aside by a killed export "
                    f"(pid {pid}) that was replacing it")
      elif os.path.islink(os.fspath(folder)):  # a link an older lev_jax set aside: only it
        folder.unlink()
        done.append(f"removed {folder}, a symbolic link left by an export (pid {pid})")
      else:
        folder.rmtree(missing_ok=True)
        done.append(f"removed {folder}, left by a killed export (pid {pid})")
      logging.warning("%s", done[-1])
  return done


def save(im: InferenceModel, out_dir, *, dtype: str | None = None,
         materialize_lev: bool = False, overwrite: bool = False, also=None) -> dict:
  """Writes the inference export of `im` into `out_dir` (see the module docstring).

  Args:
    im: from `load` (or built in memory).
    out_dir: the export folder; must not exist unless `overwrite`.
    dtype: parameter dtype of the export ("float32" | "bfloat16" | "float16"); None
      keeps the current one.
    materialize_lev: replace LEV by its V x D table (`lev_to_table`); only for a
      `lev` model.
    overwrite: replace an existing `out_dir` (the old one is removed only after the new
      one is complete).
    also: None, or a function called as also(folder, model, config, dtype) with the
      temporary folder (the export's params, config and tokenizer written, export.json
      not yet) and the exported model, config and dtype: what it writes there is part of
      the export (lev-export --hf writes hf/). Its result is returned as info["also"].
  Returns:
    The `export.json` record: format, source, step, dtype, embedding (original),
    materialized_lev, params (count), bytes (of the parameters), created (UTC),
    tokenizer_fingerprint, record_sha256 (of the other fields), checksums ({"sha256":
    {file: hex}, "bytes": {file: size}} of
    every file but export.json, hf/'s included); with `also`, its result under "also"
    (not in export.json).
  Raises:
    InferenceError: bad dtype, `out_dir` exists without `overwrite`, `out_dir` is a
      symbolic link (local), `out_dir` is the
      source, inside it or holds it (`check_not_source`), or materialising a non-LEV
      model.
    checkpoint.CheckpointWriteError: the parameters cannot be written (e.g. disk full;
      Orbax's own error reports go to PARENT/.NAME.errors.log, which the one line names).
    What `also` raises (nothing is left behind).
  """
  _check_dtype(dtype)
  out = _path(out_dir)
  clean_stale(out)  # exports killed midway: their temporaries, an export left aside
  if out.exists() and not overwrite:
    raise InferenceError(f"{out} exists; choose another output folder or overwrite")
  if os.path.islink(os.fspath(out)):  # the renames below would move the link, not write in it
    raise InferenceError(f"{out} is a symbolic link to {os.readlink(out)}; expected a "
                         f"folder: give {os.path.realpath(out)}")
  if im.source:
    check_not_source(im.source, out_dir)
  model, config = im.model, ml_collections.ConfigDict(im.config.to_dict())
  embedding = config.model.embedding
  if materialize_lev:
    model, config = lev_to_table(model, config)
  params = _cast(nnx.state(model, nnx.Param), dtype)
  dtype = dtype or str(jax.tree.leaves(params)[0].dtype)
  config.model.param_dtype = dtype
  tmp = _aside(out, "tmp")
  tmp.mkdir(parents=True)
  try:
    checkpoint.write_params(tmp / EXPORT_PARAMS, params,
                            error_log=out.parent / f".{out.name}.errors.log")
    write_json_atomic(tmp / EXPORT_CONFIG, config.to_dict())
    save_tokenizer(im.tokenizer, tmp / TOKENIZER, config.model.vocab_multiple)
    if im.token_counts_V is not None:
      write_bytes_atomic(tmp / TOKEN_COUNTS, npy_bytes(im.token_counts_V))
    extra = also(tmp, model, config, dtype) if also is not None else None
    leaves = jax.tree.leaves(params)
    info = {"format": EXPORT_FORMAT, "source": im.source, "step": int(im.step),
            "dtype": dtype, "embedding": embedding, "materialized_lev": bool(materialize_lev),
            "params": int(sum(x.size for x in leaves)),
            "bytes": int(sum(x.size * x.dtype.itemsize for x in leaves)),
            "created": datetime.datetime.now(datetime.timezone.utc).isoformat(
                timespec="seconds"),
            "tokenizer_fingerprint": im.tokenizer.fingerprint}
    info["checksums"] = _checksums(tmp)  # every file written so far, hf/ included
    info["record_sha256"] = _record_digest(info)
    write_json_atomic(tmp / EXPORT_JSON, info)  # last: the folder is complete
  except checkpoint.CheckpointWriteError as e:  # e.g. disk full: one line
    tmp.rmtree(missing_ok=True)
    raise checkpoint.CheckpointWriteError(
        f"{out}: the export could not be written, nothing was changed there: {e}") from e
  except BaseException:
    tmp.rmtree(missing_ok=True)
    raise
  if out.exists():  # a kill between the renames leaves it aside: clean_stale puts it back
    old = _aside(out, "old")
    out.rename(old)
    tmp.rename(out)
    old.rmtree(missing_ok=True)
  else:
    tmp.rename(out)
  return info if also is None else dict(info, also=extra)
