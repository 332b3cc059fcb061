"""Validation loss, perplexity, and perplexity per token-frequency bucket.

Frequency buckets follow the Leviathan paper's frequency-stratified evaluation (arXiv
2601.22040, Sec. 5): each target token is placed in a bucket by how often its id occurs
in the training split; bucket b holds counts in [edges[b-1], edges[b]) with edges
extended by 0 and infinity. A bucket's perplexity is exp(mean nll of its targets).

`data_record` says what an evaluation read (split, files, a sha256 of the batches, how
many of the split's tokens), so that two results are compared only on the same data
(`same_data`), and `coverage` says "read N of M tokens".
"""

from __future__ import annotations

import hashlib
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
  result = evaluate_schemes(eval_step, params, batches, counts_V, {"": edges})[""]
  del result["bucket_scheme"]
  return result


def evaluate_schemes(eval_step: Callable, params, batches: Sequence[dict],
                     counts_V: np.ndarray, schemes: dict[str, Sequence[int]]) -> dict:
  """`evaluate` under several bucket schemes from one pass over the batches.

  Args:
    schemes: scheme name (e.g. "log", "equal_mass") -> its bucket edges.
  Returns:
    scheme name -> the `evaluate` result, with "bucket_scheme": the name.
  """
  bucket_V = {k: bucket_of_ids(counts_V, e) for k, e in schemes.items()}
  n_buckets = {k: len(e) + 1 for k, e in schemes.items()}
  nll_sum = {k: np.zeros(n) for k, n in n_buckets.items()}
  n_tok = {k: np.zeros(n) for k, n in n_buckets.items()}
  for batch in batches:
    nll_BxL = np.asarray(eval_step(params, batch), np.float64)
    w_BxL = np.asarray(batch["weights"], np.float64)
    for k, n in n_buckets.items():
      b_BxL = bucket_V[k][np.asarray(batch["targets"])]
      nll_sum[k] += np.bincount(b_BxL.ravel(), (nll_BxL * w_BxL).ravel(), n)
      n_tok[k] += np.bincount(b_BxL.ravel(), w_BxL.ravel(), n)
  return {k: _result(nll_sum[k], n_tok[k], bucket_V[k], schemes[k]) | {"bucket_scheme": k}
          for k in schemes}


def _result(nll_sum, n_tok, bucket_V, edges) -> dict:
  n_buckets = len(edges) + 1
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


def equal_mass_edges(counts_V: np.ndarray, n_buckets: int) -> list[int]:
  """Bucket edges (training counts) that split the training tokens into `n_buckets`
  shares of about equal mass, rarest ids first: the equal-mass quantile scheme (the
  log-frequency scheme is the fixed edges 1, 10, 100, ...).

  Bucket b of `bucket_of_ids(counts_V, edges)` then holds the ids whose counts lie
  between consecutive edges; ids with equal counts always share a bucket, so a count
  carrying more than one share of the mass yields fewer buckets than asked.

  Args:
    counts_V: int [V] training count of each id.
    n_buckets: wanted buckets (>= 2).

  Returns:
    Increasing positive edges, at most n_buckets - 1 of them.

  Raises:
    ValueError: n_buckets < 2, or no training tokens.
  """
  if n_buckets < 2:
    raise ValueError(f"n_buckets = {n_buckets}: expected at least 2")
  counts = np.sort(np.asarray(counts_V, np.int64))
  total = int(counts.sum())
  if total <= 0:
    raise ValueError("counts_V holds no training tokens: no equal-mass buckets")
  cum_mass = np.cumsum(counts)
  edges = []
  for k in range(1, n_buckets):
    i = int(np.searchsorted(cum_mass, k * total / n_buckets, side="left"))
    edge = int(counts[min(i, len(counts) - 1)]) + 1  # the crossing id's count ends below
    if edge > 1 and (not edges or edge > edges[-1]) and edge <= counts[-1]:
      edges.append(edge)
  return edges


def relative_change(baseline: dict, other: dict) -> list[dict]:
  """Per-bucket relative perplexity change of `other` against `baseline`, as the paper
  reports Leviathan against its tied twin (-81 % on the rarest tokens, ~0 on the most
  frequent; arXiv 2601.22040, Sec. 5).

  Args:
    baseline, other: `evaluate` results with the same ``bucket_edges``.

  Returns:
    One ``{"range", "baseline", "other", "change"}`` per bucket, change =
    other / baseline - 1 (None where either bucket has no targets).

  Raises:
    ValueError: the two results use different bucket edges.
  """
  if list(baseline["bucket_edges"]) != list(other["bucket_edges"]):
    raise ValueError(f"bucket edges differ: {baseline['bucket_edges']} vs "
                     f"{other['bucket_edges']}; evaluate both runs with the same edges")
  rows = []
  for a, b in zip(baseline["buckets"], other["buckets"]):
    pa, pb = a["perplexity"], b["perplexity"]
    rows.append({"range": a["range"], "baseline": pa, "other": pb,
                 "change": None if pa is None or pb is None else pb / pa - 1.0})
  return rows


def batches_sha256(batches: Sequence[dict]) -> str:
  """sha256 (hex) of the evaluation batches, in order: each batch's ``inputs`` and
  ``targets`` (as int32) and ``weights`` (as float32), C order, with their shapes: equal
  exactly when the same token ids are scored with the same weights."""
  digest = hashlib.sha256()
  for batch in batches:
    for key, dtype in (("inputs", np.int32), ("targets", np.int32),
                       ("weights", np.float32)):
      array = np.ascontiguousarray(batch[key], dtype=dtype)
      digest.update(f"{key}{array.shape}".encode())
      digest.update(array.tobytes())
  return digest.hexdigest()


def data_record(batches: Sequence[dict], *, split: str, files: Sequence[str],
                tokens_in_split: int | None) -> dict:
  """What an evaluation read, for eval.json / lev_eval.json ``"data"``.

  Args:
    batches: the evaluation batches (inputs / targets int32 [B, L], weights [B, L]).
    split: "validation" or "test".
    files: the files (or patterns, or a description such as a prepared dataset's
      folder) the split was read from.
    tokens_in_split: M, the split's tokens (eos included), or None when not counted
      (a stream not read to its end).

  Returns:
    ``{"split", "files", "sha256" (`batches_sha256`), "batches", "batch_size",
    "seq_len", "tokens_evaluated", "tokens_in_split"}``; tokens_evaluated N = batches x
    B x (L + 1): the split's tokens in the evaluated rows (each row's L targets are
    scored; its first token is context only).
  """
  n_batches = len(batches)
  batch_size, seq_len = (np.shape(batches[0]["targets"]) if batches else (0, 0))
  return {"split": split, "files": [str(f) for f in files],
          "sha256": batches_sha256(batches), "batches": n_batches,
          "batch_size": int(batch_size), "seq_len": int(seq_len),
          "tokens_evaluated": int(n_batches * batch_size * (seq_len + 1)),
          "tokens_in_split": None if tokens_in_split is None else int(tokens_in_split)}


def coverage(record: dict) -> str:
  """"read N of M validation tokens (...)" for a `data_record`: how much of the split
  the evaluation read, and when not all of it, what limited it.

  N counts every token of the rows read (seq_len + 1 per row: the first is context
  only), so it exceeds the predicted tokens that a perplexity is over (seq_len per row,
  fewer where weights mask them); the line says so."""
  n, m, split = record["tokens_evaluated"], record["tokens_in_split"], record["split"]
  rows = (f"{record['batches']} batch(es) of {record['batch_size']} x "
          f"{record['seq_len'] + 1} tokens, each row predicting its last {record['seq_len']}")
  if m is None:
    return (f"read {n:,} {split} tokens ({rows}) of a stream not read to its end "
            "(its size is not counted)")
  line = f"read {n:,} of {m:,} {split} tokens ({100 * n / max(m, 1):.3g}%; {rows})"
  per_batch = record["batch_size"] * (record["seq_len"] + 1)
  if per_batch and m // per_batch > record["batches"]:
    line += (f"; the split holds {m // per_batch:,} such batches: raise eval.batches to "
             "evaluate more of it")
  return line


def same_data(record: dict | None, other: dict | None) -> bool:
  """Whether two `data_record`s describe the same evaluated batches (equal sha256); a
  missing record (None, or an older result without one) is never the same."""
  return bool(record and other and record.get("sha256")
              and record.get("sha256") == other.get("sha256"))


def describe_data(record: dict | None) -> str:
  """A `data_record` in a few words, for messages ("not recorded" for None)."""
  if not record:
    return "not recorded"
  return (f"{record['split']} of {', '.join(record['files']) or '?'}, "
          f"{record['tokens_evaluated']:,} tokens evaluated, "
          f"sha256 {record['sha256'][:12]}")
