"""`DataBundle`: what `sources.load` returns, the batches and reports built from it.

A bundle holds the tokenizer, the token counts and the documents of both splits of
one config (a list of texts, a stream or a prepared random-access source; see
`lev_jax.data.sources`) and builds from them what the trainer and the evaluation read:
the endless training batches (`DataBundle.train_dataset`, one shard per process), the
fixed validation batches (`eval_batches`), the record of what those hold (`eval_data`)
and the data report, with what the streams have counted so far (`current_report`).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable

import grain
import ml_collections
import numpy as np

from lev_jax.data.pipeline import count_tokens, make_eval_batches, make_train_dataset


@dataclasses.dataclass
class DataBundle:
  """Everything the trainer needs from the data, built once by `load`.

  Attributes:
    tokenizer: ``vocab_size == config.model.vocab_size`` (checked by `load`).
    report: ``{"source", "train": read report, "validation": read report or None,
      "train_tokens", "tokenizer_path", "tokenizer_fingerprint", "counts_path", ...}`` (+ the preparation report
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
      from lev_jax.eval.evaluate import data_record  # pylint: disable=g-import-not-at-top
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
