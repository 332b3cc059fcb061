"""Frequency buckets: a partition of the vocab that recombines to the overall loss."""

import math

import numpy as np
import pytest

from lev_jax.evaluate import bucket_labels, bucket_of_ids, evaluate


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
