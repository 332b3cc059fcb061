"""The frozen embedded corpora: the file is what the code and docs/data.md say (hash,
documents, split, default tokenizer's token count), damage is one line, the split cache
is written once, a test split comes from training documents; the builder is
deterministic. The prose presets (data.corpus): pin, manifest, splits, damage, an
unknown name and a load of a slice."""

import dataclasses
import hashlib
import json
import os
import re
from pathlib import Path

import pytest

from lev_jax.data import corpora_build, embedded, embedded_build, splits
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


@pytest.mark.parametrize("validation,test,match", [
    (1e-9, 0.0, r"^validation_fraction = 1e-09 leaves the validation split of .* empty; "
     r"expected a larger share$"),
    (0.05, 1e-9, r"^test_fraction = 1e-09 leaves the test split of .* empty"),
])
def test_a_fraction_that_empties_a_split_is_refused_before_anything_is_written(
    tmp_path, validation, test, match):
  with pytest.raises(DataError, match=match):
    embedded.write_embedded_corpus(tmp_path / "cache", validation, test)
  assert not (tmp_path / "cache").exists() or test  # nothing written for the refusal
  assert not list((tmp_path / "cache").glob("*-test*"))


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


# The prose presets (data.corpus): built by corpora_build from pinned Debian packages.
PRESETS = ("debian_books", "foldoc")


@pytest.fixture(scope="module")
def manifest():
  return json.loads((embedded.CORPORA_DIR / "manifest.json").read_text())


@pytest.mark.parametrize("name", PRESETS)
def test_a_preset_is_its_recorded_corpus(name, manifest):
  """The shipped file, the code's pin and the manifest agree; the texts are prose."""
  spec = embedded.CORPORA[name]
  docs = embedded.embedded_documents(corpus=name)
  entry = manifest[name]
  assert len(docs) == spec.documents == entry["documents"]
  assert spec.sha256 == entry["sha256"] == hashlib.sha256(spec.path.read_bytes()).hexdigest()
  assert sum(len(d["text"]) for d in docs) == entry["characters"]
  assert [(p["package"], p["version"], p["deb_sha256"]) for p in entry["packages"]] == [
      (p.name, p.version, p.sha256) for p in corpora_build.PACKAGES[name]]
  subsets = {p["subset"] for p in entry["packages"]}
  assert {d["meta"]["pile_set_name"] for d in docs} == subsets
  assert 1.9e6 < entry["utf8_bytes"] < 6e6 and spec.path.stat().st_size < 1.5e6
  texts = [d["text"] for d in docs]
  assert len(set(texts)) == len(texts)  # deduplicated
  markup = r"</?(div|span|p|a|code|pre)\b[^>]*>" + (r"|\{\w+\}" if name == "foldoc" else "")
  bodies = [t.split("\n\n", 1)[1] for t in texts]  # FOLDOC has a "{searchTerms}" entry
  assert not any(re.search(markup, b) for b in bodies)  # no HTML, no {cross reference}


def test_a_preset_splits_three_ways_once_and_as_its_manifest_says(tmp_path, manifest):
  split = manifest["debian_books"]["split"]
  paths = embedded.write_embedded_corpus(tmp_path, split["validation_fraction"],
                                         split["test_fraction"], corpus="debian_books")
  assert paths["train"].parent.name.startswith(
      embedded.cache_name("debian_books") + "-val0.05-test0.05")
  assert embedded.cache_name("debian_books").startswith("debian_books-v1-4e09ab795054")
  texts = {k: read_documents(p)[0] for k, p in paths.items()}
  assert {k: len(v) for k, v in texts.items()} == {
      k: split[k] for k in ("train", "validation", "test")}
  assert not (set(texts["train"]) & set(texts["validation"]) or
              set(texts["train"]) & set(texts["test"]) or
              set(texts["validation"]) & set(texts["test"]))
  mtimes = [os.stat(p).st_mtime_ns for p in paths.values()]
  again = embedded.write_embedded_corpus(tmp_path, 0.05, 0.05, corpus="debian_books")
  assert again == paths and [os.stat(p).st_mtime_ns for p in paths.values()] == mtimes


def test_a_damaged_or_missing_preset_is_one_line(tmp_path, monkeypatch):
  data = bytearray(embedded.CORPORA["foldoc"].path.read_bytes())
  data[len(data) // 2] ^= 0xFF
  bad = tmp_path / "foldoc.jsonl.zst"
  bad.write_bytes(bytes(data))
  with pytest.raises(DataError) as e:
    embedded.embedded_documents(bad, corpus="foldoc")
  assert re.fullmatch(r"config\.data\.corpus = 'foldoc': .*foldoc\.jsonl\.zst: sha256 "
                      r"\w+\.\.\. is not the foldoc corpus's a541166f2cbd\.\.\. .*"
                      r"\(git checkout\) or reinstall lev_jax", str(e.value))
  gone = dataclasses.replace(embedded.CORPORA["foldoc"], path=tmp_path / "absent.zst")
  monkeypatch.setitem(embedded.CORPORA, "foldoc", gone)
  with pytest.raises(DataError) as e:
    embedded.write_embedded_corpus(tmp_path / "cache", 0.05, corpus="foldoc")
  assert re.fullmatch(r"config\.data\.corpus = 'foldoc': .*absent\.zst: cannot read the "
                      r"foldoc corpus \(No such file or directory\); expected the file "
                      r"shipped with lev_jax: .*corpora_build .*\)", str(e.value))
  assert not (tmp_path / "cache").exists()  # nothing written


def test_an_unknown_corpus_is_one_line():
  from lev_jax.config import DATA_CORPORA, ConfigError, base_config, validate
  assert DATA_CORPORA == tuple(embedded.CORPORA) and DATA_CORPORA[0] == "python_docs"
  expected = ("config.data.corpus = 'wiki': expected one of 'python_docs', "
              "'debian_books', 'foldoc'")
  with pytest.raises(DataError) as e:
    embedded.write_embedded_corpus("/nonexistent", 0.05, corpus="wiki")
  assert str(e.value) == expected
  c = base_config()
  c.data.corpus = "wiki"
  with pytest.raises(ConfigError) as e:
    validate(c)
  assert str(e.value) == expected
  c.data.corpus, c.data.source, c.data.train_files = "foldoc", "jsonl", ("a.jsonl",)
  with pytest.raises(ConfigError, match=r"^config.data.corpus = 'foldoc': expected "
                     r"'python_docs' \(the default\) with data.source = 'jsonl'"):
    validate(c)


def test_load_trains_on_a_slice_of_a_preset(tmp_path):
  """data.load with data.corpus: a tiny slice (one book of debian_books, UTF-8 bytes)."""
  from lev_jax import data as lev_data  # pylint: disable=g-import-not-at-top
  from lev_jax.config import base_config, validate  # pylint: disable=g-import-not-at-top
  c = base_config()
  c.data.update(corpus="debian_books", cache_dir=str(tmp_path), tokenizer="bytes",
                pile_set_names=("developers_reference",))
  c.model.vocab_size, c.train.seq_len, c.eval.batch_size, c.eval.batches = 259, 16, 2, 1
  bundle = lev_data.load(validate(c))
  assert bundle.report["corpus"] == "debian_books"
  train = bundle.train_documents(0, 1)
  assert 100 < len(train) < 200 and bundle.validation_documents
  assert any("Debian" in t for t in train)
  assert "debian_books-v1-" in bundle.report["corpus_paths"]["train"]
