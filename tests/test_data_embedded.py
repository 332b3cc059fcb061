"""The frozen embedded corpus: the file is what the code and docs/data.md say (hash,
documents, split, default tokenizer's token count), damage is one line, the split cache
is written once, a test split comes from training documents; the builder is
deterministic."""

import os
import re
from pathlib import Path

import pytest

from lev_jax.data import embedded, embedded_build, splits
from lev_jax.data.corpus import read_documents
from lev_jax.data.errors import DataError

# The data guide as one line of single spaces (its prose wraps anywhere).
DATA_DOC = " ".join((Path(__file__).parents[1] / "docs" / "data.md").read_text().split())


@pytest.fixture(scope="module")
def docs():
  return embedded.embedded_documents()


def test_the_shipped_file_is_the_recorded_corpus(docs):
  assert len(docs) == embedded.EMBEDDED_DOCUMENTS == 607
  assert {d["meta"]["pile_set_name"] for d in docs} == {"pydoc_topics", "stdlib_docstrings"}
  texts = [d["text"] for d in docs]
  assert all(t.strip() for t in texts) and any("Return the" in t for t in texts)
  assert not any("The Zen of Python" in t for t in texts)  # `this` is never imported
  megabytes = sum(len(t.encode()) for t in texts) / 1e6
  assert 2.2 < megabytes < 2.4, megabytes
  # The frozen bytes are exactly what the builder writes for these documents.
  assert embedded_build.corpus_bytes(docs) == embedded.EMBEDDED_FILE.read_bytes()


def test_the_data_guide_states_the_default_datas_figures(docs, tmp_path):
  """Hash, documents, split and the default tokenizer's training tokens, as docs/data.md
  prints them (the default job: experiments/smoke.py, SentencePiece 2048)."""
  from lev_jax import data
  from lev_jax.experiments import experiments_dir, load_experiment
  smoke = load_experiment(experiments_dir() / "smoke.py")
  c = smoke.get_config("leviathan")
  c.data.cache_dir = str(tmp_path)
  report = data.load(c).report
  n_train, n_val = report["train"]["documents"], report["validation"]["documents"]
  assert n_train + n_val == len(docs)
  facts = [f"sha256 `{embedded.EMBEDDED_SHA256[:12]}`", f"{len(docs)} documents",
           f"{n_train} training and {n_val} validation documents",
           f"{report['train_tokens']:,} training tokens"]
  for fact in facts:
    assert fact in DATA_DOC, fact


def test_a_damaged_file_is_one_line(tmp_path):
  data = bytearray(embedded.EMBEDDED_FILE.read_bytes())
  data[len(data) // 2] ^= 0xFF
  bad = tmp_path / "corpus.jsonl.zst"
  bad.write_bytes(bytes(data))
  with pytest.raises(DataError, match=r"corpus.jsonl.zst: sha256 .* is not the embedded "
                     r"corpus's 7f7874306d25.*damaged or was replaced"):
    embedded.embedded_documents(bad)
  with pytest.raises(DataError, match=r"absent.zst: cannot read the embedded corpus"):
    embedded.embedded_documents(tmp_path / "absent.zst")


def test_the_split_is_disjoint_and_cached_once(tmp_path, docs):
  paths = embedded.write_embedded_corpus(tmp_path, 0.1)
  assert paths["train"].parent.name == f"{embedded.cache_name()}-val0.1"
  assert re.fullmatch(r"embedded-v\d+-[0-9a-f]{12}", embedded.cache_name())
  train, _ = read_documents(paths["train"])
  validation, _ = read_documents(paths["validation"])
  texts = [d["text"] for d in docs]
  assert sorted(train + validation) == sorted(texts)
  assert not set(train) & set(validation)
  assert 0.03 < len(validation) / len(texts) < 0.2
  assert all(splits.is_validation(t, 0.1) for t in validation)
  mtime = os.stat(paths["train"]).st_mtime_ns
  assert embedded.write_embedded_corpus(tmp_path, 0.1) == paths
  assert os.stat(paths["train"]).st_mtime_ns == mtime  # written once
  assert not list(paths["train"].parent.glob(".*tmp*"))
  with pytest.raises(DataError, match="validation_fraction"):
    embedded.write_embedded_corpus(tmp_path, 1.5)


@pytest.mark.parametrize("damage", ["truncate", "edit", "delete"])
def test_a_damaged_cached_split_is_named_and_written_again(tmp_path, damage, caplog):
  """The cache is checked against the corpus at every load: a truncated train.jsonl
  never trains on part of the corpus under the label "embedded"."""
  paths = embedded.write_embedded_corpus(tmp_path, 0.1, test_fraction=0.1)
  good = {k: p.read_bytes() for k, p in paths.items()}
  target = paths["train"]
  if damage == "truncate":  # a full disk, a killed copy
    target.write_bytes(good["train"][:len(good["train"]) // 3])
  elif damage == "edit":
    target.write_bytes(good["train"].replace(b"the", b"THE", 1))
  else:
    target.unlink()
  base_train = paths["validation"].parent / "train.jsonl"  # the two-way split's
  base_train.write_bytes(base_train.read_bytes()[:-10])
  caplog.set_level("INFO")
  assert embedded.write_embedded_corpus(tmp_path, 0.1, test_fraction=0.1) == paths
  assert {k: p.read_bytes() for k, p in paths.items()} == good
  assert f"{base_train}: sha256" in caplog.text and "writing it again" in caplog.text
  assert (f"{target}: sha256" in caplog.text) == (damage != "delete")


def test_a_test_split_comes_from_training_documents_and_leaves_validation_alone(tmp_path):
  two_way = embedded.write_embedded_corpus(tmp_path, 0.1)
  folder = two_way["train"].parent
  three_way = embedded.write_embedded_corpus(tmp_path, 0.1, test_fraction=0.1)
  assert three_way["validation"] == two_way["validation"]  # the same file, unchanged
  assert three_way["test"].parent.name == folder.name + "-test0.1"
  old_train, _ = read_documents(two_way["train"])
  train, _ = read_documents(three_way["train"])
  test, _ = read_documents(three_way["test"])
  texts = [f"document number {i}" for i in range(400)]
  assert sorted(train + test) == sorted(old_train) and not set(train) & set(test)
  assert 0.05 < len(test) / len(old_train) < 0.2
  assert train == [t for t in old_train if t not in set(test)]
  assert {splits.split_of(t, 0.1, 0.1) for t in test} == {"test"}
  assert {splits.split_of(t, 0.1, 0.1) for t in train} == {"train"}
  assert embedded.write_embedded_corpus(tmp_path, 0.1, test_fraction=0.1) == three_way
  # Validation is decided first, by the same hash, whatever test_fraction is.
  assert [splits.split_of(t, 0.25, 0.25) == "validation" for t in texts] == [
      splits.is_validation(t, 0.25) for t in texts]
  with pytest.raises(DataError, match="test_fraction"):
    embedded.write_embedded_corpus(tmp_path, 0.5, test_fraction=0.5)
