"""Grain input pipelines: tokenize, pack to seq_len + 1, shift into inputs/targets, batch.

Train (endless, checkpointable)::

  MapDataset.source(docs).shuffle(seed).repeat()   documents, a fresh order each epoch
    (or a grain.IterDataset stream, as it is)      texts or prepared records
    .map(tokenize + eos) .to_iter_dataset()        {"tokens": int32 [n_i]}
  ConcatThenSplitIterDataset(seq_len + 1)          documents concatenated, then cut
    .map(shift)                                    inputs/targets int32, weights float32
                                                   (+ segment_ids/positions if masked)
  WindowShuffleIterDataset(shuffle_buffer)         sequences shuffled within windows
    .batch(batch_size, drop_remainder=True)        [batch_size, seq_len] each

Every stage has a small, exact ``get_state`` / ``set_state``, so ``iter(ds)`` resumes
exactly and saves through orbax with ``grain.checkpoint.CheckpointSave(iterator)``
(the packer behind `_JsonSafePacking`, which repairs its state after JSON).
Library: Grain, https://google-grain.readthedocs.io/ (``grain.MapDataset``,
``grain.experimental.ConcatThenSplitIterDataset``, ``WindowShuffleIterDataset``).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from absl import flags
from absl import logging
import grain
import numpy as np

from lev_jax.data.errors import DataError

_U32 = 2**32
# Documents are in memory; tokenizing is fast C++; two reader threads keep batches ready.
_TRAIN_READ = grain.ReadOptions(num_threads=2, prefetch_buffer_size=64)
_EVAL_READ = grain.ReadOptions(num_threads=0, prefetch_buffer_size=16)
_ENCODE_CHUNK = 256


class _ToTokens:
  """A document -> {"tokens": int32 [n + 1]}: its ids, then eos.

  A document is a str, or a record of a prepared dataset: ``{"tokens": int array}``
  (ids without eos) or ``{"text": bytes | str}``. Ids >= vocab_size -> DataError.
  """

  def __init__(self, tokenizer, vocab_size: int):
    self._tokenizer = tokenizer
    self._vocab_size = int(vocab_size)

  def __call__(self, doc) -> dict[str, np.ndarray]:
    eos = self._tokenizer.eos_id
    if isinstance(doc, dict) and "tokens" in doc:
      ids_N = np.asarray(doc["tokens"], dtype=np.int32)
      tokens_N = np.concatenate([ids_N, np.asarray([eos], np.int32)])
    else:
      text = doc["text"] if isinstance(doc, dict) else doc
      if isinstance(text, bytes):
        text = text.decode("utf-8")
      ids = self._tokenizer.encode(text)
      ids.append(eos)
      tokens_N = np.asarray(ids, dtype=np.int32)
    _check_ids(tokens_N, self._vocab_size)
    return {"tokens": tokens_N}


def _check_ids(ids_N: np.ndarray, vocab_size: int) -> None:
  if ids_N.size and (ids_N.max() >= vocab_size or ids_N.min() < 0):
    bad = int(ids_N.max() if ids_N.max() >= vocab_size else ids_N.min())
    raise DataError(f"token id {bad} is outside [0, vocab_size = {vocab_size}): the "
                    "tokenizer and config.model.vocab_size disagree")


class _Shift:
  """Packed ``{"tokens", "tokens_segment_ids", "tokens_positions": [L + 1]}`` -> inputs,
  targets int32 [L] and weights float32 [L] (0 where the packer padded: segment id 0,
  so a tokenizer whose id 0 is a real token is weighted right).

  With segment_masking the batch also carries ``segment_ids`` and ``positions`` int32
  [L] of the inputs (positions restart at 0 in every document, and in every row), and a
  target in another document than its input gets weight 0, so neither attention nor
  the loss crosses a document boundary.
  """

  def __init__(self, segment_masking: bool):
    self._segment_masking = bool(segment_masking)

  def __call__(self, packed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    tokens_L1, segments_L1 = packed["tokens"], packed["tokens_segment_ids"]
    real_L = segments_L1[1:] != 0
    out = {"inputs": tokens_L1[:-1], "targets": tokens_L1[1:]}
    if self._segment_masking:
      real_L &= segments_L1[1:] == segments_L1[:-1]
      out["segment_ids"] = segments_L1[:-1].astype(np.int32)
      out["positions"] = packed["tokens_positions"][:-1].astype(np.int32)
    out["weights"] = real_L.astype(np.float32)
    return out


def _require_tokens(docs: Sequence[str], tokenizer) -> None:
  """DataError unless some document encodes to at least one token (eos aside)."""
  for text in docs:
    if text and tokenizer.encode(text):
      return
  raise DataError(f"the corpus yields no tokens: {len(docs)} documents, none with text "
                  "that encodes to a token; check the data paths and data.pile_set_names")


class _JsonSafePacking(grain.IterDataset):
  """ConcatThenSplitIterDataset whose state survives a JSON round trip.

  grain 0.2.18 tests ``remainder_slices`` against the tuple ``(-1, -1)`` ("no
  remainder"); ``grain.checkpoint`` stores state as JSON, which turns the tuple into a
  list, so a restored iterator with no remainder would think it has one and silently
  drop a document. This pass-through turns the lists back into tuples on set_state.
  """

  def __iter__(self) -> grain.DatasetIterator:
    return _JsonSafePackingIterator(self._parent.__iter__())


class _JsonSafePackingIterator(grain.DatasetIterator):
  """Passes elements and state through; set_state restores the (-1, -1) tuples."""

  def __next__(self):
    return next(self._parent)

  def get_state(self) -> dict:
    return self._parent.get_state()

  def set_state(self, state: dict) -> None:
    state = dict(state)
    state["remainder_slices"] = {k: tuple(v) for k, v in state["remainder_slices"].items()}
    self._parent.set_state(state)


def _packed(ds: grain.IterDataset, seq_len: int) -> grain.IterDataset:
  """Documents concatenated and cut into rows of seq_len + 1 tokens (with segment ids
  and positions); a document longer than the rest of a row continues in the next."""
  return _JsonSafePacking(grain.experimental.ConcatThenSplitIterDataset(
      ds, length_struct={"tokens": seq_len + 1}))


def _documents(documents, seed: int | None) -> grain.IterDataset | grain.MapDataset:
  """A grain dataset of documents: an IterDataset (a stream) as it is; a MapDataset or
  any random-access sequence (list, TFDS data source) shuffled per epoch when seed is
  set (a new permutation each epoch, endless), else in order, once."""
  if isinstance(documents, grain.IterDataset):
    return documents
  ds = documents if isinstance(documents, grain.MapDataset) else grain.MapDataset.source(documents)
  if seed is not None:
    ds = ds.shuffle(seed=seed % _U32).repeat(None)
  return ds


def make_train_dataset(documents, tokenizer, *, seq_len: int, batch_size: int,
                       shuffle_buffer: int, seed: int, vocab_size: int,
                       segment_masking: bool = False, worker_processes: int = 0
                       ) -> grain.IterDataset:
  """The endless, shuffled, packed training batches.

  Args:
    documents: random access (a list of texts, a ``grain.MapDataset`` or a TFDS data
      source of prepared records): shuffled globally by `seed`, a fresh permutation per
      epoch; or a ``grain.IterDataset`` stream (e.g. `stream.JsonlStreamDataset`), read
      in its own order. Documents are texts or prepared records (see `_ToTokens`).
    tokenizer: has ``encode(str) -> list[int]`` and ``eos_id``.
    seq_len: L, tokens per example; each packed row holds L + 1 consecutive tokens.
    batch_size: B, rows per batch (incomplete batches are dropped).
    shuffle_buffer: packed sequences per shuffle window (the paper streams with a
      10,000-sequence buffer).
    seed: document order and window shuffles.
    vocab_size: every id must be < vocab_size.
    segment_masking: add ``segment_ids`` / ``positions`` and zero the weights of
      targets across document boundaries (see `_Shift`).
    worker_processes: 0 builds batches in this process; n > 0 builds them in n
      processes (``grain`` ``mp_prefetch``), worker w packing documents w, w + n, ...
      of the shuffled order into whole batches, taken round-robin: throughput scales
      with host cores; the batches are deterministic for a given n (and differ
      between values of n), resume needs the same n. Random-access documents only.

  Returns:
    ``grain.IterDataset`` of ``{"inputs": int32 [B, L], "targets": int32 [B, L],
    "weights": float32 [B, L]}`` (+ ``segment_ids``, ``positions`` int32 [B, L]),
    ``targets[:, t] == next token after inputs[:, t]``, weights 1 where the target is a
    real token. ``iter(ds)`` supports ``get_state()`` / ``set_state()`` (exact resume)
    and ``grain.checkpoint.CheckpointSave/Restore``.

  Raises:
    DataError: a list of texts none of which has a token (now); an id >= vocab_size
      (when iterated).
  """
  if isinstance(documents, list):
    _require_tokens(documents, tokenizer)
  ds = _documents(documents, seed).map(_ToTokens(tokenizer, vocab_size))
  if isinstance(ds, grain.MapDataset):
    ds = ds.to_iter_dataset(_TRAIN_READ)
  ds = _packed(ds, seq_len).map(_Shift(segment_masking))
  ds = grain.experimental.WindowShuffleIterDataset(
      ds, window_size=int(shuffle_buffer), seed=(seed + 1) % _U32)
  ds = ds.batch(batch_size, drop_remainder=True)
  if worker_processes:
    if isinstance(documents, grain.IterDataset):
      raise DataError(f"data.worker_processes = {worker_processes} needs random-access "
                      "documents (sources embedded, jsonl, prepared), not a stream")
    if not flags.FLAGS.is_parsed():  # grain reads its absl flags in the workers
      flags.FLAGS.mark_as_parsed()  # outside an absl app (notebooks, tests): defaults
    ds = ds.mp_prefetch(grain.MultiprocessingOptions(num_workers=int(worker_processes)))
  return ds


def _encoded_chunks(docs: Sequence[str], tokenizer):
  """Lists of ids for consecutive chunks of documents (batch encode when available)."""
  encode_batch = getattr(tokenizer, "encode_batch", None)
  for start in range(0, len(docs), _ENCODE_CHUNK):
    texts = list(docs[start:start + _ENCODE_CHUNK])
    yield encode_batch(texts) if encode_batch else [tokenizer.encode(t) for t in texts]


def _count_tokens(documents, tokenizer, vocab_size: int) -> tuple[int, int]:
  """(documents, tokens with eos) of a finite document collection (error messages)."""
  ds = _documents(documents, None).map(_ToTokens(tokenizer, vocab_size))
  counts = [len(ex["tokens"]) for ex in ds]
  return len(counts), sum(counts)


def make_eval_batches(documents, tokenizer, *, seq_len: int, batch_size: int,
                      n_batches: int, vocab_size: int, segment_masking: bool = False
                      ) -> list[dict[str, np.ndarray]]:
  """Fixed evaluation batches: the documents in order, packed, no shuffle, no padding.

  Args:
    documents: validation documents, read in order and only as far as needed: a list
      of texts, a random-access source of prepared records, or a finite
      ``grain.IterDataset`` stream. tokenizer, seq_len, batch_size, vocab_size,
      segment_masking: as in `make_train_dataset`.
    n_batches: wanted batches; fewer are returned (with a warning) when the documents
      hold fewer full batches of ``batch_size * (seq_len + 1)`` tokens.

  Returns:
    1 to n_batches dicts ``{"inputs", "targets": int32 [B, L], "weights": float32
    [B, L]}`` (+ ``segment_ids``, ``positions``); rows are full (the partial row at the
    end is dropped), so weights are 1 except across document boundaries with
    segment_masking.

  Raises:
    DataError: an id >= vocab_size, or not enough tokens for one batch (naming the
      tokens found and needed).
  """
  need = batch_size * (seq_len + 1)
  if isinstance(documents, Sequence) and not len(documents):
    raise DataError(f"no validation documents: one eval batch needs {need} tokens "
                    f"(eval.batch_size {batch_size} x (seq_len {seq_len} + 1))")
  ds = _documents(documents, None).map(_ToTokens(tokenizer, vocab_size))
  if isinstance(ds, grain.MapDataset):
    ds = ds.to_iter_dataset(_EVAL_READ)
  ds = _packed(ds, seq_len).filter(lambda ex: bool(ex["tokens_segment_ids"].all()))
  ds = ds.map(_Shift(segment_masking)).batch(batch_size, drop_remainder=True)
  batches = list(itertools.islice(ds, n_batches))
  if not batches:
    n_docs, found = _count_tokens(documents, tokenizer, vocab_size)
    raise DataError(
        f"the validation documents give {found} tokens ({n_docs} documents, eos "
        f"included) but one eval batch needs {need} = eval.batch_size {batch_size} x "
        f"(seq_len {seq_len} + 1); add validation text or lower eval.batch_size")
  if len(batches) < n_batches:
    logging.warning("Validation data holds %d full batches of %d x %d tokens, not the %d "
                    "asked for; evaluating on %d.", len(batches), batch_size, seq_len + 1,
                    n_batches, len(batches))
  return batches


def count_tokens(docs: Sequence[str], tokenizer) -> int:
  """Tokens of a list of texts as the pipelines stream them: each document's ids plus
  one eos (e.g. M in "read N of M validation tokens"). Costs one encode of every
  document (batched where the tokenizer can)."""
  return sum(len(ids) + 1 for chunk in _encoded_chunks(docs, tokenizer) for ids in chunk)


def token_counts(docs: Sequence[str], tokenizer, vocab_size: int) -> np.ndarray:
  """How often each id occurs in the tokenized documents, one eos per document included.

  Returns:
    int64 [vocab_size]; its sum is the number of tokens the train pipeline streams per
    epoch.

  Raises:
    DataError: an id >= vocab_size.
  """
  counts_V = np.zeros(vocab_size, dtype=np.int64)
  _check_ids(np.asarray([tokenizer.eos_id]), vocab_size)
  for chunk in _encoded_chunks(docs, tokenizer):
    ids_N = np.fromiter(itertools.chain.from_iterable(chunk), dtype=np.int64)
    _check_ids(ids_N, vocab_size)
    counts_V += np.bincount(ids_N, minlength=vocab_size)
    counts_V[tokenizer.eos_id] += len(chunk)
  return counts_V
