"""Zero-shot scoring with a trained model: log-likelihoods of continuations, of whole
texts, and greedy / sampled generation, with lm-evaluation-harness semantics.

  scorer = Scorer(model, tokenizer, config=config)       # or max_len=...
  scorer.loglikelihood([(context, continuation), ...])   -> [(sum log p, is_greedy)]
  scorer.loglikelihood_rolling([text, ...])              -> [sum log p]
  scorer.generate_until([(context, {"until": [...]}), ...]) -> [text]

Semantics follow lm-eval 0.4's Hugging Face model (lm_eval/models/huggingface.py,
``_encode_pair``, ``_loglikelihood_tokens``; lm_eval/utils.py
``get_rolling_token_windows`` and ``make_disjoint_window``):
  * a continuation's tokens are those of encode(context + continuation) past the
    tokens of encode(context); whitespace ending the context moves to the continuation;
    where a token spans the boundary (the joint ids do not start with the context's),
    the continuation is encoded alone, so it is never empty;
  * an empty context conditions on the eos id;
  * an input longer than max_len keeps its last max_len tokens (left truncation);
  * is_greedy: every continuation token is the argmax of its logits;
  * a whole text is scored in disjoint windows of max_len predicted tokens, the first
    token conditioned on eos, later windows carrying as much preceding text as fits.
A continuation longer than max_len is scored the same way, in windows (lm-eval's model
would index past its logits there).

Batches are right-padded (causal attention: padding never changes earlier positions)
to a few lengths (powers of two up to max_len) and a fixed number of rows, so a whole
evaluation compiles at most ~log2(max_len) forward programs.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from absl import logging
from flax import nnx

# Gen kwargs understood by generate_until (lm-eval task `generation_kwargs`).
# max_new_tokens / max_tokens / max_completion_tokens: lm-eval's aliases of max_gen_toks.
GEN_KWARGS = ("until", "max_gen_toks", "max_new_tokens", "max_tokens",
              "max_completion_tokens", "do_sample", "temperature", "top_k", "top_p", "seed")
DEFAULT_MAX_GEN_TOKS = 256  # lm-eval's HFLM default
MIN_BUCKET = 16


def _bucket(n: int, max_len: int) -> int:
  """The padded length for an input of n tokens: a power of two >= MIN_BUCKET, at most
  max_len."""
  return min(max_len, max(MIN_BUCKET, 1 << max(0, n - 1).bit_length()))


def windows(prefix_ids: Sequence[int], target_ids: Sequence[int],
            max_len: int) -> list[tuple[list[int], list[int]]]:
  """Splits the scoring of `target_ids` after `prefix_ids` into model-sized windows.

  Args:
    prefix_ids: conditioning ids (at least one id when target_ids is non-empty).
    target_ids: ids to score, in order.
    max_len: the model's input length.
  Returns:
    (context, continuation) id lists, at most max_len continuation ids each and
    len(context) + len(continuation) <= max_len + 1 (the input is all but the last id);
    the continuations partition target_ids in order, each with the longest context that
    fits. One window when everything fits; [] when target_ids is empty.
  Raises:
    ValueError: targets but no prefix id, or max_len < 1.
  """
  if max_len < 1:
    raise ValueError(f"max_len = {max_len}: expected >= 1")
  if target_ids and not prefix_ids:
    raise ValueError("windows: target ids need at least one prefix id to condition on")
  full = list(prefix_ids) + list(target_ids)
  out = []
  for start in range(len(prefix_ids), len(full), max_len):
    end = min(start + max_len, len(full))
    out.append((full[max(0, end - 1 - max_len):start], full[start:end]))
  return out


class Scorer:
  """Log-likelihood and generation with a decoder and its tokenizer.

  Args:
    model: a `lev_jax.model.Decoder` (any nnx.Module or callable mapping int32 ids
      [B, L] to float32 logits [B, L, V] also works; padded vocab ids must carry
      -1e9 logits, as the Decoder's do).
    tokenizer: has encode(str) -> list[int], decode(ids) -> str, eos_id, vocab_size
      (and optionally pad_id; None or absent: eos_id pads, under the mask).
    max_len: tokens per forward pass. Default: config.train.seq_len, the length the
      model was trained at (RoPE allows up to config.model.max_seq_len, but quality
      beyond the training length is not what a benchmark should measure).
    config: the experiment config (only read when max_len is None).
    batch_size: rows per forward pass.
  Raises:
    ValueError: no max_len and no config, max_len above the model's max_seq_len,
      max_len or batch_size < 1, or a tokenizer vocab larger than the model's
      vocab_size (config.model, else the Decoder's attributes).
  """

  def __init__(self, model, tokenizer, *, max_len: int | None = None,
               config: ml_collections.ConfigDict | None = None, batch_size: int = 8):
    if max_len is None:
      if config is None:
        raise ValueError("Scorer: give max_len or the config (max_len = train.seq_len)")
      max_len = int(config.train.seq_len)
    model_cfg = config.model if config is not None else model
    rope_len = getattr(model_cfg, "max_seq_len", None)
    model_vocab = getattr(model_cfg, "vocab_size", None)
    if max_len < 1 or batch_size < 1:
      raise ValueError(f"Scorer: max_len = {max_len}, batch_size = {batch_size}: "
                       "expected both >= 1")
    if rope_len is not None and max_len > rope_len:
      raise ValueError(f"Scorer: max_len = {max_len}: expected <= the model's "
                       f"max_seq_len = {rope_len} (RoPE positions it was built for)")
    if model_vocab is not None and tokenizer.vocab_size > model_vocab:
      raise ValueError(f"Scorer: tokenizer vocab_size = {tokenizer.vocab_size} > "
                       f"model vocab_size = {model_vocab}: the model cannot score ids it "
                       "has no logits for")
    self.model, self.tokenizer = model, tokenizer
    self.max_len, self.batch_size = int(max_len), int(batch_size)
    self.eos_id = int(tokenizer.eos_id)
    # Padding sits after every scored position (right padding, causal attention), so
    # any valid id serves; o200k_base has no pad id: use eos.
    pad_id = getattr(tokenizer, "pad_id", None)
    self.pad_id = self.eos_id if pad_id is None else int(pad_id)

  # --- tokenization (lm-eval HFLM._encode_pair) -------------------------------------

  def encode_pair(self, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """(context ids, continuation ids) as lm-eval's HF model splits them.

    Whitespace ending `context` moves to the front of `continuation`; the continuation
    ids are encode(context + continuation) past len(encode(context)); an empty context
    becomes [eos_id] and the continuation is encoded alone. When the joint encoding
    does not start with the context's ids (a token spans the boundary, as in
    ("The retu", "rn value") -> "return"), its tail would be empty or misaligned, so the
    continuation is encoded alone (lm-eval's fix for empty continuations): a non-empty
    continuation never gets zero ids, so it never scores log p = 0 for free.
    Raises:
      ValueError: context or continuation is not a str.
    """
    if not isinstance(context, str) or not isinstance(continuation, str):
      raise ValueError(f"loglikelihood request ({context!r}, {continuation!r}): expected "
                       "(context: str, continuation: str)")
    n_spaces = len(context) - len(context.rstrip())
    if n_spaces:
      context, continuation = context[:-n_spaces], context[-n_spaces:] + continuation
    context_ids = list(self.tokenizer.encode(context)) if context else []
    if not context_ids:  # empty (or whitespace-only) context: condition on eos
      return [self.eos_id], list(self.tokenizer.encode(continuation))
    whole = list(self.tokenizer.encode(context + continuation))
    n = len(context_ids)
    if whole[:n] != context_ids or (continuation and len(whole) == n):
      return context_ids, list(self.tokenizer.encode(continuation))
    return context_ids, whole[n:]

  # --- log-likelihoods ----------------------------------------------------------------

  def loglikelihood(self, requests: Sequence[tuple[str, str]],
                    on_done: Callable[[int], None] | None = None
                    ) -> list[tuple[float, bool]]:
    """Sum of log p(continuation | context) and is_greedy, per request, in input order.

    Args:
      requests: (context, continuation) strings.
      on_done: called with a request's index once it is scored (for progress bars;
        requests finish longest first, not in input order).
    Returns:
      (log-likelihood in nats (float, <= 0), is_greedy) per request.
    Raises:
      ValueError: a request that is not two strings.
    """
    pairs = [self.encode_pair(c, x) for c, x in requests]
    return self.loglikelihood_tokens(pairs, on_done=on_done)

  def loglikelihood_rolling(self, texts: Sequence[str]) -> list[float]:
    """Total log-likelihood (nats) of each whole text, first token conditioned on eos,
    scored in disjoint windows of max_len predicted tokens (lm-eval rolling windows).
    An empty text scores 0.0.
    Raises:
      ValueError: a text that is not a str.
    """
    pairs = []
    for t in texts:
      if not isinstance(t, str):
        raise ValueError(f"loglikelihood_rolling: {t!r}: expected a str")
      pairs.append(([self.eos_id], list(self.tokenizer.encode(t))))
    return [ll for ll, _ in self.loglikelihood_tokens(pairs)]

  def loglikelihood_tokens(self, pairs: Sequence[tuple[Sequence[int], Sequence[int]]],
                           on_done: Callable[[int], None] | None = None
                           ) -> list[tuple[float, bool]]:
    """(sum log p, is_greedy) of each continuation id list after its context ids.

    Long inputs are split by `windows` (left truncation when the continuation fits in
    one window). Windows are sorted longest first, batched in rows of batch_size at
    bucketed lengths, and the results are returned in input order. on_done: called
    with a pair's index once all its windows are scored.
    Raises:
      ValueError: an id outside [0, tokenizer.vocab_size), or a continuation with no
        context id.
    """
    vocab = int(self.tokenizer.vocab_size)
    jobs = []  # (request index, input ids, continuation length)
    for i, (ctx, cont) in enumerate(pairs):
      for w_ctx, w_cont in windows(ctx, cont, self.max_len):
        ids = [int(t) for t in w_ctx + w_cont]
        bad = [t for t in ids if not 0 <= t < vocab]
        if bad:
          raise ValueError(f"request {i}: token id {bad[0]} outside [0, {vocab}) "
                           "(tokenizer.vocab_size)")
        jobs.append((i, ids, len(w_cont)))
    ll = np.zeros(len(pairs), np.float64)
    greedy = np.ones(len(pairs), bool)
    left = np.bincount([j[0] for j in jobs], minlength=len(pairs))  # windows to score
    if on_done is not None:
      for i in np.flatnonzero(left == 0):  # an empty continuation: nothing to score
        on_done(int(i))
    jobs.sort(key=lambda j: -len(j[1]))
    forward = self._forward()
    for b in range(0, len(jobs), self.batch_size):
      chunk = jobs[b:b + self.batch_size]
      length = _bucket(len(chunk[0][1]) - 1, self.max_len)
      ids_BxL = np.full((self.batch_size, length + 1), self.pad_id, np.int32)
      for r, (_, ids, _) in enumerate(chunk):
        ids_BxL[r, :len(ids)] = ids
      logp_BxL, top_BxL = forward(ids_BxL[:, :-1], ids_BxL[:, 1:])
      logp_BxL = np.asarray(logp_BxL, np.float64)
      top_BxL = np.asarray(top_BxL)
      for r, (i, ids, n) in enumerate(chunk):
        stop = len(ids) - 1  # targets ids[1:], the last n are the continuation
        ll[i] += logp_BxL[r, stop - n:stop].sum()
        greedy[i] &= bool(top_BxL[r, stop - n:stop].all())
        left[i] -= 1
        if on_done is not None and not left[i]:
          on_done(i)
    return [(float(a), bool(g)) for a, g in zip(ll, greedy)]

  def _forward(self) -> Callable:
    """(ids int32 [B, L], targets int32 [B, L]) -> (log p(target) float32 [B, L],
    target is the argmax bool [B, L]) with the model's current parameters."""
    if isinstance(self.model, nnx.Module):
      graphdef, state = nnx.split(self.model)
      return lambda ids, tgt: _token_scores(graphdef, state, ids, tgt)
    return lambda ids, tgt: _logit_scores_jit(self.model(jnp.asarray(ids)), tgt)

  # --- generation ----------------------------------------------------------------------

  def generate_until(self, requests: Sequence[tuple[str, dict]]) -> list[str]:
    """Continuations of each context, cut at the first `until` string (lm-eval
    generate_until; lm_eval/models/huggingface.py ``generate_until``).

    Args:
      requests: (context, gen_kwargs); gen_kwargs keys, with lm-eval's meaning
        (lm_eval/models/utils.py ``normalize_gen_kwargs``): until (str or list of str;
        generation also stops at eos), max_gen_toks (int, default 256; aliases
        max_new_tokens, max_tokens, max_completion_tokens), do_sample (bool; unset =
        sample iff temperature > 0), temperature (float, default 0.0 = greedy; ignored
        when do_sample is False), top_k (int, 0 = off), top_p (float, 1.0 = off),
        seed (int, default 0). Other keys are ignored with a warning.
    Returns:
      The generated text per request, in input order, without the stop string or eos.
      The context keeps its last max_len - max_gen_toks tokens (an empty context is
      [eos]), as lm-eval's HF model.
    Raises:
      ValueError: a context that is not a str, gen_kwargs not a dict, a bad `until`,
        max_gen_toks < 1 or >= max_len (no room left for the context).
    Needs `lev_jax.decode.generate`.
    """
    from lev_jax import decode  # pylint: disable=import-outside-toplevel

    groups: dict[tuple, list[int]] = {}
    settings = []
    for i, (context, kwargs) in enumerate(requests):
      s = self._gen_settings(i, context, kwargs)
      settings.append(s)
      groups.setdefault(s["key"], []).append(i)
    out = [""] * len(requests)
    for members in groups.values():
      s = settings[members[0]]
      for b in range(0, len(members), self.batch_size):
        chunk = members[b:b + self.batch_size]
        prompts = [settings[i]["prompt"] for i in chunk]
        ids = decode.generate(self.model, prompts, max_new_tokens=s["max_gen_toks"],
                              temperature=s["temperature"], top_k=s["top_k"],
                              top_p=s["top_p"], stop_ids=(self.eos_id,), seed=s["seed"],
                              pad_id=self.pad_id)
        for i, gen in zip(chunk, ids):
          gen = [int(t) for t in gen]
          if gen and gen[-1] == self.eos_id:
            gen = gen[:-1]
          out[i] = cut_at(self.tokenizer.decode(gen), s["until"])
    return out

  def _gen_settings(self, i: int, context, kwargs) -> dict:
    if not isinstance(context, str) or not isinstance(kwargs, dict):
      raise ValueError(f"generate_until request {i}: ({context!r}, {kwargs!r}): expected "
                       "(context: str, gen_kwargs: dict)")
    unknown = sorted(set(kwargs) - set(GEN_KWARGS))
    if unknown:
      logging.warning("generate_until: ignoring gen_kwargs %s (understood: %s)", unknown,
                      ", ".join(GEN_KWARGS))
    until = kwargs.get("until", [])
    until = [until] if isinstance(until, str) else list(until)
    if not all(isinstance(u, str) and u for u in until):
      raise ValueError(f"generate_until request {i}: until = {kwargs.get('until')!r}: "
                       "expected a non-empty string or a list of them")
    given = [kwargs[k] for k in GEN_KWARGS[1:5] if kwargs.get(k) is not None]
    max_gen = int(given[0]) if given else DEFAULT_MAX_GEN_TOKS
    if not 1 <= max_gen < self.max_len:
      raise ValueError(f"generate_until request {i}: max_gen_toks = {max_gen}: expected "
                       f"1 <= max_gen_toks < max_len = {self.max_len} (the context keeps "
                       "max_len - max_gen_toks tokens)")
    temperature = float(kwargs.get("temperature", 0.0) or 0.0)
    if kwargs.get("do_sample") is False or temperature <= 0.0:
      temperature = 0.0  # greedy
    top_k = int(kwargs.get("top_k", 0) or 0)
    top_p = float(kwargs.get("top_p", 1.0) or 1.0)
    seed = int(kwargs.get("seed", 0))
    ids = list(self.tokenizer.encode(context)) or [self.eos_id]
    keep = self.max_len - max_gen
    return {"prompt": ids[-keep:], "until": until, "max_gen_toks": max_gen,
            "temperature": temperature, "top_k": top_k, "top_p": top_p, "seed": seed,
            "key": (tuple(until), max_gen, temperature, top_k, top_p, seed)}


def cut_at(text: str, until: Sequence[str]) -> str:
  """`text` up to the earliest occurrence of any string in `until` (all of it if none)."""
  cut = len(text)
  for u in until:
    k = text.find(u)
    if k != -1:
      cut = min(cut, k)
  return text[:cut]


def _logit_scores(logits_BxLxV: jax.Array, targets_BxL: jax.Array):
  logp_BxLxV = jax.nn.log_softmax(logits_BxLxV.astype(jnp.float32), axis=-1)
  logp_BxL = jnp.take_along_axis(logp_BxLxV, targets_BxL[..., None], axis=-1)[..., 0]
  return logp_BxL, jnp.argmax(logits_BxLxV, axis=-1) == targets_BxL


@jax.jit
def _logit_scores_jit(logits_BxLxV, targets_BxL):
  return _logit_scores(logits_BxLxV, targets_BxL)


@functools.partial(jax.jit, static_argnums=0)
def _token_scores(graphdef, state, ids_BxL, targets_BxL):
  return _logit_scores(nnx.merge(graphdef, state)(ids_BxL), targets_BxL)


def text_metrics(loglikelihoods: Sequence[float], texts: Sequence[str],
                 n_tokens: Sequence[int] | None = None) -> dict:
  """Corpus-level figures from whole-text log-likelihoods (lm-eval wikitext metrics).

  Args:
    loglikelihoods: total nats per text (`Scorer.loglikelihood_rolling`).
    texts: the texts scored.
    n_tokens: token count per text (optional; adds the token-level figures).
  Returns:
    {"word_perplexity": exp(-sum ll / words), "byte_perplexity": exp(-sum ll / UTF-8
    bytes), "bits_per_byte": -sum ll / bytes / ln 2, "words", "bytes"} plus
    {"nll_per_token", "token_perplexity", "tokens"} with n_tokens. Words are
    re.split(r"\\s+") pieces, as lm-eval counts them.
  Raises:
    ValueError: lengths differ or the texts hold no bytes.
  """
  if len(loglikelihoods) != len(texts) or (n_tokens is not None
                                           and len(n_tokens) != len(texts)):
    raise ValueError(f"text_metrics: {len(loglikelihoods)} log-likelihoods, {len(texts)} "
                     "texts" + ("" if n_tokens is None else f", {len(n_tokens)} counts")
                     + ": expected equal lengths")
  total = float(sum(loglikelihoods))
  words = sum(len(re.split(r"\s+", t)) for t in texts)
  n_bytes = sum(len(t.encode("utf-8")) for t in texts)
  if n_bytes == 0:
    raise ValueError("text_metrics: the texts hold no bytes")
  out = {"word_perplexity": math.exp(-total / words),
         "byte_perplexity": math.exp(-total / n_bytes),
         "bits_per_byte": -total / n_bytes / math.log(2), "words": words, "bytes": n_bytes}
  if n_tokens is not None:
    tokens = int(sum(n_tokens))
    out.update(nll_per_token=-total / max(tokens, 1),
               token_perplexity=math.exp(-total / max(tokens, 1)), tokens=tokens)
  return out
