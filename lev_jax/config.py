"""The base experiment config and its one-time validation.

Every experiment file in `experiments/` starts from `base_config()` and changes only
what differs; `validate(config)` runs once at start-up and raises `ConfigError` naming
the field, the value and what was expected.
"""

from __future__ import annotations

import difflib
import math
import numbers

import ml_collections

from lev_jax.workdir import first_non_utf8

EMBEDDINGS = ("tied", "untied", "lev")
DTYPES = ("float32", "bfloat16", "float16")
LOGITS_DTYPES = ("float32", "bfloat16")
SIGMOID_VARIANTS = ("half", "full")  # sigmoid(u / 2) [default] or sigmoid(u) (KHRONOS)
BASIS_VARIANTS = ("normalized", "khronos")
LEV_MODES = ("auto", "table", "tokens", "unique")
LEV_IMPLS = ("fused", "reference", "pallas", "vectorized")
LEV_PHI_GRAD_DTYPES = ("float32", "bfloat16")  # lev.phi_grad_dtype: lev_jax/lev.py
DECAY_MASKS = ("matrices", "all", "none")
CLIP_MODES = ("global", "per_group", "exclude_lev")  # lev_jax/optimizer.py make_clipping
LOSS_IMPLS = ("auto", "dense", "chunked")  # train.loss_impl: lev_jax/loss.py
NAN_POLICIES = ("stop", "skip_step")  # train.nan_policy: lev_jax/trainer.py
LEV_OUT_PROJ_INITS = ("paper", "match_table")
LEV_OUTPUT_NORMS = ("none", "rmsnorm", "scale")  # lev.output_norm: lev_jax/lev.py
SPLINE_ORDER = 3  # quadratic B-splines: 3 nonzero basis functions per input (LEV.md 3c)
# config.model.remat -> the jax.checkpoint_policies function that decides what the
# backward pass keeps instead of recomputing (None: no rematerialisation). Named here so
# that validation needs no jax; lev_jax/model.py looks the functions up by these names.
REMAT_POLICIES = {
    "none": None,
    "full": "nothing_saveable",
    "dots": "dots_saveable",
    "dots_no_batch": "dots_with_no_batch_dims_saveable",
}
# config.model.remat's values: a policy, or "auto" (lev_jax/remat.py: chosen from an
# estimate of the activations kept, for the devices' memory).
REMAT_CHOICES = ("auto", *REMAT_POLICIES)
DATA_SOURCES = ("embedded", "jsonl", "jsonl_stream", "prepared")
# data.corpus with data.source = "embedded": the frozen corpora of lev_jax.data.embedded
# (CORPORA): CPython's docs (the default), four Debian manuals, FOLDOC's entries.
DATA_CORPORA = ("python_docs", "debian_books", "foldoc")
TOKENIZERS = ("sentencepiece", "o200k_base", "bytes")
PREPARE_FORMATS = ("tokens", "text")
HOST_BATCHES = ("global", "documents")
# model.attention (lev_jax/attention.py): auto = splash on TPU, cuDNN on an NVIDIA GPU
# where they fit, else xla (the [B, H, L, L] scores XLA builds, every CPU figure here).
ATTENTION_IMPLS = ("auto", "xla", "splash", "cudnn")
SPLASH_LANES = 128  # splash's key blocks are whole 128-lane tiles (BlockSizes checks it)
CUDNN_DTYPES = ("bfloat16", "float16")
CUDNN_MAX_HEAD_DIM = 256  # cuDNN flash attention: 128 before Hopper, 256 from Hopper on


class ConfigError(ValueError):
  """A config value is out of range; the message names the field and the allowed values."""


def base_config() -> ml_collections.ConfigDict:
  """A small Leviathan model on the embedded data; experiments override from here."""
  c = ml_collections.ConfigDict()
  c.name = "leviathan"
  c.seed = 0

  c.model = m = ml_collections.ConfigDict()
  m.embedding = "lev"          # one of EMBEDDINGS
  m.vocab_size = 2048          # real vocab (tokenizer); padded to vocab_multiple
  m.vocab_multiple = 128
  m.d_model = 128
  m.n_layers = 2
  m.n_heads = 4
  m.n_kv_heads = 4             # < n_heads: grouped-query attention
  m.head_dim = 32
  m.d_ff = 384                 # SwiGLU hidden size
  m.max_seq_len = 2048         # RoPE positions available
  m.rope_theta = 10_000.0
  m.norm_eps = 1e-5
  m.init_std = 0.02
  m.dtype = "float32"          # compute dtype
  m.param_dtype = "float32"
  # What the head's matmul returns (float32 accumulation either way; the loss's softmax
  # is float32 either way): float32, or bfloat16, one rounding per logit and half the
  # bytes of the [tokens, V] logits and their gradient (MaxText's default,
  # logits_dot_in_fp32: False). Only the dense loss (train.loss_impl) stores them.
  m.logits_dtype = "float32"
  # The input table's gradient from its row lookup (tied and untied; LEV has no table):
  # float32, autodiff's scatter-add, or bfloat16, that float32 sum rounded once, the
  # rows gathered from the table cast to the compute dtype (needs model.dtype =
  # bfloat16). On a TPU this spares transposing copies of the float32 table and its Adam
  # moments each step (lev_jax.sharding.gather_rounding_grad; MaxText's lookup).
  m.embedding_grad_dtype = "float32"
  # Layer rematerialisation: a key of REMAT_POLICIES (none, full, dots, dots_no_batch) or
  # "auto" (lev_jax/remat.py: the least recompute whose kept activations fit in a fifth
  # of a device's memory; none on a CPU; experiments/ladder.py uses it).
  m.remat = "none"
  m.scan_layers = False        # lax.scan over stacked layers (compile time flat in depth)
  # Attention kernel, one of ATTENTION_IMPLS (lev_jax/attention.py): auto, xla (any
  # platform), splash (TPU: Pallas splash attention, causal blocks skipped), cudnn (NVIDIA
  # GPU: cuDNN flash attention, bfloat16 / float16 only). The KV-cached decode is always xla.
  m.attention = "auto"
  m.splash_block_q = 512       # query / key rows per splash block: multiples of 128,
  m.splash_block_kv = 512      # clipped to train.seq_len (then dividing it)
  # splash in the Pallas interpreter on any platform (tests, CPU debugging; slow): the
  # only way to run model.attention = "splash" off a TPU. "auto" ignores it.
  m.attention_interpret = False
  # The attention scores' and softmax's dtype of the xla kernel: float32 (jax's
  # dot_product_attention: every CPU figure), or bfloat16, the compute dtype kept
  # through q k^T, the mask, exp and the value product, normalised after it (MaxText's
  # dot_product at float32_qk_product = float32_logits = False; needs model.dtype =
  # bfloat16). splash and cudnn keep float32 inside their kernels either way.
  m.attention_logits_dtype = "float32"

  # LEV, ../shared/LEV.md; defaults are the paper's (per the reimplementation).
  c.lev = lv = ml_collections.ConfigDict()
  lv.n_coords = 3              # k: base-b digits of the token id
  lv.base = 0                  # b; 0 = ceil(padded_vocab ** (1 / k))
  lv.d_seed = 128
  lv.n_heads = 8               # h ("modes")
  lv.n_knots = 16              # kappa
  lv.rank = 64                 # R
  lv.sigmoid = "half"          # one of SIGMOID_VARIANTS
  lv.basis = "normalized"      # one of BASIS_VARIANTS
  lv.ln_eps = 1e-5
  lv.log_eps = 1e-6            # log(|phi| + log_eps) in the separable product
  # Rows LEV is evaluated on per micro-batch (lev_jax/embeddings.py): table = every id
  # of the padded vocab, then a gather; tokens = one row per token; unique = the
  # distinct ids of the micro-batch (at most lev.unique_size; more falls back exactly
  # to the cheaper of table / tokens), then a gather; auto = the fewest rows of the three
  # (unique only when lev.unique_size is set).
  lv.mode = "auto"
  # Static bound on distinct ids per micro-batch for `unique` (and `auto`); 0 = unset:
  # `unique` then uses half of min(padded vocab, micro-batch tokens), `auto` ignores it.
  lv.unique_size = 0
  # fused: custom-VJP XLA core over the <= 3 nonzero knots (default, fastest exact path
  # on CPU); reference: the dense einsum over every knot, as LEV.md writes it; pallas:
  # the Pallas kernel (lev_jax/lev_pallas.py) for GPU / TPU (interpreted on CPU);
  # vectorized: every seed coordinate at once, [chunk, H, S, R] float32 per chunk (the
  # TPU path of experiments/ladder.py: lev.lev_modes_vectorized).
  lv.impl = "fused"
  lv.log_group = 4             # seed coordinates multiplied directly per log (fused, pallas)
  lv.chunk_size = 4096         # ids per chunk (one loop step of LEV over the rows)
  # The vectorized core's phi gradient, [rows, h, d_seed, rank], as it enters the
  # backward pass's two products (one of LEV_PHI_GRAD_DTYPES): float32 (exact); bfloat16
  # = rounded once (relative error <= 2**-9 per element). The backward no longer stores
  # it (lev.lev_modes_vectorized): bfloat16 saves no HBM traffic any more and costs more
  # by XLA:TPU's estimate (leviathan_200m, 8,192 rows: 3.24 ms against 2.21 float32).
  # Only with lev.impl = "vectorized".
  lv.phi_grad_dtype = "float32"
  # Recompute LEV's forward pass in the backward pass (jax.checkpoint around the input
  # embedding) instead of keeping its residuals (per row: t [h, d_seed] float32 and
  # the modes) from the start of the step to its end: on a TPU they are live at the
  # peak, in the backbone's backward pass. Same values; one more LEV forward per step.
  lv.remat = False
  # W_out initialisation: "paper" = N(0, 0.02 / sqrt(h)) (LEV.md); "match_table" = the
  # same draw rescaled so LEV's output RMS over a fixed sample of ids equals
  # model.init_std, the tied table's per-row RMS at init (one of LEV_OUT_PROJ_INITS).
  lv.out_proj_init = "paper"
  # Ablations of issue 25 (lev_jax/lev.py; defaults keep the paper's LEV unchanged).
  # id_permutation: LEV embeds id perm[i] for token id i, perm a fixed random bijection
  # of the padded vocab drawn by numpy.random.default_rng(permutation_seed) (a constant,
  # not a parameter): ids that are neighbours in order (BPE ids are roughly sorted by
  # frequency) no longer share their leading base-b digits, hence codebook rows.
  lv.id_permutation = False
  lv.permutation_seed = 0      # integer >= 0; only with id_permutation (else 0)
  # LEV's output before the backbone (one of LEV_OUTPUT_NORMS): none = the paper's;
  # rmsnorm = x / rms(x) * g per row (eps lev.ln_eps, g learned [D], init 1: unit-RMS
  # rows, as an embedding LayerNorm); scale = x * s (s one learned scalar, init 1). Both
  # parameters are LEV's (its optimizer group: lev_lr_multiplier applies).
  lv.output_norm = "none"

  # Device mesh (lev_jax/sharding.py): ICI sizes within a slice / node, DCN sizes across
  # slices / nodes; -1 = all remaining devices (at most one -1 in ICI or DCN).
  c.mesh = mh = ml_collections.ConfigDict()
  mh.data = 1
  mh.fsdp = -1
  mh.tensor = 1
  mh.dcn_data = 1
  mh.dcn_fsdp = 1
  mh.dcn_tensor = 1
  mh.rules = ()                # ((logical_name, (mesh axes...)), ...) overriding the table

  c.data = d = ml_collections.ConfigDict()
  # embedded: the corpus shipped with Python; jsonl: Pile-format files read into memory
  # (small corpora); jsonl_stream: the same files streamed with a shuffle buffer (the
  # paper's setting, quick starts); prepared: ArrayRecord shards written by
  # lev-prepare-data (random access, global shuffle; The Pile at pod scale).
  d.source = "embedded"        # one of DATA_SOURCES
  # Embedded source: which frozen corpus (DATA_CORPORA): python_docs = CPython 3.11.7's
  # pydoc topics and docstrings; debian_books = four Debian manuals (2.0 MB of prose);
  # foldoc = the Free On-line Dictionary of Computing (3.9 MB of encyclopedic entries).
  d.corpus = "python_docs"
  d.tokenizer = "sentencepiece"  # one of TOKENIZERS; sentencepiece is trained on train split
  d.tiktoken_file = ""         # o200k_base: local .tiktoken ranks file ("" = tiktoken's cache)
  d.sentencepiece_file = ""    # sentencepiece: a trained *.model ("" = train one, cached)
  d.train_files = ()           # Pile-format *.jsonl / *.jsonl.zst paths, globs, gs:// URLs
  d.validation_files = ()
  d.test_files = ()            # prepared as the "test" split; never used in training
  d.prepared_dir = ""          # lev-prepare-data output (source=prepared); local or gs://
  d.prepare_format = "tokens"  # one of PREPARE_FORMATS: token arrays or raw text records
  d.prepare_workers = 0        # preparation processes; 0 = one per CPU core
  # Pack with segment ids / positions so attention and the loss never cross a document
  # boundary (RoPE positions restart at each document); off = plain concatenation.
  d.segment_masking = False
  # Processes building the training batches (grain mp_prefetch); 0 = in the training
  # process. Scales the loader with host cores; resume needs the same value.
  d.worker_processes = 0
  d.pile_set_names = ()        # keep only these subsets; () keeps all
  d.validation_fraction = 0.05  # embedded source: share of documents held out
  # Embedded source: share of documents held out as a "test" split (lev-eval
  # --split=test), taken from the training documents by the same text hash
  # (data.splits.split_of); 0 = no test split and the train / validation split of old.
  d.test_fraction = 0.0
  d.cache_dir = "~/.cache/lev_jax"
  d.shuffle_buffer = 1024      # sequences
  d.strict = False             # bad JSONL line: error (True) or skip and count
  # How processes share the input: "global" = every host builds the global batch and
  # feeds its own rows (identical stream for any process count: exact multi-host ==
  # single-host, portable checkpoints); "documents" = each host reads 1/n of the
  # documents and builds only its rows (less host work at pod scale).
  d.host_batches = "global"
  d.seed = 0

  c.train = t = ml_collections.ConfigDict()
  t.steps = 300
  t.seq_len = 128
  t.global_batch_size = 16     # sequences per optimizer step
  t.grad_accum_steps = 1       # micro-batches per step
  t.log_every = 10
  t.eval_every = 100
  t.checkpoint_every = 100
  t.keep_checkpoints = 3
  # (first, count): a jax.profiler trace of the `count` train steps after step `first`
  # (those logged as steps first + 1 .. first + count; 0 = from the first step, whose
  # time includes the compile), by process 0 into WORKDIR/profile/ (TensorBoard's
  # profile plugin, XProf, ui.perfetto.dev), and perf/profile_step_time_s in
  # metrics.jsonl (lev_jax/trainer.py). () or count 0 = off (nothing started). CLI:
  # --config.train.profile_steps="(5, 3)". A run resumed inside the window traces the
  # steps left; first + count <= train.steps.
  t.profile_steps = ()
  # A step whose loss, gradient norm or update is not finite (checked in the jitted
  # step) leaves params and optimizer state unchanged. "stop": the run stops there with
  # one line and writes no checkpoint after it; "skip_step": training goes on, and
  # stops once more than max_skipped_steps steps of this process were skipped.
  t.nan_policy = "stop"
  t.max_skipped_steps = 10
  # The cross-entropy (lev_jax/loss.py): "dense" builds the float32 logits [tokens,
  # padded V] and applies optax's softmax cross-entropy (every CPU figure of
  # docs/results.md); "chunked" holds float32 logits of loss_token_chunk tokens (0:
  # automatic, at most 256 MiB per device) x loss_vocab_chunk ids (the padded vocab
  # itself: the whole vocab, the gradient made in the forward pass; a smaller divisor:
  # recomputed in the backward pass; 0, automatic: the whole vocab up to 65,536 padded
  # ids, above it the divisor nearest 8,192, lev_jax/loss.py `vocab_chunk_size`). "auto" (lev_jax/loss.py `resolve`): chunked where the dense
  # logits and their gradient would take more than a quarter of a device's memory (a
  # TPU or GPU whose memory is known), else dense; on a CPU always dense
  # (experiments/ladder.py uses it).
  t.loss_impl = "dense"
  t.loss_token_chunk = 0
  t.loss_vocab_chunk = 0

  c.optim = o = ml_collections.ConfigDict()
  o.lr = 3e-3
  o.min_lr_ratio = 0.1         # cosine decays to lr * min_lr_ratio
  o.warmup_steps = 30
  o.b1 = 0.9
  o.b2 = 0.95
  o.eps = 1e-8
  o.weight_decay = 0.1
  o.decay_mask = "matrices"    # one of DECAY_MASKS
  # Parameter-path substrings excluded from decay on top of decay_mask: LEV's per-head
  # LayerNorm scale/bias and KHRONOS basis scale are norms stored as [H, S] arrays.
  o.no_decay = ("ln_scale", "ln_bias", "basis_scale")
  o.clip_norm = 1.0
  # Which gradient norms clip_norm applies to (one of CLIP_MODES; lev_jax/optimizer.py):
  # "global" = one norm over all parameters; "per_group" = each parameter group (lev,
  # embedding_table, head, backbone) by its own norm; "exclude_lev" = one norm over
  # all but LEV, and LEV by its own norm.
  o.clip_mode = "global"
  # LEV's parameters train at lr * lev_lr_multiplier (schedule and weight decay as for
  # the rest); 0 freezes LEV; 1.0 = one learning rate for the whole model. 3.0 was
  # selected on validation in experiments/fidelity_study.py (vocab 32k) and again at
  # the smoke budget (experiments/smoke_study.py: mean validation perplexity 172.3 vs
  # 179.9 for 1.0, lower on 2 of 3 seeds; docs/smoke_study/study.csv); chosen at CPU
  # scale only: sweep it when reproducing the ladder (docs/results.md, the seeded study).
  o.lev_lr_multiplier = 3.0
  # LEV's own decoupled weight decay (on the parameters decay_mask selects): -1 = the
  # same as weight_decay; any other value >= 0 replaces it for LEV's group only.
  o.lev_weight_decay = -1.0
  # LEV's own linear warm-up, in optimizer steps (then the same cosine decay as the
  # rest): -1 = the same as warmup_steps; else in [0, train.steps).
  o.lev_warmup_steps = -1
  # z-loss weight: z_loss * log(Z)^2 per target added to the objective, log Z the
  # log-sum-exp of the token's logits (PaLM, Chowdhery et al. 2022, Sec. 5, used 1e-4);
  # 0 = off. Logged as train/z_loss.
  o.z_loss = 0.0

  c.eval = e = ml_collections.ConfigDict()
  e.batches = 8                # fixed validation batches
  e.batch_size = 16
  # Token-frequency buckets (count of the id in the training split): [0, e1), [e1, e2), ...
  e.freq_bucket_edges = (1, 10, 100, 1000, 10000)
  # lev-eval also forms this many equal-mass buckets (each ~1/n of the training tokens;
  # evaluate.equal_mass_edges); 0 = log-frequency buckets only.
  e.equal_mass_buckets = 4
  # Zero-shot tasks for lev-eval (lev_jax.eval.downstream): a path (local or gs://) to each
  # task's file in its released format; "" = skip the task. PIQA's labels file defaults
  # to <file stem>-labels.lst beside it.
  e.downstream = ml_collections.ConfigDict({
      "lambada": "", "hellaswag": "", "piqa": "", "piqa_labels": "", "arc_easy": "",
      "arc_challenge": "", "winogrande": ""})
  e.downstream_limit = 0       # items per task (0 = all)
  return c


def padded_vocab_size(vocab_size: int, multiple: int) -> int:
  """vocab_size rounded up to a multiple of `multiple` (128 by default): the rows of the
  tables and head and the logits' last axis, computed here only."""
  return int(math.ceil(vocab_size / multiple) * multiple)


def lev_base(vocab_size: int, n_coords: int) -> int:
  """Smallest integer b with b ** n_coords >= vocab_size (LEV.md step 1)."""
  b = max(2, int(round(vocab_size ** (1.0 / n_coords))))
  while b ** n_coords < vocab_size:
    b += 1
  while b > 2 and (b - 1) ** n_coords >= vocab_size:
    b -= 1
  return b


def lev_digit_base(base: int, n_coords: int, padded_vocab: int) -> int:
  """b, the base of LEV's digits (LEV.md step 1): `base` (config.lev.base), or when it is
  0 the smallest b with b ** n_coords >= padded_vocab (`lev_base`). The one check, used
  by `validate`, `lev.LEV` and `lev.lev_param_count`.

  Raises:
    ConfigError: base ** n_coords < padded_vocab: the n_coords base-b digits cannot
      address every token id (the message names both numbers).
  """
  b = base or lev_base(padded_vocab, n_coords)
  if b ** n_coords < padded_vocab:
    raise ConfigError(
        f"config.lev.base ** config.lev.n_coords = {b}**{n_coords} = {b ** n_coords} < "
        f"padded vocab_size = {padded_vocab}: the base-b digits cannot address every "
        "token id")
  return b


# The largest step a run can reach: the train state's step counter (lev_jax/train.py)
# and the optimizer's update count are int32.
MAX_STEPS = 2**31 - 1
# config.seed's range: jax.random.key takes a signed 64-bit seed (a larger one is an
# OverflowError), and the train state's key is jax.random.key(seed + 1) (lev_jax/train.py).
SEED_RANGE = (-2**63, 2**63 - 2)


def _fail(field: str, value, expected: str):
  raise ConfigError(f"config.{field} = {value!r}: expected {expected}")


def check_platform(c: ml_collections.ConfigDict, platform: str) -> None:
  """What a validated config cannot do in a program for `platform` ("cpu", "gpu",
  "tpu"), beyond the attention kernel (lev_jax/attention.py `resolve`): float16
  compute off an NVIDIA GPU (XLA:CPU has no float16 dot, and splash's Mosaic kernel
  no float16 layout: newcomer pass 19, C26, E22-E27: tracebacks in the first step),
  and the Pallas interpreter in a TPU program (E04: it compiled the interpreter).

  Raises:
    ConfigError: one line naming the field and what the platform allows.
  """
  m = c.model
  if m.dtype == "float16" and platform != "gpu":
    _fail("model.dtype", m.dtype, f"'bfloat16' or 'float32' in a {platform.upper()} "
          "program (float16 compute runs on NVIDIA GPUs only)")
  if m.attention_interpret and platform == "tpu":
    _fail("model.attention_interpret", m.attention_interpret, "False in a TPU program "
          "(the Pallas interpreter is a test switch off a TPU; a TPU runs splash's "
          "Mosaic kernel)")


def _positive(c, section: str, names):
  for n in names:
    v = c[section][n]
    if not isinstance(v, (int, float)) or v <= 0:
      _fail(f"{section}.{n}", v, "a positive number")


# The largest array dimension a config may ask for: one axis of an XLA array (shapes are
# int64, and a product of two int64 dimensions overflows past this; MLIR refused
# d_model = 1e20 with a traceback).
MAX_DIM = 2**31 - 1


def _dimensions(c, section: str, names):
  """Refuses an array size (an int field) above MAX_DIM."""
  for n in names:
    v = c[section][n]
    if isinstance(v, int) and v > MAX_DIM:
      _fail(f"{section}.{n}", v, f"at most {MAX_DIM:,} (2**31 - 1, an array dimension)")


def _one_of(c, section: str, name: str, allowed):
  v = c[section][name]
  if v not in allowed:
    _fail(f"{section}.{name}", v, "one of " + ", ".join(repr(a) for a in allowed))


def _non_finite(value) -> bool:
  """True for a real number (not a bool) that is nan or +-inf."""
  return (isinstance(value, numbers.Real) and not isinstance(value, bool)
          and not math.isfinite(value))


def _check_finite(node, prefix: str = "") -> None:
  """Fails on the first nan / inf anywhere under `node`: a number, or one inside a
  tuple or list (the whole sequence is shown); or a text field that is not UTF-8 (a
  command-line byte that is not, kept by Python as a lone surrogate, PEP 383: config.name
  names the run's folder and every JSON file holds it). nan passes every `<` / `>` test,
  so this runs before the range checks."""
  for name, value in node.items():
    field = f"{prefix}{name}"
    if isinstance(value, (ml_collections.ConfigDict, dict)):
      _check_finite(value, field + ".")
    elif _non_finite(value):
      _fail(field, value, "a finite number")
    elif isinstance(value, (tuple, list)) and any(_non_finite(v) for v in value):
      _fail(field, tuple(value), "finite numbers")
    elif isinstance(value, str) and first_non_utf8(value) is not None:
      _fail(field, value, "UTF-8 text (a byte that is not UTF-8 was given)")


def splash_misfit(seq_len: int, block_q: int, block_kv: int) -> tuple | None:
  """Why splash attention cannot run on rows of `seq_len` tokens with these blocks:
  (field, value, expected) for `_fail`, or None when it can. Blocks larger than
  seq_len are clipped to it (lev_jax/attention.py)."""
  if seq_len % SPLASH_LANES:
    return ("train.seq_len", seq_len, f"a multiple of {SPLASH_LANES} with model.attention "
            f"= 'splash' (its key blocks are whole {SPLASH_LANES}-lane tiles)")
  for field, block in (("model.splash_block_q", block_q), ("model.splash_block_kv", block_kv)):
    if seq_len % min(block, seq_len):
      return (field, block, f"a divisor of train.seq_len = {seq_len}, or >= it (blocks "
              "are clipped to train.seq_len)")
  return None


def cudnn_misfit(dtype: str, head_dim: int, seq_len: int, segment_masking: bool,
                 max_head_dim: int = CUDNN_MAX_HEAD_DIM) -> tuple | None:
  """Why cuDNN flash attention cannot run this model: (field, value, expected) for
  `_fail`, or None. Its limits (jax._src.cudnn.fused_attention_stablehlo, jax 0.10.2):
  bfloat16 / float16 inputs; head_dim a multiple of 8, <= 128 before Hopper, <= 256
  from Hopper on; even lengths in training with a mask (segment_masking)."""
  if dtype not in CUDNN_DTYPES:
    return ("model.dtype", dtype, "'bfloat16' or 'float16' with model.attention = "
            "'cudnn' (cuDNN flash attention, an NVIDIA GPU kernel, has no float32 kernel; "
            "off a GPU use 'auto' or 'xla')")
  if head_dim % 8 or head_dim > max_head_dim:
    return ("model.head_dim", head_dim, f"a multiple of 8, at most {max_head_dim}, with "
            "model.attention = 'cudnn'")
  if segment_masking and seq_len % 2:
    return ("train.seq_len", seq_len, "an even number with model.attention = 'cudnn' and "
            "data.segment_masking (cuDNN's masked training kernel)")
  return None


def _is_int(v) -> bool:
  return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def _check_seeds(c) -> None:
  """config.seed within SEED_RANGE; data.seed an integer, >= 0 with data.source =
  'jsonl_stream' (its file order is numpy.random.default_rng([seed, epoch]), whose
  SeedSequence refuses a negative seed; grain's shuffles take any integer, reduced
  modulo 2**32, and numpy any size). lev.permutation_seed: `_check_lev_ablations`."""
  low, high = SEED_RANGE
  if not _is_int(c.seed) or not low <= c.seed <= high:
    _fail("seed", c.seed, "an integer in [-2**63, 2**63 - 2] (jax.random.key takes a "
          "signed 64-bit seed; the train state's key is drawn from seed + 1)")
  if not _is_int(c.data.seed):
    _fail("data.seed", c.data.seed, "an integer")
  if c.data.seed < 0 and c.data.source == "jsonl_stream":
    _fail("data.seed", c.data.seed, "an integer >= 0 with data.source = 'jsonl_stream' "
          "(numpy.random.default_rng orders its files)")


def _check_lev_ablations(c) -> None:
  """lev.id_permutation, lev.permutation_seed, lev.output_norm (any model: a non-LEV
  model must leave them at their defaults, since it has no LEV to apply them to)."""
  lv, embedding = c.lev, c.model.embedding
  _one_of(c, "lev", "output_norm", LEV_OUTPUT_NORMS)
  if not _is_int(lv.permutation_seed) or lv.permutation_seed < 0:
    _fail("lev.permutation_seed", lv.permutation_seed, "an integer >= 0")
  if embedding != "lev":
    no_lev = f"with model.embedding = {embedding!r}, which has no LEV"
    if lv.id_permutation:
      _fail("lev.id_permutation", lv.id_permutation, f"False {no_lev}")
    if lv.output_norm != "none":
      _fail("lev.output_norm", lv.output_norm, f"'none' {no_lev}")
  if lv.permutation_seed and not lv.id_permutation:
    _fail("lev.permutation_seed", lv.permutation_seed, "0 without lev.id_permutation "
          "(the seed draws its permutation; set lev.id_permutation = True to use it)")
  if embedding == "lev" and lv.output_norm == "rmsnorm" and lv.out_proj_init != "paper":
    _fail("lev.out_proj_init", lv.out_proj_init, "'paper' with lev.output_norm = "
          "'rmsnorm' (the norm sets the output's scale, whatever W_out's)")


def _check_lev_optim(o, steps: int) -> None:
  """optim.lev_weight_decay and optim.lev_warmup_steps: -1 (the global value) or their
  own value."""
  wd = o.lev_weight_decay
  if (isinstance(wd, bool) or not isinstance(wd, (int, float))
      or not (wd == -1 or 0 <= wd < math.inf)):
    _fail("optim.lev_weight_decay", wd, "-1 (the same as optim.weight_decay) or a "
          "finite number >= 0")
  w = o.lev_warmup_steps
  if not _is_int(w) or not (w == -1 or 0 <= w < steps):
    _fail("optim.lev_warmup_steps", w, f"-1 (the same as optim.warmup_steps) or an "
          f"integer in [0, train.steps = {steps})")


def _check_attention(c) -> None:
  """model.attention and its fields (the platform is checked when the step is traced:
  lev_jax/attention.py)."""
  m = c.model
  _one_of(c, "model", "attention", ATTENTION_IMPLS)
  _one_of(c, "model", "attention_logits_dtype", LOGITS_DTYPES)
  if m.attention_logits_dtype == "bfloat16" and m.dtype != "bfloat16":
    _fail("model.attention_logits_dtype", m.attention_logits_dtype,
          "'float32' unless model.dtype = 'bfloat16' (the scores stay in the compute dtype)")
  for field in ("splash_block_q", "splash_block_kv"):
    v = m[field]
    if isinstance(v, bool) or not isinstance(v, int) or v <= 0 or v % SPLASH_LANES:
      _fail(f"model.{field}", v, f"a positive multiple of {SPLASH_LANES}")
  misfit = None
  if m.attention == "splash":
    misfit = splash_misfit(c.train.seq_len, m.splash_block_q, m.splash_block_kv)
  elif m.attention == "cudnn":
    misfit = cudnn_misfit(m.dtype, m.head_dim, c.train.seq_len, c.data.segment_masking)
  if misfit:
    _fail(*misfit)


def _check_profile_steps(t) -> None:
  """train.profile_steps: () or (first, count), integers with first, count >= 0 and
  first + count <= train.steps (checked after train.steps)."""
  window = t.profile_steps
  expected = ("() (off) or (first, count), two integers: e.g. (5, 3) traces steps 6 to 8; "
              'from the command line --config.train.profile_steps="(5, 3)"')
  if (not isinstance(window, (tuple, list)) or len(window) not in (0, 2)
      or not all(isinstance(v, numbers.Integral) and not isinstance(v, bool)
                 for v in window)):
    _fail("train.profile_steps", window, expected)
  if not window:
    return
  first, count = window
  if first < 0:
    _fail("train.profile_steps", tuple(window), "first >= 0 (the steps before the trace)")
  if count < 0:
    _fail("train.profile_steps", tuple(window), "count >= 0 (0 = off)")
  if first + count > t.steps:
    _fail("train.profile_steps", tuple(window),
          f"first + count <= train.steps = {t.steps} (the trace ends at step first + count)")


def _check_data_paths(d) -> None:
  """Refuses an empty folder for the data cache and a blank file where "" means unset."""
  if not str(d.cache_dir).strip():  # "" would write the cache into the current folder
    _fail("data.cache_dir", d.cache_dir, "a folder for the data cache (default "
          "'~/.cache/lev_jax'); empty would write it into the current folder")
  for field in ("tiktoken_file", "sentencepiece_file", "prepared_dir"):
    v = d[field]
    if v and not v.strip():  # "" is the documented "unset"; only spaces is a typo
      _fail(f"data.{field}", v, "a path, or '' (unset)")
  for field in ("train_files", "validation_files", "test_files"):
    if any(not str(p).strip() for p in d[field]):
      _fail(f"data.{field}", tuple(d[field]), "no empty path")


# Fields an experiment may add beyond base_config()'s (dotted path: what reads it).
OPTIONAL_FIELDS = {
    "config.label_params": "the rung's nominal size (experiments/ladder.py; lev-params)",
}


def unknown_field(node, schema, prefix: str = "config") -> str | None:
  """The one line for the first key of `node` (a config) that `schema` (a config of
  the same sections, e.g. base_config()) lacks and OPTIONAL_FIELDS does not name,
  depth first, or None.

  Returns:
    e.g. "config.train.stepz: not a field of the config (did you mean 'steps'?); a
    config sets only fields base_config() defines" (the closest names from difflib,
    else the section's fields listed).
  """
  for key, value in node.items():
    field = f"{prefix}.{key}"
    if key not in schema and field not in OPTIONAL_FIELDS:
      known = list(schema.keys())
      close = difflib.get_close_matches(key, known, n=3)
      hint = (f"did you mean {' or '.join(repr(k) for k in close)}?" if close
              else f"{prefix}'s fields: {', '.join(known)}")
      return (f"{field}: not a field of the config ({hint}); a config sets only fields "
              "base_config() defines")
    if isinstance(schema.get(key), ml_collections.ConfigDict) and isinstance(
        value, (ml_collections.ConfigDict, dict)):
      found = unknown_field(value, schema[key], field)
      if found:
        return found
  return None


def article(name: str) -> str:
  """`name` (a type's name) with its article: "an int", "a dict"."""
  return f"{'an' if name[:1].lower() in 'aeiou' else 'a'} {name}"


def type_phrase(value) -> str:
  """What `value` is, for a message about a get_config result: "None", "an int", "a
  dict"."""
  return "None" if value is None else article(type(value).__name__)


def missing_fields(node, schema, prefix: str = "config") -> list[str]:
  """The sections and fields of `schema` (e.g. base_config()) that the config `node`
  lacks: e.g. ["config.data", ..., "config.train"] for a ConfigDict holding only a name.
  A section's own sub-sections (eval.downstream: one entry per task) are free-form and
  not required."""
  missing = []
  for key, value in schema.items():
    field = f"{prefix}.{key}"
    if key not in node:
      if not (prefix != "config" and isinstance(value, ml_collections.ConfigDict)):
        missing.append(field)
    elif prefix == "config" and isinstance(value, ml_collections.ConfigDict) and isinstance(
        node[key], (ml_collections.ConfigDict, dict)):
      missing += missing_fields(node[key], value, field)
  return missing


def validate(c: ml_collections.ConfigDict, *,
             allow_unknown: bool = False) -> ml_collections.ConfigDict:
  """Checks every field once; returns the config unchanged.

  Args:
    c: the config.
    allow_unknown: keep fields base_config() does not define (a config stored by
      another lev_jax, `from_dict`); else the first one is refused (a misspelling in
      an experiment file would leave the field it meant at its default).
  Raises:
    ConfigError: `c` is not a ConfigDict (e.g. a get_config returning a dict); a field
      base_config() does not define (named, the closest names suggested) or one it
      defines that `c` lacks (named); else naming
      the first bad field, its value and the allowed values (a nan or inf in any field
      of any section first).
  """
  if not isinstance(c, ml_collections.ConfigDict):
    raise ConfigError(f"the config is {type_phrase(c)}; expected an ml_collections.ConfigDict "
                      "(get_config returns one)")
  base = base_config()
  if not allow_unknown:
    unknown = unknown_field(c, base)
    if unknown:
      raise ConfigError(unknown)
  missing = missing_fields(c, base)
  if missing:  # newcomer pass 9: a ConfigDict({"name": ...}) was a KeyError traceback
    more = f" and {len(missing) - 6} more" if len(missing) > 6 else ""
    raise ConfigError(f"the config lacks {', '.join(missing[:6])}{more}; expected one built "
                      "from lev_jax.config.base_config() with fields changed (as "
                      "experiments/smoke.py builds them)")
  _check_finite(c)
  _check_seeds(c)
  m, lv, t = c.model, c.lev, c.train
  _one_of(c, "model", "embedding", EMBEDDINGS)
  _one_of(c, "model", "dtype", DTYPES)
  _one_of(c, "model", "param_dtype", DTYPES)
  _one_of(c, "model", "logits_dtype", LOGITS_DTYPES)
  _one_of(c, "model", "embedding_grad_dtype", LOGITS_DTYPES)
  if m.embedding_grad_dtype == "bfloat16" and m.dtype != "bfloat16":
    _fail("model.embedding_grad_dtype", m.embedding_grad_dtype,
          "'float32' unless model.dtype = 'bfloat16' (the gradient is rounded to the "
          "compute dtype)")
  _one_of(c, "model", "remat", REMAT_CHOICES)
  _positive(c, "model", ["vocab_size", "vocab_multiple", "d_model", "n_layers", "n_heads",
                         "n_kv_heads", "head_dim", "d_ff", "max_seq_len", "rope_theta"])
  _dimensions(c, "model", ["vocab_size", "vocab_multiple", "d_model", "n_layers", "n_heads",
                           "n_kv_heads", "head_dim", "d_ff", "max_seq_len"])
  if m.n_heads % m.n_kv_heads:
    _fail("model.n_kv_heads", m.n_kv_heads, f"a divisor of model.n_heads = {m.n_heads}")
  if m.head_dim % 2:
    _fail("model.head_dim", m.head_dim, "an even number (RoPE rotates pairs)")
  _positive(c, "train", ["steps", "seq_len", "global_batch_size", "grad_accum_steps",
                         "log_every", "eval_every", "checkpoint_every", "keep_checkpoints"])
  _dimensions(c, "train", ["seq_len", "global_batch_size"])
  for n in ("steps", "log_every", "eval_every", "checkpoint_every"):
    if t[n] > MAX_STEPS:
      _fail(f"train.{n}", t[n], f"at most {MAX_STEPS} (2**31 - 1: the step counter is int32)")
  _one_of(c, "train", "nan_policy", NAN_POLICIES)
  if (isinstance(t.max_skipped_steps, bool) or not isinstance(t.max_skipped_steps, int)
      or t.max_skipped_steps < 0):
    _fail("train.max_skipped_steps", t.max_skipped_steps, "an integer >= 0")
  _check_profile_steps(t)
  if t.seq_len > m.max_seq_len:
    _fail("train.seq_len", t.seq_len, f"<= model.max_seq_len = {m.max_seq_len}")
  _check_attention(c)
  if t.global_batch_size % t.grad_accum_steps:
    _fail("train.grad_accum_steps", t.grad_accum_steps,
          f"a divisor of train.global_batch_size = {t.global_batch_size}")
  _one_of(c, "train", "loss_impl", LOSS_IMPLS)
  micro_tokens = t.global_batch_size // t.grad_accum_steps * t.seq_len
  padded_vocab = padded_vocab_size(m.vocab_size, m.vocab_multiple)
  for field, zero, size, what in (
      ("loss_token_chunk", "automatic", micro_tokens, "tokens per micro-batch "
       "(train.global_batch_size / train.grad_accum_steps x train.seq_len)"),
      ("loss_vocab_chunk", "automatic", padded_vocab,
       "ids of the padded vocab (itself: the whole vocab)")):
    v = t[field]
    if isinstance(v, bool) or not isinstance(v, int) or v < 0 or (v and size % v):
      _fail(f"train.{field}", v, f"0 ({zero}) or a divisor of the {size:,} {what}")
    if v and t.loss_impl == "dense":
      _fail(f"train.{field}", v, "0 with train.loss_impl = 'dense', which has no chunks "
            "(set train.loss_impl = 'chunked' to use it)")
  # The lev section's values are checked whatever model.embedding is (a typo in a tied
  # run's config is still a typo); how they fit the vocab only where LEV runs.
  _one_of(c, "lev", "sigmoid", SIGMOID_VARIANTS)
  _one_of(c, "lev", "basis", BASIS_VARIANTS)
  _one_of(c, "lev", "mode", LEV_MODES)
  _one_of(c, "lev", "out_proj_init", LEV_OUT_PROJ_INITS)
  _one_of(c, "lev", "impl", LEV_IMPLS)
  _one_of(c, "lev", "phi_grad_dtype", LEV_PHI_GRAD_DTYPES)
  if lv.phi_grad_dtype != "float32" and lv.impl != "vectorized":
    _fail("lev.phi_grad_dtype", lv.phi_grad_dtype, f"'float32' with lev.impl = "
          f"{lv.impl!r} (only the vectorized core stores phi's gradient)")
  _positive(c, "lev", ["n_coords", "d_seed", "n_heads", "rank", "chunk_size",
                       "ln_eps", "log_eps", "log_group"])
  _dimensions(c, "lev", ["n_coords", "d_seed", "n_heads", "rank", "chunk_size", "n_knots"])
  if not lv.log_eps >= 1.2e-38 or lv.log_eps == math.inf:
    _fail("lev.log_eps", lv.log_eps, "a finite number >= 1.2e-38 (float32's smallest "
          "normal: the fused product splits factors into mantissa and exponent)")
  if lv.log_group > 64 or lv.d_seed % lv.log_group:
    _fail("lev.log_group", lv.log_group, f"a divisor of lev.d_seed = {lv.d_seed}, at "
          "most 64")
  if not isinstance(lv.remat, bool):
    _fail("lev.remat", lv.remat, "True or False")
  if not isinstance(lv.unique_size, int) or lv.unique_size < 0:
    _fail("lev.unique_size", lv.unique_size, "an integer >= 0 (0 = automatic)")
  if not _is_int(lv.n_knots) or lv.n_knots < SPLINE_ORDER:
    _fail("lev.n_knots", lv.n_knots, f"an integer >= {SPLINE_ORDER}, the spline order "
          f"(quadratic B-splines: each input has {SPLINE_ORDER} nonzero basis "
          f"functions, on {SPLINE_ORDER} adjacent knots)")
  if lv.base < 0 or lv.base == 1:
    _fail("lev.base", lv.base, "0 (automatic) or an integer >= 2")
  if lv.base and m.embedding == "lev":  # 0 (automatic) always addresses every id; the
    # digits must address this vocab only where LEV reads them
    lev_digit_base(lv.base, lv.n_coords, padded_vocab_size(m.vocab_size, m.vocab_multiple))
  _check_lev_ablations(c)
  _one_of(c, "optim", "decay_mask", DECAY_MASKS)
  _positive(c, "optim", ["lr", "eps", "clip_norm"])
  for beta in ("b1", "b2"):  # Adam's moment decay rates: 1 would never forget
    v = c.optim[beta]
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v < 1:
      _fail(f"optim.{beta}", v, "a number in [0, 1)")
  _one_of(c, "optim", "clip_mode", CLIP_MODES)
  lev_mult = c.optim.lev_lr_multiplier
  if (isinstance(lev_mult, bool) or not isinstance(lev_mult, (int, float))
      or not 0 <= lev_mult < math.inf):
    _fail("optim.lev_lr_multiplier", lev_mult, "a finite number >= 0 (0 freezes LEV)")
  if not 0 <= c.optim.min_lr_ratio <= 1:
    _fail("optim.min_lr_ratio", c.optim.min_lr_ratio, "a number in [0, 1]")
  if c.optim.warmup_steps < 0 or c.optim.warmup_steps >= t.steps:
    _fail("optim.warmup_steps", c.optim.warmup_steps, f"in [0, train.steps = {t.steps}); "
          "lower it with --config.optim.warmup_steps=N (or raise train.steps)")
  if not c.optim.weight_decay >= 0:
    _fail("optim.weight_decay", c.optim.weight_decay, "a number >= 0")
  _check_lev_optim(c.optim, t.steps)
  z = c.optim.z_loss
  if isinstance(z, bool) or not isinstance(z, (int, float)) or not 0 <= z < math.inf:
    _fail("optim.z_loss", z, "a finite number >= 0 (0 = off; PaLM used 1e-4)")
  _one_of(c, "data", "source", DATA_SOURCES)
  _one_of(c, "data", "tokenizer", TOKENIZERS)
  _one_of(c, "data", "host_batches", HOST_BATCHES)
  _one_of(c, "data", "prepare_format", PREPARE_FORMATS)
  _one_of(c, "data", "corpus", DATA_CORPORA)
  if c.data.source != "embedded" and c.data.corpus != DATA_CORPORA[0]:
    _fail("data.corpus", c.data.corpus,
          f"{DATA_CORPORA[0]!r} (the default) with data.source = {c.data.source!r}; set "
          "data.source = 'embedded' to train on a frozen corpus")
  if c.data.source == "embedded":
    for field in ("train_files", "validation_files", "test_files"):
      if c.data[field]:
        _fail(f"data.{field}", tuple(c.data[field]),
              "no files with data.source = 'embedded' (it reads the embedded corpus); set "
              "data.source to 'jsonl', 'jsonl_stream' or 'prepared' to use them")
  if c.data.source in ("jsonl", "jsonl_stream") and not c.data.train_files:
    _fail("data.train_files", tuple(c.data.train_files),
          "at least one Pile-format *.jsonl or *.jsonl.zst path when data.source = "
          f"{c.data.source!r}")
  if c.data.source == "jsonl_stream" and not c.data.validation_files:
    _fail("data.validation_files", tuple(c.data.validation_files),
          "at least one Pile-format file when data.source = 'jsonl_stream' (a stream "
          "has no hold-out)")
  _check_data_paths(c.data)
  if c.data.source == "prepared" and not c.data.prepared_dir.strip():
    _fail("data.prepared_dir", c.data.prepared_dir,
          "the folder written by lev-prepare-data when data.source = 'prepared'")
  if not isinstance(c.data.worker_processes, int) or c.data.worker_processes < 0:
    _fail("data.worker_processes", c.data.worker_processes, "an integer >= 0")
  if c.data.worker_processes and c.data.source == "jsonl_stream":
    _fail("data.worker_processes", c.data.worker_processes,
          "0 with data.source = 'jsonl_stream' (a stream cannot be split among workers)")
  if not isinstance(c.data.prepare_workers, int) or c.data.prepare_workers < 0:
    _fail("data.prepare_workers", c.data.prepare_workers, "an integer >= 0 (0 = CPU count)")
  if not 0 < c.data.validation_fraction < 1:
    _fail("data.validation_fraction", c.data.validation_fraction, "a number in (0, 1)")
  test_fraction = c.data.test_fraction
  if (isinstance(test_fraction, bool) or not isinstance(test_fraction, (int, float))
      or not 0 <= test_fraction < 1 - c.data.validation_fraction):
    _fail("data.test_fraction", test_fraction,
          f"a number in [0, 1 - data.validation_fraction = "
          f"{1 - c.data.validation_fraction:g})")
  if test_fraction and c.data.source != "embedded":
    _fail("data.test_fraction", test_fraction,
          f"0 with data.source = {c.data.source!r} (its test split is data.test_files)")
  _positive(c, "data", ["shuffle_buffer"])
  _positive(c, "eval", ["batches", "batch_size"])
  if c.eval.equal_mass_buckets == 1 or c.eval.equal_mass_buckets < 0:
    _fail("eval.equal_mass_buckets", c.eval.equal_mass_buckets, "0 (off) or at least 2")
  if c.eval.downstream_limit < 0:
    _fail("eval.downstream_limit", c.eval.downstream_limit, "0 (all items) or a positive count")
  edges = list(c.eval.freq_bucket_edges)
  if (not edges or not all(isinstance(e, numbers.Real) and not isinstance(e, bool)
                           for e in edges)
      or edges != sorted(set(edges)) or edges[0] <= 0):
    _fail("eval.freq_bucket_edges", tuple(edges), "increasing positive counts")
  return c


def _merge(base: ml_collections.ConfigDict, saved: dict, source, prefix: str = "") -> None:
  for key, value in saved.items():
    if key in base and isinstance(base[key], ml_collections.ConfigDict) and isinstance(
        value, dict):
      _merge(base[key], value, source, f"{prefix}{key}.")
      continue
    if key in base and isinstance(base[key], tuple) and isinstance(value, list):
      value = tuple(value)
    elif key in base and isinstance(base[key], float) and isinstance(value, int):
      value = float(value)
    try:
      with base.unlocked():
        base[key] = value
    except TypeError as e:
      raise ConfigError(
          f"{source}: stored config.{prefix}{key} = {value!r} does not fit this lev_jax "
          f"(expected {type(base[key]).__name__}); the checkpoint is from an older "
          "version") from e


def from_dict(stored: dict, source) -> ml_collections.ConfigDict:
  """A config stored as JSON (a checkpoint's or an export's), over `base_config()`.

  Fields added since it was stored get their defaults; stored lists become the tuples
  the config declares, stored ints the declared floats; unknown fields are kept.

  Args:
    stored: the config's `to_dict()` as read back from JSON.
    source: where it was read (a path), named in the errors.
  Returns:
    The validated ConfigDict.
  Raises:
    ConfigError: "SOURCE: stored config.FIELD = VALUE does not fit ..." (a value of
      another type than the field's), or "SOURCE: the stored config is not valid: ..."
      (`validate`).
  """
  config = base_config()
  _merge(config, stored, source)
  try:
    return validate(config, allow_unknown=True)
  except ConfigError as e:
    raise ConfigError(f"{source}: the stored config is not valid: {e}") from e
