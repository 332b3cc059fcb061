"""Generated tokens/s of KV-cached vs uncached greedy decoding on a trained checkpoint.

  python benchmarks/decode_speed.py --checkpoint=runs/smoke_leviathan [--max_new_tokens 64]

Both paths are `lev_jax.decode.generate` on the same prompts (cached: one prefill, then
one cached step per token in a jitted while_loop; uncached: the full forward pass over
the growing sequence for every token). Each is compiled by one untimed call, then timed
`--repeats` times; prints the medians, tokens/s and the ratio, and whether the two
produced the same tokens (they must, greedy).
"""

from __future__ import annotations

import argparse
import statistics
import time

from lev_jax import decode, inference
PROMPTS = ["The history of", "In 1905, the", "def main():", "Python is a", "import os",
           "The function returns", "A list of", "class Node:"]


def _time(im, prompts, max_new_tokens, use_cache, repeats):
  out = decode.generate(im.model, prompts, max_new_tokens=max_new_tokens, use_cache=use_cache)
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    decode.generate(im.model, prompts, max_new_tokens=max_new_tokens, use_cache=use_cache)
    times.append(time.perf_counter() - start)
  return out, statistics.median(times)


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--checkpoint", required=True, help="lev-train workdir or lev-export folder")
  p.add_argument("--max_new_tokens", type=int, default=64)
  p.add_argument("--batch", type=int, default=4, help="prompts per batch (at most 8)")
  p.add_argument("--repeats", type=int, default=3)
  a = p.parse_args()
  im = inference.load(a.checkpoint)
  prompts = [im.tokenizer.encode(t) for t in PROMPTS[:a.batch]]
  results = {}
  for use_cache in (True, False):
    results[use_cache] = _time(im, prompts, a.max_new_tokens, use_cache, a.repeats)
  tokens = sum(len(o) for o in results[True][0])
  print(f"{im.config.name} ({im.config.model.embedding}), {len(prompts)} prompts x "
        f"{a.max_new_tokens} new tokens, median of {a.repeats}:")
  for use_cache, (_, seconds) in results.items():
    print(f"  {'cached  ' if use_cache else 'uncached'} {seconds:.3f} s  "
          f"{tokens / seconds:,.0f} tokens/s")
  print(f"  cached speed-up {results[False][1] / results[True][1]:.1f}x; same tokens: "
        f"{results[True][0] == results[False][0]}")


if __name__ == "__main__":
  main()
