"""Data for lev_jax: documents -> token ids -> packed grain batches.

`load(config)` reads ``config.data`` once and returns a `DataBundle`. Sources
(``config.data.source``):

* ``'embedded'``: CPython 3.11.7's pydoc topics and standard-library docstrings, frozen
  in the package (`embedded.embedded_documents`, 607 documents, 2.3 MB, sha256-checked),
  written once as Pile-format JSONL under
  ``config.data.cache_dir`` and split per document by a hash of its text (a test
  split too with ``data.test_fraction`` > 0, for ``lev-eval --split=test``);
* ``'jsonl'``: Pile-format ``*.jsonl`` / ``*.jsonl.zst`` files or globs (local or
  ``gs://``) in ``config.data.train_files`` read into memory (and ``validation_files``,
  else a hash hold-out of ``validation_fraction``); small corpora;
* ``'jsonl_stream'``: the same files streamed (`stream.JsonlStreamDataset`, file order
  shuffled per epoch, packed sequences shuffled in a ``shuffle_buffer`` window: the
  paper's setting); no preparation step; resume re-reads the current file up to its
  position; documents, tokens and skipped lines are counted as the stream reads them
  (`DataBundle.current_report`: complete once a whole epoch was read);
* ``'prepared'``: the ArrayRecord dataset written by ``lev-prepare-data``
  (`prepared.open_prepared`): random access, a global shuffle by seed, its own
  tokenizer, token counts and data report; The Pile at pod scale.

Tokenizers (``config.data.tokenizer``): SentencePiece BPE trained on the training text
(cached under ``{cache_dir}/tokenizers``) or ``data.sentencepiece_file``; o200k_base
through tiktoken (``data.tiktoken_file``); UTF-8 bytes. Batches are ``{"inputs",
"targets": int32 [B, L], "weights": float32 [B, L]}`` (+ ``segment_ids``,
``positions`` with ``data.segment_masking``), L = ``config.train.seq_len``.

Modules: `corpus` (readers, `DataError`, hash splits), `embedded` (the frozen default
corpus; `embedded_build` rebuilds it), `stream`, `tokenizer`, `pipeline` (grain),
`prepared` / `prepare` (ArrayRecord datasets), `vocabularies` (seqio; imports
TensorFlow, so it is never imported here).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Sequence

from absl import logging
from etils import epath
import grain
import ml_collections
import numpy as np

from lev_jax.data.corpus import DataError, read_documents, split_documents
from lev_jax.data.embedded import embedded_documents, write_embedded_corpus
from lev_jax.data.files import npy_bytes, read_npy, write_bytes_atomic
from lev_jax.data.pipeline import (count_tokens, make_eval_batches, make_train_dataset,
                                   token_counts)
from lev_jax.data.tokenizer import (ByteTokenizer, SentencePieceTokenizer, TiktokenTokenizer,
                                    cache_key, make_tokenizer, train_sentencepiece)

__all__ = [
    "ByteTokenizer", "DataBundle", "DataError", "SentencePieceTokenizer", "TiktokenTokenizer",
    "embedded_documents", "load", "make_eval_batches", "make_train_dataset",
    "read_documents", "token_counts", "train_sentencepiece", "write_embedded_corpus",
]

# jsonl_stream: token counts (for the frequency buckets) and a SentencePiece vocabulary
# come from the first documents of the stream, up to these many.
STREAM_SAMPLE_DOCUMENTS = 20_000


@dataclasses.dataclass
class DataBundle:
  """Everything the trainer needs from the data, built once by `load`.

  Attributes:
    tokenizer: ``vocab_size == config.model.vocab_size`` (checked by `load`).
    report: ``{"source", "train": read report, "validation": read report or None,
      "train_tokens", "tokenizer_path", "counts_path", ...}`` (+ the preparation report
      of a prepared dataset); as `load` left it: for jsonl_stream, whose counts grow as
      the streams are read, `current_report` has them.
    token_counts_V: int64 [config.model.vocab_size], occurrences of each id (one eos
      per document) in the training split (a sample of it for jsonl_stream).
    config: the experiment config the batches are built from.
    train_documents: ``(shard_index, shard_count) -> documents`` of that shard: a list
      of texts, a ``grain.MapDataset`` of prepared records, or a stream.
    validation_documents: a list of texts, a random-access source or a finite stream.
  """

  tokenizer: object
  report: dict
  token_counts_V: np.ndarray = dataclasses.field(repr=False)
  config: ml_collections.ConfigDict = dataclasses.field(repr=False)
  train_documents: Callable[[int, int], object] = dataclasses.field(repr=False)
  validation_documents: object = dataclasses.field(repr=False)
  _eval_batches: list | None = dataclasses.field(default=None, repr=False)
  _eval_data: dict | None = dataclasses.field(default=None, repr=False)
  _train_stream: object = dataclasses.field(default=None, repr=False)

  def train_dataset(self, batch_size: int, shard_index: int = 0, shard_count: int = 1
                    ) -> grain.IterDataset:
    """Endless shuffled batches, int32/float32 [batch_size, seq_len]; see
    `pipeline.make_train_dataset` (shuffle_buffer, seed, segment_masking,
    worker_processes from config.data; close the iterator when done with it).

    With shard_count > 1 (one shard per process, data.host_batches = "documents"),
    this process reads only its share of the documents (every shard_count-th document
    or line, from shard_index) and `batch_size` is its per-host share.
    """
    c = self.config
    documents = self.train_documents(shard_index, shard_count)
    if hasattr(documents, "counts"):  # a stream: current_report reads its counts
      self._train_stream = documents
    return make_train_dataset(
        documents, self.tokenizer,
        seq_len=c.train.seq_len, batch_size=batch_size, shuffle_buffer=c.data.shuffle_buffer,
        seed=c.data.seed, vocab_size=c.model.vocab_size,
        segment_masking=c.data.segment_masking, worker_processes=c.data.worker_processes)

  def eval_batches(self) -> list[dict[str, np.ndarray]]:
    """The fixed validation batches [eval.batch_size, seq_len] (built once, then reused).

    Raises:
      DataError: the validation split holds less than one batch of tokens.
    """
    if self._eval_batches is None:
      c = self.config
      self._eval_batches = make_eval_batches(
          self.validation_documents, self.tokenizer, seq_len=c.train.seq_len,
          batch_size=c.eval.batch_size, n_batches=c.eval.batches,
          vocab_size=c.model.vocab_size, segment_masking=c.data.segment_masking)
    return self._eval_batches

  def eval_data(self) -> dict:
    """What `eval_batches` hold: `evaluate.data_record` (split "validation", its
    files, the batches' sha256, N tokens evaluated of the split's M; M None for a
    validation stream not read to its end). Built once, with the batches; costs one
    encode of in-memory validation documents (to count M).

    Raises:
      DataError: as `eval_batches`.
    """
    if self._eval_data is None:
      from lev_jax.evaluate import data_record  # pylint: disable=g-import-not-at-top
      batches = self.eval_batches()
      self._eval_data = data_record(batches, split="validation",
                                    files=self._validation_files(),
                                    tokens_in_split=self._validation_tokens())
    return self._eval_data

  def _validation_files(self) -> list[str]:
    d, source = self.config.data, self.report.get("source")
    if source == "embedded":
      return [self.report["corpus_paths"]["validation"]]
    if source == "prepared":
      return [f"{d.prepared_dir} (validation split)"]
    if d.validation_files:
      files = d.validation_files
      return [files] if isinstance(files, (str, os.PathLike)) else [str(f) for f in files]
    return [f"hold-out ({d.validation_fraction}) of " + ", ".join(map(str, d.train_files))]

  def _validation_tokens(self) -> int | None:
    """M: the validation split's tokens, eos included (None: a stream not read to its
    end, or a prepared dataset whose report lacks them)."""
    docs, source = self.validation_documents, self.report.get("source")
    if isinstance(docs, list):
      return count_tokens(docs, self.tokenizer)
    if source == "prepared":
      split = self.report.get("validation") or {}
      if "tokens" in split and "documents" in split:
        return int(split["tokens"]) + int(split["documents"])
      return None
    counts = getattr(docs, "counts", lambda: None)()
    if counts and counts["complete"] and counts["report"]["tokens"] is not None:
      return counts["report"]["tokens"] + counts["report"]["documents"]
    return None

  def current_report(self) -> dict:
    """`report` with what the streams have counted so far (source jsonl_stream; the
    other sources count everything in `load`, and this is a copy of `report`).

    For jsonl_stream, ``train`` and ``validation`` are the stream's counts (a read
    report plus ``tokens``, ids without eos) with ``count``: "complete" (a whole epoch
    of the files was read: the split's counts; for training, of this process's shard)
    or "partial" (so far; ``note`` says how far), and ``train_tokens`` is the counted
    training tokens, eos included. ``counted`` sums that up: ``{"train": "complete" |
    "partial" | "not read yet", "validation": ...}``. The training counts are of the
    stream made last by `train_dataset` (read ahead by the shuffle window); the
    validation counts, of what `eval_batches` read.
    """
    report = dict(self.report)
    if report.get("source") != "jsonl_stream":
      return report
    train = self._train_stream.counts() if self._train_stream is not None else None
    validation = getattr(self.validation_documents, "counts", lambda: None)()
    report["train"] = _stream_section(train, "training")
    report["validation"] = _stream_section(validation, "validation")
    counted = report["train"].get("documents")
    report["train_tokens"] = (None if counted is None or report["train"]["tokens"] is None
                              else report["train"]["tokens"] + counted)
    report["counted"] = {"train": report["train"]["count"],
                         "validation": report["validation"]["count"]}
    return report


def _stream_section(counts: dict | None, split: str) -> dict:
  """A data report's section for one stream's `JsonlStreamDataset.counts` (see
  `DataBundle.current_report`)."""
  if counts is None:
    return {"count": "not read yet", "note": f"the {split} stream has not been read yet"}
  shard = f"shard {counts['shard_index']} of {counts['shard_count']}"
  if counts["complete"]:
    note = (f"complete: a whole epoch of the {split} files ({counts['files']}) was read; "
            f"these are the counts of the {split} split"
            + (f" ({shard}: this process's share)" if counts["shard_count"] > 1 else ""))
  elif counts["report"] is None:
    note = (f"partial, and unknown until epoch {counts['epoch'] + 1} starts: the stream "
            "resumed mid-epoch from a checkpoint saved before streams were counted")
  else:
    note = (f"partial: {counts['files_read']} of {counts['files']} {split} file(s) of "
            f"epoch {counts['epoch']} read so far ({shard}); complete once a whole epoch "
            "is read")
  return {**(counts["report"] or {}), "count": "complete" if counts["complete"] else
          "partial", "note": note, "epoch": counts["epoch"], "shard": shard}


def _read(patterns: Sequence[str] | str, d: ml_collections.ConfigDict, field: str):
  if isinstance(patterns, (str, os.PathLike)):  # a lone path, not a sequence of them
    patterns = [patterns]
  try:
    return read_documents(list(patterns), strict=d.strict,
                          pile_set_names=tuple(d.pile_set_names))
  except DataError as e:
    raise DataError(f"config.data.{field}: {e}") from e


def _stream(patterns, d: ml_collections.ConfigDict, field: str, **kwargs):
  """A `stream.JsonlStreamDataset` of config.data.<field> (kwargs: its options)."""
  from lev_jax.data.stream import JsonlStreamDataset  # pylint: disable=g-import-not-at-top
  if isinstance(patterns, (str, os.PathLike)):
    patterns = [patterns]
  try:
    return JsonlStreamDataset(list(patterns), seed=d.seed, strict=d.strict,
                              pile_set_names=tuple(d.pile_set_names), **kwargs)
  except DataError as e:
    raise DataError(f"config.data.{field}: {e}") from e


def _cached_counts(tokenizer, docs: list[str], vocab_size: int, path: epath.Path
                   ) -> tuple[np.ndarray, epath.Path]:
  """Token counts of docs, cached at `path` (keyed by the docs, vocab and tokenizer)."""
  if path.exists():
    counts_V = read_npy(path)
    if counts_V.shape == (vocab_size,) and counts_V.dtype == np.int64:
      return counts_V, path
  counts_V = token_counts(docs, tokenizer, vocab_size)
  write_bytes_atomic(path, npy_bytes(counts_V))
  return counts_V, path


def _check_not_empty(train_docs, validation_docs, d) -> None:
  if not train_docs:
    where = ("the embedded corpus" if d.source == "embedded"
             else f"config.data.train_files = {tuple(d.train_files)}")
    raise DataError(f"the training split has no documents: {where} gave no non-empty text"
                    + (f" in subsets {tuple(d.pile_set_names)} (config.data.pile_set_names)"
                       if d.pile_set_names else ""))
  if not validation_docs:
    if d.source == "jsonl" and d.validation_files:
      where = f"config.data.validation_files = {tuple(d.validation_files)} gave no non-empty text"
    else:
      where = (f"holding out config.data.validation_fraction = {d.validation_fraction} of "
               f"{len(train_docs)} training documents selected none; set "
               "config.data.validation_files or raise data.validation_fraction")
    raise DataError(f"the validation split has no documents: {where}")


def _in_memory(config, report: dict) -> DataBundle:
  """Sources 'embedded' and 'jsonl': every document in memory, split, tokenizer, counts."""
  d = config.data
  cache_dir = epath.Path(os.path.expanduser(d.cache_dir))
  if d.source == "embedded":
    paths = write_embedded_corpus(cache_dir, d.validation_fraction, d.test_fraction)
    report["corpus_paths"] = {k: os.fspath(v) for k, v in paths.items()}
    train_docs, report["train"] = _read([paths["train"]], d, "cache_dir")
    validation_docs, report["validation"] = _read([paths["validation"]], d, "cache_dir")
  else:
    train_docs, report["train"] = _read(d.train_files, d, "train_files")
    if d.validation_files:
      validation_docs, report["validation"] = _read(d.validation_files, d,
                                                    "validation_files")
    else:
      train_docs, validation_docs = split_documents(train_docs, d.validation_fraction)
  _check_not_empty(train_docs, validation_docs, d)
  tokenizer, counts_path = _tokenizer(config, train_docs, report)
  counts_V, counts_path = _cached_counts(tokenizer, train_docs, config.model.vocab_size,
                                         counts_path)
  report.update(train_tokens=int(counts_V.sum()), counts_path=os.fspath(counts_path))
  logging.info(
      "Data (%s): %d train documents (%d tokens, eos included), %d validation documents; "
      "tokenizer %s; "
      "token counts %s.", d.source, len(train_docs), report["train_tokens"],
      len(validation_docs), report["tokenizer_path"], report["counts_path"])
  return DataBundle(tokenizer=tokenizer, report=report, token_counts_V=counts_V,
                    config=config, train_documents=lambda i, n: train_docs[i::n],
                    validation_documents=validation_docs)


def _tokenizer(config, sample_docs: list[str], report: dict):
  """The configured tokenizer and the path of its token-counts cache file."""
  d = config.data
  cache_dir = epath.Path(os.path.expanduser(d.cache_dir)) / "tokenizers"
  cache_dir.mkdir(parents=True, exist_ok=True)
  try:
    tokenizer = make_tokenizer(d, config.model.vocab_size, train_texts=sample_docs,
                               cache_dir=cache_dir)
  except DataError as e:
    raise DataError(e if "config." in str(e) else f"config.model.vocab_size: {e}") from e
  if tokenizer.name == "sentencepiece":
    report["tokenizer_path"] = os.fspath(tokenizer.model_path)
  else:
    report["tokenizer_path"] = (d.tiktoken_file or "tiktoken:o200k_base"
                                if tokenizer.name == "o200k_base" else "bytes")
  key = cache_key(sample_docs, config.model.vocab_size)[:16]
  counts_path = cache_dir / f"{tokenizer.name}-{tokenizer.fingerprint[:12]}-{key}.counts.npy"
  return tokenizer, counts_path


def _streamed(config, report: dict) -> DataBundle:
  """Source 'jsonl_stream': nothing read up front beyond a sample of the training
  stream (tokenizer training, token counts)."""
  import itertools  # pylint: disable=g-import-not-at-top
  d = config.data
  # Quiet: the training stream reads these lines again and logs their skips then.
  sample_stream = _stream(d.train_files, d, "train_files", num_epochs=1, warn=False)
  sample_docs = list(itertools.islice(iter(sample_stream), STREAM_SAMPLE_DOCUMENTS))
  tokenizer, counts_path = _tokenizer(config, sample_docs, report)
  counts_V, counts_path = _cached_counts(tokenizer, sample_docs, config.model.vocab_size,
                                         counts_path)
  validation = _stream(d.validation_files, d, "validation_files", num_epochs=1,
                       encode=tokenizer.encode)
  # train, validation, train_tokens: counted as the streams are read (current_report).
  report.update(train_tokens=None, counts_path=os.fspath(counts_path), train=None,
                validation=None, counts_from=(
                    f"the first {len(sample_docs)} documents of the training stream "
                    f"({int(counts_V.sum())} tokens, eos included)"))
  logging.info("Data (jsonl_stream): token counts from %s; tokenizer %s.",
               report["counts_from"], report["tokenizer_path"])
  return DataBundle(
      tokenizer=tokenizer, report=report, token_counts_V=counts_V, config=config,
      train_documents=lambda i, n: _stream(d.train_files, d, "train_files",
                                           shard_index=i, shard_count=n,
                                           encode=tokenizer.encode),
      validation_documents=validation)


def _prepared(config, report: dict) -> DataBundle:
  """Source 'prepared': the lev-prepare-data dataset at data.prepared_dir."""
  from lev_jax.data import prepared  # pylint: disable=g-import-not-at-top
  d = config.data
  try:
    dataset = prepared.open_prepared(os.path.expanduser(d.prepared_dir))
  except DataError as e:
    raise DataError(f"config.data.prepared_dir: {e}") from e
  dataset.check_vocab(config.model.vocab_size)
  tokenizer = dataset.tokenizer
  if tokenizer.name != d.tokenizer:
    raise DataError(
        f"config.data.tokenizer = {d.tokenizer!r} but {d.prepared_dir} was prepared with "
        f"{tokenizer.name!r}: model and data must agree (prepare again or fix the config)")
  if "validation" not in dataset.splits:
    raise DataError(f"config.data.prepared_dir: {d.prepared_dir} has no validation split "
                    "(set data.validation_files and run lev-prepare-data again)")
  train_source = dataset.source("train")
  splits = (dataset.report or {}).get("splits", {})
  report.update(prepared_dir=os.fspath(d.prepared_dir), preparation=dataset.report,
                train=splits.get("train"), validation=splits.get("validation"),
                train_tokens=int(dataset.token_counts_V.sum()),
                tokenizer_path=os.fspath(epath.Path(d.prepared_dir) / "tokenizer"),
                counts_path=os.fspath(epath.Path(d.prepared_dir) / "token_counts.npy"))
  logging.info("Data (prepared %s): %d train / %d validation documents, %d train tokens "
               "(eos included); tokenizer %s.", d.prepared_dir, dataset.splits["train"],
               dataset.splits["validation"], report["train_tokens"], tokenizer.name)
  return DataBundle(
      tokenizer=tokenizer, report=report, token_counts_V=dataset.token_counts_V,
      config=config,
      train_documents=lambda i, n: grain.MapDataset.source(train_source)[i::n],
      validation_documents=dataset.source("validation"))


def load(config: ml_collections.ConfigDict) -> DataBundle:
  """Reads the documents (or opens the stream / prepared dataset), the tokenizer and
  the token counts of ``config.data``.

  Reads ``config.data`` (source, train_files, validation_files, pile_set_names,
  validation_fraction, cache_dir, strict, tokenizer, tiktoken_file,
  sentencepiece_file, prepared_dir) and ``config.model.vocab_size``; the bundle's batch
  methods read ``config.train.seq_len``, ``config.data.shuffle_buffer`` / ``seed`` /
  ``segment_masking`` and ``config.eval.batch_size`` / ``batches``.

  Raises:
    DataError: missing or bad files (named, with ``config.data.<field>``), an empty
      training or validation split, an unfinished or mismatched prepared dataset, or a
      vocab_size the tokenizer does not have.
  """
  d = config.data
  report = {"source": d.source, "validation": None, "corpus_paths": None}
  if d.source in ("embedded", "jsonl"):
    return _in_memory(config, report)
  if d.source == "jsonl_stream":
    return _streamed(config, report)
  if d.source == "prepared":
    return _prepared(config, report)
  raise DataError(f"config.data.source = {d.source!r}: expected 'embedded', 'jsonl', "
                  "'jsonl_stream' or 'prepared'")
