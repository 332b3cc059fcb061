"""Prepared datasets: ArrayRecord shards in a TFDS dataset folder, and their reader.

``lev-prepare-data`` (`lev_jax.data.prepare`) and the TFDS builder
`lev_jax.data.tfds_builder.LevText` write the
same layout, a TensorFlow Datasets folder
(https://www.tensorflow.org/datasets/external_tfrecord) of ArrayRecord files
(https://github.com/google/array_record)::

  {folder}/
    lev_text-train.array_record-00000-of-00030   shards, TFDS's name template
    ...                                          {DATASET}-{SPLIT}.{FILEFORMAT}-{SHARD_X_OF_Y};
    lev_text-validation.array_record-00000-of-00001   one record per document
    tokenizer/         tokenizer.json (+ spm.model | o200k_base.tiktoken):
                       `tokenizer_files.load_tokenizer`
    token_counts.npy   int64 [vocab_size]: occurrences of each id in the train split,
                       eos counted once per document
    report.json        per split: files, documents, characters, tokens, records,
                       skipped by reason (`reports.SKIP_REASONS`); and the total
    prepare/           lev-prepare-data only: run.json (the run's identity), and per
                       shard {shard}.json (its stats and run id; written last, it marks
                       the shard finished) and {shard}.counts.npy (train shards)
    features.json, metadata.json   TFDS metadata
    dataset_info.json  TFDS; written last: its presence marks a finished dataset

Records (`features`): format "tokens" -> ``{"tokens": int32 [n] (the document's ids,
WITHOUT eos: the loader appends it), "pile_set_name": bytes}``; format "text" ->
``{"text": bytes (UTF-8), "pile_set_name": bytes}``, tokenized at load time with the
saved tokenizer (token counts and the report are still computed at preparation).

``metadata.json`` (a `tfds.core.MetadataDict`) records ``format_version``, ``run_id``
(`run_id`: a fingerprint of everything that defines the data: the input files with
their sizes, subsets, tokenizer fingerprint, format, strict), ``format``, ``tokenizer``
(`tokenizer_info`), ``sources`` (per split: input paths and sizes), ``pile_set_names``,
``strict`` and ``report``.

Reading (`open_prepared`) needs neither TensorFlow nor Beam: TFDS's ArrayRecord data
source and ``FeaturesDict.deserialize_example_np`` are pure Python + NumPy.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
from collections.abc import Iterator, Sequence

from etils import epath
import numpy as np
import tensorflow_datasets as tfds

from lev_jax.data import corpus
from lev_jax.data import tokenizer as tokenizer_lib
from lev_jax.data import tokenizer_files
from lev_jax.data.errors import DataError
from lev_jax.data.files import read_npy
from lev_jax.data.reports import merge_reports
from lev_jax.workdir import (CHECKPOINTS, METRICS, PREPARED_INFO, PREPARED_RUN_JSON,
                             PREPARED_WORK, RUN_OUTPUTS, file_sha256)

DATASET_NAME = "lev_text"
FILE_FORMAT = "array_record"
FORMAT_VERSION = 1
DATASET_VERSION = "1.0.0"
FORMATS = ("tokens", "text")
TOKENIZER_DIR = "tokenizer"
COUNTS_FILE = "token_counts.npy"
REPORT_FILE = "report.json"
WORK_DIR = PREPARED_WORK  # lev_jax/workdir.py names them: other commands tell this folder
RUN_FILE = PREPARED_RUN_JSON  # from a run's (`is_prepared_data`)
INFO_FILE = PREPARED_INFO
# In WORK_DIR: {"run_id", "error"} of a run that stopped on bad input after writing its
# shards (e.g. a split whose files gave no document); removed when a run starts.
STOPPED_FILE = "stopped.json"
# ArrayRecord options: one record per chunk group, so any record is read on its own
# (https://github.com/google/array_record, "group_size"; TFDS writes the same).
WRITER_OPTIONS = "group_size:1"
_RERUN = "run lev-prepare-data --config=... again to complete it"
# Every shard of a local dataset is hashed at each open (and lev-prepare-data's re-run)
# while its shards together hold at most this many bytes (sha256: about 2 s per GiB on
# one core); larger or remote ones are checked by size, and a shard damaged inside is
# named when it is read (`ShardSource`).
HASH_LIMIT_BYTES = 1 << 30
_PREPARE_AGAIN = ("prepare the data again (lev-prepare-data --config=... rewrites what "
                  "was damaged)")


def features(fmt: str) -> tfds.features.FeaturesDict:
  """The TFDS features of one record in format `fmt` ("tokens" or "text").

  Raises:
    DataError: an unknown format.
  """
  if fmt == "tokens":
    return tfds.features.FeaturesDict({
        "tokens": tfds.features.Tensor(shape=(None,), dtype=np.int32),
        "pile_set_name": tfds.features.Text()})
  if fmt == "text":
    return tfds.features.FeaturesDict({"text": tfds.features.Text(),
                                       "pile_set_name": tfds.features.Text()})
  raise DataError(f"config.data.prepare_format = {fmt!r}: expected one of {FORMATS}")


def shard_template(folder, split: str) -> tfds.core.ShardedFileTemplate:
  """TFDS's default file-name template for `split`'s ArrayRecord shards in `folder`."""
  return tfds.core.ShardedFileTemplate(
      data_dir=epath.Path(folder), template=tfds.core.naming.DEFAULT_FILENAME_TEMPLATE,
      dataset_name=DATASET_NAME, split=split, filetype_suffix=FILE_FORMAT)


def shard_path(folder, split: str, index: int, count: int) -> epath.Path:
  """``{folder}/lev_text-{split}.array_record-{index:05d}-of-{count:05d}``."""
  return shard_template(folder, split).sharded_filepath(shard_index=index,
                                                        num_shards=count)


def run_id(identity: dict) -> str:
  """16 hex digits of sha256 over `identity` as sorted JSON (see `run_identity`)."""
  data = json.dumps(identity, sort_keys=True, separators=(",", ":")).encode()
  return hashlib.sha256(data).hexdigest()[:16]


def run_identity(*, fmt: str, strict: bool, pile_set_names: Sequence[str],
                 tokenizer: dict, sources: dict[str, list[dict]]) -> dict:
  """Everything that defines a prepared dataset, JSON-serialisable.

  Args:
    fmt: "tokens" or "text".
    strict: config.data.strict (it decides which lines are kept).
    pile_set_names: the kept subsets (order kept; empty = all).
    tokenizer: what defines the ids: ``{"name", "fingerprint"}`` of a given tokenizer,
      or the training recipe of one trained on the train split.
    sources: per split, ``[{"path": str, "bytes": int}, ...]`` in shard order.
  """
  return {"format_version": FORMAT_VERSION, "format": fmt, "strict": bool(strict),
          "pile_set_names": [str(s) for s in pile_set_names], "tokenizer": tokenizer,
          "sources": sources}


def describe_files(files: Sequence[epath.Path]) -> list[dict]:
  """``[{"path": absolute path or URL, "bytes": size}]`` of input files, in order."""
  out = []
  for f in files:
    text = os.fspath(f)
    if "://" not in text:
      text = os.path.abspath(text)
    out.append({"path": text, "bytes": int(epath.Path(f).stat().length)})
  return out


def training_sample(files: Sequence[epath.Path], *, strict: bool = False,
                    pile_set_names: Sequence[str] = (),
                    max_characters: int = tokenizer_lib.MAX_TRAINING_CHARS,
                    report: dict | None = None) -> list[str]:
  """Documents to train a SentencePiece vocabulary on, streamed from the train files.

  Reads the files round-robin (one document from each in turn, so every file is
  represented) with `corpus.iter_file` until `max_characters` characters or the end of
  every file. Deterministic for given files. Skipped lines are not logged (the full
  read that follows logs them once); they are counted in `report` (`reports.new_report`)
  when given.

  Raises:
    DataError: (strict) a bad line, naming ``file:line``.
  """
  # Quiet: the shards read these files again in full and report (and log) their skips.
  streams = [iter(corpus.iter_file(f, strict=strict, pile_set_names=pile_set_names,
                                   warn=False, report=report))
             for f in files]
  texts, chars = [], 0
  while streams and chars < max_characters:
    for stream in list(streams):
      item = next(stream, None)
      if item is None:
        streams.remove(stream)
        continue
      texts.append(item[1])
      chars += len(item[1])
      if chars >= max_characters:
        break
  for stream in streams:  # closes the files not read to the end
    stream.close()
  return texts


def file_examples(path, tokenizer, *, fmt: str, strict: bool = False,
                  pile_set_names: Sequence[str] = (), report: dict | None = None
                  ) -> Iterator[tuple[int, dict, np.ndarray]]:
  """The records of one Pile-format file, tokenized one document at a time.

  Shared by ``lev-prepare-data`` (one worker process per file, each on one core: the
  tokenizers' multi-threaded batch paths are not used, so workers = cores) and the
  TFDS builder `LevText`.

  Args:
    path: a ``*.jsonl`` / ``*.jsonl.zst`` file, streamed with `corpus.iter_file`.
    tokenizer: any lev_jax tokenizer (``encode``).
    fmt: "tokens" or "text" (see `features`).
    strict, pile_set_names, report: as in `corpus.iter_file` (the report counts
      documents, characters and skipped lines by reason).

  Yields:
    ``(lineno, record, ids_N)``: the 1-based line number, the record for
    ``features(fmt).serialize_example``, and the document's ids (int32 [n], no eos).

  Raises:
    DataError: an unknown format; (strict) the first bad line or damaged file.
  """
  features(fmt)  # checks fmt
  for lineno, text, subset in corpus.iter_file(path, strict=strict,
                                               pile_set_names=pile_set_names,
                                               report=report):
    ids_N = np.asarray(tokenizer.encode(text), dtype=np.int32)
    record = {"tokens": ids_N} if fmt == "tokens" else {"text": text}
    record["pile_set_name"] = "" if subset is None else str(subset)
    yield lineno, record, ids_N


class TokenCounter:
  """Occurrences of each id (int64 [vocab_size]), eos counted once per document.

  Ids are buffered and counted with `np.bincount` in blocks of about a million.

  Raises:
    DataError: (in `add` / `counts_V`) an id outside [0, vocab_size).
  """

  def __init__(self, vocab_size: int, eos_id: int):
    self.vocab_size, self.eos_id = int(vocab_size), int(eos_id)
    self._counts_V = np.zeros(self.vocab_size, np.int64)
    self._pending: list[np.ndarray] = []
    self._pending_n = 0
    self._documents = 0

  def add(self, ids_N: np.ndarray) -> None:
    """Counts one document's ids (int [n], without eos) and its eos."""
    self._pending.append(ids_N)
    self._pending_n += ids_N.size
    self._documents += 1
    if self._pending_n >= 1 << 20:
      self._flush()

  def _flush(self) -> None:
    if self._pending:
      ids = np.concatenate(self._pending)
      if ids.size and (ids.min() < 0 or ids.max() >= self.vocab_size):
        bad = int(ids.min() if ids.min() < 0 else ids.max())
        raise DataError(f"token id {bad} is outside [0, vocab_size = {self.vocab_size}): "
                        "the tokenizer produced an id beyond its vocab_size")
      self._counts_V += np.bincount(ids, minlength=self.vocab_size)
    self._pending, self._pending_n = [], 0

  @property
  def counts_V(self) -> np.ndarray:
    """int64 [vocab_size]: the counts so far (a copy)."""
    self._flush()
    counts_V = self._counts_V.copy()
    counts_V[self.eos_id] += self._documents
    return counts_V


def split_report(read_report: dict, tokens: int, records: int) -> dict:
  """A split's (or shard's) report: a `reports.new_report` dict plus tokens and records."""
  return {**merge_reports(read_report), "tokens": int(tokens),
          "records": int(records)}


def aggregate_reports(reports: Sequence[dict]) -> dict:
  """Field-wise sum of `split_report` dicts (files, documents, characters, tokens,
  records, skipped by reason)."""
  total = merge_reports(*reports)
  total["tokens"] = sum(int(r.get("tokens", 0)) for r in reports)
  total["records"] = sum(int(r.get("records", 0)) for r in reports)
  return total


def dataset_report(rid: str, fmt: str, tok_info: dict, splits: dict[str, dict]) -> dict:
  """The report.json / metadata report: ``{"run_id", "format", "tokenizer", "splits":
  {split: split_report}, "total": aggregate}``."""
  return {"run_id": rid, "format": fmt, "tokenizer": tok_info,
          "splits": splits, "total": aggregate_reports(list(splits.values()))}


# ----------------------------------------------------------------------------- reading


@dataclasses.dataclass
class PreparedDataset:
  """A finished prepared dataset (see `open_prepared`).

  Attributes:
    path: the dataset folder.
    metadata: ``metadata.json`` as a dict (format_version, run_id, format, tokenizer,
      sources, pile_set_names, strict, report).
    format: "tokens" or "text" (text records are tokenized at load time).
    splits: split name -> number of records (documents).
    report: ``report.json`` (else ``metadata["report"]``; None when neither exists).
    token_counts_V: int64 [vocab_size] from ``token_counts.npy`` (train split, one eos
      per document); None when the folder has none (a TFDS dataset written by other
      means).
  """

  path: epath.Path
  metadata: dict
  format: str
  splits: dict[str, int]
  report: dict | None
  token_counts_V: np.ndarray | None = dataclasses.field(repr=False)
  _builder: object = dataclasses.field(repr=False)

  @functools.cached_property
  def tokenizer(self) -> tokenizer_lib.Tokenizer:
    """The tokenizer the data was prepared with (`load_tokenizer` of ``tokenizer/``;
    loaded on first use, fingerprint checked).

    Raises:
      DataError: a missing or damaged ``tokenizer/`` folder, or a tokenizer whose
        fingerprint differs from the one in ``metadata.json``.
    """
    tokenizer = tokenizer_files.load_tokenizer(self.path / TOKENIZER_DIR)
    recorded = (self.metadata.get("tokenizer") or {}).get("fingerprint")
    if recorded and tokenizer.fingerprint != recorded:
      raise DataError(f"{self.path / TOKENIZER_DIR}: tokenizer fingerprint "
                      f"{tokenizer.fingerprint[:16]} differs from {recorded[:16]} in "
                      f"{self.path / 'metadata.json'}: the tokenizer does not belong to "
                      "this data; restore the folder, or prepare the data again "
                      "(lev-prepare-data --config=... --overwrite)")
    return tokenizer

  @property
  def vocab_size(self) -> int:
    """The tokenizer's number of ids, as recorded in ``metadata.json``."""
    return int(self.metadata["tokenizer"]["vocab_size"])

  def check_vocab(self, vocab_size: int) -> None:
    """Raises DataError unless `vocab_size` (config.model.vocab_size) equals the
    tokenizer's vocab_size (`tokenizer.check_vocab_agreement`); the message names both
    numbers and the folder."""
    tok = self.metadata["tokenizer"]
    tokenizer_lib.check_vocab_agreement(
        vocab_size, tok["name"], tok["vocab_size"], source=str(self.path),
        hint=f" (set config.model.vocab_size = {tok['vocab_size']} or prepare the data "
        "again with a matching tokenizer)")

  def source(self, split: str):
    """A random-access source of `split`'s records (TFDS ``as_data_source``).

    Returns:
      A `ShardSource` over TFDS's ``ArrayRecordDataSource``: ``len(source)`` records,
      ``source[i]`` / ``source.__getitems__(indices)`` -> dicts of NumPy values (see
      the module docstring; Text features come back as UTF-8 ``bytes``). It pickles,
      so grain worker processes can read it (``grain.MapDataset.source``). A split
      with no records (every line skipped) gives an empty list.

    Raises:
      DataError: a split the dataset does not have.
    """
    if split not in self.splits:
      raise DataError(f"{self.path}: no split {split!r}; expected one of "
                      f"{sorted(self.splits)}")
    if not self.splits[split]:  # ArrayRecordDataSource refuses an empty file list
      return []
    info = self._builder.info.splits[split]
    count = len(info.shard_lengths)
    return ShardSource(self._builder.as_data_source(split), split,
                       [shard_path(self.path, split, i, count) for i in range(count)],
                       info.shard_lengths)


class ShardSource:
  """A split's TFDS ArrayRecord data source whose read errors name the damaged shard.

  ArrayRecord and Riegeli raise a bare RuntimeError for a shard damaged inside (e.g.
  "Corrupted Riegeli/records file: chunk data hash mismatch ..."), which reached the
  user as a traceback from the training loop; datasets above HASH_LIMIT_BYTES are not
  hashed at open, so this is where such damage shows. Record i of the split is in the
  shard whose cumulative record count first passes i (TFDS reads shards in order). Same
  protocol as the wrapped source (grain's RandomAccessDataSource: ``len``, ``[i]``,
  ``__getitems__``); pickles.

  Raises (on reads):
    DataError: a read failed inside ArrayRecord / Riegeli: the shard file, the record
      and the library's first line, and the fix (delete the shard; lev-prepare-data
      writes it anew).
  """

  def __init__(self, source, split: str, shards: Sequence[str], shard_lengths: Sequence[int]):
    self._source, self._split = source, split
    self._shards = [os.fspath(s) for s in shards]
    self._ends = np.cumsum(np.asarray(shard_lengths, np.int64)).tolist()

  def __len__(self) -> int:
    return len(self._source)

  def _damaged(self, error: RuntimeError, index: int) -> DataError:
    first = (str(error).strip().splitlines() or [type(error).__name__])[0]
    shard = min(int(np.searchsorted(self._ends, index, side="right")), len(self._shards) - 1)
    local = index - (self._ends[shard - 1] if shard else 0)
    return DataError(f"{self._shards[shard]}: damaged shard of split {self._split!r}: its "
                     f"record {local} cannot be read ({first}); delete the file and run "
                     "lev-prepare-data --config=... again, which writes it anew")

  def __getitem__(self, index):
    try:
      return self._source[index]
    except RuntimeError as e:  # ArrayRecord / Riegeli: the only RuntimeErrors here
      raise self._damaged(e, int(index)) from e

  def __getitems__(self, indices):
    try:
      return self._source.__getitems__(indices)
    except RuntimeError as e:
      for index in indices:  # which one: read them one at a time
        try:
          self._source[index]
        except RuntimeError as one:
          raise self._damaged(one, int(index)) from e
      raise self._damaged(e, int(indices[0])) from e

  def __repr__(self) -> str:
    return f"ShardSource(split={self._split!r}, {len(self._shards)} shards)"


def check_work_dir(path: epath.Path) -> None:
  """Refuses a prepared-data folder whose WORK_DIR (prepare/) is a file.

  Raises:
    DataError: naming it and what it should be (newcomer pass 11: lev-eval's
      NotADirectoryError traceback; lev-prepare-data's re-run unmarked the dataset
      finished, then crashed).
  """
  work = path / WORK_DIR
  if work.exists() and not work.is_dir():
    raise DataError(f"{work}: is a file; expected the folder lev-prepare-data keeps its "
                    "shard records in (move it aside)")


def _not_finished(path: epath.Path, why: str) -> DataError:
  """"preparation did not finish"; with the error that stopped it when lev-prepare-data
  recorded one (STOPPED_FILE), which running it again as it was would repeat."""
  stopped = path / WORK_DIR / STOPPED_FILE
  try:
    error = json.loads(stopped.read_text()).get("error") if stopped.exists() else None
  except (OSError, ValueError, AttributeError):
    error = None
  if isinstance(error, str) and error:
    return DataError(f"{path}: preparation did not finish: lev-prepare-data stopped with "
                     f"\"{error}\"; fix that, then run lev-prepare-data --config=... "
                     "again to complete it")
  return DataError(f"{path}: preparation did not finish ({why}); {_RERUN}")


def _not_prepared(path: epath.Path) -> DataError:
  """For a folder with neither INFO_FILE nor a WORK_DIR/ (lev-prepare-data never ran
  there): it holds no prepared data; a training run's folder is named as one, raw JSONL
  found in it is named (a run's own metrics.jsonl is not raw JSONL)."""
  if (path / CHECKPOINTS).is_dir() or (path / METRICS).is_file():
    return DataError(f"{path}: a training run's folder (lev-train's: {CHECKPOINTS}/, "
                     f"{METRICS}), not prepared data: no {INFO_FILE}; expected a folder "
                     "lev-prepare-data wrote (data.prepared_dir)")
  raw = sorted(p.name for p in path.iterdir() if p.name not in RUN_OUTPUTS
               and p.name.endswith((".jsonl", ".jsonl.zst", ".json.zst")))
  found = f" (it holds raw JSONL, e.g. {raw[0]})" if raw else ""
  return DataError(f"{path}: holds no prepared data{found}: no {INFO_FILE}, which "
                   "lev-prepare-data writes; raw Pile-format JSONL needs "
                   "data.source=jsonl with data.train_files (and data.validation_files), "
                   "or lev-prepare-data --config=... first to prepare it here")


def read_json(path: epath.Path):
  """The JSON content of `path`; DataError naming the file when it cannot be read."""
  try:
    return json.loads(path.read_text())
  except (OSError, ValueError) as e:
    raise DataError(f"{path}: cannot read ({type(e).__name__}: {e}); expected the JSON "
                    "file written by lev-prepare-data") from e


def unfinished_work(path: epath.Path, dataset_run_id: str | None) -> str | None:
  """Why `path`'s ``prepare/`` folder shows an unfinished run, or None: leftover
  temporary shards, or a ``run.json`` of another run than `dataset_run_id`."""
  work = path / WORK_DIR
  if not work.exists():
    return None
  tmp = sorted(p.name for p in work.iterdir() if ".tmp" in p.name)
  if tmp:
    return f"temporary file {work / tmp[0]} of an interrupted run"
  run_file = work / RUN_FILE
  if run_file.exists():
    recorded = read_json(run_file).get("run_id")
    if recorded != dataset_run_id:
      return f"{run_file} is for run {recorded}, the dataset is run {dataset_run_id}"
  return None


def shard_problem(shard: epath.Path, stats: dict, hash_it: bool = True) -> str | None:
  """Why the finished shard `shard` differs from what its ``prepare/{shard}.json``
  (`stats`) records: another size, or (`hash_it`, when the stats hold one) another
  sha256; None when it agrees. Stats written before sizes and hashes were recorded
  check nothing."""
  size, recorded = int(shard.stat().length), stats.get("num_bytes")
  if isinstance(recorded, int) and size != recorded:
    return (f"{size:,} bytes, but its preparation wrote {recorded:,}: the file was "
            "replaced, truncated or damaged since")
  digest = stats.get("sha256")
  if hash_it and isinstance(digest, str) and file_sha256(shard) != digest:
    return ("its sha256 differs from the one recorded when it was written: the file was "
            "damaged or replaced since")
  return None


def hashes_checked(path: epath.Path, shards: Sequence[epath.Path]) -> bool:
  """Whether the shards' sha256 are checked: a local dataset whose existing `shards`
  hold at most HASH_LIMIT_BYTES together (a remote one would be downloaded at every
  open; sizes are still checked)."""
  if "://" in os.fspath(path):
    return False
  return sum(int(s.stat().length) for s in shards if s.exists()) <= HASH_LIMIT_BYTES


def check_shards(path: epath.Path, builder, dataset_run_id: str,
                 hash_shards: bool = True) -> None:
  """Each shard listed in ``dataset_info.json`` exists, its ``prepare/{shard}.json``
  records `dataset_run_id`, and it has the size (and, with `hash_shards`, for local
  datasets of at most HASH_LIMIT_BYTES: `hashes_checked`, the sha256) recorded there.
  Without ``prepare/`` (`LevText` output) only existence is checked.

  Raises:
    DataError: a missing shard, a shard of another preparation run, or a shard whose
      size or content changed since it was written (named, with the fix).
  """
  work = path / WORK_DIR
  listed = []
  for split, info in builder.info.splits.items():
    count = len(info.shard_lengths)
    for index in range(count):
      shard = shard_path(path, split, index, count)
      if not shard.exists():
        raise DataError(f"{shard}: missing shard of split {split!r} listed in "
                        f"{path / INFO_FILE}; {_RERUN}")
      if not work.exists():
        continue
      stats_path = work / f"{shard.name}.json"
      if not stats_path.exists():
        raise DataError(f"{shard}: no {stats_path.name} in {work}: the shard was not "
                        f"written by this preparation run; {_RERUN}")
      stats = read_json(stats_path)
      recorded = stats.get("run_id")
      if recorded != dataset_run_id:
        raise DataError(f"{shard}: written by preparation run {recorded} "
                        f"({stats_path}), but the dataset is run {dataset_run_id}: "
                        "shards of different runs never mix; prepare again into a new "
                        "folder (or with --overwrite)")
      listed.append((split, shard, stats))
  hash_it = hash_shards and hashes_checked(path, [shard for _, shard, _ in listed])
  for split, shard, stats in listed:
    why = shard_problem(shard, stats, hash_it)
    if why:
      raise DataError(f"{shard}: damaged shard of split {split!r}: {why}; "
                      f"{_PREPARE_AGAIN}")


def check_token_counts(path: epath.Path, counts_V: np.ndarray, builder) -> None:
  """``token_counts.npy`` (`counts_V`) is the sum of the train shards'
  ``prepare/{shard}.counts.npy`` it was written from (skipped without ``prepare/`` or
  without every one of them: `LevText` output).

  Raises:
    DataError: they differ (the file was edited or replaced), naming the file and how
      many ids differ.
  """
  work = path / WORK_DIR
  info = builder.info.splits.get("train") if work.exists() else None
  if info is None:
    return
  count = len(info.shard_lengths)
  parts = [work / f"{shard_path(path, 'train', i, count).name}.counts.npy"
           for i in range(count)]
  if not all(p.exists() for p in parts):
    return
  summed_V = np.zeros_like(counts_V)
  for p in parts:
    part_V = read_npy(p)
    if part_V.shape != counts_V.shape:
      return  # the shapes are checked against the tokenizer by the caller
    summed_V += part_V
  if not np.array_equal(summed_V, counts_V):
    n = int(np.sum(summed_V != counts_V))
    raise DataError(f"{path / COUNTS_FILE}: {n:,} of {counts_V.size:,} ids' counts differ "
                    f"from the train shards' counts in {work} (sums "
                    f"{int(counts_V.sum()):,} vs {int(summed_V.sum()):,}): the file was "
                    f"edited or replaced since preparation; {_PREPARE_AGAIN}")


def open_prepared(path, *, hash_shards: bool = True) -> PreparedDataset:
  """Opens a finished dataset written by ``lev-prepare-data`` or the `LevText` builder.

  Args:
    path: the dataset folder (str or path-like; ``~`` expanded; local or `etils.epath`
      URL), i.e. config.data.prepared_dir, or ``{data_dir}/lev_text/{config}/1.0.0``
      for the TFDS builder.
    hash_shards: False leaves the shards' sha256 out of `check_shards` (for a caller
      that has just checked them); sizes are always checked.

  Returns:
    A `PreparedDataset`. Reads ``dataset_info.json`` / ``features.json`` /
    ``metadata.json`` (TFDS ``builder_from_directory``), ``report.json`` and
    ``token_counts.npy``; the tokenizer is loaded on first use. Output of `LevText`
    has no ``prepare/`` folder, so its shards carry no per-shard run ids (TFDS writes
    them in one process and renames the whole folder when done); token counts and the
    report are computed by the builder as it writes. A TFDS folder without
    ``token_counts.npy`` / ``report.json`` opens with those set to None.

  Raises:
    DataError: the folder is missing; it holds no prepared data (neither
      ``dataset_info.json`` nor ``prepare/``: e.g. a folder of raw JSONL, named);
      preparation did not finish (``prepare/`` without ``dataset_info.json``, an
      unreadable one, or work files of an unfinished run):
      "...: preparation did not finish; run lev-prepare-data --config=... again to
      complete it"; a shard of another preparation run, or one whose size or sha256
      changed since it was written, a token_counts.npy that is not the sum of the
      train shards' counts (`check_shards`, `check_token_counts`), or a report.json
      that differs from metadata.json's report (named); not a lev_text
      dataset (unexpected features or a newer format version); token counts of the
      wrong shape.
  """
  path = epath.Path(os.path.expanduser(os.fspath(path)))
  if not path.exists():
    raise DataError(f"{path}: no such folder; expected a dataset written by "
                    "lev-prepare-data (config.data.prepared_dir)")
  check_work_dir(path)
  if not (path / INFO_FILE).exists():
    if not (path / WORK_DIR).exists():
      raise _not_prepared(path)
    raise _not_finished(path, f"no {INFO_FILE}")
  again = ("run lev-prepare-data --config=... again to write it anew (--overwrite "
           "prepares everything again)")
  if not (path / "metadata.json").is_file():  # newcomer pass 10: "format_version = None"
    raise DataError(f"{path / 'metadata.json'}: missing, though {INFO_FILE} marks the "
                    f"dataset finished: the dataset's record was deleted; {again}")
  try:
    builder = tfds.builder_from_directory(path)
    metadata = dict(builder.info.metadata or {})
  except Exception as e:  # pylint: disable=broad-except  # JSON / proto / TFDS errors
    # A finished dataset's damaged record: a plain re-run refuses it as another dataset.
    raise DataError(f"{path}: cannot read {INFO_FILE} or metadata.json ({type(e).__name__}: "
                    f"{str(e).strip().splitlines()[0] if str(e).strip() else ''}): the "
                    f"dataset's record is damaged; {again}") from e
  version = metadata.get("format_version")
  fmt = metadata.get("format")
  if (not isinstance(version, int) or version > FORMAT_VERSION or fmt not in FORMATS
      or not isinstance(metadata.get("tokenizer"), dict)):
    raise DataError(f"{path / 'metadata.json'}: format_version = {version!r}, format = "
                    f"{fmt!r}; expected a lev_text dataset (lev-prepare-data or LevText) "
                    f"of format version <= {FORMAT_VERSION}, a format in {FORMATS} and a "
                    "tokenizer record")
  names = set(builder.info.features.keys())
  if names != set(features(fmt).keys()):
    raise DataError(f"{path / 'features.json'}: features {sorted(names)}; expected "
                    f"{sorted(features(fmt).keys())} for format {fmt!r}")
  why = unfinished_work(path, metadata.get("run_id"))
  if why:
    raise _not_finished(path, why)
  check_shards(path, builder, metadata.get("run_id"), hash_shards)
  report = (read_json(path / REPORT_FILE) if (path / REPORT_FILE).exists()
            else metadata.get("report"))
  recorded = metadata.get("report")
  if (recorded is not None and report is not None
      and json.loads(json.dumps(recorded)) != json.loads(json.dumps(report))):
    raise DataError(f"{path / REPORT_FILE}: differs from the report in "
                    f"{path / 'metadata.json'} (lev-prepare-data writes the same in both): "
                    f"one of them was edited; {_PREPARE_AGAIN}")
  counts_V = None
  if (path / COUNTS_FILE).exists():
    counts_V = read_npy(path / COUNTS_FILE)
    vocab = int((metadata.get("tokenizer") or {}).get("vocab_size", -1))
    if counts_V.shape != (vocab,) or counts_V.dtype != np.int64:
      raise DataError(f"{path / COUNTS_FILE}: {counts_V.dtype} {counts_V.shape}; expected "
                      f"int64 ({vocab},), the tokenizer's vocab_size in "
                      f"{path / 'metadata.json'}: one of the two was edited or replaced; "
                      f"{_PREPARE_AGAIN}")
    check_token_counts(path, counts_V, builder)
  splits = {name: int(info.num_examples) for name, info in builder.info.splits.items()}
  return PreparedDataset(path=path, metadata=metadata, format=fmt, splits=splits,
                         report=report, token_counts_V=counts_V, _builder=builder)
