"""Frequency buckets: a partition of the vocab that recombines to the overall loss."""

import math

import numpy as np
import pytest

from lev_jax.eval.evaluate import (bucket_labels, bucket_of_ids, equal_mass_edges, evaluate,
                              relative_change)


def test_buckets_partition_the_vocab_by_training_count():
  counts = np.array([0, 1, 9, 10, 99, 100, 5000, 10_000, 10**7])
  edges = (1, 10, 100, 1000, 10_000)
  np.testing.assert_array_equal(bucket_of_ids(counts, edges), [0, 1, 1, 2, 2, 3, 4, 5, 5])
  assert bucket_labels(edges) == ["[0,1)", "[1,10)", "[10,100)", "[100,1000)",
                                  "[1000,10000)", "[10000,inf)"]


def test_bucket_perplexities_recombine_to_the_overall_perplexity():
  rng = np.random.default_rng(0)
  vocab = 50
  counts = rng.integers(0, 5000, vocab)
  batches = [{"targets": rng.integers(0, vocab, (3, 7)).astype(np.int32),
              "weights": (rng.random((3, 7)) > 0.2).astype(np.float32)} for _ in range(4)]
  nll = {id(b): rng.random((3, 7)).astype(np.float32) * 5 for b in batches}
  result = evaluate(lambda params, b: nll[id(b)], None, batches, counts, (10, 100, 1000))
  n = sum(b["tokens"] for b in result["buckets"])
  assert n == result["tokens"] == int(sum(b["weights"].sum() for b in batches))
  recombined = sum(b["loss"] * b["tokens"] for b in result["buckets"] if b["tokens"]) / n
  assert recombined == pytest.approx(result["loss"], rel=1e-9)
  assert result["perplexity"] == pytest.approx(math.exp(result["loss"]))
  assert sum(b["ids"] for b in result["buckets"]) == vocab
  # Exact per-bucket loss for one bucket, by hand.
  bucket = bucket_of_ids(counts, (10, 100, 1000))
  sel = [(nll[id(b)] * b["weights"])[bucket[b["targets"]] == 3].sum() for b in batches]
  cnt = [b["weights"][bucket[b["targets"]] == 3].sum() for b in batches]
  assert result["buckets"][3]["loss"] == pytest.approx(sum(sel) / sum(cnt), rel=1e-6)
  # Weight-0 targets are ignored.
  assert all(b["loss"] is None or np.isfinite(b["loss"]) for b in result["buckets"])


def test_equal_mass_edges_give_buckets_of_about_equal_training_mass():
  counts = np.random.default_rng(0).lognormal(3.0, 1.5, 5000).astype(np.int64)  # long tail
  edges = equal_mass_edges(counts, 4)
  assert edges == sorted(set(edges)) and len(edges) == 3
  bucket = bucket_of_ids(counts, edges)
  mass = np.bincount(bucket, weights=counts, minlength=len(edges) + 1) / counts.sum()
  assert set(np.unique(bucket)) == set(range(len(edges) + 1))  # a partition, none empty
  # Every bucket holds about a quarter of the training tokens; the rarest, most ids.
  assert (np.abs(mass - 0.25) < 0.02).all(), mass
  assert np.bincount(bucket)[0] == np.bincount(bucket).max()
  with pytest.raises(ValueError, match="at least 2"):
    equal_mass_edges(counts, 1)
  with pytest.raises(ValueError, match="no training tokens"):
    equal_mass_edges(np.zeros(5, np.int64), 3)


def test_equal_mass_edges_on_uniform_counts_split_the_ids_evenly():
  counts = np.repeat(np.arange(1, 9), 1)  # counts 1..8, mass 36
  edges = equal_mass_edges(counts, 2)
  bucket = bucket_of_ids(counts, edges)
  mass = np.bincount(bucket, weights=counts)
  assert len(edges) == 1 and abs(mass[0] - mass[1]) <= 8


def test_relative_change_per_bucket():
  def result(ppls):
    return {"bucket_edges": [10], "buckets": [
        {"range": r, "perplexity": p} for r, p in zip(["[0,10)", "[10,inf)"], ppls)]}
  rows = relative_change(result([100.0, 10.0]), result([19.0, 10.0]))
  assert rows[0]["change"] == pytest.approx(-0.81) and rows[1]["change"] == pytest.approx(0)
  assert relative_change(result([None, 10.0]), result([5.0, 10.0]))[0]["change"] is None
  with pytest.raises(ValueError, match="bucket edges differ"):
    relative_change(result([1.0, 1.0]), {**result([1.0, 1.0]), "bucket_edges": [100]})
