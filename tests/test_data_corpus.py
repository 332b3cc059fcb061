"""Pile-format reading (jsonl, jsonl.zst, globs, subsets, every bad input) and the
per-document hash splits."""

import json
import logging
import os
import random

from etils.epath import gpath as epath_gpath
from etils.epath import testing as epath_testing
import pytest
import zstandard

from lev_jax.data import corpus, reports, splits
from lev_jax.data.corpus import read_documents
from lev_jax.data.errors import DataError


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
  assert report["skipped"] == dict.fromkeys(reports.SKIP_REASONS, 0)


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


def _zst_cut(path, lines, keep_fraction=0.5):
  """A real multi-block zstd frame of `lines`, cut to keep_fraction of its bytes."""
  data = zstandard.ZstdCompressor().compress("".join(l + "\n" for l in lines).encode())
  path.write_bytes(data[: int(len(data) * keep_fraction)])
  return path


def _varied_lines(n):
  """Lines that compress poorly, so a frame spans several 128 KiB zstd blocks."""
  rng = random.Random(0)
  return [_record(f"doc {i} " + " ".join(f"{rng.getrandbits(40):x}" for _ in range(60)))
          for i in range(n)]


def test_every_skip_reason_is_counted(tmp_path, caplog):
  mixed = _write(tmp_path / "mixed.jsonl", [
      _record("good"), "{not json", "", "   ", _record(""), _record(" \t "),
      json.dumps({"meta": {}}), json.dumps({"text": 7}), "[1, 2]", "{broken",
      _record("wiki doc", "Wiki"), _record("also good")])
  utf8 = tmp_path / "utf8.jsonl"
  utf8.write_bytes(_record("fine").encode() + b"\n" + b'{"text": "caf\xe9"}\n'
                   + b'{"text": "\xff\xfe"}\n' + json.dumps({"text": "x\ud800y"}).encode()
                   + b"\n" + json.dumps({"text": "pair \U0001f642"}).encode() + b"\n")
  lines = _varied_lines(3000)
  cut = _zst_cut(tmp_path / "cut.jsonl.zst", lines)
  patterns = [mixed, tmp_path / "missing.jsonl", str(tmp_path / "none" / "*.jsonl"),
              utf8, cut]
  with caplog.at_level(logging.WARNING):
    texts, report = read_documents(patterns, pile_set_names=("Pile-CC", None))
  n_cut = len(texts) - 4
  assert texts[:4] == ["good", "also good", "fine", "pair \U0001f642"]
  assert 0 < n_cut < len(lines)  # the complete lines before the damage are kept
  assert texts[4:] == [json.loads(l)["text"] for l in lines[:n_cut]]
  assert report["skipped"] == {
      "missing_file": 1, "empty_glob": 1, "truncated_file": 1, "bad_utf8": 3,
      "bad_json": 2, "no_text": 3, "empty": 2, "filtered_subset": 1}
  assert report["files"] == 3 and report["documents"] == len(texts)
  assert report["characters"] == sum(map(len, texts))
  messages = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
  assert len(messages) == 5, messages  # missing, empty glob, 2 files' bad lines, cut
  assert any("missing.jsonl: no such file" in m for m in messages)
  assert any("none/*.jsonl: the glob matches no files" in m for m in messages)
  assert any("mixed.jsonl: skipped 0 line(s) that are not UTF-8, 2 that are not JSON and 3"
             in m for m in messages)
  assert any("utf8.jsonl: skipped 3 line(s) that are not UTF-8" in m for m in messages)
  assert any(f"cut.jsonl.zst: truncated Zstandard stream (the last frame is incomplete) "
             f"after line {n_cut} " in m for m in messages)


def test_strict_names_file_and_line(tmp_path):
  path = _write(tmp_path / "bad.jsonl", [_record("good"), "", "{not json"])
  with pytest.raises(DataError, match=r"bad.jsonl:3: the line is not valid JSON \(.*\); "
                     r"expected a Pile-format record"):
    read_documents(path, strict=True)
  path = _write(tmp_path / "notext.jsonl.zst", [_record("ok"), _record("ok"),
                                                json.dumps({"txt": "x"})])
  with pytest.raises(DataError, match=r"notext.jsonl.zst:3: .*string \"text\" \(got no "
                     r"\"text\"\); expected"):
    read_documents(path, strict=True)
  path = tmp_path / "latin1.jsonl"
  path.write_bytes(_record("ok").encode() + b'\n{"text": "caf\xe9"}\n')
  with pytest.raises(DataError, match=r"latin1.jsonl:2: the line is not valid UTF-8 at "
                     r"byte offset 13 .*expected UTF-8 text"):
    read_documents(path, strict=True)
  path = _write(tmp_path / "surrogate.jsonl", [json.dumps({"text": "a\udc00"})])
  with pytest.raises(DataError, match=r"surrogate.jsonl:1: .*lone surrogate"):
    read_documents(path, strict=True)
  path = _write(tmp_path / "int.jsonl", [json.dumps({"text": 7}), "[1]"])
  with pytest.raises(DataError, match=r"int.jsonl:1: .*\(got \"text\" is int\)"):
    read_documents(path, strict=True)
  with pytest.raises(DataError, match=r"int.jsonl:2: .*\(got a JSON list\)"):
    list(corpus.iter_file(path, strict=True, start_line=1))
  # Empty texts and other subsets are not errors, even when strict.
  path = _write(tmp_path / "ok.jsonl", [_record(""), _record("x", "Wiki"), _record("y")])
  assert read_documents(path, strict=True, pile_set_names=["Pile-CC"])[0] == ["y"]


def test_strict_path_and_zst_errors(tmp_path):
  good = _write(tmp_path / "good.jsonl", [_record("x")])
  with pytest.raises(DataError, match="nope.jsonl: no such file or folder"):
    read_documents([good, tmp_path / "nope.jsonl"], strict=True)
  with pytest.raises(DataError, match=r"\*\.jsonl\.zst: the glob matches no files"):
    read_documents([good, str(tmp_path / "*.jsonl.zst")], strict=True)
  (tmp_path / "empty_dir").mkdir()
  with pytest.raises(DataError, match="empty_dir: the folder holds no"):
    read_documents([good, tmp_path / "empty_dir"], strict=True)
  lines = _varied_lines(3000)
  _zst_cut(tmp_path / "cut.jsonl.zst", lines)
  n_before = len(read_documents(tmp_path / "cut.jsonl.zst")[0])
  with pytest.raises(DataError, match=rf"cut.jsonl.zst: truncated Zstandard stream .* "
                     rf"after line {n_before} \(the last complete line\); expected a "
                     "complete"):
    read_documents(tmp_path / "cut.jsonl.zst", strict=True)
  # One small frame cut in half: zstd emits nothing before the damage.
  _zst_cut(tmp_path / "small.jsonl.zst", [_record("document " * 20)] * 200)
  with pytest.raises(DataError, match="small.jsonl.zst: truncated Zstandard stream .* "
                     "before its first complete line"):
    read_documents(tmp_path / "small.jsonl.zst", strict=True)
  (tmp_path / "junk.jsonl.zst").write_bytes(b"this is not zstd data at all")
  with pytest.raises(DataError, match="junk.jsonl.zst: corrupt Zstandard data"):
    read_documents(tmp_path / "junk.jsonl.zst", strict=True)
  texts, report = read_documents([tmp_path / "junk.jsonl.zst", good])
  assert texts == ["x"] and report["skipped"]["truncated_file"] == 1


def test_no_file_at_all_is_always_an_error(tmp_path):
  (tmp_path / "empty_dir").mkdir()
  patterns = [tmp_path / "nope.jsonl", str(tmp_path / "*.jsonl"), tmp_path / "empty_dir"]
  with pytest.raises(DataError, match=r"nope.jsonl, .*\*\.jsonl, .*empty_dir: no "
                     r"Pile-format .* \(3 pattern\(s\): 1 missing, 2 glob\(s\) or "
                     r"folder\(s\) with no files\)"):
    read_documents(patterns)
  with pytest.raises(DataError, match="no Pile-format"):
    corpus.expand_files([])
  (tmp_path / "notes.txt").write_text("x")  # a wrong name is a config mistake
  with pytest.raises(DataError, match=r"notes.txt \(from .*\): expected .*\*\.jsonl"):
    read_documents([tmp_path / "notes.txt"])
  with pytest.raises(DataError, match=r"\*\*/\*.jsonl: recursive '\*\*' globs"):
    read_documents(str(tmp_path / "**" / "*.jsonl"))
  with pytest.raises(DataError, match=r"pattern None .*expected a non-empty path"):
    read_documents([None])
  with pytest.raises(DataError, match="pile_set_names = 'Wiki': .*not a string"):
    read_documents(tmp_path, pile_set_names="Wiki")


def test_expand_files_counts_and_dedups(tmp_path, shards):
  folder, a, b = shards
  report = reports.new_report()
  files = corpus.expand_files([b, str(folder / "*.jsonl*"), folder, "~/nope-lev-jax.jsonl"],
                              report=report)
  assert files == [b, a]  # pattern order, then sorted; each file once
  assert report["files"] == 2 and report["skipped"]["missing_file"] == 1
  # A file removed after listing is counted as missing when read.
  a.unlink()
  report = reports.new_report()
  assert list(corpus.iter_file(a, report=report)) == []
  assert report["skipped"]["missing_file"] == 1
  with pytest.raises(DataError, match="a.jsonl: no such file"):
    list(corpus.iter_file(a, strict=True))


def test_reports_merge_field_wise():
  a, b = reports.new_report(), reports.new_report()
  assert a == {"files": 0, "documents": 0, "characters": 0,
               "skipped": dict.fromkeys(reports.SKIP_REASONS, 0)}
  a["files"], a["documents"], a["skipped"]["bad_json"] = 1, 2, 3
  b["characters"], b["skipped"]["bad_json"], b["skipped"]["empty"] = 4, 5, 6
  total = reports.merge_reports(a, b)
  assert total["files"] == 1 and total["documents"] == 2 and total["characters"] == 4
  assert total["skipped"]["bad_json"] == 8 and total["skipped"]["empty"] == 6
  assert a["skipped"]["bad_json"] == 3  # inputs unchanged
  assert reports.merge_reports() == reports.new_report()
  with pytest.raises(DataError, match=r"reports\[1\] = .*expected a read report"):
    reports.merge_reports(a, {"files": 1})


def test_iter_file_start_line_and_shards(tmp_path):
  lines = ["{not json", _record("two"), "", _record("four", "Wiki"), _record("five")]
  for name in ("f.jsonl", "f.jsonl.zst"):
    path = _write(tmp_path / name, lines)
    report = reports.new_report()
    assert list(corpus.iter_file(path, report=report)) == [
        (2, "two", "Pile-CC"), (4, "four", "Wiki"), (5, "five", "Pile-CC")]
    assert report["documents"] == 3 and report["skipped"]["bad_json"] == 1
    # Lines up to start_line are not parsed: the bad line 1 is neither counted nor raised.
    report = reports.new_report()
    got = list(corpus.iter_file(path, strict=True, report=report, start_line=2))
    assert got == [(4, "four", "Wiki"), (5, "five", "Pile-CC")]
    assert report["documents"] == 2 and report["skipped"]["bad_json"] == 0
    # Shards split by line number before parsing: shard 1 of 2 never sees line 1.
    shard1 = list(corpus.iter_file(path, strict=True, shard_index=1, shard_count=2))
    assert [n for n, _, _ in shard1] == [2, 4]
    shard0 = list(corpus.iter_file(path, shard_index=0, shard_count=2,
                                   pile_set_names=("Pile-CC",)))
    assert [n for n, _, _ in shard0] == [5]
  with pytest.raises(DataError, match=r"shard_index = 2: expected an int \[0, 2\)"):
    list(corpus.iter_file(path, shard_index=2, shard_count=2))
  with pytest.raises(DataError, match="start_line = -1: expected an int >= 0"):
    list(corpus.iter_file(path, start_line=-1))


def test_gs_url_reads_through_epath(tmp_path, monkeypatch):
  """`gs://bucket/...` served from tmp_path by etils.epath.testing.mock_epath."""
  bucket = tmp_path / "bucket"
  bucket.mkdir()
  _write(bucket / "x.jsonl", [_record("from gcs"), "{bad"])
  _write(bucket / "y.jsonl.zst", [_record("zst on gcs", "Wiki")])
  # With TensorFlow installed, epath sends gs:// to tf.io.gfile and ignores the mock;
  # EPATH_USE_TF=false would stop that, but etils reads it once (functools.cache).
  monkeypatch.setattr(epath_gpath, "_is_tf_installed", lambda: False)

  def local(path):
    path = os.fspath(path)
    return os.fspath(tmp_path / path[len("gs://"):]) if path.startswith("gs://") else path

  def as_gs(path):
    return "gs://" + os.path.relpath(path, tmp_path)

  def glob(fn, pattern):
    found = fn(local(pattern))
    return [as_gs(p) for p in found] if os.fspath(pattern).startswith("gs://") else found

  with epath_testing.mock_epath(
      open=lambda fn, p, mode: fn(local(p), mode), exists=lambda fn, p: fn(local(p)),
      isdir=lambda fn, p: fn(local(p)), listdir=lambda fn, p: fn(local(p)), glob=glob):
    files = corpus.expand_files(["gs://bucket/x.jsonl", "gs://bucket/*.zst",
                                 "gs://bucket", "gs://bucket/missing.jsonl"])
    assert [os.fspath(f) for f in files] == ["gs://bucket/x.jsonl",
                                             "gs://bucket/y.jsonl.zst"]
    texts, report = read_documents("gs://bucket")
    assert texts == ["from gcs", "zst on gcs"]
    assert report["files"] == 2 and report["skipped"]["bad_json"] == 1
    with pytest.raises(DataError, match=r"gs://bucket/x.jsonl:2: the line is not valid"):
      read_documents("gs://bucket/x.jsonl", strict=True)


def test_split_documents_depends_on_text_only():
  texts = [f"document number {i}" for i in range(400)]
  train, validation = splits.split_documents(texts, 0.25)
  train_r, validation_r = splits.split_documents(texts[::-1], 0.25)
  assert sorted(validation) == sorted(validation_r) and 60 < len(validation) < 140
  assert len(train) + len(validation) == 400
  # sha256-based, so the same in every process (Python's str hash is salted per process).
  assert validation[:8] == [f"document number {i}" for i in (2, 7, 13, 17, 22, 41, 42, 47)]
