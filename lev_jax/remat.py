"""model.remat = "auto": which layer rematerialisation a program gets, from an estimate
of the activations its backward pass would keep.

A decoder layer's backward pass needs its forward's intermediates. Without remat XLA
keeps them all; `dots_no_batch` (jax.checkpoint_policies.dots_with_no_batch_dims_saveable)
keeps the weight matmuls' outputs and recomputes the rest; `full` (nothing_saveable)
keeps only each layer's input and recomputes the layer. What is kept, per token and
layer, in bytes (`saved_bytes_per_token_layer`; d = d_model, F = d_ff, H = n_heads,
L = seq_len):

  none            32 d + 16 F, plus 4 H L for XLA attention's scores and probabilities
  dots_no_batch   16 d + 8 F
  full            4 d

Calibrated on XLA:TPU's buffer assignment (jax 0.10.2, libtpu 0.0.42.1) of tied_200m
(d 768, F 2,048, H 12, 6 layers) on 4 v5p chips at 65,536 tokens a chip
(benchmarks/head_attention_compile.py --setups small; docs/results.md): the temporaries
were 25.03 GiB (none, splash), 14.65 (dots_no_batch), 4.40 (full) and 35.50 (none, XLA
attention); the differences give 56.3, 28.0 and 26.3 KB per token and layer where the
rows above give 57.3, 28.7 and 24.6. Checked on other shapes (v5p-32, 16,384 tokens a
chip, the dense loss, splash): none -> dots_no_batch saved 76.7 KB per token and layer
at 800M (d 1,536, F 4,096; 57.3 estimated) and 145.9 KB at 1.2B (d 2,048, F 5,632; 77.8
estimated): the estimate runs low at larger shapes, so auto errs towards less remat. A
guide for choosing, not a memory figure: lev-compile reports what XLA assigns.

auto takes the first of none, dots_no_batch, full whose estimate, for the tokens of a
micro-batch spread over the devices, is within 1/AUTO_MEMORY_SHARE of a device's memory
(full when none is), and none where the memory is unknown (a CPU). With
train.loss_impl = auto (lev_jax/loss.py: the dense logits within a quarter) this leaves
at least half of a device's memory to the training state and XLA's other buffers. The
ladder's rungs on their v5p-128 slice stay at none (4,096 tokens a chip); tied_200m on 4
chips (65,536 tokens a chip, 21 GiB estimated without remat) gets dots_no_batch.
MaxText leaves remat_policy to the user ("full" by default); Levanter remats every layer
by default.
"""

from __future__ import annotations

import ml_collections

from lev_jax.config import REMAT_POLICIES

AUTO_MEMORY_SHARE = 5  # auto: the saved activations within 1/5 of a device's memory
AUTO_ORDER = ("none", "dots_no_batch", "full")  # least recompute first


def saved_bytes_per_token_layer(model_cfg, policy: str, seq_len: int,
                                xla_attention: bool) -> int:
  """Bytes one layer keeps for its backward pass per token under `policy` (module
  docstring: the calibrated rows).

  Args:
    model_cfg: config.model (d_model, d_ff, n_heads).
    policy: "none", "dots_no_batch" or "full" (`dots` keeps every matmul output, the
      attention's batched ones included: counted as none).
    seq_len: L, tokens per row (the XLA attention's scores are [H, L] per token).
    xla_attention: the attention kernel is XLA's (its scores kept without remat);
      splash and cuDNN keep none.
  Raises:
    ValueError: an unknown policy.
  """
  d, f = model_cfg.d_model, model_cfg.d_ff
  if policy in ("none", "dots"):
    return 32 * d + 16 * f + (4 * model_cfg.n_heads * seq_len if xla_attention else 0)
  if policy == "dots_no_batch":
    return 16 * d + 8 * f
  if policy == "full":
    return 4 * d
  raise ValueError(f"model.remat = {policy!r}: expected one of "
                   + ", ".join(repr(p) for p in REMAT_POLICIES))


def choose(model_cfg, *, tokens: int, seq_len: int, n_devices: int,
           memory_bytes: int | None, xla_attention: bool) -> tuple[str, str]:
  """What config.model.remat becomes for a micro-batch of `tokens` tokens (all rows,
  seq_len each) spread over `n_devices` devices of `memory_bytes` each (None: unknown,
  e.g. a CPU).

  Returns:
    (policy, why): an explicit policy stays ("model.remat"); auto gives the first of
    AUTO_ORDER whose `saved_bytes_per_token_layer` x n_layers x tokens / n_devices is
    within memory_bytes / AUTO_MEMORY_SHARE, else "full"; "none" for unknown memory.
  """
  requested = model_cfg.remat
  if requested != "auto":
    return requested, "model.remat"
  if memory_bytes is None:
    return "none", "auto; device memory unknown (CPU)"
  per_device = tokens / max(n_devices, 1) * model_cfg.n_layers
  share = memory_bytes / AUTO_MEMORY_SHARE
  gib = lambda n: f"{n / 2**30:.1f} GiB"
  estimates = {p: saved_bytes_per_token_layer(model_cfg, p, seq_len, xla_attention)
               * per_device for p in AUTO_ORDER}
  for policy in AUTO_ORDER:
    if estimates[policy] <= share:
      break
  shown = ", ".join(f"{p} {gib(estimates[p])}" for p in AUTO_ORDER)
  return policy, (f"auto; activations kept per device (estimate): {shown}; the first "
                  f"within 1/{AUTO_MEMORY_SHARE} of its {gib(memory_bytes)}"
                  + ("" if estimates[policy] <= share else ": none is, so full"))


def resolve(config: ml_collections.ConfigDict, n_devices: int, memory_bytes: int | None,
            attention_kernel: str) -> tuple[str, str]:
  """`choose` for a train step of `config` (a micro-batch: global_batch_size /
  grad_accum_steps rows of train.seq_len) on `n_devices` devices; attention_kernel is
  model.attention resolved ("xla", "splash" or "cudnn": lev_jax.attention.resolve). The
  trainer logs it once; lev-compile's program line shows it."""
  t = config.train
  return choose(config.model, tokens=t.global_batch_size // t.grad_accum_steps * t.seq_len,
                seq_len=t.seq_len, n_devices=n_devices, memory_bytes=memory_bytes,
                xla_attention=attention_kernel == "xla")
