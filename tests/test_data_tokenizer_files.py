"""Tokenizer folders: tokenizer_info records, save_tokenizer / load_tokenizer round
trips for SentencePiece, o200k_base (a small ranks file built here) and bytes, and the
refusal of tampered or mismatched folders."""

import json
import os
import re

import pytest

from conftest import SPM_DOCS as DOCS
from lev_jax import config as config_lib
from lev_jax.data import tokenizer as tok_lib
from lev_jax.data import tokenizer_files as files_lib
from lev_jax.data.errors import DataError


def test_every_configurable_tokenizer_has_a_folder_layout():
  assert sorted(files_lib.MODEL_FILES) == sorted(config_lib.TOKENIZERS)


def test_info_is_json_and_fingerprints_tell_models_apart(trained_spm, tmp_path):
  tok, _ = trained_spm
  other = tok_lib.train_sentencepiece(DOCS[:20], 320, tmp_path)
  info = files_lib.tokenizer_info(tok)
  assert info == {"name": "sentencepiece", "vocab_size": 320, "padded_vocab_size": 384,
                  "eos_id": 2, "pad_id": 0, "fingerprint": info["fingerprint"]}
  assert len(info["fingerprint"]) == 64 and json.loads(json.dumps(info)) == info
  assert files_lib.tokenizer_info(other)["fingerprint"] != info["fingerprint"]
  assert files_lib.tokenizer_info(tok, vocab_multiple=64)["padded_vocab_size"] == 320
  byte_info = files_lib.tokenizer_info(tok_lib.ByteTokenizer())
  assert (byte_info["vocab_size"], byte_info["padded_vocab_size"], byte_info["eos_id"],
          byte_info["pad_id"]) == (259, 384, 1, 0)
  assert byte_info["fingerprint"] != info["fingerprint"]


def test_save_load_round_trip(trained_spm, tmp_path):
  tok, _ = trained_spm
  for original, files in [(tok, {"tokenizer.json", "spm.model"}),
                          (tok_lib.ByteTokenizer(), {"tokenizer.json"})]:
    folder = tmp_path / original.name
    info = files_lib.save_tokenizer(original, folder)
    assert {p.name for p in folder.iterdir()} == files  # no temporary files left
    assert json.loads((folder / "tokenizer.json").read_text()) == info
    loaded = files_lib.load_tokenizer(folder)
    assert type(loaded) is type(original)
    assert loaded.encode(DOCS[2] + " 日本") == original.encode(DOCS[2] + " 日本")
    assert files_lib.tokenizer_info(loaded) == info


def test_load_rejects_tampered_or_mismatched_records(trained_spm, tmp_path):
  tok, _ = trained_spm
  folder = tmp_path / "ds"
  info = files_lib.save_tokenizer(tok, folder)
  record = folder / "tokenizer.json"
  record.write_text(json.dumps({**info, "fingerprint": "0" * 64}))
  with pytest.raises(DataError, match=re.escape(str(folder)) + ": .*fingerprint .*do not match"):
    files_lib.load_tokenizer(folder)
  record.write_text(json.dumps({**info, "vocab_size": 321}))
  with pytest.raises(DataError, match="vocab_size = 320 but tokenizer.json records 321"):
    files_lib.load_tokenizer(folder)
  record.write_text("{not json")
  with pytest.raises(DataError, match="tokenizer.json: cannot read"):
    files_lib.load_tokenizer(folder)
  record.write_text(json.dumps({k: v for k, v in info.items() if k != "eos_id"}))
  with pytest.raises(DataError, match=r"missing field\(s\) \['eos_id'\]"):
    files_lib.load_tokenizer(folder)
  record.write_text(json.dumps({**info, "name": "wordpiece"}))
  with pytest.raises(DataError, match="name = 'wordpiece'"):
    files_lib.load_tokenizer(folder)
  other = tok_lib.train_sentencepiece(DOCS[:20], 320, tmp_path / "other")
  record.write_text(json.dumps(info))
  (folder / "spm.model").write_bytes(other.model_proto)  # right size, other merges
  with pytest.raises(DataError, match="fingerprint"):
    files_lib.load_tokenizer(folder)
  with pytest.raises(DataError, match="empty.*tokenizer.json: cannot read"):
    files_lib.load_tokenizer(tmp_path / "empty")


def test_tiktoken_info_saves_and_loads(ranks_file, tmp_path):
  tok = tok_lib.TiktokenTokenizer(ranks_file)
  text = "the thing in the ring!\n"
  info = files_lib.tokenizer_info(tok)
  assert info == {"name": "o200k_base", "vocab_size": 200_019,
                  "padded_vocab_size": 200_064, "eos_id": 199_999, "pad_id": None,
                  "fingerprint": tok.fingerprint}
  folder = tmp_path / "dataset"
  assert files_lib.save_tokenizer(tok, folder) == info
  assert {p.name for p in folder.iterdir()} == {"tokenizer.json", "o200k_base.tiktoken"}
  os.remove(ranks_file)  # the dataset folder is self-contained
  loaded = files_lib.load_tokenizer(folder)
  assert loaded.encode(text) == tok.encode(text) and loaded.fingerprint == tok.fingerprint


def test_load_rejects_other_tiktoken_ranks(ranks_file, tmp_path):
  other = tmp_path / "other.tiktoken"
  lines = open(ranks_file).read().splitlines()
  other.write_text("\n".join(lines[:-1]) + "\n")  # one merge fewer
  tok = tok_lib.TiktokenTokenizer(ranks_file)
  folder = tmp_path / "dataset"
  files_lib.save_tokenizer(tok, folder)
  (folder / "o200k_base.tiktoken").write_bytes(other.read_bytes())
  with pytest.raises(DataError, match="dataset: the rebuilt o200k_base tokenizer has "
                     "fingerprint"):
    files_lib.load_tokenizer(folder)
