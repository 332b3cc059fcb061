"""Tokenizers: SentencePiece training, ids, round trips, the cache, bytes, pickling,
info / save / load records and make_tokenizer."""

import json
import pickle
import re

import pytest
import sentencepiece as spm

from lev_jax.config import base_config
from lev_jax.data import tokenizer as tok_lib
from lev_jax.data.errors import DataError

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


# ----------------------------------------------------------- bytes, pickling, info, I/O


def test_byte_tokenizer_ids_and_exact_round_trip():
  tok = tok_lib.ByteTokenizer()
  assert (tok.name, tok.vocab_size, tok.pad_id, tok.eos_id, tok.unk_id) == (
      "bytes", 259, 0, 1, 2)
  assert tok.encode("Ab\n") == [65 + 3, 98 + 3, 10 + 3]
  assert tok.encode("é") == [0xC3 + 3, 0xA9 + 3]  # UTF-8 bytes, each + 3
  for text in ["", "plain ascii", "ünïcödé 日本語 🙂\t\n", "\x00\x7f",
               "lone \ud800 surrogate", DOCS[7]]:
    ids = tok.encode(text)
    assert all(3 <= i < 259 for i in ids)
    assert tok.decode(ids) == text
  assert tok.decode([0, 1, 2] + tok.encode("fox") + [259, 1000, -1]) == "fox"
  assert tok.decode([0xFF + 3, 65 + 3]) == "\ufffdA"  # invalid UTF-8 is replaced
  assert tok.encode_batch(["a", "ü"]) == [tok.encode("a"), tok.encode("ü")]


def test_pickled_tokenizers_give_identical_ids(trained, tmp_path):
  spm_tok, _ = trained
  model = tmp_path / "moved.model"
  model.write_bytes(spm_tok.model_proto)
  moved = tok_lib.SentencePieceTokenizer(model)
  data = pickle.dumps(moved)
  model.unlink()  # the pickle carries the model proto, not just the path
  for tok, restored in [(moved, pickle.loads(data)),
                        (tok_lib.ByteTokenizer(), pickle.loads(pickle.dumps(
                            tok_lib.ByteTokenizer())))]:
    assert type(restored) is type(tok) and restored.name == tok.name
    assert restored.encode(DOCS[1] + " ü🙂") == tok.encode(DOCS[1] + " ü🙂")
    assert restored.fingerprint == tok.fingerprint


def test_info_is_json_and_fingerprints_tell_models_apart(trained, tmp_path):
  tok, _ = trained
  other = tok_lib.train_sentencepiece(DOCS[:20], 320, tmp_path)
  info = tok_lib.tokenizer_info(tok)
  assert info == {"name": "sentencepiece", "vocab_size": 320, "padded_vocab_size": 384,
                  "eos_id": 2, "pad_id": 0, "fingerprint": info["fingerprint"]}
  assert len(info["fingerprint"]) == 64 and json.loads(json.dumps(info)) == info
  assert tok_lib.tokenizer_info(other)["fingerprint"] != info["fingerprint"]
  assert tok_lib.tokenizer_info(tok, vocab_multiple=64)["padded_vocab_size"] == 320
  byte_info = tok_lib.tokenizer_info(tok_lib.ByteTokenizer())
  assert (byte_info["vocab_size"], byte_info["padded_vocab_size"], byte_info["eos_id"],
          byte_info["pad_id"]) == (259, 384, 1, 0)
  assert byte_info["fingerprint"] != info["fingerprint"]


def test_save_load_round_trip(trained, tmp_path):
  tok, _ = trained
  for original, files in [(tok, {"tokenizer.json", "spm.model"}),
                          (tok_lib.ByteTokenizer(), {"tokenizer.json"})]:
    folder = tmp_path / original.name
    info = tok_lib.save_tokenizer(original, folder)
    assert {p.name for p in folder.iterdir()} == files  # no temporary files left
    assert json.loads((folder / "tokenizer.json").read_text()) == info
    loaded = tok_lib.load_tokenizer(folder)
    assert type(loaded) is type(original)
    assert loaded.encode(DOCS[2] + " 日本") == original.encode(DOCS[2] + " 日本")
    assert tok_lib.tokenizer_info(loaded) == info


def test_load_rejects_tampered_or_mismatched_records(trained, tmp_path):
  tok, _ = trained
  folder = tmp_path / "ds"
  info = tok_lib.save_tokenizer(tok, folder)
  record = folder / "tokenizer.json"
  record.write_text(json.dumps({**info, "fingerprint": "0" * 64}))
  with pytest.raises(DataError, match=re.escape(str(folder)) + ": .*fingerprint .*do not match"):
    tok_lib.load_tokenizer(folder)
  record.write_text(json.dumps({**info, "vocab_size": 321}))
  with pytest.raises(DataError, match="vocab_size = 320 but tokenizer.json records 321"):
    tok_lib.load_tokenizer(folder)
  record.write_text("{not json")
  with pytest.raises(DataError, match="tokenizer.json: cannot read"):
    tok_lib.load_tokenizer(folder)
  record.write_text(json.dumps({k: v for k, v in info.items() if k != "eos_id"}))
  with pytest.raises(DataError, match=r"missing field\(s\) \['eos_id'\]"):
    tok_lib.load_tokenizer(folder)
  record.write_text(json.dumps({**info, "name": "wordpiece"}))
  with pytest.raises(DataError, match="name = 'wordpiece'"):
    tok_lib.load_tokenizer(folder)
  other = tok_lib.train_sentencepiece(DOCS[:20], 320, tmp_path / "other")
  record.write_text(json.dumps(info))
  (folder / "spm.model").write_bytes(other.model_proto)  # right size, other merges
  with pytest.raises(DataError, match="fingerprint"):
    tok_lib.load_tokenizer(folder)
  with pytest.raises(DataError, match="empty.*tokenizer.json: cannot read"):
    tok_lib.load_tokenizer(tmp_path / "empty")


def test_vocab_agreement_is_one_check_with_one_message():
  tok_lib.check_vocab_agreement(259, "bytes", 259)
  with pytest.raises(DataError, match=r"^config.model.vocab_size = 300 but the bytes tokenizer "
                     r"has 259 ids: model and data must agree$"):
    tok_lib.check_vocab_agreement(300, "bytes", 259)
  with pytest.raises(DataError, match=r"^config.model.vocab_size = 300 but the bytes tokenizer "
                     r"of /data/x has 259 ids: model and data must agree \(do this\)$"):
    tok_lib.check_vocab_agreement(300, "bytes", 259, source="/data/x", hint=" (do this)")


def test_make_tokenizer_builds_the_configured_one(trained, tmp_path):
  tok, cache = trained
  d = base_config().data
  d.tokenizer = "bytes"
  assert isinstance(tok_lib.make_tokenizer(d, 259), tok_lib.ByteTokenizer)
  with pytest.raises(DataError, match=r"^config.model.vocab_size = 2048 but the bytes "
                     "tokenizer has 259 ids: model and data must agree$"):
    tok_lib.make_tokenizer(d, 2048)
  d.tokenizer = "sentencepiece"
  d.sentencepiece_file = str(tok.model_path)
  assert tok_lib.make_tokenizer(d, 320).fingerprint == tok.fingerprint
  with pytest.raises(DataError, match="vocab_size = 512 but the sentencepiece tokenizer "
                     "has 320 ids"):
    tok_lib.make_tokenizer(d, 512)
  d.sentencepiece_file = str(tmp_path / "absent.model")
  with pytest.raises(DataError, match="sentencepiece_file: .*absent.model: cannot load"):
    tok_lib.make_tokenizer(d, 320)
  d.sentencepiece_file = ""
  trained_again = tok_lib.make_tokenizer(d, 320, train_texts=DOCS, cache_dir=cache)
  assert trained_again.model_path == tok.model_path  # the cached model
  d.cache_dir = str(tmp_path)
  assert tok_lib.make_tokenizer(d, 320, train_texts=DOCS).model_path.parent == (
      tmp_path / "tokenizers")
  with pytest.raises(DataError, match="training texts are needed"):
    tok_lib.make_tokenizer(d, 320)
