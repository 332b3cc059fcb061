"""SentencePiece training, ids, exact round trips, the content-keyed cache and errors."""

import pytest
import sentencepiece as spm

from lev_jax.data import tokenizer as tok_lib
from lev_jax.data.corpus import DataError

DOCS = [
    f"Document {i}: the quick brown fox jumps over the lazy dog.\n"
    f"    def f(x):\n        return x * {i}  # indented code\n\nNumbers 12345 and 'quotes'."
    for i in range(40)
]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  cache = tmp_path_factory.mktemp("spm")
  return tok_lib.train_sentencepiece(DOCS, 320, cache), cache


def test_ids_and_exact_round_trip(trained):
  tok, _ = trained
  assert (tok.vocab_size, tok.pad_id, tok.eos_id) == (320, 0, 2)
  assert tok.id_to_piece(0) == "<pad>" and tok.id_to_piece(1) == "<unk>"
  for text in ["the quick brown fox", "  two  spaces\n\n\tand a tab ", "ünïcödé 日本語 🙂",
               "", "\n", DOCS[3]]:
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert all(3 <= i < 320 for i in ids)  # never pad / unk / eos: byte fallback
  assert tok.decode(tok.encode("fox") + [tok.eos_id, tok.pad_id]) == "fox"
  assert tok.encode_batch(["fox", "dog"]) == [tok.encode("fox"), tok.encode("dog")]


def test_training_compresses_the_corpus(trained):
  tok, _ = trained
  n_bytes = len(DOCS[5].encode())
  assert len(tok.encode(DOCS[5])) < 0.8 * n_bytes  # merges learnt, not just bytes


def test_cache_hit_loads_without_training(trained, monkeypatch):
  tok, cache = trained

  def no_training(*args, **kwargs):
    raise AssertionError("trained again instead of loading the cache")

  monkeypatch.setattr(spm.SentencePieceTrainer, "train", no_training)
  again = tok_lib.train_sentencepiece(list(DOCS), 320, cache)
  assert again.model_path == tok.model_path
  assert again.encode(DOCS[0]) == tok.encode(DOCS[0])
  assert [p.name for p in cache.iterdir()] == [tok.model_path.name]  # no temp files left


def test_key_depends_on_docs_and_vocab():
  key = tok_lib.cache_key(DOCS, 320)
  assert key == tok_lib.cache_key(list(DOCS), 320)
  assert key != tok_lib.cache_key(DOCS, 321)
  assert key != tok_lib.cache_key(DOCS[:-1] + [DOCS[-1] + " "], 320)
  assert tok_lib.cache_key(["ab", "c"], 320) != tok_lib.cache_key(["a", "bc"], 320)


def test_training_is_deterministic(trained, tmp_path):
  tok, _ = trained
  other = tok_lib.train_sentencepiece(DOCS, 320, tmp_path)
  assert [other.id_to_piece(i) for i in range(320)] == [tok.id_to_piece(i) for i in range(320)]


def test_vocab_too_big_names_vocab_and_corpus_size(tmp_path):
  with pytest.raises(DataError, match=r"vocab_size = 5000 .*40 documents, \d+ characters"):
    tok_lib.train_sentencepiece(DOCS, 5000, tmp_path)
  assert not list(tmp_path.iterdir())  # nothing cached
  with pytest.raises(DataError, match=r"vocab_size = 262 is too small .*40 documents"):
    tok_lib.train_sentencepiece(DOCS, 262, tmp_path)


def test_no_text_and_bad_model_file(tmp_path):
  with pytest.raises(DataError, match="no non-blank text"):
    tok_lib.train_sentencepiece(["", "  \n"], 320, tmp_path)
  (tmp_path / "junk.model").write_bytes(b"not a model")
  with pytest.raises(DataError, match="junk.model: cannot load"):
    tok_lib.SentencePieceTokenizer(tmp_path / "junk.model")
