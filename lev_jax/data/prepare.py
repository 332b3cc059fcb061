"""`prepare(config)`: Pile-format JSONL -> a prepared ArrayRecord dataset (lev-prepare-data).

One output shard per (split, input file), written by a pool of worker processes
(`multiprocessing` "spawn" context, https://docs.python.org/3/library/multiprocessing.html):
each streams its file (`corpus.iter_file`), tokenizes in batches (`encode_batch`),
writes ArrayRecord (``ArrayRecordWriter``, ``group_size:1`` for random access,
https://github.com/google/array_record) to a temporary name, renames it into place,
then writes the shard's stats (``prepare/{shard}.json``, with the run id) last. A shard
with its stats is finished and never redone, so a rerun after an interruption (kill,
preemption) writes only the unfinished shards. When all are done: ``report.json``,
``token_counts.npy`` and the TFDS metadata, ``dataset_info.json`` last
(`tfds.folder_dataset.write_metadata`). The layout is described in `prepared`.
"""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import os
import re
import shutil
import tempfile
import time

from absl import logging
from array_record.python import array_record_module
from etils import epath
import ml_collections
import numpy as np
import sentencepiece as spm
import tensorflow_datasets as tfds
import tqdm

from lev_jax.data import corpus, embedded
from lev_jax.data.files import npy_bytes, read_npy, write_bytes_atomic
from lev_jax.data import prepared
from lev_jax.data import tokenizer as tokenizer_lib
from lev_jax.data import tokenizer_files
from lev_jax.data.errors import DataError
from lev_jax.data.reports import describe_skipped, new_report
from lev_jax.parent_watch import exit_with_parent
from lev_jax.workdir import file_sha256
from lev_jax import progress as progress_logs

_FIELDS = {"train": "train_files", "validation": "validation_files", "test": "test_files"}


@dataclasses.dataclass(frozen=True)
class Shard:
  """One output shard: `source` (an input file) -> `path`, stats in `work`."""

  split: str
  index: int
  count: int
  source: str
  source_bytes: int
  path: str
  work: str

  @property
  def name(self) -> str:
    return epath.Path(self.path).name

  @property
  def stats_path(self) -> epath.Path:
    return epath.Path(self.work) / f"{self.name}.json"

  @property
  def counts_path(self) -> epath.Path | None:
    """``{shard}.counts.npy`` for train shards (token counts), else None."""
    return (epath.Path(self.work) / f"{self.name}.counts.npy"
            if self.split == "train" else None)


# ----------------------------------------------------------------------------- workers

_WORKER: dict = {}


def _init_worker(tokenizer, settings: dict) -> None:
  """The tokenizer and settings, received once per process."""
  _WORKER.clear()
  _WORKER.update(settings, tokenizer=tokenizer)


def _init_pool_worker(tokenizer, settings: dict) -> None:
  """Pool initializer: the worker ends with the preparing process, even one killed with
  SIGKILL (lev_jax.parent_watch), so none writes on after its folder lock is freed."""
  exit_with_parent()
  _init_worker(tokenizer, settings)


def _write_shard(shard: Shard) -> dict:
  """Writes one shard, its token counts (train) and its stats, stats last.

  Returns:
    The stats written to ``prepare/{shard}.json``: ``{"run_id", "split", "shard",
    "index", "count", "source", "source_bytes", "num_bytes" and "sha256" (of the
    shard file: `prepared.check_shard_files` compares them at every open), "seconds",
    "report": `prepared.split_report` of the file}``.
  """
  tokenizer, fmt = _WORKER["tokenizer"], _WORKER["fmt"]
  serialize = prepared.features(fmt).serialize_example
  out = epath.Path(shard.path)
  local = "://" not in shard.path
  # ArrayRecordWriter writes local files: remote shards are written locally, then copied.
  tmp_dir = None if local else epath.Path(tempfile.mkdtemp(prefix="lev-prepare-"))
  tmp = (epath.Path(shard.work) / f"{out.name}.tmp") if local else tmp_dir / out.name
  report = new_report()
  counter = (prepared.TokenCounter(tokenizer.vocab_size, tokenizer.eos_id)
             if shard.split == "train" else None)
  tokens = records = 0
  start = time.perf_counter()
  writer = array_record_module.ArrayRecordWriter(os.fspath(tmp), prepared.WRITER_OPTIONS)
  try:
    for _, record, ids_N in prepared.file_examples(
        shard.source, tokenizer, fmt=fmt, strict=_WORKER["strict"],
        pile_set_names=_WORKER["pile_set_names"], report=report):
      writer.write(serialize(record))
      tokens += ids_N.size
      records += 1
      if counter is not None:
        counter.add(ids_N)
  except BaseException:  # a bad line (strict), an interrupt: no partial shard is left
    if writer.is_open():
      writer.close()
    tmp.unlink(missing_ok=True)
    if tmp_dir is not None:
      shutil.rmtree(tmp_dir, ignore_errors=True)
    raise
  writer.close()
  num_bytes, sha256 = int(tmp.stat().length), file_sha256(tmp)
  if local:
    tmp.replace(out)
  else:
    tmp.copy(out, overwrite=True)
    shutil.rmtree(tmp_dir, ignore_errors=True)
  if counter is not None:
    write_bytes_atomic(shard.counts_path, npy_bytes(counter.counts_V))
  report["files"] = 1
  stats = {"run_id": _WORKER["run_id"], "split": shard.split, "shard": out.name,
           "index": shard.index, "count": shard.count, "source": shard.source,
           "source_bytes": shard.source_bytes, "num_bytes": num_bytes,
           "sha256": sha256,
           "seconds": round(time.perf_counter() - start, 3),
           "report": prepared.split_report(report, tokens, records)}
  write_bytes_atomic(shard.stats_path,
                              (json.dumps(stats, indent=2) + "\n").encode())
  return stats


# ----------------------------------------------------------------------------- planning


def input_files(config: ml_collections.ConfigDict, reports: dict[str, dict]
                ) -> dict[str, list[epath.Path]]:
  """Per split, the input files (splits without files are left out).

  data.source "embedded": the frozen corpus data.corpus under data.cache_dir (train,
  validation, and test with data.test_fraction > 0; `embedded.write_embedded_corpus`);
  otherwise
  data.train_files, validation_files and test_files through `corpus.expand_files`
  (skipped paths counted in ``reports[split]``).

  Raises:
    DataError: prefixed with the config field: no training file; (strict) a missing
      path or empty glob.
  """
  d = config.data
  if d.source == "embedded":
    paths = embedded.write_embedded_corpus(
        epath.Path(os.path.expanduser(d.cache_dir)), d.validation_fraction,
        d.get("test_fraction", 0.0), corpus=d.get("corpus", embedded.DEFAULT_CORPUS))
    for split in paths:
      reports[split]["files"] += 1
    return {split: [path] for split, path in paths.items()}
  files = {}
  for split, field in _FIELDS.items():
    patterns = d.get(field) or ()
    if isinstance(patterns, (str, os.PathLike)):
      patterns = [patterns]
    if not patterns:
      if split == "train":
        raise DataError("config.data.train_files = (): expected at least one "
                        "Pile-format *.jsonl or *.jsonl.zst path, glob or folder")
      continue
    try:
      files[split] = corpus.expand_files(list(patterns), strict=d.strict,
                                         report=reports[split])
    except DataError as e:
      raise DataError(f"config.data.{field}: {e}") from e
  train = {os.fspath(p) for p in files["train"]}
  for split in ("validation", "test"):
    shared = sorted(os.fspath(p) for p in files.get(split, ()) if os.fspath(p) in train)
    if shared:
      raise DataError(f"config.data.{_FIELDS[split]}: {shared[0]} is also matched by "
                      "config.data.train_files; a file belongs to one split only")
  return files


def _tokenizer_spec(config: ml_collections.ConfigDict):
  """(what defines the ids for the run id, the tokenizer or None when it is trained)."""
  d = config.data
  if d.tokenizer == "sentencepiece" and not d.get("sentencepiece_file"):
    return {"name": "sentencepiece", "trained_on": "train",
            "vocab_size": int(config.model.vocab_size),
            "max_characters": tokenizer_lib.MAX_TRAINING_CHARS,
            "settings": tokenizer_lib.TRAINER_SETTINGS,
            "sentencepiece": spm.__version__}, None
  tokenizer = tokenizer_lib.make_tokenizer(d, config.model.vocab_size)
  return {"name": tokenizer.name, "fingerprint": tokenizer.fingerprint}, tokenizer


def _finished_run_id(out: epath.Path) -> str | None:
  try:
    return json.loads((out / "metadata.json").read_text()).get("run_id")
  except (OSError, ValueError, AttributeError):
    return None


def _finished_fingerprint(out: epath.Path) -> str | None:
  """The tokenizer fingerprint a finished dataset's metadata.json records, or None."""
  try:
    return json.loads((out / "metadata.json").read_text())["tokenizer"]["fingerprint"]
  except (OSError, ValueError, KeyError, TypeError):
    return None


def _claim_folder(out: epath.Path, rid: str, overwrite: bool) -> str:
  """"new", "resume" or "finished" (same run); removes another run's data only when
  `overwrite`; DataError otherwise (see `prepare`)."""
  if not out.exists():
    return "new"
  if not out.is_dir():
    raise DataError(f"{out}: not a folder; expected the folder to write the prepared "
                    "dataset to (--output_dir or config.data.prepared_dir)")
  run_file = out / prepared.WORK_DIR / prepared.RUN_FILE
  finished = (out / prepared.INFO_FILE).exists()
  if finished:  # a deleted or damaged metadata.json: the run's own record tells
    existing = _finished_run_id(out) or (prepared.read_json(run_file).get("run_id")
                                         if run_file.exists() else None)
  elif run_file.exists():
    existing = prepared.read_json(run_file).get("run_id")
  elif any(out.iterdir()):
    raise DataError(f"{out}: the folder is not empty and holds no lev-prepare-data "
                    "dataset; choose an empty or new folder (--output_dir or "
                    "config.data.prepared_dir)")
  else:
    return "new"
  if existing == rid:
    return "finished" if finished else "resume"
  if not overwrite:
    if finished:
      raise DataError(
          f"{out}: holds a different finished dataset (run {existing}; this config "
          f"gives run {rid}); choose another folder (--output_dir or "
          "config.data.prepared_dir) or pass --overwrite to replace it")
    raise DataError(
        f"{out}: holds unfinished work of a different preparation run ({existing}; "
        f"this config gives run {rid}), and runs never mix: rerun the config that "
        "started it, choose another folder (--output_dir or config.data.prepared_dir), "
        "or pass --overwrite to discard it")
  logging.warning("%s: removing %s dataset of run %s to prepare run %s (overwrite).",
                  out, "the finished" if finished else "the unfinished", existing, rid)
  out.rmtree()
  return "new"


def _finished_stats(shard: Shard, rid: str, overwrite: bool,
                    hash_it: bool = True) -> dict | None:
  """The shard's stats when it is finished for run `rid` and its file is as they record
  (size; sha256 with `hash_it`: `prepared.shard_problem`), else None.

  Raises:
    DataError: stats of another run (removed instead when `overwrite`).
  """
  if not shard.stats_path.exists():
    return None
  stats = prepared.read_json(shard.stats_path)
  if stats.get("run_id") != rid:
    if not overwrite:
      raise DataError(
          f"{shard.path}: its stats {shard.stats_path} are from preparation run "
          f"{stats.get('run_id')}, this run is {rid}: shards of different runs never "
          "mix; remove the folder or pass --overwrite")
    shard.stats_path.unlink()
    return None
  if not epath.Path(shard.path).exists():
    return None
  if shard.counts_path is not None and not shard.counts_path.exists():
    return None
  damaged = prepared.shard_problem(epath.Path(shard.path), stats, hash_it)
  if damaged:  # newcomer pass 8: flipped or emptied shards; written again
    logging.warning("%s: %s; writing it again", shard.path, damaged)
    return None
  return stats


def _opens(out: epath.Path) -> bool:
  """Whether the finished dataset `out` opens with every check (`prepared.open_prepared`:
  e.g. an edited token_counts.npy); when not, the reason is logged and it is finished
  again (its report, counts and metadata rewritten from the shards' own). The shards'
  sha256 are not computed again: `_finished_stats` has just checked each."""
  try:
    prepared.open_prepared(out, hash_shards=False).tokenizer  # noqa: B018 (fingerprint)
  except DataError as e:
    logging.warning("%s; finishing it again", e)
    return False
  return True


# The files `_finish` writes (TFDS's write_metadata: features.json, metadata.json, then
# dataset_info.json).
_FINISH_FILES = (prepared.COUNTS_FILE, prepared.REPORT_FILE, "features.json",
                 "metadata.json", prepared.INFO_FILE)


def _check_finish_files(out: epath.Path) -> None:
  """Refuses a dataset folder where a file `_finish` writes is there as a folder: the
  re-run unmarked the finished dataset, then crashed at the write (newcomer pass 13).

  Raises:
    DataError: naming it; before anything is written or unmarked.
  """
  for name in _FINISH_FILES:
    path = out / name
    if path.is_dir():
      raise DataError(f"{path}: is a folder; expected lev-prepare-data's {name} file "
                      "(move it aside)")


def _check_strays(out: epath.Path, shards: list[Shard], overwrite: bool) -> None:
  """Shard files that this run does not plan: DataError (removed when `overwrite`)."""
  planned = {s.name for s in shards}
  for p in out.iterdir():
    if p.name.startswith(f"{prepared.DATASET_NAME}-") and p.name not in planned:
      if not overwrite:
        raise DataError(f"{p}: a shard this preparation run does not write (another run "
                        "or another input file list); remove it or pass --overwrite")
      p.unlink()


def _run_pool(todo: list[Shard], tokenizer, settings: dict, n_workers: int,
              progress) -> list[dict]:
  results = []
  if n_workers <= 1:
    _init_worker(tokenizer, settings)
    try:
      for shard in todo:
        results.append(_write_shard(shard))
        progress.update(1)
    finally:
      _WORKER.clear()
    return results
  ctx = multiprocessing.get_context("spawn")
  # Leaving the block terminates the workers, also on an error or KeyboardInterrupt, and
  # they end with this process when it is killed: their temporary files are removed by
  # the next run.
  with ctx.Pool(n_workers, initializer=_init_pool_worker,
                initargs=(tokenizer, settings)) as pool:
    for stats in pool.imap_unordered(_write_shard, todo):
      results.append(stats)
      progress.update(1)
  return results


# ----------------------------------------------------------------------------- prepare


def worker_count(workers: int | None, configured: int, shards: int) -> int:
  """The preparation's processes: `workers` (--workers) if given, else `configured`
  (data.prepare_workers); 0 means one per CPU core; never more than `shards`."""
  n = configured if workers is None else workers
  return min(n or os.cpu_count() or 1, shards)


def prepare(config: ml_collections.ConfigDict, *, output_dir=None,
            workers: int | None = None, overwrite: bool = False) -> dict:
  """Prepares the dataset ``config.data`` describes (``lev-prepare-data``).

  Args:
    config: an experiment config. Reads ``data.source`` ("embedded": the embedded
      corpus, train + validation; else ``data.train_files`` / ``validation_files`` /
      ``test_files``), ``data.tokenizer`` / ``tiktoken_file`` / ``sentencepiece_file``
      (SentencePiece without a file is trained on a sample of the train split of up to
      ``tokenizer.MAX_TRAINING_CHARS`` characters, `prepared.training_sample`),
      ``data.prepare_format``, ``pile_set_names``, ``strict``, ``cache_dir``,
      ``prepared_dir``, ``prepare_workers`` and ``model.vocab_size`` /
      ``vocab_multiple``.
    output_dir: the dataset folder (local or `etils.epath` URL); default
      ``data.prepared_dir``.
    workers: worker processes; default ``data.prepare_workers`` or, when 0, the CPU
      count; never more than the unfinished shards; 1 writes in this process.
    overwrite: a folder holding another run's dataset (finished or not) is removed
      first instead of raising. Work of the same run is always kept (resumed).

  Returns:
    ``report.json``'s content: ``{"run_id", "format", "tokenizer": tokenizer_info,
    "splits": {split: {"files", "documents", "characters", "tokens", "records",
    "skipped": {reason: int}}}, "total": the same summed}``, plus ``"output_dir"``,
    ``"already_prepared"`` (bool), ``"written_shards"``, ``"written_tokens"`` (this
    call) and ``"seconds"`` (this call, wall clock).

  Raises:
    DataError: no output folder; missing inputs (named with the config field); a
      tokenizer whose vocab_size is not config.model.vocab_size; the folder holds a
      different finished dataset, unfinished work of a different run, or files that
      are not a lev-prepare-data dataset (unless `overwrite`, except the last); with
      ``data.strict``, the first bad line (``file:line``); an empty training split.
  """
  start = time.perf_counter()
  d = config.data
  fmt = d.prepare_format
  prepared.features(fmt)
  out_text = output_dir or d.prepared_dir
  if not out_text:
    raise DataError("config.data.prepared_dir = '': expected the folder to write the "
                    "prepared dataset to (or --output_dir)")
  out = epath.Path(os.path.expanduser(os.fspath(out_text)))
  vocab_multiple = int(config.model.get("vocab_multiple", 128))

  path_reports = {split: new_report() for split in _FIELDS}
  files = input_files(config, path_reports)
  spec, tokenizer = _tokenizer_spec(config)
  sources = {split: prepared.describe_files(f) for split, f in files.items()}
  identity = prepared.run_identity(fmt=fmt, strict=d.strict,
                                   pile_set_names=tuple(d.pile_set_names),
                                   tokenizer=spec, sources=sources)
  rid = prepared.run_id(identity)
  work = out / prepared.WORK_DIR
  shards = [Shard(split=split, index=i, count=len(split_files), source=src["path"],
                  source_bytes=src["bytes"],
                  path=os.fspath(prepared.shard_path(out, split, i, len(split_files))),
                  work=os.fspath(work))
            for split, split_files in files.items()
            for i, src in enumerate(sources[split])]

  prepared.check_work_dir(out)  # before anything is written or unmarked
  _check_finish_files(out)
  state = _claim_folder(out, rid, overwrite)
  done = {}
  if state != "new":
    _check_strays(out, shards, overwrite)
    hash_it = prepared.hashes_checked(out, [epath.Path(s.path) for s in shards])
    for shard in shards:
      stats = _finished_stats(shard, rid, overwrite, hash_it)
      if stats is not None:
        done[shard.name] = stats
  complete = all((out / f).exists() for f in (prepared.REPORT_FILE, prepared.COUNTS_FILE))
  if state == "finished" and len(done) == len(shards) and complete:
    complete = _opens(out)
  if state == "finished" and len(done) == len(shards) and complete:
    logging.info("%s: already prepared (run %s); nothing to do.", out, rid)
    report = prepared.read_json(out / prepared.REPORT_FILE)
    return {**report, "output_dir": os.fspath(out), "already_prepared": True,
            "written_shards": 0, "written_tokens": 0,
            "seconds": time.perf_counter() - start}

  # The tokenizer before anything is written: a vocab the corpus cannot fill leaves no
  # work behind. Resuming uses the one saved with the data.
  tok_dir = out / prepared.TOKENIZER_DIR
  saved = None
  if state != "new" and (tok_dir / tokenizer_files.TOKENIZER_JSON).exists():
    saved = tokenizer_files.load_tokenizer(tok_dir)
    recorded = _finished_fingerprint(out) if state == "finished" else None
    if recorded and saved.fingerprint != recorded:  # newcomer pass 9: "0 shards written"
      raise DataError(f"{tok_dir}: tokenizer fingerprint {saved.fingerprint[:16]} differs "
                      f"from {recorded[:16]}, the one the shards were written with "
                      f"({out / 'metadata.json'}): the folder was replaced; restore it, or "
                      "prepare the data again with --overwrite")
    if tokenizer is not None and saved.fingerprint != tokenizer.fingerprint:
      raise DataError(f"{tok_dir}: holds another tokenizer than config.data names "
                      "(fingerprints differ); remove the folder or pass --overwrite")
    tokenizer = saved
  elif tokenizer is None:
    sample_report = new_report()
    sample = prepared.training_sample(files["train"], strict=d.strict,
                                      pile_set_names=tuple(d.pile_set_names),
                                      report=sample_report)
    if not sample:  # newcomer pass 7: blamed on config.model.vocab_size
      raise DataError(_empty_split_line("train", files["train"], sample_report,
                                        tuple(d.pile_set_names)))
    tokenizer = tokenizer_lib.make_tokenizer(d, config.model.vocab_size, train_texts=sample)

  if state == "finished":
    if len(done) < len(shards):
      logging.warning("%s: %d of %d shards of run %s are missing or damaged; writing "
                      "them again.", out, len(shards) - len(done), len(shards), rid)
    (out / prepared.INFO_FILE).unlink()  # unfinished until they are back
  work.mkdir(parents=True, exist_ok=True)
  run_file = work / prepared.RUN_FILE
  if not run_file.exists():
    write_bytes_atomic(run_file, (json.dumps(
        {"run_id": rid, "identity": identity}, indent=2) + "\n").encode())
  for p in work.iterdir():  # temporary files of killed workers, an earlier stop's reason
    if ".tmp" in p.name or p.name == prepared.STOPPED_FILE:
      p.unlink()
  if saved is None:
    tokenizer_files.save_tokenizer(tokenizer, tok_dir, vocab_multiple)
  tok_info = tokenizer_files.tokenizer_info(tokenizer, vocab_multiple)

  todo = sorted((s for s in shards if s.name not in done), key=lambda s: -s.source_bytes)
  n_workers = worker_count(workers, d.prepare_workers, len(todo))
  settings = {"fmt": fmt, "strict": bool(d.strict), "run_id": rid,
              "pile_set_names": tuple(d.pile_set_names)}
  logging.info("%s: run %s, %d shards to write (%d already finished), %d worker(s).",
               out, rid, len(todo), len(done), n_workers)
  logs_restored = progress_logs.logs_above_bars()  # log lines above the bar, not on it
  try:
    with tqdm.tqdm(total=len(shards), initial=len(done), unit="shard", disable=None,
                   desc=f"lev-prepare-data {out.name}") as progress:
      written = _run_pool(todo, tokenizer, settings, n_workers, progress)
  finally:
    logs_restored()
  for stats in written:
    done[stats["shard"]] = stats

  try:
    report = _finish(out, fmt, rid, identity, tok_info, files, shards, done, path_reports)
  except DataError as e:  # newcomer pass 8: lev-train then said only "did not finish"
    write_bytes_atomic(work / prepared.STOPPED_FILE, (json.dumps(
        {"run_id": rid, "error": str(e)}, indent=2) + "\n").encode())
    raise
  return {**report, "output_dir": os.fspath(out), "already_prepared": False,
          "written_shards": len(written),
          "written_tokens": sum(s["report"]["tokens"] for s in written),
          "seconds": time.perf_counter() - start}


def _empty_split_line(split: str, split_files, report: dict, subsets: tuple) -> str:
  """The error for a split whose files gave no document: the files, why each line was
  skipped, and what a line must hold."""
  shown = ", ".join(os.fspath(f) for f in split_files[:3])
  more = f" and {len(split_files) - 3} more" if len(split_files) > 3 else ""
  skipped = re.sub(r"(truncated_file [\d,]+)", r"\1: a .zst that zstd could not read to "
                   "its end, truncated, damaged or not zstd at all", describe_skipped(report))
  return (f"config.data.{_FIELDS[split]}: {shown}{more} gave no document ({skipped}); "
          'expected Pile-format JSONL lines with a string "text" field'
          + (f" in the subsets config.data.pile_set_names = {subsets}" if subsets else ""))


def _finish(out: epath.Path, fmt: str, rid: str, identity: dict, tok_info: dict,
            files: dict, shards: list[Shard], done: dict, path_reports: dict) -> dict:
  """Report, token counts, TFDS metadata; ``dataset_info.json`` last."""
  splits, split_infos = {}, []
  for split in files:
    split_shards = [s for s in shards if s.split == split]
    path_report = {**path_reports[split], "files": 0}  # files are counted per shard
    reports = [prepared.split_report(path_report, 0, 0)]
    reports += [done[s.name]["report"] for s in split_shards]
    splits[split] = prepared.aggregate_reports(reports)
    split_infos.append(tfds.core.SplitInfo(
        name=split, shard_lengths=[done[s.name]["report"]["records"] for s in split_shards],
        num_bytes=sum(done[s.name]["num_bytes"] for s in split_shards),
        filename_template=prepared.shard_template(out, split)))
  for split, split_files in files.items():  # newcomer pass 7: an empty validation split
    if split_files and not splits[split]["documents"]:  # was "prepared", exit 0
      raise DataError(_empty_split_line(split, split_files, splits[split],
                                        tuple(identity["pile_set_names"])))
  counts_V = np.zeros(tok_info["vocab_size"], np.int64)
  for shard in shards:
    if shard.counts_path is not None:
      counts_V += read_npy(shard.counts_path)
  report = prepared.dataset_report(rid, fmt, tok_info, splits)
  write_bytes_atomic(out / prepared.COUNTS_FILE, npy_bytes(counts_V))
  write_bytes_atomic(out / prepared.REPORT_FILE,
                              (json.dumps(report, indent=2) + "\n").encode())
  metadata = tfds.core.MetadataDict(
      format_version=prepared.FORMAT_VERSION, run_id=rid, format=fmt, tokenizer=tok_info,
      sources=identity["sources"], pile_set_names=identity["pile_set_names"],
      strict=identity["strict"], report=report, writer="lev-prepare-data")
  # Writes features.json, metadata.json, then dataset_info.json (DatasetInfo
  # .write_to_directory): its presence marks the dataset finished.
  tfds.folder_dataset.write_metadata(
      data_dir=out, features=prepared.features(fmt), split_infos=split_infos,
      version=prepared.DATASET_VERSION, check_data=False,
      description="Pile-format documents prepared by lev-prepare-data (lev_jax).",
      homepage="https://pile.eleuther.ai/", metadata=metadata)
  logging.info("%s: prepared (run %s): %s", out, rid,
               {s: (r["documents"], r["tokens"]) for s, r in splits.items()})
  return report
