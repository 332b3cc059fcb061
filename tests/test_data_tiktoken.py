"""o200k_base adapter with a small ranks file built here (no download, no cache):
ids, pickling, fingerprints and make_tokenizer (saved folders:
test_data_tokenizer_files.py)."""

import pickle

import numpy as np
import pytest

from lev_jax.config import base_config
from lev_jax.data import DataError, TiktokenTokenizer
from lev_jax.data import pipeline
from lev_jax.data import tokenizer as tok_lib




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


def test_tiktoken_pickles(ranks_file):
  tok = TiktokenTokenizer(ranks_file)
  text = "the thing in the ring!\n"
  restored = pickle.loads(pickle.dumps(tok))
  assert restored.encode(text) == tok.encode(text)
  assert restored.fingerprint == tok.fingerprint and restored.eos_id == tok.eos_id


def test_tiktoken_fingerprint_follows_the_ranks(ranks_file, tmp_path):
  other = tmp_path / "other.tiktoken"
  lines = open(ranks_file).read().splitlines()
  other.write_text("\n".join(lines[:-1]) + "\n")  # one merge fewer
  tok = TiktokenTokenizer(ranks_file)
  assert TiktokenTokenizer(str(other)).fingerprint != tok.fingerprint


def test_tiktoken_from_cache_pickles_by_name(ranks_file, monkeypatch):
  import tiktoken
  cached = TiktokenTokenizer(ranks_file)._enc
  calls = []
  monkeypatch.setattr(tiktoken, "get_encoding", lambda name: calls.append(name) or cached)
  tok = TiktokenTokenizer("")
  state = tok.__getstate__()
  assert state == {"ranks_file": "", "mergeable_ranks": None}
  restored = pickle.loads(pickle.dumps(tok))
  assert calls == ["o200k_base", "o200k_base"]
  assert restored.encode("the ring") == tok.encode("the ring")


def test_make_tokenizer_o200k_and_vocab_mismatch(ranks_file):
  d = base_config().data
  d.tokenizer = "o200k_base"
  d.tiktoken_file = ranks_file
  assert tok_lib.make_tokenizer(d, 200_019).name == "o200k_base"
  with pytest.raises(DataError, match=r"config.model.vocab_size = 2048 but the o200k_base "
                     r"tokenizer has 200019 ids: model and data must agree"):
    tok_lib.make_tokenizer(d, 2048)
