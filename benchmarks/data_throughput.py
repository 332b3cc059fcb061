"""Data-path throughput: preparation tokens/s per core, loader tokens/s per host, and
the margin of the loader over the 1.2B training step.

  python benchmarks/data_throughput.py --tiktoken_file=PATH/o200k_base.tiktoken \\
          [--files='pile/train/*.jsonl.zst'] [--mb=24] [--workers=1,2] [--segments=3]

1. Corpus: the given Pile-format files, or (default) the embedded corpus cut into ~4 KB
   documents (The Pile's mean length) repeated into 4 train files of ``--mb / 4`` MB
   of text each (``*.jsonl.zst``) plus a validation file.
2. Preparation (`lev_jax.data.prepare.prepare`, tokens format) with each worker count
   (each worker is one process on one core): wall time, tokens/s, and tokens/s per
   worker. Also the raw o200k_base ``encode`` rate of one core, for reference.
3. Loader (`lev_jax.data.load`, source 'prepared', seq_len 512, batches of 512 rows,
   shuffle_buffer 1024): tokens/s of one host, the median over ``--segments``
   stretches of 4 x shuffle_buffer rows (the window shuffle refills in bursts), with
   and without data.segment_masking, for each ``--worker_processes`` value (grain
   worker processes building batches; 0 = the training process alone).
4. Need at the 1.2B shape (experiments/ladder.py leviathan_1.2b, 512 x 512 tokens a
   step): step seconds = model FLOPs per step (lev_jax.flops, remat included) /
   (chips x peak bf16 FLOP/s x MFU, ``--mfu`` 0.5) on the CLUSTERS below. Per host the
   loader must deliver the whole global batch each step with data.host_batches =
   "global" (every host builds it) and 1/hosts of it with "documents" (the ladder's
   setting). margin = loader tokens/s / needed tokens/s (> 1: the loader keeps ahead).

All figures come from one run on this machine; quote medians and ratios.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import zstandard

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "experiments"))

import ladder  # noqa: E402

from lev_jax import config as config_lib  # noqa: E402
from lev_jax import flops  # noqa: E402
from lev_jax.data import corpus, embedded, load  # noqa: E402
from lev_jax.data.prepare import prepare  # noqa: E402
from lev_jax.data.tiktoken_tokenizer import TiktokenTokenizer  # noqa: E402

SEQ_LEN, GLOBAL_BATCH = 512, 512
# (chip, chips, chips per host) of the reference clusters for the margin.
CLUSTERS = (("TPU v5p", 64, 4), ("TPU v5p", 256, 4), ("NVIDIA H100 SXM", 64, 8))


def _pile_like_documents() -> list[str]:
  """The embedded corpus cut at paragraph breaks into documents of ~4 KB, The Pile's
  mean (825 GB / 210 M documents; Gao et al. 2020, Table 1)."""
  docs = []
  for doc in embedded.embedded_documents():
    part = []
    for para in doc["text"].split("\n\n"):
      part.append(para)
      if sum(len(p) for p in part) >= 4000:
        docs.append("\n\n".join(part))
        part = []
    if part:
      docs.append("\n\n".join(part))
  return docs


def _write_corpus(folder: Path, megabytes: float) -> dict[str, list[str]]:
  """Pile-like documents repeated into 4 train .jsonl.zst files and 1 validation file."""
  docs = _pile_like_documents()
  lines = [json.dumps({"text": d, "meta": {"pile_set_name": "embedded"}},
                      ensure_ascii=False) + "\n" for d in docs]
  per_file = megabytes * 1e6 / 4
  files = {"train": [], "validation": []}
  for i in range(4):
    path = folder / f"train-{i:02d}.jsonl.zst"
    size, parts, k = 0, [], i
    while size < per_file:
      parts.append(lines[k % len(lines)])
      size += len(parts[-1].encode())
      k += 7
    path.write_bytes(zstandard.ZstdCompressor(level=3).compress("".join(parts).encode()))
    files["train"].append(str(path))
  val = folder / "val.jsonl.zst"
  val.write_bytes(zstandard.ZstdCompressor().compress("".join(lines[:500]).encode()))
  files["validation"].append(str(val))
  return files


def _config(args, files, prepared_dir):
  c = config_lib.base_config()
  c.data.update(source="prepared", tokenizer="o200k_base", tiktoken_file=args.tiktoken_file,
                train_files=tuple(files["train"]), validation_files=tuple(files["validation"]),
                prepared_dir=str(prepared_dir), shuffle_buffer=1024)
  c.model.vocab_size = 200_019
  c.model.max_seq_len = SEQ_LEN
  c.train.update(seq_len=SEQ_LEN, global_batch_size=GLOBAL_BATCH)
  c.eval.update(batch_size=1, batches=1)
  return config_lib.validate(c)


def _tokens(report: dict) -> int:
  return sum(int(s["tokens"]) for s in report["splits"].values())


def _loader_tokens_per_s(config, rows: int, segments: int) -> float:
  """Median tokens/s over `segments` stretches of 4 x shuffle_buffer rows each (the
  window shuffle fills its window in bursts, so single batches mislead)."""
  it = iter(load(config).train_dataset(rows))
  try:
    next(it)
    per_segment = max(1, 4 * config.data.shuffle_buffer // rows)
    rates = []
    for _ in range(segments):
      start = time.perf_counter()
      for _ in range(per_segment):
        next(it)
      rates.append(per_segment * rows * SEQ_LEN / (time.perf_counter() - start))
  finally:
    getattr(it, "close", lambda: None)()
  return statistics.median(rates)


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--tiktoken_file", required=True, help="o200k_base.tiktoken ranks file")
  p.add_argument("--files", default="", help="Pile-format train files (glob); default: "
                 "the embedded corpus repeated")
  p.add_argument("--validation_files", default="")
  p.add_argument("--mb", type=float, default=24.0, help="synthetic corpus size, MB")
  p.add_argument("--workers", default="1,2")
  p.add_argument("--segments", type=int, default=3)
  p.add_argument("--worker_processes", default="0,2", help="data.worker_processes values")
  p.add_argument("--mfu", type=float, default=0.5)
  args = p.parse_args()

  with tempfile.TemporaryDirectory() as tmp:
    tmp = Path(tmp)
    if args.files:
      files = {"train": sorted(glob.glob(os.path.expanduser(args.files))),
               "validation": sorted(glob.glob(os.path.expanduser(args.validation_files)))}
    else:
      files = _write_corpus(tmp, args.mb)
    mb = sum(os.path.getsize(f) for f in files["train"]) / 1e6
    print(f"corpus: {len(files['train'])} train files, {mb:.1f} MB compressed")

    tok = TiktokenTokenizer(args.tiktoken_file)
    texts, _ = corpus.read_documents(files["train"][:1])
    texts = texts[:2000]
    start = time.perf_counter()
    n = sum(len(tok.encode(t)) for t in texts)  # one thread (encode_batch uses a pool)
    encode_s = time.perf_counter() - start
    print(f"o200k_base encode, 1 core: {n / encode_s:,.0f} tokens/s "
          f"({len(texts)} documents, {n:,} tokens)")

    prepared = None  # the last dataset written is the one the loader reads
    for workers in [int(w) for w in args.workers.split(",")]:
      out = tmp / f"prepared-w{workers}"
      config = _config(args, files, out)
      start = time.perf_counter()
      report = prepare(config, workers=workers)
      seconds = time.perf_counter() - start
      tokens = _tokens(report)
      shard_s = sum(json.loads(f.read_text())["seconds"]
                    for f in (out / "prepare").glob("lev_text-*.json"))
      print(f"prepare, {workers} worker(s): {seconds:.1f} s wall, {tokens:,} tokens, "
            f"{tokens / seconds:,.0f} tokens/s wall; per core (tokens / worker seconds "
            f"inside shards) {tokens / shard_s:,.0f} tokens/s")
      prepared = out

    config = _config(args, files, prepared)
    ladder_config = ladder.get_config("leviathan_1.2b")
    flops_step = (flops.train_flops_per_step(ladder_config)["total"]
                  # model.remat auto: none at the ladder's 4,096 tokens a chip
                  + flops.remat_flops_per_step(ladder_config, remat="none")["total"])
    rates = {}
    for procs in [int(w) for w in args.worker_processes.split(",")]:
      for masking in (False, True):
        config.data.update(segment_masking=masking, worker_processes=procs)
        rates[procs, masking] = _loader_tokens_per_s(config, GLOBAL_BATCH, args.segments)
        print(f"loader, worker_processes={procs}, segment_masking={masking}: "
              f"{rates[procs, masking]:,.0f} tokens/s per host (median of {args.segments} "
              f"stretches of {4 * config.data.shuffle_buffer} rows)")
    best = max(procs for procs, _ in rates)
    have = min(rates[best, m] for m in (False, True))
    print(f"margins below: worker_processes={best}, the slower masking setting")
    for chip, chips, per_host in CLUSTERS:
      step_s = flops_step / (chips * flops.peak_flops_per_device(chip) * args.mfu)
      hosts = chips // per_host
      need = {"global": GLOBAL_BATCH * SEQ_LEN / step_s,
              "documents": GLOBAL_BATCH * SEQ_LEN / hosts / step_s}
      print(f"1.2B on {chips} x {chip} ({hosts} hosts), MFU {args.mfu:g}: "
            f"{flops_step / 1e15:.2f} PFLOP/step -> {step_s:.3f} s/step; per host need "
            + "; ".join(f"{mode} {n:,.0f} tokens/s (margin {have / n:.1f}x)"
                        for mode, n in need.items()))


if __name__ == "__main__":
  main()
