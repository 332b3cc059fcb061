"""`lev-prepare-data` and prepared datasets: round trips, report, resume, refusals, CLI."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from absl import flags
from array_record.python import array_record_module
import numpy as np
import pytest
import tensorflow_datasets as tfds
import zstandard

from lev_jax import lock

from lev_jax.cli import prepare_data
from lev_jax.config import base_config
from lev_jax.data import prepare as prepare_lib, prepared, tfds_builder
from lev_jax.data.errors import DataError
from lev_jax.data.prepare import prepare

REPO = Path(__file__).resolve().parent.parent
SMOKE = str(REPO / "experiments" / "smoke.py")
WORDS = ("alpha beta gamma delta epsilon zeta theta iota kappa lambda omicron sigma "
         "tensor vector matrix scalar kernel shard token record").split()
# Planted bad lines in train/a.jsonl and train/b.jsonl.zst, by skip reason.
PLANTED = {"bad_json": 2, "no_text": 1, "empty": 1, "bad_utf8": 1}


def _line(text, subset):
  return json.dumps({"text": text, "meta": {"pile_set_name": subset}}).encode()


def _write(path, lines):
  data = b"\n".join(lines) + b"\n"
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_bytes(zstandard.ZstdCompressor().compress(data)
                   if path.name.endswith(".zst") else data)


def _docs(n, start, subsets=("Pile-CC", "Github", "ArXiv")):
  return [(f"Doc {i}: " + " ".join(WORDS[(i * k + k) % len(WORDS)] for k in range(1, 25))
           + ("\n\tnaïve café — 日本語" if i % 3 == 0 else ""), subsets[i % len(subsets)])
          for i in range(start, start + n)]


@pytest.fixture
def pile(tmp_path):
  """A tiny Pile: train/a.jsonl + train/b.jsonl.zst (with bad lines), val, test."""
  root = tmp_path / "pile"
  a, b = _docs(7, 0), _docs(4, 100)
  _write(root / "train" / "a.jsonl",
         [_line(*a[0]), b"{not json", _line(*a[1]), b'{"meta": {}}', _line(*a[2]), b"",
          json.dumps({"text": "   "}).encode(), _line(*a[3]), b'{"text": "\xff\xfe"}',
          *[_line(*d) for d in a[4:]]])
  _write(root / "train" / "b.jsonl.zst", [_line(*d) for d in b[:2]] + [b"[1, 2"] +
         [_line(*d) for d in b[2:]])
  _write(root / "train" / "c.jsonl", [_line(*d) for d in _docs(3, 200)])
  _write(root / "val.jsonl", [_line(*d) for d in _docs(3, 300)])
  _write(root / "test.jsonl", [_line(*d) for d in _docs(2, 400)])
  return {"root": root, "train": a + b + _docs(3, 200), "validation": _docs(3, 300),
          "test": _docs(2, 400)}


def _config(tmp_path, pile, **data):
  c = base_config()
  c.model.vocab_size = 259
  d = c.data
  d.source = "jsonl"
  d.tokenizer = "bytes"
  d.train_files = (str(pile["root"] / "train" / "*.jsonl*"),)
  d.validation_files = (str(pile["root"] / "val.jsonl"),)
  d.test_files = (str(pile["root"] / "test.jsonl"),)
  d.prepared_dir = str(tmp_path / "out")
  d.cache_dir = str(tmp_path / "cache")
  d.prepare_workers = 1
  for k, v in data.items():
    d[k] = v
  return c


def _texts(dataset, split):
  source = dataset.source(split)
  records = [source[i] for i in range(len(source))]
  if dataset.format == "tokens":
    texts = [dataset.tokenizer.decode(r["tokens"]) for r in records]
  else:
    texts = [r["text"].decode("utf-8") for r in records]
  return [(t, r["pile_set_name"].decode()) for t, r in zip(texts, records)]


def _records(shard):
  """The decoded records of one shard (bytes may differ between processes: protobuf map
  order in tf.train.Example follows Python's per-process string hash seed)."""
  reader = array_record_module.ArrayRecordReader(str(shard))
  decode = prepared.features("tokens").deserialize_example_np
  return [{k: np.asarray(v).tolist() for k, v in decode(r).items()}
          for r in reader.read_all()]


def _mtimes(folder):
  return {p.name: p.stat().st_mtime_ns for p in Path(folder).iterdir() if p.is_file()}


def test_tokens_round_trip_report_and_counts(tmp_path, pile):
  c = _config(tmp_path, pile, test_files=(str(pile["root"] / "test.jsonl"),
                                          str(tmp_path / "nowhere" / "*.jsonl")))
  report = prepare(c)
  ds = prepared.open_prepared(c.data.prepared_dir)
  assert ds.format == "tokens" and ds.splits == {"train": 14, "validation": 3, "test": 2}
  for split in ("train", "validation", "test"):
    assert _texts(ds, split) == pile[split]  # file then line order, subsets kept
  rec = ds.source("train")[0]
  assert rec["tokens"].dtype == np.int32 and ds.tokenizer.eos_id not in rec["tokens"]

  train = report["splits"]["train"]
  assert train["files"] == 3 and train["documents"] == 14 and train["records"] == 14
  assert train["skipped"] == {**dict.fromkeys(train["skipped"], 0), **PLANTED}
  assert not any(report["splits"]["validation"]["skipped"].values())
  assert report["splits"]["test"]["skipped"]["empty_glob"] == 1
  texts = [t for t, _ in pile["train"]]
  assert train["characters"] == sum(map(len, texts))
  assert train["tokens"] == sum(len(t.encode()) for t in texts)  # bytes: one id per byte
  assert report["total"]["documents"] == 19

  counts_V = ds.token_counts_V
  assert counts_V.shape == (259,) and counts_V.dtype == np.int64
  assert counts_V.sum() == train["tokens"] + train["documents"]  # eos once per document
  assert counts_V[ds.tokenizer.eos_id] == 14
  expected_V = np.bincount(np.concatenate([ds.source("train")[i]["tokens"]
                                           for i in range(14)]), minlength=259)
  expected_V[ds.tokenizer.eos_id] += 14
  np.testing.assert_array_equal(counts_V, expected_V)

  assert ds.report == json.loads((Path(c.data.prepared_dir) / "report.json").read_text())
  assert ds.report["splits"] == report["splits"] and not report["already_prepared"]
  meta = ds.metadata
  assert meta["run_id"] == report["run_id"] and meta["format_version"] == 1
  assert meta["tokenizer"]["name"] == "bytes" and meta["report"] == ds.report
  assert [s["path"] for s in meta["sources"]["train"]] == sorted(
      str(p) for p in (pile["root"] / "train").iterdir())
  ds.check_vocab(259)
  with pytest.raises(DataError, match=r"vocab_size = 300 .*out.* 259 ids"):
    ds.check_vocab(300)
  with pytest.raises(DataError, match="no split 'nope'"):
    ds.source("nope")


def test_text_format_sentencepiece_two_workers(tmp_path, pile):
  c = _config(tmp_path, pile, prepare_format="text", tokenizer="sentencepiece",
              pile_set_names=("Pile-CC", "Github"))
  c.model.vocab_size = 300
  report = prepare(c, workers=2)
  ds = prepared.open_prepared(c.data.prepared_dir)
  keep = [d for d in pile["train"] if d[1] != "ArXiv"]
  assert ds.format == "text" and _texts(ds, "train") == keep
  assert report["splits"]["train"]["skipped"]["filtered_subset"] == len(pile["train"]) - len(keep)
  tok = ds.tokenizer
  assert tok.name == "sentencepiece" and tok.vocab_size == 300
  assert (Path(c.data.prepared_dir) / "tokenizer" / "spm.model").exists()
  n_tokens = sum(len(tok.encode(t)) for t, _ in keep)
  assert report["splits"]["train"]["tokens"] == n_tokens
  assert ds.token_counts_V.sum() == n_tokens + len(keep)


def test_resume_writes_only_unfinished_shards(tmp_path, pile):
  c = _config(tmp_path, pile)
  out = Path(c.data.prepared_dir)
  first = prepare(c)
  shard = out / "lev_text-train.array_record-00001-of-00003"
  stats = out / "prepare" / f"{shard.name}.json"
  original = _records(shard)
  counts = (out / "token_counts.npy").read_bytes()
  before = _mtimes(out)

  # A finished shard and its stats disappear: only that shard is written again.
  shard.unlink()
  stats.unlink()
  again = prepare(c)
  assert again["written_shards"] == 1 and not again["already_prepared"]
  after = _mtimes(out)
  for name, mtime in before.items():
    if name.startswith("lev_text-") and name != shard.name:
      assert after[name] == mtime, name
  assert _records(shard) == original
  assert (out / "token_counts.npy").read_bytes() == counts
  assert again["splits"] == first["splits"] and again["run_id"] == first["run_id"]

  # A kill mid-shard: no dataset_info.json, no stats, a temporary file left behind.
  (out / "dataset_info.json").unlink()
  stats.unlink()
  (out / "prepare" / f"{shard.name}.tmp").write_bytes(b"partial")
  with pytest.raises(DataError, match="preparation did not finish.*lev-prepare-data"):
    prepared.open_prepared(out)
  before = _mtimes(out)
  resumed = prepare(c)
  assert resumed["written_shards"] == 1
  assert not list((out / "prepare").glob("*.tmp"))
  after = _mtimes(out)
  assert all(after[n] == m for n, m in before.items()
             if n.startswith("lev_text-") and n != shard.name)
  assert _records(shard) == original
  ds = prepared.open_prepared(out)
  assert _texts(ds, "train") == pile["train"] and ds.report["splits"] == first["splits"]


def test_finished_dataset_no_op_other_config_needs_overwrite(tmp_path, pile):
  c = _config(tmp_path, pile)
  out = Path(c.data.prepared_dir)
  first = prepare(c)
  before = _mtimes(out)
  again = prepare(c)
  assert again["already_prepared"] and again["written_shards"] == 0
  assert again["run_id"] == first["run_id"] and _mtimes(out) == before

  other = _config(tmp_path, pile, pile_set_names=("Github",))
  with pytest.raises(DataError, match=r"holds a different finished dataset.*--overwrite"):
    prepare(other)
  assert _mtimes(out) == before
  replaced = prepare(other, overwrite=True)
  assert replaced["run_id"] != first["run_id"]
  ds = prepared.open_prepared(out)
  assert _texts(ds, "train") == [d for d in pile["train"] if d[1] == "Github"]


def test_strict_stops_at_bad_line_and_runs_never_mix(tmp_path, pile):
  c = _config(tmp_path, pile, strict=True)
  out = Path(c.data.prepared_dir)
  bad = pile["root"] / "train" / "a.jsonl"
  with pytest.raises(DataError, match=f"{bad}:2: the line is not valid JSON"):
    prepare(c)
  assert not (out / "dataset_info.json").exists()
  with pytest.raises(DataError, match="preparation did not finish"):
    prepared.open_prepared(out)
  lenient = _config(tmp_path, pile)
  with pytest.raises(DataError, match="unfinished work of a different preparation run"):
    prepare(lenient)
  prepare(lenient, overwrite=True)
  assert prepared.open_prepared(out).splits["train"] == 14


def test_shard_of_another_run_is_refused(tmp_path, pile):
  c = _config(tmp_path, pile)
  out = Path(c.data.prepared_dir)
  prepare(c)
  stats_path = out / "prepare" / "lev_text-validation.array_record-00000-of-00001.json"
  stats = json.loads(stats_path.read_text())
  stats["run_id"] = "0123456789abcdef"
  stats_path.write_text(json.dumps(stats))
  shard = "lev_text-validation.array_record-00000-of-00001"
  with pytest.raises(DataError, match=f"{shard}: written by preparation run 0123456789abcdef"):
    prepared.open_prepared(out)
  with pytest.raises(DataError, match=f"{shard}: its stats .* run 0123456789abcdef"):
    prepare(c)


def test_damaged_shards_and_edited_counts_are_named_then_prepared_again(tmp_path, pile):
  """Newcomer pass 8: a shard with a flipped byte or emptied was a Riegeli traceback in
  lev-train; the validation shard replaced by the test shard, or an edited
  token_counts.npy, trained on without a word."""
  c = _config(tmp_path, pile)
  out = Path(c.data.prepared_dir)
  prepare(c)
  counts = (out / "token_counts.npy").read_bytes()
  valid = out / "lev_text-validation.array_record-00000-of-00001"
  test = out / "lev_text-test.array_record-00000-of-00001"
  train = out / "lev_text-train.array_record-00001-of-00003"
  original = valid.read_bytes()

  data = bytearray(original)
  data[len(data) // 2] ^= 0xFF
  valid.write_bytes(bytes(data))
  with pytest.raises(DataError, match=f"^{valid}: damaged shard of split 'validation': its "
                     "sha256 differs from the one recorded when it was written: .*; "
                     r"prepare the data again \(lev-prepare-data"):
    prepared.open_prepared(out)
  again = prepare(c)  # the damaged shard is written again, the others kept
  assert again["written_shards"] == 1 and valid.read_bytes() == original

  train.write_bytes(b"")
  size = json.loads((out / "prepare" / f"{train.name}.json").read_text())["num_bytes"]
  with pytest.raises(DataError, match=f"^{train}: damaged shard of split 'train': 0 bytes, "
                     f"but its preparation wrote {size:,}"):
    prepared.open_prepared(out)
  assert prepare(c)["written_shards"] == 1

  valid.write_bytes(test.read_bytes())
  with pytest.raises(DataError, match=f"^{valid}: damaged shard of split 'validation': "):
    prepared.open_prepared(out)
  prepare(c)
  assert _texts(prepared.open_prepared(out), "validation") == pile["validation"]

  edited = np.load(out / "token_counts.npy")
  edited[:] = 7
  np.save(out / "token_counts.npy", edited)
  with pytest.raises(DataError, match=r"token_counts.npy: \d+ of 259 ids' counts differ "
                     r"from the train shards' counts in .*prepare \(sums 1,813 vs"):
    prepared.open_prepared(out)
  assert prepare(c)["written_shards"] == 0  # finished again from the shards' counts
  assert (out / "token_counts.npy").read_bytes() == counts

  # newcomer pass 9: a re-run said "0 shard(s) written" over a replaced tokenizer/
  metadata_text = (out / "metadata.json").read_text()
  metadata = json.loads(metadata_text)
  metadata["tokenizer"]["fingerprint"] = "0" * 64
  (out / "metadata.json").write_text(json.dumps(metadata))
  with pytest.raises(DataError, match=r"tokenizer: tokenizer fingerprint .* differs from "
                     r"0000000000000000 in .*metadata.json: the tokenizer does not belong to "
                     r"this data; restore the folder, or prepare the data again"):
    prepared.open_prepared(out).tokenizer  # pylint: disable=expression-not-assigned
  with pytest.raises(DataError, match=r"tokenizer: tokenizer fingerprint .* differs from "
                     r"0000000000000000, the one the shards were written with .*: the folder "
                     "was replaced; restore it, or prepare the data again with --overwrite"):
    prepare(c)
  (out / "metadata.json").write_text(metadata_text)

  # newcomer pass 10: metadata.json deleted ("format_version = None") or damaged (the
  # advice to run lev-prepare-data again looped)
  for damage in ("", "{not json"):
    if damage:
      (out / "metadata.json").write_text(damage)
    else:
      (out / "metadata.json").unlink()
    with pytest.raises(DataError, match=r"metadata.json.*; run lev-prepare-data --config=... "
                       r"again to write it anew"):
      prepared.open_prepared(out)
    assert prepare(c)["written_shards"] == 0
    assert prepared.open_prepared(out).splits["validation"] == 3

  report = json.loads((out / "report.json").read_text())
  report["splits"]["validation"]["tokens"] += 1000
  (out / "report.json").write_text(json.dumps(report))
  with pytest.raises(DataError, match=r"report.json: differs from the report in .*"
                     r"metadata.json \(lev-prepare-data writes the same in both\): one of "
                     "them was edited"):
    prepared.open_prepared(out)
  prepare(c)
  assert prepared.open_prepared(out).report["splits"]["validation"]["tokens"] == (
      report["splits"]["validation"]["tokens"] - 1000)

  # newcomer pass 11: prepare/ a file (a NotADirectoryError traceback in lev-eval; the
  # re-run unmarked the dataset finished, then crashed) and token_counts.npy a folder
  shutil.move(out / "prepare", tmp_path / "prepare.aside")
  (out / "prepare").write_text("x")
  for step in (lambda: prepared.open_prepared(out), lambda: prepare(c)):
    with pytest.raises(DataError, match=f"^{out / 'prepare'}: is a file; expected the folder "
                       "lev-prepare-data keeps its shard records in"):
      step()
  assert (out / "dataset_info.json").exists()  # still marked finished
  (out / "prepare").unlink()
  shutil.move(tmp_path / "prepare.aside", out / "prepare")
  shutil.move(out / "token_counts.npy", tmp_path / "counts.aside")
  (out / "token_counts.npy").mkdir()
  with pytest.raises(DataError, match=f"^{out / 'token_counts.npy'}: is a folder; expected a "
                     r"\.npy array file"):
    prepared.open_prepared(out)
  # newcomer pass 13: the re-run unmarked the finished dataset (dataset_info.json
  # deleted), then crashed writing into the folder; the same for report.json,
  # features.json and metadata.json
  for name in ("token_counts.npy", "report.json", "features.json", "metadata.json"):
    if name != "token_counts.npy":
      shutil.move(out / name, tmp_path / f"{name}.aside")
      (out / name).mkdir()
    with pytest.raises(DataError, match=f"^{out / name}: is a folder; expected "
                       f"lev-prepare-data's {name} file \\(move it aside\\)$"):
      prepare(c)
    assert (out / "dataset_info.json").is_file()  # still marked finished
    (out / name).rmdir()
    shutil.move(tmp_path / f"{name}.aside" if name != "token_counts.npy"
                else tmp_path / "counts.aside", out / name)
  assert prepare(c)["written_shards"] == 0


def test_a_shard_damaged_inside_is_named_when_read(tmp_path, pile, monkeypatch):
  """Datasets above HASH_LIMIT_BYTES are checked by size at open; a read of a damaged
  record raises DataError naming its shard and how to rewrite it (was Riegeli's
  RuntimeError traceback)."""
  c = _config(tmp_path, pile)
  out = Path(c.data.prepared_dir)
  prepare(c)
  shard = out / "lev_text-train.array_record-00001-of-00003"  # the 2nd: records 7, 8, ...
  data = bytearray(shard.read_bytes())
  for offset in range(64, 512):  # the first records' chunk: its hash no longer matches
    data[offset] ^= 0xFF
  shard.write_bytes(bytes(data))
  monkeypatch.setattr(prepared, "HASH_LIMIT_BYTES", 0)
  source = prepared.open_prepared(out).source("train")
  with pytest.raises(DataError, match=f"^{shard}: damaged shard of split 'train': its record "
                     r"0 cannot be read \(.*\); delete the file and run lev-prepare-data "
                     r"--config=\.\.\. again, which writes it anew$"):
    source.__getitems__(list(range(len(source))))
  shard.unlink()  # as the line says
  assert prepare(c)["written_shards"] == 1
  source = prepared.open_prepared(out).source("train")
  assert len(source.__getitems__(list(range(len(source))))) == len(source)


def test_open_and_prepare_errors(tmp_path, pile):
  with pytest.raises(DataError, match="no such folder"):
    prepared.open_prepared(tmp_path / "nowhere")
  (tmp_path / "empty").mkdir()
  with pytest.raises(DataError, match=r"empty: holds no prepared data: no "
                     r"dataset_info.json, which lev-prepare-data writes; raw Pile-format "
                     r"JSONL needs data.source=jsonl with data.train_files"):
    prepared.open_prepared(tmp_path / "empty")
  with pytest.raises(DataError, match=r"train: holds no prepared data \(it holds raw "
                     r"JSONL, e.g. a.jsonl\): no dataset_info.json"):
    prepared.open_prepared(pile["root"] / "train")
  (tmp_path / "run" / "checkpoints").mkdir(parents=True)  # newcomer pass 5: "raw JSONL"
  (tmp_path / "run" / "metrics.jsonl").touch()
  with pytest.raises(DataError, match=r"run: a training run's folder \(lev-train's: "
                     r"checkpoints/, metrics.jsonl\), not prepared data"):
    prepared.open_prepared(tmp_path / "run")
  with pytest.raises(DataError, match=r"config.model.vocab_size = 300 but the bytes "
                     "tokenizer has 259 ids"):
    c = _config(tmp_path, pile)
    c.model.vocab_size = 300
    prepare(c)
  (tmp_path / "busy").mkdir()
  (tmp_path / "busy" / "notes.txt").write_text("mine")
  with pytest.raises(DataError, match="not empty and holds no lev-prepare-data dataset"):
    prepare(_config(tmp_path, pile), output_dir=tmp_path / "busy", overwrite=True)
  with pytest.raises(DataError, match=r"config.data.train_files: .*nowhere"):
    prepare(_config(tmp_path, pile, train_files=(str(tmp_path / "nowhere.jsonl"),)))
  with pytest.raises(DataError, match=r"config.data.validation_files: .*val.jsonl is also "
                     "matched by config.data.train_files"):
    prepare(_config(tmp_path, pile, train_files=(str(pile["root"] / "*.jsonl"),)))
  # newcomer pass 7: an empty or all-garbage validation file was "prepared" (exit 0) and
  # lev-train failed on it later; a train file with no usable line was blamed on
  # config.model.vocab_size (SentencePiece) instead of the file
  empty, garbage = tmp_path / "empty.jsonl", tmp_path / "garbage.jsonl"
  empty.write_bytes(b"")
  garbage.write_bytes(b'{"foo": 1}\n\xff\xfe\n')
  with pytest.raises(DataError, match=r"^config.data.validation_files: .*empty.jsonl gave no "
                     r"document \(nothing skipped\); expected Pile-format JSONL lines with a "
                     r'string "text" field$'):
    prepare(_config(tmp_path, pile, validation_files=(str(empty),)),
            output_dir=tmp_path / "out_empty_val")
  # newcomer pass 8: the folder left said only "did not finish ... run it again"
  with pytest.raises(DataError, match=r"out_empty_val: preparation did not finish: "
                     r'lev-prepare-data stopped with "config.data.validation_files: .*'
                     r'empty.jsonl gave no document .*"; fix that, then run'):
    prepared.open_prepared(tmp_path / "out_empty_val")
  prepare(_config(tmp_path, pile), output_dir=tmp_path / "out_empty_val", overwrite=True)
  assert not (tmp_path / "out_empty_val" / "prepare" / prepared.STOPPED_FILE).exists()
  fake = tmp_path / "fake.jsonl.zst"  # newcomer pass 9: only "truncated_file 1"
  fake.write_bytes(b"this is not zstd " * 50)
  with pytest.raises(DataError, match=r"fake.jsonl.zst gave no document \(truncated_file 1: "
                     r"a .zst that zstd could not read to its end, truncated, damaged or not "
                     r"zstd at all\)"):
    prepare(_config(tmp_path, pile, train_files=(str(fake),)), output_dir=tmp_path / "out_z")
  for tokenizer in ("bytes", "sentencepiece"):
    c = _config(tmp_path, pile, train_files=(str(garbage),), tokenizer=tokenizer)
    c.model.vocab_size = 259 if tokenizer == "bytes" else 512
    with pytest.raises(DataError, match=r"^config.data.train_files: .*garbage.jsonl gave no "
                       r"document \(bad_utf8 1, no_text 1\); expected Pile-format JSONL"):
      prepare(c, output_dir=tmp_path / f"out_garbage_{tokenizer}")


def test_loading_does_not_import_tensorflow(tmp_path, pile):
  c = _config(tmp_path, pile)
  prepare(c)
  code = (
      "import sys, grain\n"
      "from lev_jax.data.prepared import open_prepared\n"
      f"ds = open_prepared({c.data.prepared_dir!r})\n"
      "src = ds.source('train')\n"
      "docs = list(grain.MapDataset.source(src)[::2])\n"
      "assert len(docs) == 7 and ds.tokenizer.decode(docs[0]['tokens'])\n"
      "assert ds.token_counts_V.sum() > 0\n"
      "print('tensorflow' in sys.modules)\n")
  proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                        timeout=120, cwd=REPO)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert proc.stdout.strip() == "False"


_CLI_FLAGS = ("config", "output_dir", "workers", "overwrite", "force_unlock", "lock")


def _forget_cli_flags():
  for name in list(flags.FLAGS):
    if name in _CLI_FLAGS or name.startswith("config."):
      delattr(flags.FLAGS, name)


def _cli(argv, capsys, monkeypatch):
  """Runs `lev-prepare-data` in this process with fresh flags; returns (exit status,
  stdout, stderr). config_flags defines the --config.* override flags while parsing
  and reads them from sys.argv, so both are reset for each call."""
  _forget_cli_flags()
  prepare_data._define_flags()  # pylint: disable=protected-access
  capsys.readouterr()
  argv = ["lev-prepare-data", *argv]
  monkeypatch.setattr(sys, "argv", argv)
  try:
    flags.FLAGS(argv)
    prepare_data.main(["lev-prepare-data"])
    status = 0
  except SystemExit as e:
    status = e.code
  finally:
    _forget_cli_flags()
  out, err = capsys.readouterr()
  return status, out, err


@pytest.mark.filterwarnings("ignore:the load_module:DeprecationWarning")  # config_flags
def test_cli_summary_and_strict_error(tmp_path, pile, capsys, monkeypatch):
  root = pile["root"]
  args = [f"--config={SMOKE}:tied", "--config.model.vocab_size=259",
          "--config.data.tokenizer=bytes", "--config.data.source=jsonl",
          f"--config.data.train_files=('{root}/train/*.jsonl*',)",
          f"--config.data.validation_files=('{root}/val.jsonl',)",
          f"--config.data.cache_dir={tmp_path / 'cache'}", "--workers=1"]
  status, out, err = _cli([*args, f"--output_dir={tmp_path / 'cli'}"], capsys, monkeypatch)
  assert status == 0, err
  lines = out.strip().splitlines()
  assert lines[0].startswith(f"lev-prepare-data: prepared {tmp_path / 'cli'} (run ")
  assert "train" in lines[1] and "14 documents" in lines[1]
  assert "bad_json=2" in lines[1] and "bad_utf8=1" in lines[1] and "empty=1" in lines[1]
  assert "validation" in lines[2] and "3 documents" in lines[2] and "skipped: none" in lines[2]
  assert "tokens/s" in lines[3]
  status, out, _ = _cli([*args, f"--output_dir={tmp_path / 'cli'}"], capsys, monkeypatch)
  assert status == 0 and "already prepared" in out

  status, out, err = _cli([*args, f"--output_dir={tmp_path / 'strict'}",
                           "--config.data.strict=True"], capsys, monkeypatch)
  assert status == 2 and out == ""
  assert err.startswith("lev-prepare-data: error: ") and len(err.strip().splitlines()) == 1
  assert f"{root / 'train' / 'a.jsonl'}:2" in err
  status, _, err = _cli(args, capsys, monkeypatch)  # no prepared_dir, no --output_dir
  assert status == 2 and "config.data.prepared_dir" in err
  # newcomer pass 9: a dataset written inside another dataset (or a run, an export)
  status, _, err = _cli([*args, f"--output_dir={tmp_path / 'cli' / 'sub'}"], capsys,
                        monkeypatch)
  assert status == 2 and err == (
      f"lev-prepare-data: error: --output_dir={tmp_path / 'cli' / 'sub'}: is inside "
      f"{tmp_path / 'cli'}, lev-prepare-data's output (prepared data; only lev-prepare-data "
      "writes there); expected a path outside it\n")
  assert not (tmp_path / "cli" / "sub").exists()


def test_tfds_builder_writes_a_dataset_open_prepared_reads(tmp_path, pile):
  manual = tmp_path / "manual"
  (manual / "train").mkdir(parents=True)
  for name in ("a.jsonl", "b.jsonl.zst", "c.jsonl"):
    (manual / "train" / name).write_bytes((pile["root"] / "train" / name).read_bytes())
  (manual / "val.jsonl").write_bytes((pile["root"] / "val.jsonl").read_bytes())
  builder = tfds_builder.LevText(config="bytes_tokens", data_dir=tmp_path / "tfds",
                             file_format="array_record")
  builder.download_and_prepare(
      download_config=tfds.download.DownloadConfig(manual_dir=os.fspath(manual)))
  ds = prepared.open_prepared(builder.data_path)
  assert ds.splits == {"train": 14, "validation": 3}
  assert sorted(_texts(ds, "train")) == sorted(pile["train"])  # TFDS orders by key hash
  train = ds.report["splits"]["train"]
  assert train["skipped"] == {**dict.fromkeys(train["skipped"], 0), **PLANTED}
  assert ds.token_counts_V.sum() == train["tokens"] + train["documents"]
  assert ds.metadata["writer"] == "tfds:LevText" and ds.tokenizer.name == "bytes"


@pytest.mark.filterwarnings("ignore:the load_module:DeprecationWarning")  # config_flags
def test_cli_refuses_a_folder_another_preparation_is_writing(tmp_path, pile, capsys,
                                                             monkeypatch):
  root, busy = pile["root"], tmp_path / "busy"
  args = [f"--config={SMOKE}:tied", "--config.model.vocab_size=259",
          "--config.data.tokenizer=bytes", "--config.data.source=jsonl",
          f"--config.data.train_files=('{root}/train/*.jsonl*',)",
          f"--config.data.validation_files=('{root}/val.jsonl',)", f"--output_dir={busy}"]
  with lock.hold(busy, prog="lev-prepare-data", inside=False):
    status, out, err = _cli(args, capsys, monkeypatch)
  assert status == 2 and out == "" and len(err.strip().splitlines()) == 1, err
  assert err.startswith(f"lev-prepare-data: error: {busy} is in use by lev-prepare-data "
                        f"(pid {os.getpid()}, host "), err
  assert not busy.exists() and not (tmp_path / ".busy.lock").exists()
  def read_only(path, *_):  # /proc/x: the lock file beside the folder cannot be created
    raise PermissionError(13, "Permission denied", path)
  monkeypatch.setattr(lock, "_open", read_only)
  args = [a for a in args if not a.startswith("--output_dir")]
  status, _, err = _cli([*args, f"--config.data.prepared_dir={busy}"], capsys, monkeypatch)
  assert status == 2 and err.strip() == (
      f"lev-prepare-data: error: config.data.prepared_dir={busy}: cannot write in "
      f"{tmp_path} (Permission denied); expected a folder you can write to")


def test_each_file_s_skipped_lines_are_logged_once(tmp_path, pile, caplog):
  """Issue 13.9c: the tokenizer's training sample reads the train files before the
  shards do; only the shards' full read logs their skipped lines."""
  c = _config(tmp_path, pile, tokenizer="sentencepiece")
  c.model.vocab_size = 300
  with caplog.at_level("WARNING"):
    prepare(c, workers=1)
  for name in ("a.jsonl", "b.jsonl.zst"):
    logged = [r.getMessage() for r in caplog.records
              if r.getMessage().startswith(f"{pile['root'] / 'train' / name}: skipped")]
    assert len(logged) == 1, logged


def test_pool_workers_end_with_the_preparing_process(monkeypatch):
  """Issue 26.16: lev_jax.parent_watch in each worker (tests/test_parent_watch.py)."""
  made, watched = [], []

  class Pool:
    def __init__(self, n, initializer, initargs):
      made.append(n)
      initializer(*initargs)  # as in each worker

    def __enter__(self):
      return self

    def __exit__(self, *exc):
      return None

    def imap_unordered(self, fn, items):
      return map(fn, items)
  monkeypatch.setattr(prepare_lib.multiprocessing, "get_context",
                      lambda method: type("Context", (), {"Pool": Pool}))
  monkeypatch.setattr(prepare_lib, "exit_with_parent", lambda: watched.append(True))
  assert prepare_lib._run_pool([], "tokenizer", {}, 2, progress=None) == []
  assert made == [2] and watched == [True]
  prepare_lib._WORKER.clear()


def test_workers_0_and_output_dir_alone_mean_what_the_help_says(tmp_path, capsys, monkeypatch):
  """Issue 26: `--workers=0` ("0 = one per CPU core") was refused as "not a positive
  integer", and `--output_dir` without config.data.prepared_dir failed validation
  ("config.data.prepared_dir = '': expected the folder ...")."""
  seen = {}

  def fake(config, *, output_dir=None, workers=None, overwrite=False):
    seen.update(prepared_dir=config.data.prepared_dir, workers=workers)
    raise DataError("stop here")
  monkeypatch.setattr(prepare_lib, "prepare", fake)
  out = str(tmp_path / "out")
  status, _, err = _cli([f"--config={SMOKE}:tied", "--config.data.source=prepared",
                         f"--config.data.train_files=('{tmp_path}/a.jsonl',)",
                         f"--output_dir={out}", "--workers=0"], capsys, monkeypatch)
  assert (status, err, seen) == (
      2, "lev-prepare-data: error: stop here\n", {"prepared_dir": out, "workers": 0})
  monkeypatch.setattr(os, "cpu_count", lambda: 6)
  assert [prepare_lib.worker_count(w, c, 4) for w, c in
          ((0, 2), (None, 0), (None, 2), (3, 0))] == [4, 4, 2, 3]
