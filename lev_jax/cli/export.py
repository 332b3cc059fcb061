"""`lev-export`: a trained checkpoint -> an inference export (and a Hugging Face copy).

  lev-export --checkpoint=runs/smoke_leviathan --output=exports/leviathan
  lev-export --checkpoint=runs/smoke_leviathan --step=200 --output=exports/lev_bf16 \\
             --dtype=bfloat16 --materialize_lev --hf

--checkpoint is a `lev-train` workdir (latest complete step unless --step) or an earlier
`lev-export` folder. OUTPUT gets the parameters only (Orbax, no optimizer state), the
experiment config, the tokenizer and the training token counts (lev_jax.inference.save);
`lev_jax.inference.load(OUTPUT)` reads it back. --materialize_lev replaces a Leviathan
model's LEV generator by its V x D table (same logits, no generator at inference).
--hf also writes OUTPUT/hf, a transformers LlamaForCausalLM folder (lev_jax.hf_export;
LEV is always materialised there, as HF LLaMA has a plain input table).

The whole export, hf/ included, is written into a temporary folder beside OUTPUT and
renamed into place once complete (lev_jax.inference.save): an export killed midway
leaves no partial OUTPUT, and the next export to OUTPUT removes that temporary (or puts
back the earlier export a kill left aside while replacing it).

The source checkpoint is only read. A non-empty OUTPUT is refused unless it is an
earlier export (holding export.json) and --overwrite is given (the old folder is
replaced only once the new export is complete); an earlier export holding files
lev-export did not write (lev-eval's lev_eval.json among them) is refused, naming them.
OUTPUT may not be the checkpoint, inside it, or hold it. export.json records the sha256
of every file and the tokenizer's fingerprint, which every load checks.

One export per OUTPUT: it holds PARENT/.NAME.lock beside OUTPUT (lev_jax.lock; OUTPUT
itself is replaced by a rename), and a second export to the same OUTPUT stops at once
naming the holder; --force_unlock removes a lock left by a run on another host that is
gone; --nolock writes without the lock (a filesystem without flock).
"""

from __future__ import annotations

import os

from absl import flags

from lev_jax.cli import common
from lev_jax.config import DTYPES
from lev_jax.lock import LOCK_FLAG_HELP
from lev_jax.workdir import (CHECKPOINTS, EXPORT_CONFIG, EXPORT_JSON, EXPORT_PARAMS, HF,
                             LEV_EVAL_JSON, TOKEN_COUNTS, TOKENIZER)

PROG = "lev-export"
MB = 1 << 20


def define_flags(fv: flags.FlagValues = flags.FLAGS) -> None:
  """Defines the command's flags on `fv` (tests pass a fresh FlagValues)."""
  common.define_path("checkpoint", None, "A lev-train workdir or a lev-export folder.",
                     what="a lev-train workdir or a lev-export folder", fv=fv)
  flags.DEFINE_integer("step", None, "Checkpoint step (default: the latest).",
                       flag_values=fv)
  common.define_path("output", None, "The export folder to write.",
                     what="the export folder to write", fv=fv)
  flags.DEFINE_enum("dtype", None, list(DTYPES),
                    "Parameter dtype of the export (default: as stored).", flag_values=fv)
  flags.DEFINE_bool("materialize_lev", False, "Replace LEV by its V x D table (a "
                    "Leviathan model only).", flag_values=fv)
  flags.DEFINE_bool("hf", False, f"Also write OUTPUT/{HF}, a Hugging Face LlamaForCausalLM "
                    "folder (LEV materialised there).", flag_values=fv)
  flags.DEFINE_bool("overwrite", False, "Replace OUTPUT when it is an earlier export "
                    f"(holding {EXPORT_JSON}); any other non-empty folder is refused.",
                    flag_values=fv)
  flags.DEFINE_bool("force_unlock", False, "Remove OUTPUT's lock when it was left by a run "
                    "on another host that is gone (see lev_jax/lock.py).", flag_values=fv)
  flags.DEFINE_bool("lock", True, LOCK_FLAG_HELP, flag_values=fv)


def check_output(checkpoint: str, output: str, overwrite: bool) -> None:
  """Refuses an OUTPUT that would touch the source or lose files without --overwrite.

  Raises:
    ValueError: OUTPUT is the checkpoint, inside it or holds it; OUTPUT is inside another
      run's checkpoints or export's parameters (common.checkpoint_tree_error); OUTPUT is
      a file; OUTPUT is a non-empty folder that is not an earlier export (no
      EXPORT_JSON in it: a training run, the user's files), `overwrite` or not; OUTPUT
      is an earlier export and not `overwrite`, or one holding files lev-export did not
      write (lev-eval's lev_eval.json among them: it scores the export being replaced,
      so --overwrite names it rather than delete it);
      OUTPUT lies inside a run's folder, an export or prepared data
      (common.within_owned_folder_error); a local OUTPUT is a symbolic link
      (dangling or not: the rename into place would replace the link; its target named).
  """
  from lev_jax.inference import check_not_source
  check_not_source(checkpoint, output)
  inside = (common.checkpoint_tree_error("--output", output)
            or common.within_owned_folder_error("--output", output))
  if inside:
    raise ValueError(inside)
  if "://" in output:
    from etils import epath
    path = epath.Path(output)
    nonempty = path.exists() and any(path.iterdir())
    held = {p.name for p in path.iterdir()} if nonempty else set()
  else:
    path = os.path.expanduser(output)
    if os.path.islink(path):  # the rename into place would replace the link itself
      gone = "" if os.path.exists(path) else ", which does not exist"
      raise ValueError(f"--output={output} is a symbolic link to {os.readlink(path)}{gone}; "
                       "expected a folder (the export is renamed into place, which would "
                       f"replace the link): give --output={os.path.realpath(path)}")
    if os.path.exists(path) and not os.path.isdir(path):
      raise ValueError(f"--output={output} is a file; expected a folder")
    nonempty = os.path.isdir(path) and bool(os.listdir(path))
    held = set(os.listdir(path)) if nonempty else set()
  if nonempty and EXPORT_JSON not in held:
    what = "a training run's folder" if CHECKPOINTS in held else "not empty"
    raise ValueError(f"--output={output} is {what}, not an earlier export (no "
                     f"{EXPORT_JSON}); expected a new or empty folder (--overwrite only "
                     "replaces an earlier export)")
  if nonempty and not overwrite:
    raise ValueError(f"--output={output} is not empty; pass --overwrite to replace it")
  foreign = sorted(held - set(common.EXPORT_OUTPUTS))
  if foreign:  # newcomer pass 8: --overwrite deleted a nested export without a word
    scores = (f" ({LEV_EVAL_JSON} scores the export being replaced)"
              if LEV_EVAL_JSON in foreign else "")
    raise ValueError(f"--output={output} is an earlier export that also holds "
                     f"{', '.join(foreign)}, which lev-export did not write{scores}; "
                     "--overwrite replaces the whole folder: move them aside first")


def output_error(output: str, error: OSError) -> str | None:
  """`--output=OUTPUT: cannot write in PARENT (reason)` for an OSError on OUTPUT, inside
  it, or on a hidden file beside it (the export's lock, its temporary folder): internal
  names are not the user's to know. None for another path (e.g. the checkpoint's)."""
  return common.output_path_error("--output", output, error)


def _folder_bytes(path) -> int:
  from etils import epath
  path = epath.Path(path)
  if path.is_dir():
    return sum(_folder_bytes(p) for p in path.iterdir())
  return path.stat().length


def export(checkpoint: str, output: str, *, step: int | None = None,
           dtype: str | None = None, materialize_lev: bool = False, hf: bool = False,
           overwrite: bool = False) -> dict:
  """Writes the inference export (and OUTPUT/hf) of a checkpoint.

  Args:
    checkpoint: a lev-train workdir or a lev-export folder (read only).
    output: the export folder.
    step: the checkpoint step (None: the latest / the export's).
    dtype: "float32" | "bfloat16" | "float16" for the parameters; None keeps them.
    materialize_lev: replace LEV by its table in the export (Leviathan models only).
    hf: also write OUTPUT/hf with `hf_export.save_hf` (in `dtype`, else the export's).
    overwrite: replace a non-empty `output`.
  Returns:
    {"export": the export.json record (lev_jax.inference.save; its "source" is the
     checkpoint's absolute path) plus "dir" (`output`), "checkpoint" (`checkpoint`,
     both as given) and "folder_bytes", "hf": the save_hf record or None}.
  Raises:
    ValueError (InferenceError, HFExportError, ConfigError, DataError among them):
      `check_output`, an unreadable checkpoint or step, a bad dtype, materialising a
      non-LEV model, a model HF LLaMA cannot express.
  """
  from lev_jax import hf_export, inference
  inference.clean_stale(output)  # first: an earlier export a kill left aside is back
  check_output(checkpoint, output, overwrite)
  im = inference.load(checkpoint, step=step)  # stored precision; cast once, on writing
  if hf:
    hf_export.check_exportable(im.config)  # before writing anything

  def write_hf(folder, model, config, dtype):  # inside the export: renamed with it
    del model, config  # HF gets the original model (LEV materialised by save_hf)
    return hf_export.save_hf(im.model, im.config, os.fspath(folder / HF), dtype=dtype,
                             tokenizer=im.tokenizer)
  # check_output passed: OUTPUT is absent, empty, or may be replaced.
  info = inference.save(im, output, dtype=dtype, materialize_lev=materialize_lev,
                        overwrite=True, also=write_hf if hf else None)
  hf_info = info.pop("also", None)
  if hf_info is not None:
    hf_info["dir"] = os.path.join(os.fspath(output), HF)
  info = dict(info, dir=os.fspath(output), checkpoint=os.fspath(checkpoint))
  info["folder_bytes"] = _folder_bytes(output)
  return {"export": info, "hf": hf_info}


def report(result: dict) -> str:
  """The lines `lev-export` prints: paths (as the user gave them, as other commands
  print theirs), parameter counts, dtypes, sizes in MB."""
  e, h = result["export"], result["hf"]
  kind = e["embedding"] + (" -> materialised table" if e["materialized_lev"] else "")
  lines = [f"{PROG}: step {e['step']} of {e.get('checkpoint', e['source'])} ({kind}) -> "
           f"{e['dir']}",
           f"  params  {e['params']:,} {e['dtype']} ({e['bytes'] / MB:.2f} MB); "
           f"folder {e['folder_bytes'] / MB:.2f} MB: {EXPORT_PARAMS}/, {EXPORT_CONFIG}, "
           f"{TOKENIZER}/, {EXPORT_JSON}"
           + (f", {TOKEN_COUNTS}" if os.path.exists(os.path.join(e["dir"], TOKEN_COUNTS))
              else "")]
  if h:
    note = "; LEV materialised into embed_tokens" if h["embedding"] == "lev" else ""
    lines.append(f"  hf      {h['dir']}: {h['n_params']:,} {h['dtype']} params "
                 f"(tie_word_embeddings={h['tie_word_embeddings']}{note}); "
                 f"model.safetensors {h['files']['model.safetensors'] / MB:.2f} MB, "
                 f"folder {sum(h['files'].values()) / MB:.2f} MB: "
                 + ", ".join(h["files"]))
  return "\n".join(lines)


def main(argv, fv: flags.FlagValues | None = None):
  fv = flags.FLAGS if fv is None else fv
  if len(argv) > 1:
    common.fail_unexpected(PROG, argv[1:])
  common.quiet_library_logs()
  for name, what in (("checkpoint", "a lev-train workdir or a lev-export folder"),
                     ("output", "the export folder to write")):
    if not fv[name].value:
      common.fail(PROG, f"--{name} is required ({what})")
  common.backend_or_exit(PROG)  # JAX_PLATFORMS naming a backend this machine lacks
  from lev_jax import lock as workdir_lock
  try:
    check_output(fv.checkpoint, fv.output, fv.overwrite)  # before the lock is created
    # Beside OUTPUT, not inside: inference.save renames a new folder into its place.
    with workdir_lock.hold(fv.output, prog=PROG, inside=False, force_unlock=fv.force_unlock,
                           enabled=fv.lock):
      result = export(fv.checkpoint, fv.output, step=fv.step, dtype=fv.dtype,
                      materialize_lev=fv.materialize_lev, hf=fv.hf, overwrite=fv.overwrite)
  except OSError as e:  # the lock or the export beside OUTPUT, or the checkpoint
    common.fail(PROG, output_error(fv.output, e) or common.first_line(e))
  except workdir_lock.WorkdirLockError as e:  # the lock file beside OUTPUT: name --output
    cause = e.__cause__ if isinstance(e.__cause__, OSError) else None
    common.fail(PROG, (cause and output_error(fv.output, cause)) or common.first_line(e))
  except ValueError as e:
    # InferenceError, HFExportError, ConfigError, DataError among the ValueErrors
    common.fail(PROG, common.first_line(e))
  print(report(result))


def run():
  define_flags()
  common.run(PROG, main, __name__)


if __name__ == "__main__":
  run()
