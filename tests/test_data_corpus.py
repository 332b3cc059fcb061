"""Pile-format reading (jsonl, jsonl.zst, globs, subsets, every bad input) and the
embedded corpus (deterministic, disjoint split, idempotent cache)."""

import json
import logging
import os
import sys

import pytest
import zstandard

from lev_jax.data import corpus
from lev_jax.data.corpus import DataError, read_documents


def _record(text, subset="Pile-CC"):
  return json.dumps({"text": text, "meta": {"pile_set_name": subset}})


def _write(path, lines):
  data = "".join(line + "\n" for line in lines).encode()
  if path.name.endswith(".zst"):
    data = zstandard.ZstdCompressor().compress(data)
  path.write_bytes(data)
  return path


@pytest.fixture
def shards(tmp_path):
  a = _write(tmp_path / "a.jsonl", [_record("alpha one"), _record("alpha two", "Wiki")])
  b = _write(tmp_path / "b.jsonl.zst", [_record("beta ünï 🙂"), _record("beta two", "Wiki")])
  return tmp_path, a, b


def test_reads_jsonl_and_zst_in_order(shards):
  _, a, b = shards
  texts, report = read_documents([a, b])
  assert texts == ["alpha one", "alpha two", "beta ünï 🙂", "beta two"]
  assert report["files"] == 2 and report["documents"] == 4
  assert report["characters"] == sum(len(t) for t in texts)
  assert report["skipped"] == dict.fromkeys(corpus.SKIP_REASONS, 0)


def test_glob_folder_and_single_path(shards):
  folder, a, b = shards
  by_glob, report = read_documents(str(folder / "*.jsonl*"))
  assert by_glob == read_documents([a, b])[0] and report["files"] == 2
  assert read_documents(folder)[0] == by_glob  # a folder: its *.jsonl[.zst] files
  # The same file through a path and a glob is read once.
  assert read_documents([a, str(folder / "a.*")])[1]["files"] == 1


def test_filters_by_pile_set_name(shards):
  folder, _, _ = shards
  texts, report = read_documents(str(folder / "*"), pile_set_names=("Wiki",))
  assert texts == ["alpha two", "beta two"]
  assert report["skipped"]["filtered_subset"] == 2


def test_missing_path_and_empty_glob_name_the_pattern(tmp_path):
  with pytest.raises(DataError, match="nope.jsonl: no such file"):
    read_documents(tmp_path / "nope.jsonl")
  with pytest.raises(DataError, match=r"\*\.jsonl\.zst: the glob matches no files"):
    read_documents(str(tmp_path / "*.jsonl.zst"))
  (tmp_path / "notes.txt").write_text("x")
  with pytest.raises(DataError, match=r"notes.txt: expected .*\*\.jsonl"):
    read_documents(tmp_path / "notes.txt")


def test_bad_lines_are_skipped_counted_and_warned_once_per_file(tmp_path, caplog):
  path = _write(tmp_path / "bad.jsonl", [
      _record("good"), "{not json", "", _record(""), json.dumps({"meta": {}}),
      json.dumps({"text": 7}), "[1, 2]", "{broken", _record("also good")])
  with caplog.at_level(logging.WARNING):
    texts, report = read_documents(path)
  assert texts == ["good", "also good"]
  assert report["skipped"] == {"bad_json": 2, "no_text": 3, "empty": 1, "filtered_subset": 0}
  warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
  assert len(warnings) == 1 and "bad.jsonl" in warnings[0].getMessage()
  assert "2 line(s) that are not JSON and 3" in warnings[0].getMessage()


def test_strict_names_file_and_line(tmp_path):
  path = _write(tmp_path / "bad.jsonl", [_record("good"), "{not json"])
  with pytest.raises(DataError, match=r"bad.jsonl:2: the line is not valid JSON"):
    read_documents(path, strict=True)
  path = _write(tmp_path / "notext.jsonl.zst", [_record("ok"), _record("ok"),
                                                json.dumps({"txt": "x"})])
  with pytest.raises(DataError, match=r"notext.jsonl.zst:3: .*string \"text\""):
    read_documents(path, strict=True)


def test_truncated_and_corrupt_zst_name_the_file(tmp_path):
  lines = [_record(f"document {i} " * 20) for i in range(200)]
  whole = _write(tmp_path / "whole.jsonl.zst", lines).read_bytes()
  (tmp_path / "cut.jsonl.zst").write_bytes(whole[: len(whole) // 2])
  with pytest.raises(DataError, match="cut.jsonl.zst: truncated Zstandard"):
    read_documents(tmp_path / "cut.jsonl.zst")
  (tmp_path / "junk.jsonl.zst").write_bytes(b"this is not zstd data at all")
  with pytest.raises(DataError, match="junk.jsonl.zst: corrupt Zstandard"):
    read_documents(tmp_path / "junk.jsonl.zst")


def test_zst_multiple_frames_and_lines_across_chunks(tmp_path, monkeypatch):
  lines = [_record(f"document {i}: " + "word " * (i % 50)) for i in range(300)]
  c = zstandard.ZstdCompressor()
  data = b"".join(c.compress("".join(l + "\n" for l in part).encode())
                  for part in (lines[:100], lines[100:]))
  (tmp_path / "frames.jsonl.zst").write_bytes(data)
  monkeypatch.setattr(corpus, "_ZST_CHUNK_BYTES", 7)  # split frames and lines everywhere
  texts, _ = read_documents(tmp_path / "frames.jsonl.zst")
  assert texts == [json.loads(l)["text"] for l in lines]


@pytest.fixture(scope="module")
def embedded():
  return corpus.embedded_documents()


def test_embedded_documents_are_real_deterministic_text(embedded):
  assert corpus.embedded_documents() == embedded
  subsets = {d["meta"]["pile_set_name"] for d in embedded}
  assert subsets == {"pydoc_topics", "stdlib_docstrings"}
  megabytes = sum(len(d["text"].encode()) for d in embedded) / 1e6
  assert 1.5 < megabytes < 6, megabytes
  texts = [d["text"] for d in embedded]
  assert all(t.strip() for t in texts)
  assert any("Return the" in t for t in texts)
  assert not any("The Zen of Python" in t for t in texts)  # `this` is never imported


def test_embedded_corpus_split_is_disjoint_and_cached(tmp_path, embedded):
  paths = corpus.write_embedded_corpus(tmp_path, 0.1)
  version = ".".join(map(str, sys.version_info[:3]))
  assert paths["train"].parent.name == f"embedded-py{version}-val0.1"
  train, _ = read_documents(paths["train"])
  validation, _ = read_documents(paths["validation"])
  texts = [d["text"] for d in embedded]
  assert sorted(train + validation) == sorted(texts)
  assert not set(train) & set(validation)
  assert 0.03 < len(validation) / len(texts) < 0.2
  assert all(corpus.is_validation(t, 0.1) for t in validation)
  mtime = os.stat(paths["train"]).st_mtime_ns
  assert corpus.write_embedded_corpus(tmp_path, 0.1) == paths
  assert os.stat(paths["train"]).st_mtime_ns == mtime  # written once
  assert not list(paths["train"].parent.glob(".*tmp*"))
  with pytest.raises(DataError, match="validation_fraction"):
    corpus.write_embedded_corpus(tmp_path, 1.5)


def test_split_documents_depends_on_text_only():
  texts = [f"document number {i}" for i in range(400)]
  train, validation = corpus.split_documents(texts, 0.25)
  train_r, validation_r = corpus.split_documents(texts[::-1], 0.25)
  assert sorted(validation) == sorted(validation_r) and 60 < len(validation) < 140
  assert len(train) + len(validation) == 400
  # sha256-based, so the same in every process (Python's str hash is salted per process).
  assert validation[:8] == [f"document number {i}" for i in (2, 7, 13, 17, 22, 41, 42, 47)]
