"""Data for lev_jax: documents -> SentencePiece ids -> packed grain batches.

`load(config)` reads ``config.data`` once and returns a `DataBundle`:

* source ``'embedded'``: the pydoc topics and standard-library docstrings of this Python
  (`corpus.embedded_documents`, about 2.3 MB), written once as Pile-format JSONL under
  ``config.data.cache_dir`` and split per document by a hash of its text;
* source ``'jsonl'``: Pile-format ``*.jsonl`` / ``*.jsonl.zst`` files or globs in
  ``config.data.train_files`` (and ``validation_files``, else a hash hold-out of
  ``validation_fraction`` of the training documents).

The tokenizer (``config.data.tokenizer``) is a BPE SentencePiece model with
``config.model.vocab_size`` ids trained on the training split and cached under
``{cache_dir}/tokenizers``, or o200k_base through tiktoken (``data.tiktoken_file``);
token counts of the training split are cached beside it (``*.counts.npy``). Batches are ``{"inputs", "targets": int32 [B, L], "weights":
float32 [B, L]}`` with L = ``config.train.seq_len``.

Modules: `corpus` (documents, `DataError`), `tokenizer`, `pipeline` (grain).
"""

from __future__ import annotations

import dataclasses
import io
import os
from collections.abc import Sequence

from absl import logging
from etils import epath
import grain
import ml_collections
import numpy as np

from lev_jax.data.corpus import (DataError, embedded_documents, read_documents,
                                 split_documents, write_embedded_corpus)
from lev_jax.data.pipeline import make_eval_batches, make_train_dataset, token_counts
from lev_jax.data.tokenizer import (SentencePieceTokenizer, TiktokenTokenizer, cache_key,
                                    train_sentencepiece)

__all__ = [
    "DataBundle", "DataError", "SentencePieceTokenizer", "TiktokenTokenizer", "embedded_documents", "load",
    "make_eval_batches", "make_train_dataset", "read_documents", "token_counts",
    "train_sentencepiece", "write_embedded_corpus",
]


@dataclasses.dataclass
class DataBundle:
  """Everything the trainer needs from the data, built once by `load`.

  Attributes:
    tokenizer: trained on ``train_docs``; ``vocab_size == config.model.vocab_size``.
    train_docs, validation_docs: the texts of each split.
    report: ``{"source", "train": read report, "validation": read report or None
      (hold-out), "train_tokens", "tokenizer_path", "counts_path", "corpus_paths"}``.
    token_counts_V: int64 [config.model.vocab_size], occurrences of each id (one eos
      per document) in ``train_docs``.
    config: the experiment config the batches are built from.
  """

  tokenizer: SentencePieceTokenizer
  train_docs: list[str] = dataclasses.field(repr=False)
  validation_docs: list[str] = dataclasses.field(repr=False)
  report: dict
  token_counts_V: np.ndarray = dataclasses.field(repr=False)
  config: ml_collections.ConfigDict = dataclasses.field(repr=False)
  _eval_batches: list | None = dataclasses.field(default=None, repr=False)

  def train_dataset(self, batch_size: int, shard_index: int = 0, shard_count: int = 1
                    ) -> grain.IterDataset:
    """Endless shuffled batches, int32/float32 [batch_size, seq_len]; see
    `pipeline.make_train_dataset` (shuffle_buffer and seed from config.data).

    With shard_count > 1 (one shard per process), this process reads only documents
    shard_index, shard_index + shard_count, ... and `batch_size` is its per-host share.
    """
    c = self.config
    return make_train_dataset(
        self.train_docs[shard_index::shard_count], self.tokenizer, seq_len=c.train.seq_len, batch_size=batch_size,
        shuffle_buffer=c.data.shuffle_buffer, seed=c.data.seed,
        vocab_size=c.model.vocab_size)

  def eval_batches(self) -> list[dict[str, np.ndarray]]:
    """The fixed validation batches [eval.batch_size, seq_len] (built once, then reused).

    Raises:
      DataError: the validation split holds less than one batch of tokens.
    """
    if self._eval_batches is None:
      c = self.config
      self._eval_batches = make_eval_batches(
          self.validation_docs, self.tokenizer, seq_len=c.train.seq_len,
          batch_size=c.eval.batch_size, n_batches=c.eval.batches,
          vocab_size=c.model.vocab_size)
    return self._eval_batches


def _read(patterns: Sequence[str] | str, d: ml_collections.ConfigDict, field: str):
  if isinstance(patterns, (str, os.PathLike)):  # a lone path, not a sequence of them
    patterns = [patterns]
  try:
    return read_documents(list(patterns), strict=d.strict,
                          pile_set_names=tuple(d.pile_set_names))
  except DataError as e:
    raise DataError(f"config.data.{field}: {e}") from e


def _cached_counts(tokenizer, docs: list[str], vocab_size: int, path: epath.Path
                   ) -> tuple[np.ndarray, epath.Path]:
  """Token counts of docs, cached at `path` (keyed by the docs, vocab and tokenizer)."""
  if path.exists():
    counts_V = np.load(io.BytesIO(path.read_bytes()))
    if counts_V.shape == (vocab_size,) and counts_V.dtype == np.int64:
      return counts_V, path
  counts_V = token_counts(docs, tokenizer, vocab_size)
  buf = io.BytesIO()
  np.save(buf, counts_V)
  tmp = path.parent / f".{path.name}.tmp-{os.getpid()}"
  tmp.write_bytes(buf.getvalue())
  tmp.replace(path)
  return counts_V, path


def load(config: ml_collections.ConfigDict) -> DataBundle:
  """Reads the documents, trains or loads the tokenizer and the token counts.

  Reads ``config.data`` (source, train_files, validation_files, pile_set_names,
  validation_fraction, cache_dir, strict), ``config.model.vocab_size``; the bundle's
  batch methods read ``config.train.seq_len``, ``config.data.shuffle_buffer`` /
  ``seed`` and ``config.eval.batch_size`` / ``batches``.

  Raises:
    DataError: missing or bad files (named, with ``config.data.<field>``), an empty
      training or validation split, or a vocab_size the corpus cannot fill.
  """
  d = config.data
  cache_dir = epath.Path(os.path.expanduser(d.cache_dir))
  report = {"source": d.source, "validation": None, "corpus_paths": None}
  if d.source == "embedded":
    paths = write_embedded_corpus(cache_dir, d.validation_fraction)
    report["corpus_paths"] = {k: os.fspath(v) for k, v in paths.items()}
    train_docs, report["train"] = _read([paths["train"]], d, "cache_dir")
    validation_docs, report["validation"] = _read([paths["validation"]], d, "cache_dir")
  elif d.source == "jsonl":
    train_docs, report["train"] = _read(d.train_files, d, "train_files")
    if d.validation_files:
      validation_docs, report["validation"] = _read(d.validation_files, d,
                                                    "validation_files")
    else:
      train_docs, validation_docs = split_documents(train_docs, d.validation_fraction)
  else:
    raise DataError(f"config.data.source = {d.source!r}: expected 'embedded' or 'jsonl'")
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
  vocab_size = config.model.vocab_size
  if d.tokenizer == "o200k_base":
    tokenizer = TiktokenTokenizer(d.tiktoken_file)
    if tokenizer.vocab_size != vocab_size:
      raise DataError(f"config.model.vocab_size = {vocab_size} but o200k_base has "
                      f"{tokenizer.vocab_size} ids: model and data must agree")
    counts_path = (cache_dir / "tokenizers" /
                   f"o200k_base-{cache_key(train_docs, vocab_size)[:16]}.counts.npy")
    counts_path.parent.mkdir(parents=True, exist_ok=True)
    report["tokenizer_path"] = d.tiktoken_file or "tiktoken:o200k_base"
  else:
    try:
      tokenizer = train_sentencepiece(train_docs, vocab_size, cache_dir / "tokenizers")
    except DataError as e:
      raise DataError(f"config.model.vocab_size: {e}") from e
    model_path = tokenizer.model_path
    counts_path = model_path.parent / (model_path.stem + ".counts.npy")
    report["tokenizer_path"] = os.fspath(model_path)
  counts_V, counts_path = _cached_counts(tokenizer, train_docs, vocab_size, counts_path)
  report.update(train_tokens=int(counts_V.sum()), counts_path=os.fspath(counts_path))
  logging.info(
      "Data (%s): %d train documents (%d tokens), %d validation documents; tokenizer %s; "
      "token counts %s.", d.source, len(train_docs), report["train_tokens"],
      len(validation_docs), report["tokenizer_path"], report["counts_path"])
  return DataBundle(tokenizer=tokenizer, train_docs=train_docs,
                    validation_docs=validation_docs, report=report,
                    token_counts_V=counts_V, config=config)
