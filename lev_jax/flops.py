"""Analytic training FLOPs per optimizer step, and model FLOPs utilisation (MFU).

Units: FLOPs are floating-point operations, one multiply-add = 2 FLOPs; times are
seconds; peaks are FLOP/s per chip. Everything is a pure function of the config: no
model is built and nothing is traced, so it is free to call from the trainer.

What is counted (the MFU convention of PaLM, Chowdhery et al. 2022, arXiv 2204.02311,
appendix B): *model* FLOPs, the matrix multiplications the model needs for one forward
and one backward pass, whatever the implementation. Not counted:
  - rematerialisation: the forward recomputed in the backward pass by `model.remat`
    (nnx.remat per block, by policy) and by LEV's `jax.checkpoint` chunks. That is
    hardware work, not model work; PaLM's MFU excludes it so that a run does not look
    more efficient by recomputing more. `remat_flops_per_step` reports it apart (the
    matmuls actually recomputed), so hardware matmul FLOPs ~= train_flops_per_step()
    ["total"] + remat_flops_per_step()["total"] + the overheads listed below.
  - elementwise and reduction work: RMSNorm, RoPE, SiLU, softmax, the cross-entropy,
    the optimizer update, and LEV's LayerNorm, sigmoid, B-spline basis and log-space
    product (see "LEV" below). These are not matrix-unit work and are conventionally
    left out (PaLM; Kaplan et al. 2020, Table 1; Hoffmann et al. 2022, appendix F).
  - gathers and scatters: the tied/untied input lookup, LEV's codebook lookup, the
    table-mode gather of LEV rows and their gradient scatter-add: 0 FLOPs.
  - work the implementation adds on top of the model: LEV's last chunk padded to
    lev.chunk_size; the upper triangle of the causal mask, which XLA's
    dot_product_attention(implementation="xla") computes and then masks; and any
    computation repeated on several devices (LEV's parameters are replicated, so a
    table-mode LEV evaluation that is not sharded over the ids runs on every device).
The padded vocabulary V (vocab_size rounded up to vocab_multiple) *is* counted: the
head's matmul and LEV's table are that wide.

Symbols: T = train.global_batch_size * train.seq_len tokens per step; B = global batch
(sequences); L = seq_len; n_micro = train.grad_accum_steps; D = d_model; H = n_heads;
G = n_kv_heads; K = head_dim; F = d_ff; n_layers; V = padded vocab. LEV: S = d_seed,
Hl = lev.n_heads, J = n_knots, R = rank.

Backward = 2 x forward for every matmul (one product for the input gradient, one for
the weight gradient), so a training step is 3 x forward, i.e. 6 FLOPs per multiply-add
per (token, weight) pair:

  backbone  = 6 * T * n_layers * P_layer,
              P_layer = D*H*K + 2*D*G*K + H*K*D + 3*D*F   (wq, wk+wv, wo, SwiGLU)
  attention = 3 * n_layers * [2 * 2 * B * L * L * H * K / 2]
            = 6 * n_layers * B * L**2 * H * K
              (q.k scores and the probability-weighted sum of v, each 2*B*L*L*H*K for
              the full square; causal attention only needs the lower triangle, counted
              as half the square. PaLM's 12*n_layers*H*K*L per token counts the full
              square; we count half of it, 6*n_layers*H*K*L per token, as the useful
              work. Grouped-query attention does not change it: scores are per query
              head.)
  head      = 6 * T * D * V            (tied and untied alike: the output matmul is
                                        D x V either way; the tied input gather is free)
  lev       = 3 * n_micro * rows * f_lev          (`lev` embedding only; else 0)
              f_lev = 2*Hl*S*S  +  2*Hl*S*J*R  +  2*Hl*R*D   forward FLOPs per LEV row:
                      seed proj    phi einsum     output projection
              rows  = LEV rows evaluated per micro-batch, from the one decision
                      `lev.evaluation_plan` that `embeddings.LEVEmbedding.embed` uses:
                      'table'  -> V (the whole padded vocab, once per micro-batch)
                      'tokens' -> T / n_micro (one row per token of the micro-batch)
                      'unique' -> U, the static distinct-id bound (lev.unique_size)
                      'auto'   -> the fewest of the three
  total     = backbone + attention + head + lev

Check: with a shared table counted once as the head, backbone + head = 6 T (N - norms)
where N is the non-input-embedding parameter count: the usual 6N rule per token
(Kaplan et al. 2020), to within the RMSNorm scales.

LEV: all of LEV's matmuls are float32 (lev.py casts its parameters), yet MFU compares
them with the bf16 peak like everything else: MFU is a ratio of model FLOPs to one
nominal peak, not a per-op efficiency. The elementwise LEV work (B-spline basis on
Hl*S*J values, the sum over J and log/abs/exp product on Hl*S*R values, LayerNorm and
sigmoid on Hl*S) is NOT counted; at the paper's defaults (S=128, Hl=8, J=16, R=64,
D=2048) it is roughly Hl*S*(13*J + 7*R) ~ 0.67 MFLOP per row against f_lev ~ 4.46 MFLOP,
and it runs on the vector units, not the matrix units.

MFU = train_flops_per_step(config)["total"] / (step_time_s * n_devices * peak), with
peak the dense bf16 FLOP/s of one chip (PEAK_BF16_FLOPS). It assumes one JAX device per
chip, which holds for GPUs and for TPU v4/v5p (megacore: one device per two-core chip),
v5e and v6e.

Peak sources (dense bf16 per chip, no 2:4 sparsity; NVIDIA's Hopper datasheets print
the sparse figure and note that dense is one half of it), in TFLOP/s:
  TPU v4     275    cloud.google.com/tpu/docs/v4 (system architecture): "Peak compute
                    per chip 275 teraflops (bf16 or int8)"
  TPU v5e    197    cloud.google.com/tpu/docs/v5e: "Peak compute per chip (bf16) 197"
  TPU v5p    459    cloud.google.com/tpu/docs/v5p: "Peak compute per chip (bf16) 459"
  TPU v6e    918    cloud.google.com/tpu/docs/v6e: "Peak compute per chip (bf16) 918"
  A100       312    NVIDIA A100 datasheet: BFLOAT16 Tensor Core 312 (624 with
                    sparsity); the same for SXM4 and PCIe, 40 and 80 GB
  H100 SXM   989.5  NVIDIA H100 datasheet: BF16 Tensor Core 1,979 with sparsity (the
                    Hopper whitepaper's dense figure is 989.4)
  H100 PCIe  756.5  NVIDIA H100 datasheet: 1,513 with sparsity
  H100 NVL   835.5  NVIDIA H100 datasheet: 1,671 with sparsity
  H200 SXM   989.5  NVIDIA H200 datasheet: 1,979 with sparsity (same die as H100 SXM)
  H200 NVL   835.5  NVIDIA H200 datasheet: 1,671 with sparsity
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import ml_collections

from lev_jax.config import ConfigError, padded_vocab_size
from lev_jax.lev import dense_plan, evaluation_plan

PARTS = ("backbone", "attention", "head", "lev")

# Dense bf16 peak FLOP/s per chip (sources: the module docstring, and per line below).
PEAK_BF16_FLOPS = {
    "TPU v4": 275e12,           # cloud.google.com/tpu/docs/v4, system architecture
    "TPU v5e": 197e12,          # cloud.google.com/tpu/docs/v5e, system architecture
    "TPU v5p": 459e12,          # cloud.google.com/tpu/docs/v5p, system architecture
    "TPU v6e": 918e12,          # cloud.google.com/tpu/docs/v6e, system architecture
    "NVIDIA A100": 312e12,      # A100 datasheet: BFLOAT16 Tensor Core 312 (624 sparse)
    "NVIDIA H100 SXM": 1979e12 / 2,   # H100 datasheet: 1,979 with sparsity, SXM
    "NVIDIA H100 PCIe": 1513e12 / 2,  # H100 datasheet: 1,513 with sparsity, PCIe
    "NVIDIA H100 NVL": 1671e12 / 2,   # H100 datasheet: 1,671 with sparsity, NVL
    "NVIDIA H200 SXM": 1979e12 / 2,   # H200 datasheet: 1,979 with sparsity, SXM
    "NVIDIA H200 NVL": 1671e12 / 2,   # H200 datasheet: 1,671 with sparsity, NVL
}

# jax `device.device_kind` (lower-cased, spaces collapsed) -> PEAK_BF16_FLOPS key; each
# pattern must match the whole string. JAX names TPU v5e 'TPU v5 lite', v5p 'TPU v5',
# v6e 'TPU v6 lite'; 'TPU v4 lite' (v4i) is another chip and matches nothing. CUDA
# names: 'NVIDIA H100 80GB HBM3' (SXM), 'NVIDIA H100 PCIe', 'NVIDIA H100 NVL',
# 'NVIDIA H200' (SXM), 'NVIDIA H200 NVL', 'NVIDIA A100-SXM4-80GB', 'NVIDIA A100 80GB PCIe'.
_DEVICE_KINDS = (
    (r"tpu v4", "TPU v4"),
    (r"tpu v5 lite|tpu v5e", "TPU v5e"),
    (r"tpu v5|tpu v5p", "TPU v5p"),
    (r"tpu v6 lite|tpu v6e", "TPU v6e"),
    (r"nvidia a100(-sxm4?|-pcie)?(-(40|80)gb)?|nvidia a100 (40|80)gb pcie", "NVIDIA A100"),
    (r"nvidia h100( sxm5?)?( 80gb)?( hbm3)?", "NVIDIA H100 SXM"),
    (r"nvidia h100 pcie( 80gb)?", "NVIDIA H100 PCIe"),
    (r"nvidia h100 nvl", "NVIDIA H100 NVL"),
    (r"nvidia h200( sxm5?)?( 141gb)?( hbm3e)?", "NVIDIA H200 SXM"),
    (r"nvidia h200 nvl", "NVIDIA H200 NVL"),
)


def tokens_per_step(config: ml_collections.ConfigDict) -> int:
  """T = train.global_batch_size * train.seq_len (input positions, padding included)."""
  return int(config.train.global_batch_size) * int(config.train.seq_len)


def _micro_batches(config) -> int:
  t = config.train
  n_micro = int(t.grad_accum_steps)
  if n_micro <= 0 or t.global_batch_size % n_micro:
    raise ConfigError(f"config.train.grad_accum_steps = {t.grad_accum_steps!r}: expected a "
                      f"divisor of train.global_batch_size = {t.global_batch_size}")
  return n_micro


def _lev_plan(config: ml_collections.ConfigDict) -> tuple[str, int, int, int]:
  """(strategy, rows, padded vocab, micro-batch tokens): `lev.evaluation_plan` for the
  shapes of one micro-batch, the decision `embeddings.LEVEmbedding.embed` makes."""
  vocab = padded_vocab_size(config.model.vocab_size, config.model.vocab_multiple)
  micro_tokens = tokens_per_step(config) // _micro_batches(config)
  strategy, rows = evaluation_plan(config.lev.mode, vocab, micro_tokens,
                                   config.lev.get("unique_size", 0))
  return strategy, rows, vocab, micro_tokens


def lev_rows_per_micro_batch(config: ml_collections.ConfigDict) -> int:
  """LEV rows evaluated per micro-batch, as `lev.evaluation_plan` decides for the
  embedding: V ('table'), micro-batch tokens ('tokens'), the static distinct-id bound
  ('unique', counted as if no micro-batch overflowed it), the fewest of them ('auto').
  """
  return _lev_plan(config)[1]


def lev_plan_line(config: ml_collections.ConfigDict) -> str:
  """One log line: LEV's core and the rows it is evaluated on per micro-batch."""
  strategy, rows, vocab, micro_tokens = _lev_plan(config)
  lv = config.lev
  line = (f"LEV: {lv.impl} core, lev.mode={lv.mode} -> {strategy}: {rows:,} rows per "
          f"micro-batch of {micro_tokens:,} tokens (padded vocab {vocab:,})")
  if strategy == "unique":
    dense, _ = dense_plan(vocab, micro_tokens)
    line += (f"; a micro-batch with more than {rows:,} distinct ids runs {dense} mode "
             "instead (exact, slower)")
  return line


def lev_forward_flops_per_row(config: ml_collections.ConfigDict) -> int:
  """f_lev = 2*Hl*S*S + 2*Hl*S*J*R + 2*Hl*R*D: LEV's matmul FLOPs for one id."""
  lv, d = config.lev, config.model.d_model
  h, s, j, r = lv.n_heads, lv.d_seed, lv.n_knots, lv.rank
  return 2 * h * s * s + 2 * h * s * j * r + 2 * h * r * d


def _layer_matmul_params(m) -> int:
  """P_layer: wq D*H*K + wk, wv 2*D*G*K + wo H*K*D + SwiGLU 3*D*F."""
  d, h, g, k, f = m.d_model, m.n_heads, m.n_kv_heads, m.head_dim, m.d_ff
  return d * h * k + 2 * d * g * k + h * k * d + 3 * d * f


def train_flops_per_step(config: ml_collections.ConfigDict) -> dict:
  """Model FLOPs of one optimizer step (forward + backward, all micro-batches).

  Returns:
    {"backbone", "attention", "head", "lev", "total"}: Python ints (exact), FLOPs.
  Raises:
    ConfigError: grad_accum_steps does not divide global_batch_size, or an unknown
      lev.mode for a `lev` model.
  """
  m, t = config.model, config.train
  n_micro = _micro_batches(config)
  tokens = tokens_per_step(config)
  d, h, k = m.d_model, m.n_heads, m.head_dim
  vocab = padded_vocab_size(m.vocab_size, m.vocab_multiple)
  out = {
      "backbone": 6 * tokens * m.n_layers * _layer_matmul_params(m),
      # 3 x forward; forward per layer = 2 * 2 * B * L * L * H * K / 2 (causal half).
      "attention": 3 * m.n_layers * 2 * t.global_batch_size * t.seq_len ** 2 * h * k,
      "head": 6 * tokens * d * vocab,
      "lev": 0,
  }
  if m.embedding == "lev":
    rows = lev_rows_per_micro_batch(config)
    out["lev"] = 3 * n_micro * rows * lev_forward_flops_per_row(config)
  out["total"] = sum(out[p] for p in PARTS)
  return out


# config.model.remat -> which parts of the block forward the backward pass recomputes.
# "none"/False: nothing. "full"/True (nothing_saveable): the whole block.
# "dots" (dots_saveable): every dot_general output is kept, so no matmul is recomputed.
# "dots_no_batch" (dots_with_no_batch_dims_saveable): the weight matmuls (no batch
# dimensions) are kept; the attention scores and weighted values (batched over B and
# heads) are recomputed.
_REMAT_RECOMPUTES = {
    "none": (), "full": ("backbone", "attention"), "dots": (),
    "dots_no_batch": ("attention",),
}


def remat_flops_per_step(config: ml_collections.ConfigDict, remat: str | None = None
                         ) -> dict:
  """Matmul FLOPs recomputed by rematerialisation in one step (hardware, not model).

  Only forward matmuls whose outputs the backward pass needs are recomputed; XLA drops
  the rest. Checked on compiled HLO (XLA:CPU, jax 0.10): under "full", every block
  matmul but w_down is recomputed (w_down's output is the block output, which remat
  keeps), so backbone = 2 * T * n_layers * (P_layer - D*F); attention recomputes its
  forward, 1/3 of its training FLOPs ("full" and "dots_no_batch"). LEV always runs under
  `jax.checkpoint` with no saved residuals: its seed projection and phi einsum are
  recomputed, its output projection (the checkpoint's output) is not:
  lev = n_micro * rows * (2*Hl*S*S + 2*Hl*S*J*R). A bool model.remat reads as
  "full" / "none". Same conventions as `train_flops_per_step` (causal half, no chunk
  padding). `remat`: the policy to count instead of config.model.remat, which must be
  given when that is "auto" (resolved for the devices: lev_jax.remat.resolve).

  Returns:
    {"backbone", "attention", "head", "lev", "total"}: ints, FLOPs (head is always 0).
  Raises:
    ConfigError: unknown model.remat, or "auto" without `remat`.
  """
  remat = config.model.get("remat", "none") if remat is None else remat
  if remat == "auto":
    raise ConfigError("config.model.remat = 'auto': resolve it for the devices first "
                      "(lev_jax.remat.resolve) and pass the policy as remat=")
  if isinstance(remat, bool):
    remat = "full" if remat else "none"
  if remat not in _REMAT_RECOMPUTES:
    raise ConfigError(f"config.model.remat = {remat!r}: expected one of "
                      + ", ".join(repr(r) for r in _REMAT_RECOMPUTES))
  parts = _REMAT_RECOMPUTES[remat]
  m = config.model
  model = train_flops_per_step(config)
  out = dict.fromkeys(PARTS, 0)
  if "backbone" in parts:
    out["backbone"] = (2 * tokens_per_step(config) * m.n_layers
                       * (_layer_matmul_params(m) - m.d_model * m.d_ff))
  if "attention" in parts:
    out["attention"] = model["attention"] // 3
  if m.embedding == "lev":
    lv = config.lev
    out["lev"] = (_micro_batches(config) * lev_rows_per_micro_batch(config)
                  * 2 * lv.n_heads * lv.d_seed * (lv.d_seed + lv.n_knots * lv.rank))
  out["total"] = sum(out[p] for p in PARTS)
  return out


def _normalise_kind(device_kind: str) -> str:
  return " ".join(str(device_kind).lower().replace("_", " ").split())


def peak_flops_per_device(device_kind: str) -> float | None:
  """Dense bf16 peak FLOP/s of one chip for a jax `device.device_kind`, or None.

  Only the chips in PEAK_BF16_FLOPS are known; anything else ('cpu', 'TPU v4 lite',
  'TPU v3', 'NVIDIA GH200 480GB', 'NVIDIA A10G', ...) is None: never a guess.
  """
  if not isinstance(device_kind, str):
    return None
  kind = _normalise_kind(device_kind)
  for pattern, name in _DEVICE_KINDS:
    if re.fullmatch(pattern, kind):
      return PEAK_BF16_FLOPS[name]
  return None


def _check_time_devices(step_time_s, n_devices):
  if not step_time_s > 0:
    raise ValueError(f"step_time_s = {step_time_s!r}: expected a positive number of seconds")
  if not n_devices >= 1:
    raise ValueError(f"n_devices = {n_devices!r}: expected at least 1")


def mfu(flops_per_step, step_time_s: float, n_devices: int,
        device_kind: str) -> float | None:
  """Model FLOPs utilisation: flops_per_step / (step_time_s * n_devices * peak).

  Args:
    flops_per_step: model FLOPs of one step (a number, or the dict from
      `train_flops_per_step`, whose "total" is used).
    step_time_s: wall-clock seconds per optimizer step.
    n_devices: chips the step ran on (jax.device_count()).
    device_kind: jax `device.device_kind` of those chips.
  Returns:
    A fraction in [0, 1] for a sane measurement; None when the peak is unknown.
  Raises:
    ValueError: step_time_s <= 0 or n_devices < 1.
  """
  if isinstance(flops_per_step, Mapping):
    flops_per_step = flops_per_step["total"]
  _check_time_devices(step_time_s, n_devices)
  peak = peak_flops_per_device(device_kind)
  if peak is None:
    return None
  return float(flops_per_step) / (step_time_s * n_devices * peak)


def tokens_per_s_per_device(tokens: int, step_time_s: float, n_devices: int) -> float:
  """Throughput per chip: tokens per step (e.g. `tokens_per_step(config)`) / time / chips.

  Raises:
    ValueError: step_time_s <= 0 or n_devices < 1.
  """
  _check_time_devices(step_time_s, n_devices)
  return tokens / step_time_s / n_devices


# LEV's vector-unit and memory cost, for the share of a step it takes on an accelerator
# (an estimate from counts, not a measurement). Operations per (row, LEV head, seed
# coordinate, rank) element, float32, counted from the code paths in lev.py:
#   reference  forward: phi einsum over J knots (2J, a matmul: counted in `lev` FLOPs
#              above, not here), + sum of B, |.| + eps, log, sum, sign count (~26 with a
#              log at ~20); backward under jax.checkpoint: the forward again (~26) plus
#              the log's and |.|'s gradients (~6); the einsum's two gradient matmuls
#              (4J, counted as matmul FLOPs).
#              Memory: the [rows, H, S, R] phi tensor and its log are written and read
#              ~6 times (forward, recompute, gradient) at 4 bytes.
#   fused      forward: 3 gathered rows x FMA (6) + 1 add, factor (2), mantissa /
#              exponent split (5), product (1), a log per log_group elements (~20/G);
#              backward: the forward's phi again (~9), divide (~4), three multiply-reduce
#              (6), one-hot basis and the g_delta matmul over rows (2J, a matmul on an
#              accelerator but counted here as vector work to stay conservative).
#              Memory: only [rows, H, S, W] window weights and knots (~4 passes) and the
#              [rows, H, R] modes (~3 passes); delta (H*S*J*R floats, 4 MiB at the
#              paper's defaults) stays in on-chip cache.
_LEV_VECTOR_OPS = {"reference": lambda j, g: 26 + 26 + 6,
                   "fused": lambda j, g: 15 + 20 / g + 19 + 2 * j}
_LEV_BYTES = {"reference": lambda h, s, r, w: 6 * h * s * r * 4,
              "fused": lambda h, s, r, w: 4 * h * s * w * 8 + 3 * h * r * 4}

# Per-chip throughputs for the estimate: dense bf16 peak (PEAK_BF16_FLOPS), float32
# non-tensor FLOP/s and HBM bandwidth (NVIDIA H200 datasheet: FP32 67 TFLOPS, 4.8 TB/s).
ACCELERATORS = {"NVIDIA H200 SXM": {"vector_flops": 67e12, "hbm_bytes_per_s": 4.8e12}}


def lev_step_share(config: ml_collections.ConfigDict, impl: str,
                   device: str = "NVIDIA H200 SXM", mfu_fraction: float = 0.5) -> dict:
  """LEV's estimated share of a training step on an accelerator (analytic model).

  step time = model FLOPs without LEV / (peak * mfu_fraction) + LEV time, with
    LEV time = LEV matmul FLOPs / (peak * mfu_fraction)
             + max(vector ops / vector FLOP/s, bytes moved / HBM bandwidth)
  and the per-element counts above (`_LEV_VECTOR_OPS`, `_LEV_BYTES`) over rows x H x S x
  R elements, rows = `lev_rows_per_micro_batch` x micro-batches. An estimate to compare
  implementations and shapes, not a measurement.

  Args:
    config: a `lev` model config.
    impl: "reference" or "fused" (the Pallas kernel does the fused path's work).
    device: a key of ACCELERATORS.
    mfu_fraction: the model FLOPs utilisation assumed for matmul work.
  Returns:
    {"rows", "step_s", "lev_s", "lev_matmul_s", "lev_vector_s", "lev_memory_s",
     "share"}: rows per step, seconds, and LEV time / step time.
  Raises:
    ConfigError: not a `lev` model, or an unknown impl / device.
  """
  if config.model.embedding != "lev":
    raise ConfigError(f"config.model.embedding = {config.model.embedding!r}: expected 'lev'")
  if impl not in _LEV_VECTOR_OPS or device not in ACCELERATORS:
    raise ConfigError(f"impl = {impl!r}, device = {device!r}: expected one of "
                      f"{sorted(_LEV_VECTOR_OPS)} and one of {sorted(ACCELERATORS)}")
  lv, d = config.lev, config.model.d_model
  h, s, j, r = lv.n_heads, lv.d_seed, lv.n_knots, lv.rank
  rows = lev_rows_per_micro_batch(config) * _micro_batches(config)
  flops = train_flops_per_step(config)
  peak = PEAK_BF16_FLOPS[device] * mfu_fraction
  matmul = 3 * rows * (2 * h * s * s + 2 * h * r * d)
  if impl == "reference":
    matmul += 3 * rows * 2 * h * s * j * r
  elements = rows * h * s * r
  vector_s = elements * _LEV_VECTOR_OPS[impl](j, lv.log_group) / ACCELERATORS[device][
      "vector_flops"]
  window = j if lv.basis == "khronos" else 3
  memory_s = rows * _LEV_BYTES[impl](h, s, r, window) / ACCELERATORS[device][
      "hbm_bytes_per_s"]
  lev_s = matmul / peak + max(vector_s, memory_s)
  step_s = (flops["total"] - flops["lev"]) / peak + lev_s
  return {"rows": rows, "step_s": step_s, "lev_s": lev_s, "lev_matmul_s": matmul / peak,
          "lev_vector_s": vector_s, "lev_memory_s": memory_s, "share": lev_s / step_s}
