"""lev_jax tokenizers and corpora as seqio vocabularies, Tasks and Mixtures (tiny data).

seqio (and the TensorFlow it brings) is a lev_jax dependency, imported only by
lev_jax.data.vocabularies and these tests; the training path never imports it.
"""

import base64
import collections
import json

import pytest
import zstandard

from lev_jax.data import embedded, splits
from lev_jax.data import tokenizer as tok_lib
from lev_jax.data.errors import DataError

# seqio imports TensorFlow: ~11 s of CPU, once per process. Imported when the first test
# here runs, not when pytest collects this file (every pytest-xdist worker collects every
# file); the xdist_group keeps these tests on one worker (pyproject: --dist loadgroup).
seqio = tf = vocabularies = None
pytestmark = pytest.mark.xdist_group("tensorflow")


@pytest.fixture(scope="module", autouse=True)
def _seqio_and_tensorflow():
  global seqio, tf, vocabularies  # pylint: disable=global-statement
  import seqio  # pylint: disable=import-outside-toplevel,redefined-outer-name
  import tensorflow as tf  # pylint: disable=import-outside-toplevel,redefined-outer-name
  from lev_jax.data import vocabularies  # pylint: disable=import-outside-toplevel,redefined-outer-name

L = 64
LONG = "alpha long " + "a long document " * 12  # 203 bytes: trimmed to L - 1 ids + eos
DOCS = {  # pile_set_name -> texts; "Pile-CC" is not a valid seqio name as it is
    "alpha": [f"alpha {i}: the quick brown fox." for i in range(6)] + ["alpha ünï 日本 🙂"],
    "Pile-CC": [f"Pile-CC {i}: jumps over\n  the lazy dog" for i in range(6)],
    "gamma": [f"gamma {i}: pack my box; 12345" for i in range(6)],
}


def _record(text, subset):
  return json.dumps({"text": text, "meta": {"pile_set_name": subset}}) + "\n"


@pytest.fixture(scope="module")
def files(tmp_path_factory):
  """train: a.jsonl (alpha, Pile-CC interleaved, LONG) then b.jsonl.zst (gamma);
  validation: v.jsonl. Returns (files, train texts in file/line order)."""
  root = tmp_path_factory.mktemp("pile")
  first = [t for pair in zip(DOCS["alpha"], DOCS["Pile-CC"]) for t in pair]
  first += DOCS["alpha"][len(DOCS["Pile-CC"]):]
  subset_of = {t: s for s, texts in DOCS.items() for t in texts}
  (root / "a.jsonl").write_text("".join(_record(t, subset_of[t]) for t in first)
                                + _record(LONG, "alpha"))
  (root / "b.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(
      "".join(_record(t, "gamma") for t in DOCS["gamma"]).encode()))
  (root / "v.jsonl").write_text(_record("held out text", "alpha"))
  return ({"train": [str(root / "a.jsonl"), str(root / "b.jsonl.zst")],
           "validation": str(root / "v.jsonl")}, first + [LONG] + DOCS["gamma"])


@pytest.fixture(scope="module")
def spm_tok(tmp_path_factory):
  texts = [t for ts in DOCS.values() for t in ts] * 3
  return tok_lib.train_sentencepiece(texts, 320, tmp_path_factory.mktemp("spm"))


@pytest.fixture(scope="module")
def tiktoken_tok(tmp_path_factory):
  ranks = {bytes([i]): i for i in range(256)}
  for piece in (b"th", b"the", b" the", b"in", b"ing", b"al", b"alpha"):
    ranks[piece] = len(ranks)
  path = tmp_path_factory.mktemp("tiktoken") / "tiny.tiktoken"
  path.write_text("".join(f"{base64.b64encode(t).decode()} {r}\n" for t, r in ranks.items()))
  return tok_lib.TiktokenTokenizer(str(path))


@pytest.fixture(params=["bytes", "sentencepiece", "o200k_base"])
def tokenizer(request, spm_tok, tiktoken_tok):
  return {"bytes": tok_lib.ByteTokenizer(), "sentencepiece": spm_tok,
          "o200k_base": tiktoken_tok}[request.param]


TEXTS = ["", "plain text", "ünïcödé 日本語 🙂", "  two  spaces\n\n\tand a tab ",
         "the thing"]


def test_byte_tokenizer_matches_seqio_byte_vocabulary():
  ours, theirs = tok_lib.ByteTokenizer(), vocabularies.as_seqio_vocabulary(
      tok_lib.ByteTokenizer())
  assert isinstance(theirs, seqio.ByteVocabulary)
  assert (ours.vocab_size, ours.pad_id, ours.eos_id, ours.unk_id) == (
      theirs.vocab_size, theirs.pad_id, theirs.eos_id, theirs.unk_id)
  for text in TEXTS:
    ids = ours.encode(text)
    assert ids == theirs.encode(text) == theirs.encode_tf(tf.constant(text)).numpy().tolist()
    assert theirs.decode(ids) == ours.decode(ids) == text


def test_sentencepiece_vocabulary_gives_our_ids(spm_tok):
  vocab = vocabularies.as_seqio_vocabulary(spm_tok)
  assert isinstance(vocab, seqio.SentencePieceVocabulary)
  assert (vocab.vocab_size, vocab.eos_id, vocab.unk_id, vocab.pad_id) == (320, 2, 1, 0)
  for text in TEXTS + DOCS["Pile-CC"][:1]:
    ids = spm_tok.encode(text)
    assert list(vocab.encode(text)) == ids
    assert vocab.encode_tf(tf.constant(text)).numpy().tolist() == ids
    assert vocab.decode(ids + [vocab.eos_id, 5]) == text  # through the first eos
  assert vocabularies.as_seqio_vocabulary(spm_tok) == vocab


def test_tiktoken_vocabulary_tf_equals_python(tiktoken_tok):
  vocab = vocabularies.as_seqio_vocabulary(tiktoken_tok)
  assert isinstance(vocab, vocabularies.TiktokenVocabulary)
  assert (vocab.vocab_size, vocab.eos_id, vocab.unk_id, vocab.bos_id) == (
      200_019, 199_999, None, None)
  for text in TEXTS:
    ids = tiktoken_tok.encode(text)
    encoded = vocab.encode_tf(tf.constant(text))
    assert encoded.dtype == tf.int32 and encoded.shape.rank == 1
    assert encoded.numpy().tolist() == list(vocab.encode(text)) == ids
    assert vocab.decode(ids + [vocab.eos_id, 258]) == text
  batch = vocab.encode_tf(tf.constant([["the thing", ""], ["in", "ü"]]))
  assert isinstance(batch, tf.RaggedTensor) and batch.dtype == tf.int32
  assert batch.to_list() == [[tiktoken_tok.encode("the thing"), []],
                             [tiktoken_tok.encode("in"), tiktoken_tok.encode("ü")]]
  eos = vocab.eos_id
  ids = tf.constant([[0, 258, eos, 259], [259, 0, 200_005, 0]])  # 0 is a real token
  decoded = vocab.decode_tf(ids)
  assert decoded.dtype == tf.string and decoded.shape == (2,)
  assert decoded.numpy().tolist() == [b"\x00 the", b"in\x00\x00"]  # unassigned id dropped
  assert vocab.decode_tf(tf.constant([258, eos, 258])).numpy() == b" the"
  assert vocab.decode_tf(tf.ragged.constant([[258], [259, 0]])).numpy().tolist() == [
      b" the", b"in\x00"]
  assert vocab == vocabularies.as_seqio_vocabulary(tiktoken_tok)
  assert vocab != seqio.ByteVocabulary()


def _targets(dataset, limit=None):
  if limit:
    dataset = dataset.take(limit)
  return [ex["targets"] for ex in dataset.as_numpy_iterator()]


def test_task_yields_eos_terminated_ids_that_decode_to_the_documents(tokenizer, files):
  patterns, texts = files
  for _ in range(2):  # registering the same name again replaces the task
    task = vocabularies.register_jsonl_task("lev_test_jsonl", files=patterns,
                                            tokenizer=tokenizer)
  assert seqio.get_mixture_or_task("lev_test_jsonl") is task
  assert sorted(task.splits) == ["train", "validation"]
  vocab = task.output_features["targets"].vocabulary
  examples = list(task.get_dataset(sequence_length={"targets": L}, split="train",
                                   shuffle=False).as_numpy_iterator())
  assert [ex["targets_pretokenized"].decode() for ex in examples] == texts  # in order
  for ex, text in zip(examples, texts):
    targets = ex["targets"]
    assert targets.dtype == "int32" and targets[-1] == tokenizer.eos_id
    assert len(targets) <= L and tokenizer.eos_id not in targets[:-1]
    ids = tokenizer.encode(text)
    assert targets.tolist() == ids[:L - 1] + [tokenizer.eos_id]
    if len(ids) < L:
      assert vocab.decode(targets.tolist()) == text
  if tokenizer.name == "bytes":
    assert len(examples[texts.index(LONG)]["targets"]) == L  # trimmed, then eos
  validation = _targets(task.get_dataset(sequence_length={"targets": L},
                                         split="validation", shuffle=False))
  assert [vocab.decode(t.tolist()) for t in validation] == ["held out text"]


def test_task_keeps_only_its_pile_subsets(files):
  patterns, _ = files
  task = vocabularies.register_jsonl_task("lev_test_gamma", files=patterns,
                                          tokenizer=tok_lib.ByteTokenizer(),
                                          pile_set_names=["gamma", "Pile-CC"])
  vocab = task.output_features["targets"].vocabulary
  got = [vocab.decode(t.tolist()) for t in _targets(task.get_dataset(
      sequence_length={"targets": L}, split="train", shuffle=False))]
  assert got == [t for t in files[1] if t in DOCS["Pile-CC"] + DOCS["gamma"]]


def test_task_errors_name_the_split_and_files(files, tmp_path):
  patterns, _ = files
  tok = tok_lib.ByteTokenizer()
  with pytest.raises(DataError, match=r"'lev_test_bad', files\['test'\]: .*absent.jsonl: "
                     "no Pile-format"):
    vocabularies.register_jsonl_task("lev_test_bad", files={
        **patterns, "test": str(tmp_path / "absent.jsonl")}, tokenizer=tok)
  with pytest.raises(DataError, match="task name = 'bad name!'"):
    vocabularies.register_jsonl_task("bad name!", files=patterns, tokenizer=tok)
  with pytest.raises(DataError, match="files is empty"):
    vocabularies.register_jsonl_task("lev_test_bad", files={}, tokenizer=tok)
  with pytest.raises(DataError, match="expected a SentencePieceTokenizer"):
    vocabularies.register_jsonl_task("lev_test_bad", files=patterns, tokenizer=object())
  task = vocabularies.register_jsonl_task("lev_test_none", files=patterns, tokenizer=tok,
                                          pile_set_names=["absent"])
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match=r"DataError: .*'lev_test_none', split 'train': .*a.jsonl.*"
                     "hold no documents with meta.pile_set_name in \\('absent',\\)"):
    _targets(task.get_dataset(sequence_length={"targets": L}, split="train",
                              shuffle=False))


def test_embedded_task_reads_the_written_corpus(tmp_path, monkeypatch):
  docs = [{"text": f"embedded document {i}", "meta": {"pile_set_name": "pydoc_topics"}}
          for i in range(40)]
  monkeypatch.setattr(embedded, "embedded_documents", lambda corpus=None: docs)
  task = vocabularies.register_embedded_task(cache_dir=tmp_path, validation_fraction=0.25,
                                             tokenizer=tok_lib.ByteTokenizer())
  assert task.name == "lev_embedded"
  vocab = task.output_features["targets"].vocabulary
  got = {split: [vocab.decode(t.tolist()) for t in _targets(task.get_dataset(
      sequence_length={"targets": L}, split=split, shuffle=False))]
         for split in ("train", "validation")}
  assert sorted(got["train"] + got["validation"]) == sorted(d["text"] for d in docs)
  assert got["validation"] and all(splits.is_validation(t, 0.25) for t in got["validation"])


def test_mixture_samples_its_subsets_by_rate(files):
  patterns, _ = files
  tok = tok_lib.ByteTokenizer()
  for _ in range(2):  # re-registering replaces the mixture and its tasks
    mixture = vocabularies.register_pile_mixture(
        "lev_test_mix", files=patterns, rates={"alpha": 3.0, "Pile-CC": 1},
        tokenizer=tok)
  assert seqio.get_mixture_or_task("lev_test_mix") is mixture
  assert [t.name for t in mixture.tasks] == ["lev_test_mix_Pile_CC", "lev_test_mix_alpha"]
  dataset = mixture.get_dataset(sequence_length={"targets": L}, split="train",
                                shuffle=False, seed=0)
  counts = collections.Counter(tok.decode(t.tolist()).split()[0].rstrip(":")
                               for t in _targets(dataset, limit=200))
  assert set(counts) == {"alpha", "Pile-CC"}  # gamma is in the files, not in the mixture
  assert sum(counts.values()) == 200 and 125 <= counts["alpha"] <= 175  # expect 150


@pytest.mark.parametrize("rate", [0, -1.0, float("nan"), float("inf"), "1", None, True])
def test_mixture_rejects_bad_rates(files, rate):
  with pytest.raises(DataError, match=r"'lev_test_bad_mix': rates\['Pile-CC'\] = .*"
                     "expected a positive finite number"):
    vocabularies.register_pile_mixture("lev_test_bad_mix", files=files[0],
                                       rates={"alpha": 1.0, "Pile-CC": rate},
                                       tokenizer=tok_lib.ByteTokenizer())


def test_mixture_rejects_empty_rates_and_clashing_subset_names(files):
  tok = tok_lib.ByteTokenizer()
  with pytest.raises(DataError, match="rates is empty"):
    vocabularies.register_pile_mixture("lev_test_bad_mix", files=files[0], rates={},
                                       tokenizer=tok)
  with pytest.raises(DataError, match="subsets 'Pile CC' and 'Pile-CC' both map to the "
                     "task name 'lev_test_bad_mix_Pile_CC'"):
    vocabularies.register_pile_mixture("lev_test_bad_mix", files=files[0],
                                       rates={"Pile CC": 1.0, "Pile-CC": 1.0},
                                       tokenizer=tok)
