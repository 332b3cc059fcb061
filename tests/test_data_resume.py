"""Exact resume of the training batches for the prepared and streaming sources.

After restoring the iterator state taken after batch k, batches k+1..k+m equal the
uninterrupted run's, for 1 process and for each of 2 simulated processes (each reading
its own share: data.host_batches = "documents"); with "global" every process iterates
the same global stream, so its state restores under any process count (the trainer's
checkpoint handler; see test_trainer for the refusal in "documents" mode).
"""

import json

import numpy as np
import pytest
import zstandard

from conftest import tiny_config
from lev_jax.data import load
from lev_jax.data.prepare import prepare

K, M = 3, 3


def _corpus(folder):
  words = "river stone leaf cloud ember frost moss tide dune reed lark fern".split()
  rng = np.random.default_rng(0)
  lines = []
  for i in range(120):
    text = " ".join(rng.choice(words, size=int(rng.integers(3, 40))))
    lines.append(json.dumps({"text": f"{i}: {text}", "meta": {"pile_set_name": "toy"}}))
  folder.mkdir(parents=True, exist_ok=True)
  (folder / "a.jsonl").write_text("\n".join(lines[:50]) + "\n")
  (folder / "b.jsonl.zst").write_bytes(
      zstandard.ZstdCompressor().compress(("\n".join(lines[50:100]) + "\n").encode()))
  (folder / "val.jsonl").write_text("\n".join(lines[100:]) + "\n")
  return [str(folder / "a.jsonl"), str(folder / "b.jsonl.zst")], [str(folder / "val.jsonl")]


@pytest.fixture(scope="module")
def configs(tmp_path_factory):
  root = tmp_path_factory.mktemp("resume")
  train, val = _corpus(root / "corpus")
  out = {}
  for source in ("prepared", "jsonl_stream"):
    c = tiny_config("tied")
    c.model.vocab_size = 259
    c.data.update(source=source, tokenizer="bytes", train_files=tuple(train),
                  validation_files=tuple(val), prepared_dir=str(root / "prepared"),
                  cache_dir=str(root / "cache"), shuffle_buffer=4, segment_masking=True)
    c.train.update(seq_len=24, global_batch_size=4)
    c.eval.update(batch_size=2, batches=1)
    out[source] = c
  prepare(out["prepared"], workers=1)
  return out


def _take(it, n):
  return [next(it) for _ in range(n)]


def _assert_same(a, b):
  assert len(a) == len(b)
  for x, y in zip(a, b):
    assert x.keys() == y.keys()
    for key in x:
      np.testing.assert_array_equal(x[key], y[key], err_msg=key)


@pytest.mark.parametrize("source", ["prepared", "jsonl_stream"])
@pytest.mark.parametrize("shard_count", [1, 2])
def test_batches_after_restore_equal_the_uninterrupted_run(configs, source, shard_count):
  bundle = load(configs[source])
  for shard in range(shard_count):
    ds = bundle.train_dataset(4 // shard_count, shard, shard_count)
    straight = _take(iter(ds), K + M)
    it = iter(ds)
    _take(it, K)
    state = json.loads(json.dumps(it.get_state()))  # as a checkpoint stores it
    resumed = iter(bundle.train_dataset(4 // shard_count, shard, shard_count))
    resumed.set_state(state)
    _assert_same(_take(resumed, M), straight[K:])
    assert set(straight[0]) == {"inputs", "targets", "weights", "segment_ids", "positions"}


def _doc_ids(batches) -> list[int]:
  """Ids of the documents that start inside the rows (after an eos), in row order.
  Bytes tokenizer: eos = 1, byte b = id b + 3; every document starts with "<id>:"."""
  ids = []
  for batch in batches:
    for row in batch["inputs"]:
      row = [int(t) for t in row]
      for pos in np.flatnonzero(np.asarray(row) == 1):
        text = bytes(t - 3 for t in row[pos + 1:] if t >= 3).decode("utf-8", "replace")
        head = text.split(":")[0]
        if ":" in text and head.isdigit():
          ids.append(int(head))
  return ids


@pytest.mark.parametrize("source", ["prepared", "jsonl_stream"])
def test_two_simulated_processes_read_disjoint_documents(configs, source):
  """"documents" mode: shard 0 and shard 1 of 2 never see the same document."""
  bundle = load(configs[source])
  seen = [set(_doc_ids(_take(iter(bundle.train_dataset(2, shard, 2)), 40)))
          for shard in range(2)]
  assert len(seen[0]) > 5 and len(seen[1]) > 5 and not seen[0] & seen[1]


def test_prepared_source_is_shuffled_across_files(configs):
  """The global shuffle mixes documents of both files (ids 0-49 and 50-99) from the
  first batches on; a file-order read with a 4-sequence window could not."""
  ids = _doc_ids(_take(iter(load(configs["prepared"]).train_dataset(4)), 3))
  assert min(ids) < 50 <= max(ids), ids


def test_worker_processes_build_the_batches_and_resume_exactly(configs):
  """data.worker_processes = 2: batches come from 2 grain worker processes; the state
  (with both workers' positions) restores exactly."""
  c = configs["prepared"].copy_and_resolve_references()
  c.data.worker_processes = 2
  ds = load(c).train_dataset(4)
  it = iter(ds)
  try:
    _take(it, K)
    state = json.loads(json.dumps(it.get_state()))
    after = _take(it, M)
  finally:
    it.close()
  resumed = iter(ds)
  try:
    resumed.set_state(state)
    _assert_same(_take(resumed, M), after)
  finally:
    resumed.close()
