"""Scorer: log-likelihoods equal hand sums from full forward passes, lm-eval tokenization
and rolling windows, batching / order / padding invariance, generation glue."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from conftest import tiny_config
from lev_jax.data.tokenizer import ByteTokenizer
from lev_jax.eval.scoring import Scorer, cut_at, text_metrics, windows
from lev_jax.train import create_model

TOK = ByteTokenizer()
EOS = TOK.eos_id
MAX_LEN = 16


class Bigram(nnx.Module):
  """logits_BxLxV = table[ids]: the next-token distribution depends on the last id."""

  def __init__(self, table_VxV):
    self.table = nnx.Param(jnp.asarray(table_VxV, jnp.float32))

  def __call__(self, ids_BxL):
    return self.table[...][ids_BxL]


def favour(prev_to_next: dict, default: str, strength=10.0):
  """A Bigram over byte ids preferring `default` after any byte, or prev_to_next[prev]."""
  v = TOK.vocab_size
  table = np.zeros((v, v), np.float32)
  table[:, TOK.encode(default)[0]] = strength
  for prev, nxt in prev_to_next.items():
    row = TOK.encode(prev)[0]
    table[row] = 0.0
    table[row, TOK.encode(nxt)[0]] = strength
  return Bigram(table)


@pytest.fixture(scope="module")
def model():
  c = tiny_config("untied")
  c.model.vocab_size = TOK.vocab_size
  return create_model(c)


@pytest.fixture(scope="module")
def config():
  c = tiny_config("untied")
  c.model.vocab_size = TOK.vocab_size
  return c


# One un-batched, un-padded full forward pass (jitted: eager costs seconds per call on
# CPU; one program per input length, so the tests below use only lengths 11 and 16).
_full_forward = nnx.jit(lambda m, ids_1xL: m(ids_1xL))


def hand_ll(model, ctx_ids, cont_ids):
  """Sum log p(cont | ctx) and greedy flag from one un-batched full forward pass."""
  ids = list(ctx_ids) + list(cont_ids)
  logits = _full_forward(model, jnp.asarray([ids[:-1]], jnp.int32))[0]
  logp = np.asarray(jax.nn.log_softmax(logits, axis=-1), np.float64)
  n = len(cont_ids)
  pos = range(len(ids) - 1 - n, len(ids) - 1)
  ll = sum(logp[p, ids[p + 1]] for p in pos)
  greedy = all(int(np.argmax(logits[p])) == ids[p + 1] for p in pos)
  return ll, greedy


def test_windows_match_lm_eval_rolling_example():
  # lm_eval/api/model.py loglikelihood_rolling docstring: tokens 0..9, max length 4.
  got = windows([-1], list(range(10)), 4)
  assert got == [([-1], [0, 1, 2, 3]), ([3], [4, 5, 6, 7]), ([5, 6, 7], [8, 9])]
  # Fits in one window: the whole context is kept; too long: left-truncated.
  assert windows([1, 2, 3], [4, 5], 4) == [([1, 2, 3], [4, 5])]
  assert windows([1, 2, 3, 4, 5], [6, 7], 4) == [([3, 4, 5], [6, 7])]
  assert windows([1], [], 4) == []


def test_encode_pair_moves_trailing_space_and_uses_eos_for_empty_context(config):
  s = Scorer(None, TOK, config=config)
  assert s.encode_pair("ab ", "c") == (TOK.encode("ab"), TOK.encode(" c"))
  assert s.encode_pair("ab", " c") == (TOK.encode("ab"), TOK.encode(" c"))
  assert s.encode_pair("", "xy") == ([EOS], TOK.encode("xy"))
  assert s.encode_pair("  ", "xy") == ([EOS], TOK.encode("  xy"))
  with pytest.raises(ValueError, match="expected .context: str"):
    s.encode_pair("a", None)


class MergingTokenizer:
  """Greedy longest match over bytes + a few whole words, like BPE merges: "return"
  and "default" are one token each, so a context ending inside them ("The retu",
  "def") re-tokenises with the continuation. No pad id (as o200k_base)."""
  WORDS = ("The", " return", "return", " value", "default", "def")
  pad_id = None

  def __init__(self):
    self.eos_id, self.vocab_size = 256 + len(self.WORDS), 256 + len(self.WORDS) + 1

  def encode(self, text):
    data, ids = text.encode(), []
    while data:
      words = [(len(w), i) for i, w in enumerate(self.WORDS) if data.startswith(w.encode())]
      n, i = max(words) if words else (1, None)
      ids.append(data[0] if i is None else 256 + i)
      data = data[n:]
    return ids

  def decode(self, ids):
    return b"".join(bytes([t]) if t < 256 else self.WORDS[t - 256].encode()
                    for t in ids if t != self.eos_id).decode()


def test_a_token_spanning_the_boundary_never_leaves_the_continuation_empty(config):
  """("The retu", "rn value"): the joined text has " return" where the context ended,
  so its tail past the context's ids is empty; the continuation is encoded alone and
  gets a finite, negative score (not log p = 0, which would win every comparison)."""
  tok = MergingTokenizer()
  tok.pad_id = 0
  c = config.copy_and_resolve_references()
  c.model.vocab_size = tok.vocab_size
  scorer = Scorer(create_model(c), tok, config=c)
  requests = [("The retu", "rn value"), ("def", "ault"), ("The", " return")]
  assert scorer.encode_pair(*requests[0]) == (tok.encode("The retu"), tok.encode("rn value"))
  assert scorer.encode_pair(*requests[1]) == (tok.encode("def"), tok.encode("ault"))
  assert scorer.encode_pair(*requests[2]) == (tok.encode("The"), tok.encode(" return"))
  for (ll, _), (ctx, cont) in zip(scorer.loglikelihood(requests), requests):
    expected, _ = hand_ll(scorer.model, tok.encode(ctx), tok.encode(cont))
    assert math.isfinite(ll) and ll < 0
    assert ll == pytest.approx(expected, rel=1e-5)


def test_an_o200k_model_scores_lambada(ranks_file, tmp_path):
  """o200k_base has no pad id: zero-shot scoring pads with eos (a tiny ranks file
  stands in for o200k's; the vocabulary is o200k's 200019 ids)."""
  from lev_jax.data import TiktokenTokenizer
  from lev_jax.eval.downstream import evaluate_task
  tok = TiktokenTokenizer(ranks_file)
  c = tiny_config("untied")
  c.model.vocab_size, c.model.d_model = tok.vocab_size, 8
  scorer = Scorer(create_model(c), tok, config=c, batch_size=2)
  assert scorer.pad_id == tok.eos_id
  path = tmp_path / "lambada_test.jsonl"
  path.write_text('{"text": "the thing in the ring"}\n{"text": "in the thing"}\n')
  r = evaluate_task(scorer, "lambada", path)
  assert 0.0 <= r["acc"] <= 1.0 and math.isfinite(r["perplexity"]) and r["perplexity"] > 1


def test_loglikelihood_equals_hand_sum_in_any_order_and_batching(model, config):
  # 12 tokens each (input length 11), except the last: 22 tokens, left-truncated to 17.
  requests = [("hello", " world"), ("", "abcdefghijk"), ("x ", "yzabcdefghi"),
              ("The cat", " sat."), ("q", "rstuvwxyz01"), ("0123456789abcdefghij", "kl")]
  ref = Scorer(model, TOK, config=config, batch_size=4)
  got = ref.loglikelihood(requests)
  for (ctx, cont), (ll, greedy) in zip(requests, got):
    c_ids, x_ids = ref.encode_pair(ctx, cont)
    full = (c_ids + x_ids)[-(MAX_LEN + 1):]
    want_ll, want_greedy = hand_ll(model, full[:len(full) - len(x_ids)], x_ids)
    assert ll == pytest.approx(want_ll, abs=1e-4), (ctx, cont)
    assert greedy == want_greedy
  # Another batch size and order (other padding, other row mates): same numbers.
  for bs, order in ((1, slice(None)), (4, slice(None, None, -1))):
    other = Scorer(model, TOK, config=config, batch_size=bs).loglikelihood(requests[order])
    other = other[order]
    np.testing.assert_allclose([r[0] for r in other], [r[0] for r in got], atol=1e-4)
    assert [r[1] for r in other] == [r[1] for r in got]


def test_rolling_loglikelihood_equals_hand_windowed_sum(model, config):
  text = "The quick brown fox jumps over the lazy dog!!"  # 45 bytes > MAX_LEN = 16
  ids = TOK.encode(text)
  assert len(ids) == 45
  # Windows by hand (lm-eval rolling, max length 16): predict ids[0:16] from
  # [eos] + ids[0:15]; ids[16:32] from ids[15:31]; ids[32:45] from ids[28:44].
  want = (hand_ll(model, [EOS], ids[0:16])[0] + hand_ll(model, ids[15:16], ids[16:32])[0]
          + hand_ll(model, ids[28:32], ids[32:45])[0])
  s = Scorer(model, TOK, config=config, batch_size=4)
  short = "abcdefghijk"
  got = s.loglikelihood_rolling([text, short, ""])
  assert got[0] == pytest.approx(want, abs=1e-3)
  assert got[1] == pytest.approx(hand_ll(model, [EOS], TOK.encode(short))[0], abs=1e-4)
  assert got[2] == 0.0
  # A continuation longer than max_len is scored in the same windows.
  ll, _ = s.loglikelihood_tokens([([EOS], ids)])[0]
  assert ll == pytest.approx(want, abs=1e-3)


def test_is_greedy_by_construction():
  # After 'q' the model predicts ' ', after anything else 'z'.
  s = Scorer(favour({"q": " "}, "z"), TOK, max_len=MAX_LEN, batch_size=2)
  out = s.loglikelihood([("aq", " zzz"), ("aq", " zaz"), ("a", " zzz"), ("", "zz")])
  assert [g for _, g in out] == [True, False, False, True]
  lp_hit = 10.0 - math.log(math.exp(10.0) + TOK.vocab_size - 1)
  lp_miss = -math.log(math.exp(10.0) + TOK.vocab_size - 1)
  assert out[0][0] == pytest.approx(4 * lp_hit, abs=1e-4)
  assert out[1][0] == pytest.approx(3 * lp_hit + lp_miss, abs=1e-4)


def test_scorer_errors(model, config):
  with pytest.raises(ValueError, match="give max_len or the config"):
    Scorer(model, TOK)
  with pytest.raises(ValueError, match="max_seq_len"):
    Scorer(model, TOK, max_len=config.model.max_seq_len + 1, config=config)
  small = tiny_config("untied")
  small.model.vocab_size = 200  # fewer ids than the 259-id byte tokenizer
  with pytest.raises(ValueError, match="vocab_size = 259 > model vocab_size = 200"):
    Scorer(model, TOK, config=small)
  with pytest.raises(ValueError, match="expected a str"):
    Scorer(model, TOK, config=config).loglikelihood_rolling([b"bytes"])


def test_text_metrics_known_numbers():
  lls = [-10.0, -6.0]
  texts = ["ab cd", "é"]  # 2 + 1 words, 5 + 2 bytes
  m = text_metrics(lls, texts, n_tokens=[4, 4])
  assert m["words"] == 3 and m["bytes"] == 7 and m["tokens"] == 8
  assert m["word_perplexity"] == pytest.approx(math.exp(16 / 3))
  assert m["byte_perplexity"] == pytest.approx(math.exp(16 / 7))
  assert m["bits_per_byte"] == pytest.approx(16 / 7 / math.log(2))
  assert m["token_perplexity"] == pytest.approx(math.exp(2.0))
  with pytest.raises(ValueError, match="expected equal lengths"):
    text_metrics([1.0], texts)


def test_cut_at():
  assert cut_at("abc\n\ndef", ["\n\n", "c"]) == "ab"
  assert cut_at("abc", ["x"]) == "abc"


def test_generate_until_maps_kwargs_and_cuts(model, config, monkeypatch):
  decode = pytest.importorskip("lev_jax.decode")
  calls = []

  def fake_generate(m, prompts, **kw):
    calls.append((prompts, kw))
    return [TOK.encode("ok. more") + [EOS] for _ in prompts]

  class EosVisible(ByteTokenizer):  # a tokenizer whose decode renders eos as text
    def decode(self, ids):
      return "".join("</s>" if i == EOS else super(EosVisible, self).decode([i]) for i in ids)

  monkeypatch.setattr(decode, "generate", fake_generate)
  s = Scorer(model, EosVisible(), config=config, batch_size=2)
  out = s.generate_until([
      ("0123456789abcdef", {"until": ["."], "max_gen_toks": 4}),
      ("hi", {"until": ".", "max_gen_toks": 4}),
      ("", {"max_new_tokens": 3, "do_sample": True, "temperature": 0.7, "top_k": 5}),
      ("x", {"max_gen_toks": 3, "do_sample": False, "temperature": 0.7}),
  ])
  assert out == ["ok", "ok", "ok. more", "ok. more"]
  # Grouped by settings: "until" "." as a str or a list is the same group.
  assert [p for p, _ in calls] == [[TOK.encode("456789abcdef"), TOK.encode("hi")],
                                   [[EOS]], [TOK.encode("x")]]
  kws = [kw for _, kw in calls]
  assert kws[0]["max_new_tokens"] == 4 and kws[0]["temperature"] == 0.0
  assert kws[1]["temperature"] == 0.7 and kws[1]["top_k"] == 5
  assert kws[1]["max_new_tokens"] == 3
  assert kws[2]["temperature"] == 0.0  # do_sample=False: greedy whatever the temperature
  assert all(kw["stop_ids"] == (EOS,) for kw in kws)
  with pytest.raises(ValueError, match="max_gen_toks = 16"):
    s.generate_until([("a", {"max_gen_toks": MAX_LEN})])


def test_generate_until_with_the_real_decoder(model, config):
  decode = pytest.importorskip("lev_jax.decode")
  s = Scorer(model, TOK, config=config, batch_size=2)
  prompt = "Once upon"
  ids = decode.generate(model, [TOK.encode(prompt)], max_new_tokens=5, stop_ids=(EOS,))[0]
  text = TOK.decode([t for t in ids if t != EOS])
  assert s.generate_until([(prompt, {"max_gen_toks": 5})]) == [text]
  if len(text) >= 3:
    stop = text[2]
    assert s.generate_until([(prompt, {"max_gen_toks": 5, "until": [stop]})]) == [
        text[:text.index(stop)]]
