"""o200k_base adapter with a small ranks file built here (no download, no cache)."""

import base64

import numpy as np
import pytest

from lev_jax.data import DataError, TiktokenTokenizer
from lev_jax.data import pipeline


@pytest.fixture
def ranks_file(tmp_path):
  ranks = {bytes([i]): i for i in range(256)}
  for piece in (b"th", b"the", b" the", b"in", b"ing"):
    ranks[piece] = len(ranks)
  path = tmp_path / "tiny.tiktoken"
  # The .tiktoken format: one "base64(bytes) rank" line per token.
  path.write_text("".join(f"{base64.b64encode(t).decode()} {r}\n" for t, r in ranks.items()))
  return str(path)


def test_tiktoken_round_trip_ids_and_specials(ranks_file):
  tok = TiktokenTokenizer(ranks_file)
  assert tok.vocab_size == 200_019 and tok.eos_id == 199_999 and tok.pad_id is None
  text = "the thing in the ring!\n<|endoftext|> stays text"
  ids = tok.encode(text)
  assert 258 in ids or 259 in ids  # merges from the file are used
  assert tok.decode(ids) == text
  assert tok.eos_id not in ids  # special-token text is encoded as ordinary text
  assert tok.encode_batch([text, "in"]) == [ids, tok.encode("in")]


def test_tiktoken_token_zero_is_a_real_target(ranks_file):
  """'\\x00' is id 0 here (and '!' in o200k): its targets keep weight 1."""
  tok = TiktokenTokenizer(ranks_file)
  docs = ["a\x00b\x00c " * 20, "the \x00 thing " * 20]
  batches = pipeline.make_eval_batches(docs, tok, seq_len=8, batch_size=2, n_batches=3,
                                       vocab_size=tok.vocab_size)
  targets = np.concatenate([b["targets"] for b in batches])
  weights = np.concatenate([b["weights"] for b in batches])
  assert (targets == 0).any() and (weights == 1).all()


def test_missing_or_bad_ranks_file_is_a_clear_error(tmp_path):
  with pytest.raises(DataError, match="tiktoken_file.*no such file"):
    TiktokenTokenizer(str(tmp_path / "absent.tiktoken"))
  bad = tmp_path / "bad.tiktoken"
  bad.write_text("not base64 at all\n")
  with pytest.raises(DataError, match="not a tiktoken ranks file"):
    TiktokenTokenizer(str(bad))


def test_o200k_without_cache_or_file_points_to_tiktoken_file(monkeypatch):
  import tiktoken

  def offline(name):
    raise ConnectionError("no network")

  monkeypatch.setattr(tiktoken, "get_encoding", offline)
  with pytest.raises(DataError, match="set config.data.tiktoken_file"):
    TiktokenTokenizer("")
