"""lev_jax: JAX/Flax pretraining of Leviathan language models and their tied baselines.

Leviathan (arXiv 2601.22040) replaces the input embedding table with LEV, a small
continuous generator from token id to embedding, and keeps an untied output head.

Modules, one concern each:
  config      base experiment config and its validation
  lev         the LEV generator (digits, codebooks, B-spline separable product)
  embeddings  tied / untied / lev embeddings behind embed() and unembed()
  model       LLaMA-style decoder
  optimizer   AdamW, clipping, warm-up + cosine schedule
  train       train state, jitted train and eval steps
  evaluate    validation perplexity, per token-frequency bucket
  scaling     power-law fits, effective parameters, tokens to reach a target loss
  checkpoint  every Orbax read and write: train checkpoints (state, data iterator,
              config), the params-only restore, an export's parameters
  workdir     the run folder's map: every file and folder name lev_jax writes
  lock        one writer per output folder (fcntl lock)
  metrics     metrics.jsonl and TensorBoard writers
  trainer     the training loop;  main: `lev-train`;  params: `lev-params`
  prepare_data  `lev-prepare-data` (the command; the work is in data.prepare)
  data        readers (corpus, stream), tokenizers, grain pipeline, prepared
              ArrayRecord datasets (prepare, prepared, tfds_builder), seqio Tasks
  inference   a workdir or export loaded for inference; the params-only export
  decode      KV-cached generation (greedy, temperature, top-k, top-p);  sample: `lev-sample`
  scoring     log-likelihood of continuations and texts (lm-eval semantics)
  downstream  zero-shot LAMBADA, HellaSwag, PIQA, ARC-E/C, WinoGrande from released files
  lm_eval_adapter  the lm-eval-harness model `lev_jax` (`lev-lm-eval`)
  eval_cli    `lev-eval`: perplexity, frequency buckets, zero-shot tasks of a checkpoint
  hf_export   Hugging Face LLaMA export (safetensors + config);  export: `lev-export`
  ladder      collect and analyse a ladder of runs;  report: plots, CSV, Markdown;
              ladder_cli: `lev-ladder`
  study       a seeded study (cells x seeds, paired t-intervals, validation selection,
              test table);  study_report;  study_cli: `lev-study`

Shape legend used in names (x_BxLxD):
  B batch (sequences)  L seq_len  D d_model  V padded vocab  H heads  G kv heads
  K head_dim (or LEV digits)  F d_ff  N flat ids  S LEV d_seed (KV-cache slots in
  decode)  T new tokens (decode)  J knots  R LEV rank
"""

from pathlib import Path

__version__ = "0.1.0"


def experiments_dir() -> Path:
  """The repo's experiments/ folder (next to the package in a source checkout)."""
  return Path(__file__).resolve().parent.parent / "experiments"
