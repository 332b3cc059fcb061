"""Grain pipelines: packing that decodes back to the text, shifted targets, shuffling,
exact resume (get_state/set_state, JSON, orbax), eval batches, token counts, errors."""

import json
import logging

import grain
import numpy as np
import orbax.checkpoint as ocp
import pytest

from lev_jax.data import pipeline
from lev_jax.data.errors import DataError
from lev_jax.data.tokenizer import train_sentencepiece

VOCAB = 280
DOCS = [f"Doc {i}: " + " ".join(f"word{(i * j) % 37}" for j in range(5 + i % 23)) + "."
        for i in range(60)]


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
  return train_sentencepiece(DOCS, VOCAB, tmp_path_factory.mktemp("spm"))


def _stream(docs, tok):
  """The token stream the packer sees: each document's ids then eos."""
  return np.concatenate([np.asarray(tok.encode(d) + [tok.eos_id], np.int32) for d in docs])


def _rows(batch):
  """[B, L + 1] rows rebuilt from inputs and the last target."""
  return np.concatenate([batch["inputs"], batch["targets"][:, -1:]], axis=1)


def _train(docs, tok, **kw):
  args = dict(seq_len=16, batch_size=4, shuffle_buffer=8, seed=3, vocab_size=VOCAB)
  args.update(kw)
  return pipeline.make_train_dataset(docs, tok, **args)


def _equal(a, b):
  return all(np.array_equal(x[k], y[k]) for x, y in zip(a, b, strict=True) for k in x)


def test_eval_batches_pack_the_text_in_order(tok):
  batches = pipeline.make_eval_batches(DOCS, tok, seq_len=16, batch_size=4, n_batches=5,
                                       vocab_size=VOCAB)
  assert len(batches) == 5
  for b in batches:
    assert b["inputs"].shape == b["targets"].shape == b["weights"].shape == (4, 16)
    assert b["inputs"].dtype == b["targets"].dtype == np.int32
    assert b["weights"].dtype == np.float32 and (b["weights"] == 1).all()
    np.testing.assert_array_equal(b["inputs"][:, 1:], b["targets"][:, :-1])
  packed = np.concatenate([_rows(b) for b in batches]).reshape(-1)
  stream = _stream(DOCS, tok)
  np.testing.assert_array_equal(packed, stream[: packed.size])  # no gaps, no padding
  n_eos = int((packed == tok.eos_id).sum())
  assert tok.decode(packed[: np.flatnonzero(packed == tok.eos_id)[-1]]) == "".join(DOCS[:n_eos])


def test_weights_mask_padding_targets():
  # The packer pads with segment id 0; id 0 itself (a real token in o200k) keeps weight 1.
  shifted = pipeline._Shift(False)({"tokens": np.array([7, 0, 9, 0, 0], np.int32),
                                    "tokens_segment_ids": np.array([1, 1, 2, 0, 0], np.int32),
                                    "tokens_positions": np.array([0, 1, 0, 0, 0], np.int32)})
  np.testing.assert_array_equal(shifted["inputs"], [7, 0, 9, 0])
  np.testing.assert_array_equal(shifted["targets"], [0, 9, 0, 0])
  np.testing.assert_array_equal(shifted["weights"], [1, 1, 0, 0])
  assert shifted["weights"].dtype == np.float32
  assert set(shifted) == {"inputs", "targets", "weights"}


def test_segment_masking_cuts_attention_and_loss_at_document_boundaries(tok):
  # Row of 7 tokens: doc A (3 ids + eos) then doc B (first 3 ids); positions restart.
  packed = {"tokens": np.array([5, 6, 7, 2, 8, 9, 10], np.int32),
            "tokens_segment_ids": np.array([1, 1, 1, 1, 2, 2, 2], np.int32),
            "tokens_positions": np.array([0, 1, 2, 3, 0, 1, 2], np.int32)}
  shifted = pipeline._Shift(True)(packed)
  np.testing.assert_array_equal(shifted["segment_ids"], [1, 1, 1, 1, 2, 2])
  np.testing.assert_array_equal(shifted["positions"], [0, 1, 2, 3, 0, 1])
  # eos -> first token of B crosses the boundary: weight 0; everything else counts.
  np.testing.assert_array_equal(shifted["weights"], [1, 1, 1, 0, 1, 1])
  # Through the whole pipeline: every row's segments start at 1 and weights are 0
  # exactly where the target's document differs from the input's.
  batch = next(iter(pipeline.make_train_dataset(
      DOCS, tok, seq_len=16, batch_size=4, shuffle_buffer=8, seed=0, vocab_size=VOCAB,
      segment_masking=True)))
  seg = batch["segment_ids"]
  assert (seg[:, 0] == 1).all() and batch["positions"].dtype == np.int32
  eos_in = batch["inputs"] == tok.eos_id
  assert (batch["weights"][eos_in] == 0).all()
  assert (batch["positions"][:, 1:][eos_in[:, :-1]] == 0).all()  # a new document starts


def test_eval_returns_fewer_batches_or_explains_the_shortfall(tok, caplog):
  total = _stream(DOCS, tok).size
  available = total // (8 * 17)
  with caplog.at_level(logging.WARNING):
    batches = pipeline.make_eval_batches(DOCS, tok, seq_len=16, batch_size=8,
                                         n_batches=available + 10, vocab_size=VOCAB)
  assert len(batches) == available and "not the" in caplog.text
  too_big = total // 17 + 1  # one batch of too_big rows needs more tokens than there are
  with pytest.raises(DataError, match=rf"give {total} tokens .* needs {too_big * 17}"):
    pipeline.make_eval_batches(DOCS, tok, seq_len=16, batch_size=too_big, n_batches=1,
                               vocab_size=VOCAB)
  with pytest.raises(DataError, match="no validation documents"):
    pipeline.make_eval_batches([], tok, seq_len=16, batch_size=4, n_batches=1,
                               vocab_size=VOCAB)


def test_train_batches_are_shifted_shuffled_epochs_of_the_documents(tok):
  tokens_per_epoch = _stream(DOCS, tok).size
  rows_needed = 2 * tokens_per_epoch // 17 + 1
  it = iter(_train(DOCS, tok, shuffle_buffer=1))  # window of 1: sequences in order
  rows = []
  while len(rows) < rows_needed:
    b = next(it)
    assert b["inputs"].shape == (4, 16) and b["inputs"].dtype == np.int32
    assert (b["weights"] == 1).all()
    np.testing.assert_array_equal(b["inputs"][:, 1:], b["targets"][:, :-1])
    rows.extend(_rows(b))
  stream = np.concatenate(rows)
  ends = np.flatnonzero(stream == tok.eos_id)
  texts = [tok.decode(stream[s + 1:e]) for s, e in zip(np.r_[-1, ends[:-1]], ends)]
  epoch1, epoch2 = texts[:len(DOCS)], texts[len(DOCS):2 * len(DOCS)]
  assert sorted(epoch1) == sorted(DOCS) and sorted(epoch2) == sorted(DOCS)
  assert epoch1 != DOCS and epoch2 != epoch1  # shuffled, a fresh order each epoch


def test_sequence_shuffle_and_seed(tok):
  def first(n, **kw):
    it = iter(_train(DOCS, tok, **kw))
    return np.concatenate([_rows(next(it)) for _ in range(n)])
  in_order, shuffled = first(4, shuffle_buffer=1), first(4, shuffle_buffer=16)
  assert not np.array_equal(in_order, shuffled)
  assert sorted(map(tuple, in_order)) == sorted(map(tuple, shuffled))  # same 16 rows
  assert np.array_equal(first(3, seed=5), first(3, seed=5))
  assert not np.array_equal(first(3, seed=5), first(3, seed=6))


@pytest.mark.parametrize("json_round_trip", [False, True])
def test_train_iterator_resumes_exactly(tok, json_round_trip):
  ds = _train(DOCS, tok)
  it = iter(ds)
  reference, states = [], []
  for _ in range(40):  # 8-sequence windows: restores inside windows and on boundaries
    states.append(it.get_state())
    reference.append(next(it))
  for k in (0, 1, 2, 7, 19, 33):
    state = json.loads(json.dumps(states[k])) if json_round_trip else states[k]
    resumed = iter(ds)
    resumed.set_state(state)
    assert _equal([next(resumed) for _ in range(5)], reference[k:k + 5]), k


def test_train_iterator_resumes_through_orbax(tok, tmp_path):
  ds = _train(DOCS, tok, shuffle_buffer=64)
  options = ocp.CheckpointManagerOptions(max_to_keep=2)
  for steps in (1, 11):  # 1: the packer holds no remainder (JSON tuple-vs-list case)
    it = iter(ds)
    for _ in range(steps):
      next(it)
    with ocp.CheckpointManager(tmp_path / f"ckpt{steps}", options=options) as mngr:
      mngr.save(steps, args=ocp.args.Composite(data=grain.checkpoint.CheckpointSave(it)))
      mngr.wait_until_finished()
    expected = [next(it) for _ in range(6)]
    fresh = iter(ds)
    with ocp.CheckpointManager(tmp_path / f"ckpt{steps}", options=options) as mngr:
      restored = mngr.restore(steps, args=ocp.args.Composite(
          data=grain.checkpoint.CheckpointRestore(fresh)))
    assert _equal([next(restored["data"]) for _ in range(6)], expected), steps


class _WideTokenizer:
  """Emits an id beyond any small vocab."""
  eos_id = 2

  def encode(self, text):
    return [5, 700]


def test_ids_beyond_vocab_raise(tok):
  with pytest.raises(DataError, match=r"token id \d+ is outside \[0, vocab_size = 100\)"):
    next(iter(_train(DOCS, tok, vocab_size=100)))
  with pytest.raises(DataError, match=r"token id 700 .*vocab_size = 512"):
    next(iter(_train(DOCS, _WideTokenizer(), vocab_size=512)))
  with pytest.raises(DataError, match=r"token id 700 .*vocab_size = 512"):
    pipeline.make_eval_batches(DOCS, _WideTokenizer(), seq_len=4, batch_size=1,
                               n_batches=1, vocab_size=512)
  with pytest.raises(DataError, match=r"token id 700 .*vocab_size = 512"):
    pipeline.token_counts(DOCS, _WideTokenizer(), 512)


def test_corpus_without_tokens_raises(tok):
  for docs in ([], ["", ""]):
    with pytest.raises(DataError, match="yields no tokens"):
      _train(docs, tok)


def test_token_counts_sum_to_the_number_of_tokens(tok):
  counts = pipeline.token_counts(DOCS, tok, VOCAB)
  stream = _stream(DOCS, tok)
  assert counts.dtype == np.int64 and counts.shape == (VOCAB,)
  assert counts.sum() == stream.size
  assert counts[tok.eos_id] == len(DOCS) and counts[tok.pad_id] == 0
  np.testing.assert_array_equal(counts, np.bincount(stream, minlength=VOCAB))
