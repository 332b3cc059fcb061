"""Autoregressive generation: greedy, temperature, top-k and top-p sampling, KV-cached.

`generate(model, prompts, max_new_tokens=...)` left-pads the prompts into one batch,
fills the key/value cache with one forward pass over the prompts (the prefill), then
runs one cached step per new token inside a single `jax.lax.while_loop` in one `jit`
(standard KV caching; Pope et al. 2022, "Efficiently Scaling Transformer Inference",
Sec. 2). It compiles once per (model, batch size, longest prompt, max_new_tokens,
greedy or sampled); temperature, top_k, top_p, seed and stop ids are run-time values.

Left padding: row b of the batch holds P - len(prompt_b) padding slots, then its prompt,
then its generated tokens; RoPE positions restart at 0 at the row's first real token and
padding slots are never attended, so a row's tokens do not depend on the other rows.

Token choice per step, on the float32 logits of the real vocabulary (padded ids
>= vocab_size are never chosen):
  temperature == 0   greedy (argmax)
  temperature > 0    sample from softmax(logits / temperature) after `filter_logits`:
                     top-k (Fan et al. 2018, "Hierarchical Neural Story Generation",
                     Sec. 5.1) then top-p / nucleus (Holtzman et al. 2019, "The Curious
                     Case of Neural Text Degeneration", Sec. 3.1); top_k = 0 and
                     top_p = 1 are off: the logits pass through bit for bit.
The logits are divided by the temperature in float32, so a temperature > 0 must be a
normal float32 number (MIN_TEMPERATURE to MAX_TEMPERATURE): a subnormal one (1e-38)
overflows the logits to inf (every prompt then got the same few ids), one beyond
float32's range rounds to inf; both are refused (ValueError), not taken as greedy: 0
is the only way to ask for greedy.
Sampling is seeded (jax.random), so the same call returns the same tokens.
"""

from __future__ import annotations

import functools
import math
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from lev_jax.embeddings import mask_padded_logits

# The range of a temperature > 0: float32's normal numbers (the logits are divided by it
# in float32; below, a subnormal, they overflow to inf; above, it rounds to inf).
MIN_TEMPERATURE = float(np.finfo(np.float32).tiny)  # 1.1754944e-38
MAX_TEMPERATURE = float(np.finfo(np.float32).max)   # 3.4028235e+38


def filter_logits(logits_BxV: jax.Array, top_k=0, top_p=1.0) -> jax.Array:
  """Top-k, then top-p (nucleus) filtering: removed entries become -inf.

  Off is exact: top_k = 0 (or >= V) and top_p >= 1.0 select every entry by a flag, not
  by a comparison with a float32 cumulative sum (which reaches 1.0 before the last id
  when one logit dominates, and would remove the rest), so with both off the result is
  `logits_BxV` bit for bit.

  Args:
    logits_BxV: float logits (already divided by the temperature).
    top_k: int (Python or traced scalar); keep the top_k largest logits per row (ties
      with the k-th largest are kept too); 0 = no top-k (Fan et al. 2018, Sec. 5.1).
      Values of V or more keep everything.
    top_p: float in (0, 1]; keep the smallest set of largest logits whose probability
      mass (under the softmax of the top-k-filtered row) is >= top_p (ties with the
      last kept logit are kept too); 1.0 = no top-p (Holtzman et al. 2019, Sec. 3.1).
  Returns:
    float [B, V], same dtype: kept logits unchanged, the rest -inf. The largest logit of
    every row is always kept.
  """
  v = logits_BxV.shape[-1]
  top_k_on = (jnp.asarray(top_k) > 0) & (jnp.asarray(top_k) < v)
  sorted_BxV = -jnp.sort(-logits_BxV, axis=-1)  # descending
  k = jnp.where(top_k_on, top_k, v)
  kth_Bx1 = jax.lax.dynamic_slice_in_dim(sorted_BxV, k - 1, 1, axis=-1)
  logits_BxV = jnp.where(~top_k_on | (logits_BxV >= kth_Bx1), logits_BxV, -jnp.inf)
  sorted_BxV = jnp.where(jnp.arange(v) < k, sorted_BxV, -jnp.inf)
  probs_BxV = jax.nn.softmax(sorted_BxV.astype(jnp.float32), axis=-1)
  mass_before_BxV = jnp.cumsum(probs_BxV, axis=-1) - probs_BxV
  n_keep_B = jnp.sum(mass_before_BxV < top_p, axis=-1)  # >= 1: mass before the first is 0
  last_Bx1 = jnp.take_along_axis(sorted_BxV, n_keep_B[:, None] - 1, axis=-1)
  return jnp.where((jnp.asarray(top_p) >= 1) | (logits_BxV >= last_Bx1), logits_BxV,
                   -jnp.inf)


def _choose(logits_BxV, key, temperature, top_k, top_p, *, vocab_size, greedy):
  """int32 [B]: the next token of every row (see the module docstring)."""
  logits_BxV = mask_padded_logits(logits_BxV, vocab_size, -jnp.inf)
  if greedy:
    return jnp.argmax(logits_BxV, axis=-1).astype(jnp.int32)
  logits_BxV = filter_logits(logits_BxV / temperature, top_k, top_p)
  return jax.random.categorical(key, logits_BxV, axis=-1).astype(jnp.int32)


@functools.partial(jax.jit, static_argnames=(
    "graphdef", "max_new_tokens", "pad_id", "vocab_size", "greedy", "use_cache"))
def _generate(graphdef, state, ids_BxP, valid_BxP, stop_ids, temperature, top_k, top_p,
              key, *, max_new_tokens, pad_id, vocab_size, greedy, use_cache):
  """(tokens_BxN int32, lengths_B int32): row b's tokens are tokens_BxN[b, :lengths_B[b]]
  (up to and including its first stop id); pad_id after them."""
  b, p = ids_BxP.shape
  n = max_new_tokens
  s = p + n
  key_valid_BxS = jnp.concatenate([valid_BxP, jnp.ones((b, n), bool)], axis=1)
  positions_BxS = jnp.maximum(jnp.cumsum(key_valid_BxS, axis=1) - 1, 0).astype(jnp.int32)
  choose = functools.partial(_choose, temperature=temperature, top_k=top_k, top_p=top_p,
                             vocab_size=vocab_size, greedy=greedy)

  def emit(i, logits_BxV, out):  # token i of every row; stopped rows: pad_id
    tokens_BxN, lengths_B, done_B = out
    tok_B = jnp.where(done_B, pad_id, choose(logits_BxV, jax.random.fold_in(key, i)))
    tokens_BxN = jax.lax.dynamic_update_slice_in_dim(tokens_BxN, tok_B[:, None], i, axis=1)
    lengths_B = lengths_B + (~done_B).astype(jnp.int32)
    return tok_B, (tokens_BxN, lengths_B, done_B | jnp.isin(tok_B, stop_ids))

  if use_cache:
    model = nnx.merge(graphdef, state)
    logits_BxPxV, cache = model.decode(ids_BxP, positions_BxS[:, :p], model.init_cache(b, s),
                                       0, key_valid_BxS)

    def step(state, cache, tok_B, slot):  # one cached step: the token at `slot`
      m = nnx.merge(graphdef, state)
      pos_Bx1 = jax.lax.dynamic_slice_in_dim(positions_BxS, slot, 1, axis=1)
      logits_Bx1xV, cache = m.decode(tok_B[:, None], pos_Bx1, cache, slot, key_valid_BxS)
      return logits_Bx1xV[:, 0], cache

    # The parameters travel in the loop state: nnx refuses modules closed over from an
    # outer trace inside nnx.scan.
    def body(carry):
      i, out, logits_BxV, cache, state = carry
      tok_B, out = emit(i, logits_BxV, out)
      logits_BxV, cache = jax.lax.cond(  # no step after the last token
          i + 1 < n, step, lambda _, c, *__: (logits_BxV, c), state, cache, tok_B, p + i)
      return i + 1, out, logits_BxV, cache, state
    loop_state = (logits_BxPxV[:, -1], cache, state)
  else:  # the reference: a full forward pass over the whole sequence for every token
    segment_ids_BxS = key_valid_BxS.astype(jnp.int32)  # padding = segment 0

    def body(carry):  # causal: the slots after p + i - 1 do not change its logits
      i, out, ids_BxS, state = carry
      logits_BxSxV = nnx.merge(graphdef, state)(ids_BxS, positions_BxS, segment_ids_BxS)
      logits_BxV = jax.lax.dynamic_index_in_dim(logits_BxSxV, p + i - 1, 1, keepdims=False)
      tok_B, out = emit(i, logits_BxV, out)
      ids_BxS = jax.lax.dynamic_update_slice_in_dim(ids_BxS, tok_B[:, None], p + i, axis=1)
      return i + 1, out, ids_BxS, state
    loop_state = (jnp.concatenate([ids_BxP, jnp.full((b, n), pad_id, jnp.int32)], axis=1),
                  state)

  def cond(carry):
    i, (_, _, done_B), *_ = carry
    return (i < n) & ~jnp.all(done_B)  # every row stopped: no more steps

  out = (jnp.full((b, n), pad_id, jnp.int32), jnp.zeros((b,), jnp.int32),
         jnp.zeros((b,), bool))
  init = (jnp.int32(0), out, *loop_state)
  _, (tokens_BxN, lengths_B, _), *_ = jax.lax.while_loop(cond, body, init)
  return tokens_BxN, lengths_B


def _is_int(x) -> bool:
  return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))


def _check_id(value, what: str, vocab_size: int):
  if not _is_int(value) or not 0 <= value < vocab_size:
    raise ValueError(f"{what} = {value!r}: expected a token id in [0, vocab_size = "
                     f"{vocab_size})")


def generate(model, prompts: Sequence[Sequence[int]], *, max_new_tokens: int,
             temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
             stop_ids: Sequence[int] = (), seed: int = 0, pad_id: int = 0,
             use_cache: bool = True) -> list[list[int]]:
  """Continues every prompt with up to `max_new_tokens` tokens.

  Args:
    model: a `lev_jax.model.Decoder`.
    prompts: one list of token ids per row (each non-empty, ids in [0, vocab_size)).
    max_new_tokens: int >= 1, the most tokens generated per prompt.
    temperature: 0 = greedy (argmax), else sample from softmax(logits / T); T must then
      be a normal float32 number, MIN_TEMPERATURE (1.18e-38) to MAX_TEMPERATURE
      (3.40e38): a subnormal one is refused, not taken as greedy.
    top_k: int >= 0; keep only the k most likely tokens (0 = all; Fan et al. 2018).
    top_p: in (0, 1]; nucleus sampling (1.0 = off; Holtzman et al. 2019).
    stop_ids: a row stops after its first id in stop_ids (that id is returned as the
      row's last token); rows stop independently; generation ends when all rows stopped.
    seed: the jax.random seed of the sampling (same call, same tokens).
    pad_id: the id in the left-padding slots (never attended; any valid id).
    use_cache: True = KV-cached decoding; False = a full forward pass over the whole
      sequence for every token (slow; the reference the cache is tested against).
  Returns:
    Per prompt, the generated ids (without the prompt).
  Raises:
    ValueError: no prompts, an empty prompt (naming its index), an id out of range
      (naming prompt, position and vocab size), a bad max_new_tokens, temperature
      (negative, not finite, or not 0 nor a normal float32), top_k, top_p, stop id or
      pad id, or longest prompt + max_new_tokens >
      config.model.max_seq_len (the RoPE positions the model was built for).
  """
  vocab_size = model.vocab_size
  if isinstance(prompts, (str, bytes)) or not len(prompts):
    raise ValueError("prompts: expected at least one prompt (a list of token-id lists)")
  rows = []
  for i, prompt in enumerate(prompts):
    prompt = list(prompt)
    if not prompt:
      raise ValueError(f"prompts[{i}] is empty: expected at least one token id")
    for j, t in enumerate(prompt):
      _check_id(t, f"prompts[{i}][{j}]", vocab_size)
    rows.append([int(t) for t in prompt])
  if not _is_int(max_new_tokens) or max_new_tokens < 1:
    raise ValueError(f"max_new_tokens = {max_new_tokens!r}: expected an integer >= 1")
  longest = max(range(len(rows)), key=lambda i: len(rows[i]))
  if len(rows[longest]) + max_new_tokens > model.max_seq_len:
    raise ValueError(
        f"prompts[{longest}] has {len(rows[longest])} tokens; + max_new_tokens = "
        f"{max_new_tokens} is {len(rows[longest]) + max_new_tokens} > "
        f"config.model.max_seq_len = {model.max_seq_len}")
  if (not isinstance(temperature, (int, float, np.number)) or isinstance(temperature, bool)
      or not math.isfinite(temperature) or temperature < 0):
    raise ValueError(f"temperature = {temperature!r}: expected a finite number >= 0 "
                     "(0 = greedy)")
  if temperature != 0 and not MIN_TEMPERATURE <= temperature <= MAX_TEMPERATURE:
    raise ValueError(f"temperature = {temperature!r}: expected 0 (greedy) or a normal "
                     f"float32 number, {MIN_TEMPERATURE:.8g} to {MAX_TEMPERATURE:.8g} (the "
                     "logits are divided by it in float32)")
  if not _is_int(top_k) or top_k < 0:
    raise ValueError(f"top_k = {top_k!r}: expected an integer >= 0 (0 = off)")
  if (not isinstance(top_p, (int, float, np.number)) or isinstance(top_p, bool)
      or not 0 < top_p <= 1):
    raise ValueError(f"top_p = {top_p!r}: expected a number in (0, 1] (1 = off)")
  stop_ids = list(stop_ids)
  for j, t in enumerate(stop_ids):
    _check_id(t, f"stop_ids[{j}]", vocab_size)
  _check_id(pad_id, "pad_id", vocab_size)
  if not _is_int(seed):
    raise ValueError(f"seed = {seed!r}: expected an integer")

  p = len(rows[longest])
  ids_BxP = np.full((len(rows), p), pad_id, np.int32)
  valid_BxP = np.zeros((len(rows), p), bool)
  for b, row in enumerate(rows):
    ids_BxP[b, p - len(row):] = row
    valid_BxP[b, p - len(row):] = True
  # Stop ids padded with -1 (never a token) to a multiple of 8: fewer shapes to compile.
  stop_S = np.full((-(-max(len(stop_ids), 1) // 8) * 8,), -1, np.int32)
  stop_S[:len(stop_ids)] = stop_ids
  graphdef, state = nnx.split(model)
  greedy = temperature == 0
  tokens_BxN, lengths_B = _generate(
      graphdef, state, jnp.asarray(ids_BxP), jnp.asarray(valid_BxP),
      jnp.asarray(stop_S), jnp.float32(temperature or 1.0),
      jnp.int32(min(top_k, vocab_size)), jnp.float32(top_p), jax.random.key(seed),
      max_new_tokens=max_new_tokens, pad_id=int(pad_id), vocab_size=vocab_size,
      greedy=greedy, use_cache=use_cache)
  return [row[:n] for row, n in zip(np.asarray(tokens_BxN).tolist(),
                                    np.asarray(lengths_B).tolist())]
