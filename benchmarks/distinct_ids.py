"""Distinct token ids in one 512 x 512 batch: what `lev.mode = "unique"` evaluates.

  python benchmarks/distinct_ids.py [--vocabs 2048,8192,32000] [--batches 3]

Two sources, each printed with the share of the (padded) vocabulary and of the batch:
  - real text: the embedded corpus (the default data, ~0.7M tokens), tokenized with a
    SentencePiece model of each vocabulary size trained on its training split (cached
    under data.cache_dir, as `lev-train` does), packed into 512 sequences of 512 tokens by
    the training pipeline (shuffled); first `--batches` batches. The corpus is small: one
    batch holds a third or more of it, so these counts are close to the corpus's own
    vocabulary use, an upper bound for that text.
  - Zipf(1.0) ids over o200k_base's 200,019 ids (p(rank k) ~ 1/k), 262,144 draws; text
    repeats more than this.
The o200k_base ranks file is not shipped (tiktoken downloads it), so o200k on real text
is measured only where `--config.data.tiktoken_file` would point to it; here it is not.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "experiments"))

import smoke  # noqa: E402

from lev_jax.config import padded_vocab_size  # noqa: E402
from lev_jax.data import load  # noqa: E402

BATCH, SEQ_LEN, O200K = 512, 512, 200_019


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--vocabs", default="2048,8192,32000")
  p.add_argument("--batches", type=int, default=3)
  args = p.parse_args()
  tokens = BATCH * SEQ_LEN
  print(f"one batch = {BATCH} x {SEQ_LEN} = {tokens:,} tokens")
  print(f"{'source':<44} {'distinct ids':>13} {'of vocab':>9} {'of tokens':>10}")
  for vocab in (int(v) for v in args.vocabs.split(",")):
    c = smoke.get_config("leviathan")
    c.model.vocab_size = vocab
    c.train.seq_len = SEQ_LEN
    data = load(c)
    it = iter(data.train_dataset(BATCH))
    counts = [len(np.unique(next(it)["inputs"])) for _ in range(args.batches)]
    vp = padded_vocab_size(vocab, c.model.vocab_multiple)
    for i, n in enumerate(counts):
      print(f"{f'embedded text, SentencePiece {vocab} (batch {i + 1})':<44} {n:13,} "
            f"{n / vp:9.1%} {n / tokens:10.1%}")
  rng = np.random.default_rng(0)
  ranks = np.arange(1, O200K + 1)
  ids = rng.choice(O200K, size=tokens, p=(1 / ranks) / (1 / ranks).sum())
  n = len(np.unique(ids))
  print(f"{'Zipf(1.0) over 200,019 ids':<44} {n:13,} {n / padded_vocab_size(O200K, 128):9.1%} "
        f"{n / tokens:10.1%}")


if __name__ == "__main__":
  main()
