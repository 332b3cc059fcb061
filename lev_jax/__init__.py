"""lev_jax: JAX/Flax pretraining of Leviathan language models and their tied baselines.

Leviathan (arXiv 2601.22040) replaces the input embedding table with LEV, a small
continuous generator from token id to embedding, and keeps an untied output head.

Where things live (library first; commands only in cli/, which no library module imports):
  config      base experiment config, validation, stored-config merge (from_dict)
  experiments the repo's experiment files, imported by path (load_experiment)
  workdir     every name in a run folder, export folder and ladder root; atomic JSON
  lock        one writer per output folder (fcntl lock file)
  error_log   libraries' own error reports (Orbax's tracebacks) to a file, not the terminal
  parent_watch  worker processes that end with their parent (lev-prepare-data's pool)
  lev         the LEV generator (digits, codebooks, B-spline separable product);
              lev_pallas: its Pallas kernels
  embeddings  tied / untied / lev embeddings behind embed() and unembed()
  model       LLaMA-style decoder;  sharding: mesh and the one logical-axis rules table
  dense       the weight matmuls;  portable: XLA:CPU set-up for CPU-independent bits
  optimizer   AdamW, clipping, warm-up + cosine schedule, parameter groups
  train       train state, jitted train and eval steps;  trainer: the training loop
  flops       model FLOPs and MFU;  params: parameter counts by part
  aot         ahead-of-time compile of the steps for a TPU slice / GPUs (lev-compile);
              topology: slice and GPU names, compile-only devices; gpu_targets: the
              H100 / H200 descriptions; target: the platform a trace is for
  checkpoint  all Orbax I/O: state, data iterator, config, params-only restore, exports;
              checkpoint_checks: checksum manifest, stored-config checks, quarantine
  metrics     metrics.jsonl and TensorBoard writers;  distributed: multi-host set-up
  inference   a workdir or export loaded for inference;  decode: KV-cached generation
  hf_export   Hugging Face LLaMA export (safetensors + config)
  data/       readers (corpus, stream, embedded), splits, tokenizers, grain pipeline,
              prepared ArrayRecord datasets, TFDS builder, seqio Tasks; `load` in sources
  eval/       evaluate (perplexity, frequency buckets), scoring, downstream (zero-shot
              tasks from released files), checkpoint_eval (what lev-eval computes),
              lm_eval_adapter (the lm-eval model "lev_jax")
  ladder/     runs (read a ladder's run folders), analysis (the paper's comparisons),
              scaling (power-law fits), report
              (CSV, Markdown) and plots (PNGs), study, study_report and study_plots
              (seeded studies), reporting (text, tables, provenance both reports share)
  cli/        common (flags, one-line errors, --help) and one module per command:
              train (lev-train), params, prepare_data, eval, ladder, study, export,
              sample, lm_eval, compile

Shape legend used in names (x_BxLxD):
  B batch (sequences)  L seq_len  D d_model  V padded vocab  H heads  G kv heads
  K head_dim (or LEV digits)  F d_ff  N flat ids  S LEV d_seed (KV-cache slots in
  decode)  T new tokens (decode)  J knots  R LEV rank
"""

__version__ = "0.1.0"

from lev_jax import portable as _portable

# Before any JAX backend starts: CPU float32 results that do not depend on the CPU model
# or its thread count (lev_jax/portable.py; LEV_JAX_PORTABLE_CPU=0 switches it off).
_portable.configure_environment()
