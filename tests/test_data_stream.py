"""JsonlStreamDataset: file order per epoch, sharding, exact resume (alone, under .map and
under WindowShuffleIterDataset), skip counting, the counts a checkpoint carries, and the
empty-epoch error."""

import itertools
import json

import grain
import numpy as np
import pytest
import zstandard

from lev_jax.data.errors import DataError
from lev_jax.data.stream import JsonlStreamDataset


def _record(text, subset="Pile-CC"):
  return json.dumps({"text": text, "meta": {"pile_set_name": subset}})


def _write(path, lines):
  data = "".join(line + "\n" for line in lines).encode()
  if path.name.endswith(".zst"):
    c = zstandard.ZstdCompressor()  # two frames: the reader must cross the frame boundary
    data = c.compress(data[: len(data) // 2]) + c.compress(data[len(data) // 2:])
  path.write_bytes(data)
  return path


@pytest.fixture
def files(tmp_path):
  """4 files, 13 documents, 1 bad line; names say file and line."""
  _write(tmp_path / "a.jsonl", [_record(f"a{i}") for i in range(1, 5)])
  _write(tmp_path / "b.jsonl.zst", [_record("b1"), "{bad json", _record("b3"), "",
                                    _record("b5")])
  _write(tmp_path / "c.jsonl", [_record(f"c{i}") for i in range(1, 4)])
  _write(tmp_path / "d.jsonl.zst", [_record(f"d{i}", "Wiki") for i in range(1, 4)])
  return tmp_path


def _take(it, n):
  return list(itertools.islice(it, n))


def _position(state):
  return {k: state[k] for k in ("epoch", "file", "line")}


def _epoch_docs(ds, epoch):
  """The documents of one epoch, read file by file in the epoch's order."""
  by_file = {}
  for path in ds.files:
    one = JsonlStreamDataset(path, seed=0, num_epochs=1)
    by_file[path] = list(one)
  return [doc for i in ds.file_order(epoch) for doc in by_file[ds.files[i]]]


def test_epoch_order_is_a_seeded_file_permutation(files):
  ds = JsonlStreamDataset(str(files / "*.jsonl*"), seed=3, num_epochs=3)
  assert [p.name for p in ds.files] == ["a.jsonl", "b.jsonl.zst", "c.jsonl", "d.jsonl.zst"]
  np.testing.assert_array_equal(ds.file_order(1),
                                np.random.default_rng([3, 1]).permutation(4))
  docs = list(ds)
  assert docs == _epoch_docs(ds, 0) + _epoch_docs(ds, 1) + _epoch_docs(ds, 2)
  assert len(docs) == 3 * 13 and sorted(docs[:13]) == sorted(docs[13:26])
  assert list(JsonlStreamDataset(files, seed=3, num_epochs=3)) == docs  # deterministic
  other = list(JsonlStreamDataset(files, seed=4, num_epochs=3))
  assert other != docs and sorted(other) == sorted(docs)
  # Files keep their line order inside every epoch.
  assert [d for d in docs[:13] if d[0] == "b"] == ["b1", "b3", "b5"]


def test_endless_by_default(files):
  it = iter(JsonlStreamDataset(files / "c.jsonl", seed=0))
  assert _take(it, 10) == ["c1", "c2", "c3"] * 3 + ["c1"]
  assert _position(it.get_state()) == {"epoch": 3, "file": 0, "line": 1}


def test_shards_partition_each_epoch(files):
  ds = JsonlStreamDataset(files, seed=1, num_epochs=2)
  shards = [list(JsonlStreamDataset(files, seed=1, num_epochs=2, shard_index=i,
                                    shard_count=2)) for i in range(2)]
  all_docs = list(ds)
  for epoch in range(2):
    epoch_docs = sorted(all_docs[13 * epoch: 13 * (epoch + 1)])
    half = [s[len(s) // 2 * epoch: len(s) // 2 * (epoch + 1)] for s in shards]
    assert sorted(half[0] + half[1]) == epoch_docs
    assert not set(half[0]) & set(half[1])
  # By line number, before parsing: odd lines to shard 0, even lines to shard 1.
  assert [d for d in shards[1] if d[0] == "b"] == []  # b's docs are on lines 1, 3, 5
  assert [d for d in shards[0] if d[0] == "a"] == ["a1", "a3"] * 2


@pytest.mark.parametrize("shard_index", [0, 1])
def test_state_resumes_exactly_at_every_position(files, shard_index):
  ds = JsonlStreamDataset(files, seed=2, shard_index=shard_index, shard_count=2)
  reference = _take(iter(ds), 40)  # about 6 epochs: every file and epoch boundary
  it = iter(ds)
  for k in range(len(reference) - 5):
    state = json.loads(json.dumps(it.get_state()))  # JSON-safe
    assert state == it.get_state()
    assert all(type(v) is int for v in _position(state).values())
    fresh = iter(ds)
    fresh.set_state(state)
    assert _take(fresh, 5) == reference[k: k + 5], (k, state)
    assert next(it) == reference[k]


def test_state_restores_into_a_used_iterator_and_past_the_end(files):
  ds = JsonlStreamDataset(files / "a.jsonl", seed=0, num_epochs=2)
  it = iter(ds)
  _take(it, 3)
  state = it.get_state()
  assert _position(state) == {"epoch": 0, "file": 0, "line": 3}
  assert _take(it, 3) == ["a4", "a1", "a2"]
  it.set_state(state)  # rewind an iterator that has a file open
  assert list(it) == ["a4", "a1", "a2", "a3", "a4"]
  assert _position(it.get_state()) == {"epoch": 2, "file": 0, "line": 0}
  fresh = iter(ds)
  fresh.set_state(it.get_state())
  assert list(fresh) == []


def test_bad_states_are_named(files):
  it = iter(JsonlStreamDataset(files, seed=0, num_epochs=2))
  with pytest.raises(DataError, match=r"state\['file'\] = 4: expected an int \[0, 4\)"):
    it.set_state({"epoch": 0, "file": 4, "line": 0})
  with pytest.raises(DataError, match=r"state\['epoch'\] = 3: expected an int \[0, 3\)"):
    it.set_state({"epoch": 3, "file": 0, "line": 0})
  with pytest.raises(DataError, match=r"state\['line'\] = -1"):
    it.set_state({"epoch": 0, "file": 0, "line": -1})
  with pytest.raises(DataError, match="expected a dict with exactly the keys"):
    it.set_state({"epoch": 0, "file": 0})


def test_skips_are_counted_in_the_iterator_report(files):
  ds = JsonlStreamDataset([files / "b.jsonl.zst", files / "gone.jsonl"], seed=0)
  assert ds.report["files"] == 1 and ds.report["skipped"]["missing_file"] == 1
  it = iter(ds)
  assert _take(it, 6) == ["b1", "b3", "b5"] * 2
  report = it.report
  assert report["skipped"]["bad_json"] == 2 and report["skipped"]["missing_file"] == 1
  assert report["documents"] == 6 and report["characters"] == 12
  assert ds.report["documents"] == 0  # the dataset's copy is not touched
  with pytest.raises(DataError, match="b.jsonl.zst:2: the line is not valid JSON"):
    _take(iter(JsonlStreamDataset(files / "b.jsonl.zst", seed=0, strict=True)), 2)
  only_wiki = JsonlStreamDataset(files, seed=0, num_epochs=1, pile_set_names=["Wiki"])
  it = iter(only_wiki)
  assert sorted(it) == ["d1", "d2", "d3"]
  assert it.report["skipped"]["filtered_subset"] == 10


def test_an_epoch_without_documents_is_an_error(tmp_path, files):
  _write(tmp_path / "bad.jsonl", ["{bad", _record(""), _record("x", "Wiki")])
  ds = JsonlStreamDataset([tmp_path / "bad.jsonl"], seed=0, pile_set_names=["Pile-CC"])
  with pytest.raises(DataError, match=r"bad.jsonl: epoch 0 of the stream yielded no "
                     r"document \(shard 0 of 1, 1 file\(s\); skipped so far: bad_json 1, empty 1, "
                     r"filtered_subset 1\)"):
    next(iter(ds))
  # A shard whose lines are all elsewhere, even though the other shard has documents.
  ds = JsonlStreamDataset(files / "c.jsonl", seed=0, shard_index=3, shard_count=4)
  with pytest.raises(DataError, match="epoch 0 of the stream yielded no document"):
    next(iter(ds))


def test_bad_arguments_are_named(files):
  with pytest.raises(DataError, match="seed = -1: expected an int >= 0"):
    JsonlStreamDataset(files, seed=-1)
  with pytest.raises(DataError, match=r"shard_index = 2: expected an int \[0, 2\)"):
    JsonlStreamDataset(files, seed=0, shard_index=2, shard_count=2)
  with pytest.raises(DataError, match="num_epochs = 0: expected an int >= 1"):
    JsonlStreamDataset(files, seed=0, num_epochs=0)
  with pytest.raises(DataError, match="no Pile-format"):
    JsonlStreamDataset(files / "none" / "*.jsonl", seed=0)
  one_shot = (p for p in [files / "c.jsonl", files / "a.jsonl"])  # read once, kept
  assert len(JsonlStreamDataset(one_shot, seed=0).files) == 2
  with pytest.raises(DataError, match="nope.jsonl: no such file"):
    JsonlStreamDataset([files, files / "nope.jsonl"], seed=0, strict=True)


def test_map_batch_and_window_shuffle_resume_exactly(files):
  ds = JsonlStreamDataset(files, seed=5).map(str.upper)
  assert _take(iter(ds), 3) == [d.upper() for d in _take(iter(JsonlStreamDataset(
      files, seed=5)), 3)]
  batches = _take(iter(JsonlStreamDataset(files, seed=5).batch(4)), 2)
  assert batches[0].shape == (4,)
  # grain's index_shuffle costs ~7 ms per element for windows this small: few elements.
  shuffled = grain.experimental.WindowShuffleIterDataset(ds, window_size=4, seed=0)
  reference = _take(iter(shuffled), 24)  # crosses the epoch boundary (13 documents)
  assert reference[:13] != _take(iter(ds), 13)  # windows are shuffled
  assert sorted(reference[:12]) == sorted(_take(iter(ds), 12))
  it = iter(shuffled)
  for k in range(0, 19, 3):
    state = json.loads(json.dumps(it.get_state()))
    fresh = iter(shuffled)
    fresh.set_state(state)
    assert _take(fresh, 5) == reference[k: k + 5], (k, state)
    assert _take(it, 3) == reference[k: k + 3]


def test_close_releases_the_file(files):
  it = iter(JsonlStreamDataset(files / "b.jsonl.zst", seed=0))
  assert next(it) == "b1"
  it.close()
  it.close()
  with pytest.raises(ValueError, match="closed"):
    next(it)


def test_counts_are_partial_then_one_whole_epoch_and_travel_with_the_state(files):
  """Issue 13.7: documents, tokens and skipped lines per reason, counted as the stream
  reads; complete once a whole epoch was read; carried by the state across a resume."""
  ds = JsonlStreamDataset([files, files / "gone.jsonl"], seed=0,
                          encode=lambda text: [ord(ch) for ch in text])
  assert ds.counts() is None
  it = iter(ds)
  docs = [d["tokens"] for d in _take(it, 5)]
  assert all(d.dtype == np.int32 for d in docs)
  partial = ds.counts()
  assert not partial["complete"] and partial["report"]["documents"] == 5
  assert partial["report"]["tokens"] == sum(d.size for d in docs)
  assert partial["report"]["skipped"]["missing_file"] == 1  # the listing's skips too
  assert partial["files_read"] < partial["files"] == 4
  _take(it, 13 - 5 + 1)  # past the end of epoch 0
  whole = ds.counts()
  assert whole["complete"] and whole["epoch"] == 1 and whole["report"]["files"] == 4
  assert whole["report"]["documents"] == 13 and whole["report"]["tokens"] == 26
  assert whole["report"]["skipped"]["bad_json"] == 1
  state = json.loads(json.dumps(it.get_state()))  # as a checkpoint stores it
  _take(it, 20)  # epoch 1 ends too: the whole-epoch counts stay the same
  assert ds.counts()["report"] == whole["report"]
  resumed = iter(ds)
  resumed.set_state(state)
  assert resumed.counts()["report"] == whole["report"]
  _take(resumed, 3)
  assert ds.counts() == resumed.counts()
  del resumed  # the dataset keeps the counts of the iterator it made last
  assert ds.counts()["complete"]
  # A state saved before counts were kept: counting restarts at the next epoch.
  old = iter(ds)
  old.set_state({"epoch": 0, "file": 2, "line": 1})
  assert old.counts()["report"] is None and not old.counts()["complete"]
  old.set_state({"epoch": 1, "file": 0, "line": 0})
  assert old.counts()["report"]["documents"] == 0
  with pytest.raises(DataError, match=r"state\['counts'\] = 3: expected"):
    old.set_state({"epoch": 0, "file": 0, "line": 0, "counts": 3})


def test_a_finite_stream_read_to_its_end_is_counted_in_full(files):
  ds = JsonlStreamDataset(files / "b.jsonl.zst", seed=0, num_epochs=1)
  assert list(ds) == ["b1", "b3", "b5"]
  counts = ds.counts()
  assert counts["complete"] and counts["report"]["documents"] == 3
  assert counts["report"]["tokens"] is None  # texts: no encode, no token count
