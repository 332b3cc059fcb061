"""`lev_jax.data.load(config)`: both sources, hold-out, caches, errors naming the field."""

import json

import numpy as np
import pytest
import zstandard

from lev_jax import data
from lev_jax.data import sources
from lev_jax.config import base_config

WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()


def _docs(n, offset=0):
  return [f"Record {i}. " + " ".join(WORDS[(i * k) % len(WORDS)] for k in range(3, 40))
          for i in range(offset, offset + n)]


def _write(path, texts, subset="Pile-CC"):
  lines = "".join(json.dumps({"text": t, "meta": {"pile_set_name": subset}}) + "\n"
                  for t in texts).encode()
  path.write_bytes(zstandard.ZstdCompressor().compress(lines)
                   if path.name.endswith(".zst") else lines)
  return str(path)


def _config(tmp_path, **data_fields):
  c = base_config()
  c.model.vocab_size = 320
  c.train.seq_len = 16
  c.eval.batch_size = 2
  c.eval.batches = 3
  c.data.cache_dir = str(tmp_path / "cache")
  c.data.shuffle_buffer = 8
  for k, v in data_fields.items():
    c.data[k] = v
  return c


def test_jsonl_with_hold_out(tmp_path, monkeypatch):
  train = _write(tmp_path / "train.jsonl.zst", _docs(300))
  c = _config(tmp_path, source="jsonl", train_files=(train,), validation_fraction=0.2)
  bundle = data.load(c)
  assert bundle.tokenizer.vocab_size == 320
  assert not set(bundle.train_documents(0, 1)) & set(bundle.validation_documents)
  assert len(bundle.train_documents(0, 1)) + len(bundle.validation_documents) == 300
  assert 30 < len(bundle.validation_documents) < 90
  assert bundle.report["train"]["documents"] == 300 and bundle.report["validation"] is None
  assert bundle.token_counts_V.shape == (320,) and bundle.token_counts_V.dtype == np.int64
  assert bundle.report["train_tokens"] == bundle.token_counts_V.sum()
  batch = next(iter(bundle.train_dataset(4)))
  assert batch["inputs"].shape == (4, 16) and batch["weights"].dtype == np.float32
  evals = bundle.eval_batches()
  assert len(evals) == 3 and evals[0]["targets"].shape == (2, 16)
  assert bundle.eval_batches() is evals

  # Second load: tokenizer and token counts come from the cache.
  monkeypatch.setattr(sources, "token_counts", lambda *a: pytest.fail("counts recomputed"))
  again = data.load(c)
  assert again.report["tokenizer_path"] == bundle.report["tokenizer_path"]
  np.testing.assert_array_equal(again.token_counts_V, bundle.token_counts_V)


def test_jsonl_with_validation_files_and_subsets(tmp_path):
  _write(tmp_path / "train.jsonl", _docs(150))
  _write(tmp_path / "other.jsonl", _docs(50, 1000), subset="Github")
  val = _write(tmp_path / "val.jsonl", _docs(40, 500))
  c = _config(tmp_path, source="jsonl", train_files=(str(tmp_path / "[to]*.jsonl"),),
              validation_files=(val,), pile_set_names=("Pile-CC",))
  bundle = data.load(c)
  assert bundle.train_documents(0, 1) == _docs(150) and bundle.validation_documents == _docs(40, 500)
  assert bundle.report["train"]["skipped"]["filtered_subset"] == 50


def test_errors_name_the_config_field(tmp_path):
  c = _config(tmp_path, source="jsonl", train_files=(str(tmp_path / "missing.jsonl"),))
  with pytest.raises(data.DataError, match="config.data.train_files: .*missing.jsonl"):
    data.load(c)
  train = _write(tmp_path / "train.jsonl", _docs(30))
  c = _config(tmp_path, source="jsonl", train_files=(train,), pile_set_names=("Github",))
  with pytest.raises(data.DataError, match="training split has no documents"):
    data.load(c)


@pytest.mark.parametrize("source,field", [("jsonl", "validation_files"),
                                          ("jsonl_stream", "validation_files"),
                                          ("jsonl", "test_files")])
def test_a_training_folder_holding_a_held_out_file_is_refused(tmp_path, source, field):
  _write(tmp_path / "train.jsonl", _docs(10))
  _write(tmp_path / "val.jsonl", _docs(10, 500))
  c = _config(tmp_path, source=source, train_files=(str(tmp_path),),
              **{field: (str(tmp_path / "." / "val.jsonl"),)})
  with pytest.raises(data.DataError, match=rf"^config.data.{field}: .*/val.jsonl is also "
                     "matched by config.data.train_files; a file belongs to one split only"):
    data.load(c)
  assert not (tmp_path / "cache").exists()


def test_embedded_source_at_the_default_vocab(tmp_path):
  c = _config(tmp_path)
  c.model.vocab_size = 2048
  bundle = data.load(c)
  assert bundle.report["source"] == "embedded"
  assert bundle.tokenizer.vocab_size == 2048
  assert len(bundle.train_documents(0, 1)) > 300 and len(bundle.validation_documents) > 5
  assert bundle.report["train_tokens"] > 300_000
  assert (bundle.token_counts_V > 0).sum() > 1500  # the merges are used
  assert len(bundle.eval_batches()) == 3


def test_jsonl_stream_report_counts_what_the_streams_read(tmp_path, caplog):
  """Issue 13.7: the report of a stream holds its documents, tokens and skipped lines,
  partial while an epoch is being read, complete once one was read in full. Issue 13.9c
  (sibling): the bad line is logged once, not by the tokenizer's sample nor per epoch."""
  train = tmp_path / "train.jsonl"
  _write(train, _docs(5))
  train.write_text(train.read_text() + "{bad json\n")
  val = _write(tmp_path / "val.jsonl", _docs(40, 500))
  c = _config(tmp_path, source="jsonl_stream", train_files=(str(train),),
              validation_files=(val,), tokenizer="bytes")
  c.model.vocab_size = 259
  with caplog.at_level("WARNING"):
    bundle = data.load(c)
  assert bundle.current_report()["counted"] == {"train": "not read yet",
                                                "validation": "not read yet"}
  assert "not counted in full" not in bundle.report["counts_from"]
  bundle.eval_batches()  # 3 batches of 2 x 17 tokens: the start of 40 documents
  it = iter(bundle.train_dataset(4))
  next(it)
  report = bundle.current_report()
  assert report["counted"] == {"train": "partial", "validation": "partial"}
  assert 0 < report["validation"]["documents"] < 40
  assert report["train"]["note"].startswith("partial: 0 of 1 training file(s) of epoch 0")
  with caplog.at_level("WARNING"):
    for _ in range(40):  # 5 documents of ~230 tokens: one epoch is ~18 batches
      next(it)
  assert [r.getMessage() for r in caplog.records].count(
      f"{train}: skipped 0 line(s) that are not UTF-8, 1 that are not JSON and 0 without "
      'a string "text" (data.strict=True makes these errors).') == 1
  report = json.loads(json.dumps(bundle.current_report()))  # JSON-safe, as written
  train_report = report["train"]
  assert report["counted"]["train"] == "complete" and train_report["documents"] == 5
  assert train_report["skipped"]["bad_json"] == 1 and train_report["files"] == 1
  tokens = sum(len(bundle.tokenizer.encode(d)) for d in _docs(5))
  assert train_report["tokens"] == tokens and report["train_tokens"] == tokens + 5
  assert train_report["note"].startswith("complete: a whole epoch of the training files")
  assert bundle.report["train"] is None  # load's report is left as it was


def test_evaluation_batches_use_the_given_tokenizer_and_leave_the_config_unchanged(tmp_path):
  from lev_jax.config import ConfigError
  from lev_jax.eval.evaluate import batches_sha256
  train = _write(tmp_path / "train.jsonl", _docs(200))
  val = _write(tmp_path / "val.jsonl", _docs(40, 500))
  c = _config(tmp_path, source="jsonl", train_files=(train,), validation_files=(val,))
  bundle = data.load(c)  # trains the SentencePiece tokenizer a checkpoint would hold
  before = c.to_dict()
  batches, counts_V, record = data.evaluation_batches(c, bundle.tokenizer)
  assert c.to_dict() == before and c.data.sentencepiece_file == ""
  assert batches_sha256(batches) == batches_sha256(bundle.eval_batches())
  np.testing.assert_array_equal(counts_V, bundle.token_counts_V)
  assert record == bundle.eval_data() and record["split"] == "validation"

  batches, counts_V, record = data.evaluation_batches(c, bundle.tokenizer, files=[val],
                                                      split="test")
  assert c.to_dict() == before and counts_V is None
  assert record["split"] == "test" and record["files"] == [val]
  assert record["sha256"] == bundle.eval_data()["sha256"] and len(batches) == 3

  with pytest.raises(ConfigError, match="different tokenizer than the checkpoint's"):
    data.evaluation_batches(c, data.ByteTokenizer())
  (tmp_path / "empty.jsonl").write_text("")  # newcomer pass 6: the file was not named
  with pytest.raises(data.DataError, match=f"^the test split has no documents: "
                     f"{tmp_path / 'empty.jsonl'} gave no non-empty text"):
    data.evaluation_batches(c, bundle.tokenizer, files=[str(tmp_path / "empty.jsonl")],
                            split="test")


@pytest.mark.parametrize("source", ["embedded", "jsonl"])
def test_a_cache_dir_that_cannot_be_written_is_named(tmp_path, source):
  """Issue 26: an unwritable data.cache_dir was a bare `[Errno 2] ...`: the error names
  the field, its value and the OS reason (the corpus copy, the tokenizer, the counts)."""
  (tmp_path / "file").write_text("not a folder")
  cache = tmp_path / "file" / "cache"
  train = _write(tmp_path / "train.jsonl", _docs(20))
  c = _config(tmp_path, source=source, train_files=(train,), validation_fraction=0.2)
  c.data.cache_dir = str(cache)
  with pytest.raises(data.DataError) as e:
    data.load(c)
  assert str(e.value).startswith(
      f"config.data.cache_dir = {str(cache)!r}: cannot write the data cache there: Not a "
      "directory"), e.value
  assert str(e.value).endswith("expected a folder you can write to")
