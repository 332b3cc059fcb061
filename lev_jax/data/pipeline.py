"""Grain input pipelines: tokenize, pack to seq_len + 1, shift into inputs/targets, batch.

Train (endless, checkpointable)::

  MapDataset.source(docs).shuffle(seed).repeat()   documents, a fresh order each epoch
    .map(tokenize + eos) .to_iter_dataset()        {"tokens": int32 [n_i]}
  ConcatThenSplitIterDataset(seq_len + 1)          documents concatenated, then cut
    .map(shift)                                    inputs/targets int32, weights float32
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

from absl import logging
import grain
import numpy as np

from lev_jax.data.corpus import DataError

_U32 = 2**32
# Documents are in memory; tokenizing is fast C++; two reader threads keep batches ready.
_TRAIN_READ = grain.ReadOptions(num_threads=2, prefetch_buffer_size=64)
_EVAL_READ = grain.ReadOptions(num_threads=0, prefetch_buffer_size=16)
_ENCODE_CHUNK = 256


class _Tokenize:
  """text -> {"tokens": int32 [n + 1]}: the ids then eos; ids >= vocab_size -> DataError."""

  def __init__(self, tokenizer, vocab_size: int):
    self._tokenizer = tokenizer
    self._vocab_size = int(vocab_size)

  def __call__(self, text: str) -> dict[str, np.ndarray]:
    ids = self._tokenizer.encode(text)
    ids.append(self._tokenizer.eos_id)
    tokens_N = np.asarray(ids, dtype=np.int32)
    _check_ids(tokens_N, self._vocab_size)
    return {"tokens": tokens_N}


def _check_ids(ids_N: np.ndarray, vocab_size: int) -> None:
  if ids_N.size and (ids_N.max() >= vocab_size or ids_N.min() < 0):
    bad = int(ids_N.max() if ids_N.max() >= vocab_size else ids_N.min())
    raise DataError(f"token id {bad} is outside [0, vocab_size = {vocab_size}): the "
                    "tokenizer and config.model.vocab_size disagree")


def _shift(packed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
  """{"tokens", "tokens_segment_ids": [L + 1]} -> inputs, targets [L] (int32), weights [L]
  (float32, 0 where the packer padded: segment id 0). Independent of the pad id, so
  tokenizers whose id 0 is a real token (tiktoken) are weighted correctly."""
  tokens_L1 = packed["tokens"]
  return {"inputs": tokens_L1[:-1], "targets": tokens_L1[1:],
          "weights": (packed["tokens_segment_ids"][1:] != 0).astype(np.float32)}


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
  ds = _JsonSafePacking(grain.experimental.ConcatThenSplitIterDataset(
      ds, length_struct={"tokens": seq_len + 1}))
  # Keep only the tokens: positions / segment ids are not used by the model.
  return ds.map(_shift)


def make_train_dataset(docs: Sequence[str], tokenizer, *, seq_len: int, batch_size: int,
                       shuffle_buffer: int, seed: int, vocab_size: int
                       ) -> grain.IterDataset:
  """The endless, shuffled, packed training batches.

  Args:
    docs: training texts (kept in memory; indexed by the shuffle).
    tokenizer: has ``encode(str) -> list[int]`` and ``eos_id``.
    seq_len: L, tokens per example; each packed row holds L + 1 consecutive tokens.
    batch_size: B, rows per batch (incomplete batches are dropped).
    shuffle_buffer: sequences per shuffle window.
    seed: document order (a new permutation per epoch) and window shuffles.
    vocab_size: every id must be < vocab_size.

  Returns:
    ``grain.IterDataset`` of ``{"inputs": int32 [B, L], "targets": int32 [B, L],
    "weights": float32 [B, L]}``, ``targets[:, t] == next token after inputs[:, t]``,
    weights 1 where the target is a real token (0 where the packer padded). ``iter(ds)`` supports ``get_state()`` /
    ``set_state()`` (exact resume) and ``grain.checkpoint.CheckpointSave/Restore``.

  Raises:
    DataError: no documents or no tokens (now); an id >= vocab_size (when iterated).
  """
  _require_tokens(docs, tokenizer)
  ds = grain.MapDataset.source(list(docs)).shuffle(seed=seed % _U32).repeat(None)
  ds = ds.map(_Tokenize(tokenizer, vocab_size)).to_iter_dataset(_TRAIN_READ)
  ds = _packed(ds, seq_len)
  ds = grain.experimental.WindowShuffleIterDataset(
      ds, window_size=int(shuffle_buffer), seed=(seed + 1) % _U32)
  return ds.batch(batch_size, drop_remainder=True)


def _encoded_chunks(docs: Sequence[str], tokenizer):
  """Lists of ids for consecutive chunks of documents (batch encode when available)."""
  encode_batch = getattr(tokenizer, "encode_batch", None)
  for start in range(0, len(docs), _ENCODE_CHUNK):
    texts = list(docs[start:start + _ENCODE_CHUNK])
    yield encode_batch(texts) if encode_batch else [tokenizer.encode(t) for t in texts]


def _count_tokens(docs: Sequence[str], tokenizer) -> int:
  return sum(len(ids) + 1 for chunk in _encoded_chunks(docs, tokenizer) for ids in chunk)


def make_eval_batches(docs: Sequence[str], tokenizer, *, seq_len: int, batch_size: int,
                      n_batches: int, vocab_size: int) -> list[dict[str, np.ndarray]]:
  """Fixed evaluation batches: the documents in order, packed, no shuffle, no padding.

  Args:
    docs: validation texts. tokenizer, seq_len, batch_size, vocab_size: as in
      `make_train_dataset`.
    n_batches: wanted batches; fewer are returned (with a warning) when the documents
      hold fewer full batches of ``batch_size * (seq_len + 1)`` tokens.

  Returns:
    1 to n_batches dicts ``{"inputs", "targets": int32 [B, L], "weights": float32
    [B, L]}`` (weights all 1: partial rows at the end are dropped).

  Raises:
    DataError: an id >= vocab_size, or not enough tokens for one batch (naming the
      tokens found and needed).
  """
  need = batch_size * (seq_len + 1)
  if not docs:
    raise DataError(f"no validation documents: one eval batch needs {need} tokens "
                    f"(eval.batch_size {batch_size} x (seq_len {seq_len} + 1))")
  ds = grain.MapDataset.source(list(docs)).map(_Tokenize(tokenizer, vocab_size))
  ds = _packed(ds.to_iter_dataset(_EVAL_READ), seq_len)
  ds = ds.filter(lambda ex: bool(ex["weights"].all()))
  batches = list(itertools.islice(ds.batch(batch_size, drop_remainder=True), n_batches))
  if not batches:
    found = _count_tokens(docs, tokenizer)
    raise DataError(
        f"the validation documents give {found} tokens ({len(docs)} documents, eos "
        f"included) but one eval batch needs {need} = eval.batch_size {batch_size} x "
        f"(seq_len {seq_len} + 1); add validation text or lower eval.batch_size")
  if len(batches) < n_batches:
    logging.warning("Validation data holds %d full batches of %d x %d tokens, not the %d "
                    "asked for; evaluating on %d.", len(batches), batch_size, seq_len + 1,
                    n_batches, len(batches))
  return batches


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
