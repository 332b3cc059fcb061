"""Validation loss, perplexity, and perplexity per token-frequency bucket.

Frequency buckets follow the Leviathan paper's frequency-stratified evaluation (arXiv
2601.22040, Sec. 5): each target token is placed in a bucket by how often its id occurs
in the training split; bucket b holds counts in [edges[b-1], edges[b]) with edges
extended by 0 and infinity. A bucket's perplexity is exp(mean nll of its targets).
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

import numpy as np


def bucket_of_ids(counts_V: np.ndarray, edges: Sequence[int]) -> np.ndarray:
  """int32 [V]: the bucket index of every id, by its training count.

  Buckets: 0 = [0, edges[0]), ..., len(edges) = [edges[-1], inf).
  """
  return np.searchsorted(np.asarray(edges), counts_V, side="right").astype(np.int32)


def bucket_labels(edges: Sequence[int]) -> list[str]:
  """Human-readable count ranges, e.g. ['[0,1)', '[1,10)', ..., '[10000,inf)']."""
  bounds = [0, *edges, math.inf]
  return [f"[{lo},{hi})" for lo, hi in zip(bounds[:-1], bounds[1:])]


def evaluate(eval_step: Callable, params, batches: Sequence[dict], counts_V: np.ndarray,
             edges: Sequence[int]) -> dict:
  """Mean loss, perplexity and per-bucket perplexity over fixed validation batches.

  Args:
    eval_step: (params, batch) -> float32 [B, L] per-target nll.
    batches: dicts with int32 inputs/targets [B, L] and float32 weights [B, L].
    counts_V: int64 [V] training-split count of each id.
    edges: increasing bucket edges (token counts).
  Returns:
    {"loss", "perplexity", "tokens", "buckets": [{"range", "tokens", "ids", "loss",
    "perplexity"}], "bucket_edges"}; a bucket with no targets has loss None.
  """
  bucket_V = bucket_of_ids(counts_V, edges)
  n_buckets = len(edges) + 1
  nll_sum = np.zeros(n_buckets)
  n_tok = np.zeros(n_buckets)
  for batch in batches:
    nll_BxL = np.asarray(eval_step(params, batch), np.float64)
    w_BxL = np.asarray(batch["weights"], np.float64)
    b_BxL = bucket_V[np.asarray(batch["targets"])]
    nll_sum += np.bincount(b_BxL.ravel(), (nll_BxL * w_BxL).ravel(), n_buckets)
    n_tok += np.bincount(b_BxL.ravel(), w_BxL.ravel(), n_buckets)
  total = n_tok.sum()
  loss = float(nll_sum.sum() / max(total, 1))
  ids_per_bucket = np.bincount(bucket_V, minlength=n_buckets)
  buckets = []
  for b, label in enumerate(bucket_labels(edges)):
    mean = float(nll_sum[b] / n_tok[b]) if n_tok[b] else None
    buckets.append({"range": label, "tokens": int(n_tok[b]), "ids": int(ids_per_bucket[b]),
                    "loss": mean, "perplexity": math.exp(mean) if mean is not None else None})
  return {"loss": loss, "perplexity": math.exp(loss), "tokens": int(total),
          "buckets": buckets, "bucket_edges": list(edges)}
