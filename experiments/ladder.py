"""The 200M-1.2B scaling ladder: tied baselines and their Leviathan twins.

  lev-params --config=experiments/ladder.py:tied_1.2b
  lev-prepare-data --config=experiments/ladder.py:tied_200m      # once, shared by all rungs
  lev-train  --config=experiments/ladder.py:leviathan_400m --config.data.prepared_dir=...

Setup as reported for Leviathan (arXiv 2601.22040; ../shared/LEV.md "Reported setup"):
o200k_base vocabulary (200,019 ids, padded to 200,064), seq_len 512, global batch 512
sequences, AdamW + clipping, warm-up + cosine, The Pile. The paper does not give the
per-scale shapes, learning rates or token budgets: the shapes below are LLaMA-style
(d_ff ~ 8/3 d_model rounded to 256, head_dim 128 where d_model allows) chosen so that
each tied model is within +-5 % of its label (`lev-params` prints the deviation); the
token budget is 20 tokens per labelled parameter (Hoffmann et al. 2022) and the learning
rates follow common practice at these sizes. Leviathan = same backbone, LEV input
embedding (paper defaults k=3, d_seed=128, h=8, kappa=16, R=64) + untied head.
"""

from lev_jax.config import base_config

# label: (label_params, d_model, n_layers, n_heads, head_dim, d_ff, lr)
SHAPES = {
    "200m": (200e6, 768, 6, 12, 64, 2048, 6e-4),
    "400m": (400e6, 1024, 15, 16, 64, 2816, 5e-4),
    "800m": (800e6, 1536, 18, 12, 128, 4096, 4e-4),
    "1.2b": (1.2e9, 2048, 16, 16, 128, 5632, 3e-4),
}
EMBEDDINGS = {"tied": "tied", "leviathan": "lev"}
O200K_VOCAB = 200_019
SEQ_LEN = 512
GLOBAL_BATCH = 512
# The ladder for lev-ladder, smallest first, each tied rung next to its Leviathan twin.
RUNGS = tuple(f"{kind}_{size}" for size in SHAPES for kind in EMBEDDINGS)


def get_config(variant: str = "leviathan_1.2b"):
  kind, _, size = variant.partition("_")
  if kind not in EMBEDDINGS or size not in SHAPES:
    names = [f"{k}_{s}" for k in EMBEDDINGS for s in SHAPES]
    raise ValueError(f"experiments/ladder.py: unknown variant {variant!r}; "
                     f"expected one of {', '.join(names)}")
  label, d, n_layers, n_heads, head_dim, d_ff, lr = SHAPES[size]
  c = base_config()
  c.name = f"ladder_{variant}"
  c.label_params = label
  m = c.model
  m.embedding = EMBEDDINGS[kind]
  m.vocab_size = O200K_VOCAB
  m.d_model, m.n_layers, m.n_heads, m.n_kv_heads = d, n_layers, n_heads, n_heads
  m.head_dim, m.d_ff = head_dim, d_ff
  m.max_seq_len = SEQ_LEN
  m.dtype = "bfloat16"
  # One compiled layer looped n_layers times (lax.scan): compile time flat in depth
  # (lev-compile of the 1.2B rungs for a v5p-128 slice: ~2 min scanned).
  m.scan_layers = True
  # The Pile as shipped (train/00.jsonl.zst .. 29, val, test), prepared once with
  # `lev-prepare-data --config=experiments/ladder.py:tied_200m` into token ArrayRecord
  # shards that every rung shares (same tokenizer and files -> same dataset).
  c.data.source = "prepared"
  c.data.train_files = ("pile/train/*.jsonl.zst",)
  c.data.validation_files = ("pile/val.jsonl.zst",)
  c.data.test_files = ("pile/test.jsonl.zst",)
  c.data.prepared_dir = "pile/prepared/o200k_base"
  c.data.shuffle_buffer = 10_000  # packed sequences, as the paper's streaming buffer
  c.data.tokenizer = "o200k_base"
  # At pod scale each host tokenizes only its share (global mode would make every host
  # build all 262,144 tokens of each step); resume needs the same process count.
  c.data.host_batches = "documents"
  # Batches built by 8 grain processes per host (benchmarks/data_throughput.py: one
  # loader process delivers ~0.8M tokens/s, two ~1.7M on 2 cores; a 1.2B step on
  # 64 H100s needs ~0.53M tokens/s per 8-GPU host). Resume needs the same value.
  c.data.worker_processes = 8
  c.train.seq_len = SEQ_LEN
  c.train.global_batch_size = GLOBAL_BATCH
  c.train.steps = int(20 * label / (SEQ_LEN * GLOBAL_BATCH))
  c.train.log_every = 50
  c.train.eval_every = 1000
  c.train.checkpoint_every = 1000
  # LEV on every token (lev.mode tokens), its rows spread over all chips ("lev_rows"),
  # by the vectorized core (every seed coordinate at once): the fused core's loop over
  # the 128 coordinates moves [rows, 8, 64] arrays through HBM once per coordinate and
  # is the slowest core on a TPU (XLA:TPU's cost-model estimate for 4,096 rows per
  # chip: 80 ms vs 4.2 ms, 1.28 ms with its new backward; benchmarks/lev_tpu_estimate.py).
  # The vectorized core holds [rows, 8, 128, 64] float32 per chunk, so chunks of 32,768
  # ids: 512 rows per chip per chunk on a v5p-128 slice (64 chips), 8 chunks per step.
  # One chunk of 262,144
  # made the 200M step 1.29x tied's memory per chip; chunks of 65,536 and of 32,768
  # both 1.11x, the chunk's buffers then off the step's peak (lev-compile; docs/results.md,
  # "Every rung on its slice"). `unique` sorts the ids of the whole batch and
  # compiles its 200,064-row table fallback beside it (lax.cond: memory for the larger
  # branch). lev.remat (LEV's forward pass again in the backward pass, so nothing of
  # LEV is held through the backbone's backward pass) by lev-compile on v5p-128, per
  # chip: 200M 7.75 -> 7.05 GiB (tied 6.98; v5p-32: 34.84 -> 34.14, tied 34.17), so on;
  # from 400M up it raised memory (400M 14.38 -> 15.74 GiB, 1.2B 20.34 -> 23.22; tied
  # 14.30, 20.33) and the estimated step, so off. Since the vectorized core's backward
  # stores nothing [rows, heads, d_seed, rank]-sized (issue 24, 2026-12-03) it is off at
  # 200M too: per chip 5.16 GiB on v5p-128 (tied 5.06; 4.99 with it on) and 23.39 on
  # v5p-32 (tied 22.66), and the 2-layer 200M step estimates 0.98x MaxText's instead of
  # 1.01x (docs/results.md "The head and attention").
  c.lev.mode = "tokens"
  c.lev.impl = "vectorized"
  c.lev.chunk_size = 32_768
  c.lev.remat = False
  # The head's loss, its logits' precision and the attention kernel (lev-compile,
  # tied_200m; ESTIMATES, no TPU measured; docs/results.md "The head and attention"). On a
  # v5p-128 slice the dense loss fits with 93 % of HBM free and estimates fastest with
  # bfloat16 logits (6.31 GiB per chip, 0.0196 s; float32 logits 6.98 GiB, 0.0202 s;
  # the chunked loss 3.60 GiB, 0.028 s); on 4 chips at the same global batch the dense
  # logits alone would need 48.8 GiB a chip and only the chunked loss fits. So
  # loss_impl = "auto" (lev_jax/loss.py: chunked where the dense logits would take over
  # a quarter of a chip's memory, else dense), bfloat16 logits (MaxText's default), and
  # model.attention = "auto": splash on a TPU (what MaxText's "autoselected" picks),
  # cuDNN flash attention on an NVIDIA GPU, XLA on a CPU. Every tied rung on v5p-128
  # per loss x attention (2026-12-04, ESTIMATES, docs/results.md): the dense loss is
  # fastest at every rung; splash is fastest at head_dim 128 (800M, 1.2B), XLA's
  # attention 4 % / 6 % faster at head_dim 64 (200M, 400M), where
  # --config.model.attention=xla is the alternative to measure on a TPU (kept auto: the
  # cost model cannot price splash's kernel, xla would drop cuDNN on GPUs, and its
  # scores push model.remat=auto into remat on smaller slices).
  # Where XLA attention runs (auto off a TPU and a GPU, or model.attention = xla), its
  # scores stay bfloat16 as in MaxText's dot_product (model.attention_logits_dtype).
  c.train.loss_impl = "auto"
  c.model.logits_dtype = "bfloat16"
  c.model.attention = "auto"
  # Layer remat by the activations' share of a chip (lev_jax/remat.py: the least
  # recompute whose kept activations fit in a fifth of its memory; estimates): none on
  # the rungs' v5p-128 slices (4,096 tokens a chip), dots_no_batch where a chip holds
  # more tokens (tied_200m on 4 v5p chips: 14.65 GiB of temporaries instead of 25.03,
  # compiler figures, docs/results.md), full where even that would not fit.
  c.model.remat = "auto"
  c.model.attention_logits_dtype = "bfloat16"
  # The input table's lookup gradient rounded once to bfloat16, its rows gathered from
  # the bfloat16 cast (tied; Leviathan has no table): XLA:TPU then no longer transposes
  # the float32 table and its Adam moments each step (benchmarks/maxtext_compare.py,
  # tied_200m with 2 layers on v5p:2x2x1: 0.0314 -> 0.0300 s estimated, MaxText 0.0310).
  c.model.embedding_grad_dtype = "bfloat16"
  c.optim.lr = lr
  c.optim.warmup_steps = 1000
  # 2,048 validation sequences, in batches that split over 64 devices (a v5p-128 slice)
  c.eval.batches = 32
  c.eval.batch_size = 64
  return c
