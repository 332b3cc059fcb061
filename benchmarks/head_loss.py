"""The output head's loss + gradient, dense vs chunked (lev_jax/loss.py), on this CPU.

  python benchmarks/head_loss.py                       # every section, 5 repetitions
  python benchmarks/head_loss.py --sections head --cases 200064x512 --reps 3
  python benchmarks/head_loss.py --sections chunks,step

Sections (one process; every variant compiled and warmed up first, then repetitions
interleaved dense, chunked, ..., dense, ... so that load on the machine hits all alike):
  head    the summed cross-entropy + its gradient (to the hidden states and the head)
          of `--tokens` float32 hidden states [N, d] through a [d, V] head, per case VxD
          (default 32768x512, 32768x2048, 200064x512, 200064x2048): dense; chunked
          (`chunked_loss_sums`: token chunks over the whole vocab, the automatic size,
          gradient made in the forward pass: what train.loss_impl=chunked runs); and
          chunked with vocab chunks of ~8k ids (`chunked_log_z_and_target`, recomputing
          backward: train.loss_vocab_chunk). Median seconds, the median of the
          per-repetition ratios to dense (paired), and XLA's temporaries
          (`compile().memory_analysis()`).
  chunks  chunked at 32768x512 for token chunks of 256 to 4,096 tokens: how the
          automatic size (lev_jax.loss.LOGITS_CHUNK_BYTES) was chosen.
  step    the medium train step of benchmarks/step_time.py (d_model 512, 4 layers,
          8 x 256 tokens) with a 32,768-id vocab, tied: train.loss_impl dense vs chunked.
Times are measurements on this machine (single run of the script; quote its medians);
memory is the compiler's buffer assignment.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from lev_jax import loss  # noqa: E402
from lev_jax.workdir import write_json_atomic  # noqa: E402

DEFAULT_CASES = "32768x512,32768x2048,200064x512,200064x2048"


def _dense_head(x_NxD, w_DxV, targets_N, vocab_size):
  logits = jnp.dot(x_NxD, w_DxV, preferred_element_type=jnp.float32)
  logits = jnp.where(jnp.arange(w_DxV.shape[1]) < vocab_size, logits, -1e9)
  return optax.softmax_cross_entropy_with_integer_labels(logits, targets_N).sum()


def _chunked_head(token_chunk=0):
  def fn(x_NxD, w_DxV, targets_N, vocab_size):
    weights_N = jnp.ones(targets_N.shape, jnp.float32)
    return loss.chunked_loss_sums(x_NxD, w_DxV, targets_N, weights_N, vocab_size, 0.0,
                                  token_chunk)[0]
  return fn


def _vocab_chunked_head(vocab_chunk):
  def fn(x_NxD, w_DxV, targets_N, vocab_size):
    log_z, tgt = loss.chunked_log_z_and_target(x_NxD, w_DxV, targets_N, vocab_size, 0,
                                               vocab_chunk)
    return (log_z - tgt).sum()
  return fn


def _near_divisor(n: int, size: int) -> int:
  return min((d for d in range(1, n + 1) if n % d == 0), key=lambda d: abs(d - size))


def _compiled(fn, args, vocab_size):
  grad = jax.jit(jax.value_and_grad(lambda x, w, t: fn(x, w, t, vocab_size), (0, 1)))
  compiled = grad.lower(*args).compile()
  return compiled, compiled.memory_analysis().temp_size_in_bytes


def interleaved(fns: dict, reps: int) -> dict:
  """{name: [seconds per repetition]}: each callable run once per repetition, in turn."""
  for f in fns.values():  # warm-up
    jax.block_until_ready(f())
  times = {name: [] for name in fns}
  for _ in range(reps):
    for name, f in fns.items():
      start = time.perf_counter()
      jax.block_until_ready(f())
      times[name].append(time.perf_counter() - start)
  return times


def _summary(times: dict, base: str) -> dict:
  out = {}
  for name, ts in times.items():
    ratios = [t / b for t, b in zip(ts, times[base])]
    out[name] = {"median_s": statistics.median(ts), "ratio": statistics.median(ratios),
                 "times_s": ts}
  return out


def head_case(vocab: int, d: int, tokens: int, reps: int,
              token_chunks: tuple | None = None) -> dict:
  """Dense vs the chunked paths at one shape (token_chunks: chunked only, these sizes)."""
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.normal(size=(tokens, d)), jnp.float32)
  w = jnp.asarray(rng.normal(size=(d, vocab)) * d ** -0.5, jnp.float32)
  t = jnp.asarray(rng.integers(0, vocab, tokens), jnp.int32)
  variants = {"dense": _dense_head}
  if token_chunks is None:
    auto = loss.token_chunk_size(tokens, 0, vocab)
    variants[f"chunked ({auto} tokens)"] = _chunked_head()
    vc = _near_divisor(vocab, 8192)
    variants[f"chunked, vocab chunks of {vc:,}"] = _vocab_chunked_head(vc)
  else:
    variants.update({f"chunked ({c} tokens)": _chunked_head(c) for c in token_chunks})
  fns, temps = {}, {}
  for name, fn in variants.items():
    compiled, temps[name] = _compiled(fn, (x, w, t), vocab)
    fns[name] = lambda compiled=compiled: compiled(x, w, t)
  out = _summary(interleaved(fns, reps), "dense")
  for name in out:
    out[name]["temp_bytes"] = temps[name]
    out[name]["temp_vs_dense"] = temps[name] / temps["dense"]
  return out


def step_case(reps: int) -> dict:
  from step_time import medium, token_batch  # pylint: disable=import-outside-toplevel
  from lev_jax.train import create_train_state, make_train_step  # pylint: disable=import-outside-toplevel
  fns, temps = {}, {}
  for impl in ("dense", "chunked"):
    c = medium("tied")
    c.model.vocab_size = 32768
    c.train.loss_impl = impl
    part, state = create_train_state(c)
    step = make_train_step(part, c)
    batch = token_batch(c, "zipf")
    temps[impl] = step.lower(state, batch).compile().memory_analysis().temp_size_in_bytes
    holder = {"state": state}

    def run(step=step, holder=holder, batch=batch):
      holder["state"], m = step(holder["state"], batch)
      return m["loss"]
    fns[impl] = run
  out = _summary(interleaved(fns, reps), "dense")
  for name in out:
    out[name]["temp_bytes"] = temps[name]
  return out


def _print(title: str, rows: dict) -> None:
  print(f"\n{title}\n| variant | median s | vs dense (median of paired ratios) | "
        "temporaries MiB | vs dense |\n|---|---|---|---|---|")
  for name, r in rows.items():
    print(f"| {name} | {r['median_s']:.4f} | {r['ratio']:.3f}x | "
          f"{r['temp_bytes'] / 2**20:,.0f} | {r['temp_bytes'] / rows['dense']['temp_bytes']:.3f}x |",
          flush=True)


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--sections", default="head,chunks,step")
  p.add_argument("--cases", default=DEFAULT_CASES, help="VxD,... for the head section")
  p.add_argument("--tokens", type=int, default=4096)
  p.add_argument("--reps", type=int, default=5)
  p.add_argument("--json", default="", help="also write the figures here")
  args = p.parse_args(argv)
  sections = [s for s in args.sections.split(",") if s]
  unknown = set(sections) - {"head", "chunks", "step"}
  if unknown:
    p.error(f"--sections: unknown {', '.join(sorted(unknown))}; expected head, chunks, step")
  try:
    cases = [tuple(int(v) for v in case.split("x")) for case in args.cases.split(",")]
    assert all(len(c) == 2 and min(c) > 0 for c in cases)
  except (ValueError, AssertionError):
    p.error(f"--cases {args.cases!r}: expected VxD pairs such as 32768x512,200064x2048")
  print(f"jax {jax.__version__} on {jax.devices()[0].device_kind}; {args.tokens:,} tokens; "
        f"{args.reps} interleaved repetitions; float32", flush=True)
  out = {}
  if "head" in sections:
    for v, d in cases:
      out[f"head {v}x{d}"] = head_case(v, d, args.tokens, args.reps)
      _print(f"head loss + gradient, V = {v:,}, d = {d}", out[f"head {v}x{d}"])
  if "chunks" in sections:
    out["chunks"] = head_case(32768, 512, args.tokens, args.reps,
                              tuple(c for c in (256, 512, 1024, 2048, 4096)
                                    if args.tokens % c == 0))
    _print("token chunk sizes, V = 32,768, d = 512", out["chunks"])
  if "step" in sections:
    out["step"] = step_case(args.reps)
    _print("medium train step, V = 32,768, tied", out["step"])
  if args.json:
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(args.json, out)  # strict JSON, never a partial file
  return 0


if __name__ == "__main__":
  sys.exit(main())
