"""KV-cached decoding (model.Decoder.decode) and lev_jax.decode.generate."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import conftest

# Two layers here: what these tests check depends on the layer stack.
tiny_config = functools.partial(conftest.tiny_config, n_layers=2)
from lev_jax.decode import filter_logits, generate
from lev_jax.model import Decoder

PROMPTS = [[5, 6, 7, 8, 9], [10, 11], [12, 13, 14, 15, 16]]  # two lengths, left-padded
N = 6
# One pytest-xdist worker runs this file (--dist loadgroup): the models and greedy
# continuations cached below (each compiles its programs) are shared by its tests.
pytestmark = pytest.mark.xdist_group("decode")


def _abstract(embedding, scan):
  c = tiny_config(embedding)
  c.model.scan_layers = scan
  return c, nnx.split(nnx.eval_shape(lambda: Decoder(c, rngs=nnx.Rngs(0))))


@functools.lru_cache(maxsize=None)
def _model(embedding, scan):
  """A tiny model whose greedy continuations vary from token to token.

  At the paper's init the tiny models repeat one token; weights of std 0.5 (LEV spline
  coefficients 1.0) make the logits depend on the context, so a wrong mask, position or
  cache slot changes the tokens. Drawn with numpy into the abstract model (no XLA
  init program: seconds saved). The scan_layers model holds the layer-list model's
  parameters, stacked.
  """
  c, (graphdef, state) = _abstract(embedding, scan)
  if scan:
    layers = dict(nnx.to_flat_state(nnx.state(_model(embedding, False))))
    for path, var in nnx.to_flat_state(state):
      if path[0] == "blocks":
        var.set_value(jnp.stack([layers[("blocks", i, *path[1:])][...]
                                 for i in range(c.model.n_layers)]))
      else:
        var.set_value(layers[path][...])
    return nnx.merge(graphdef, state)
  rng = np.random.default_rng(0)
  for path, var in nnx.to_flat_state(state):
    shape, dtype = var.get_value().shape, var.get_value().dtype
    if path[-1] in ("scale", "ln_scale"):  # RMSNorm and LEV LayerNorm gains
      x = np.ones(shape)
    elif path[-1] == "ln_bias":
      x = np.zeros(shape)
    else:
      x = (1.0 if path[-1] == "spline_delta" else 0.5) * rng.standard_normal(shape)
    var.set_value(jnp.asarray(x, dtype))
  return nnx.merge(graphdef, state)


def _greedy(embedding="tied", scan=False, use_cache=True):
  return _greedy_cached(embedding, scan, use_cache)


@functools.lru_cache(maxsize=None)
def _greedy_cached(embedding, scan, use_cache):
  return generate(_model(embedding, scan), PROMPTS, max_new_tokens=N, use_cache=use_cache)


@pytest.mark.parametrize("scan", [False, True], ids=["layers_list", "scan_layers"])
@pytest.mark.parametrize("embedding", ["lev", "tied"])
def test_cached_greedy_equals_uncached_token_for_token(embedding, scan):
  """The reference for both layer loops: full forward passes of the layer-list model
  (the scan model holds the same parameters stacked)."""
  cached = _greedy(embedding, scan, True)
  assert cached == _greedy(embedding, False, False)
  assert [len(r) for r in cached] == [N] * len(PROMPTS)
  assert len({t for r in cached for t in r}) > N, "degenerate test model: one token"
  assert all(0 <= t < 300 for r in cached for t in r)


def test_a_left_padded_row_equals_its_prompt_alone():
  """Padding slots, restarted positions and the padding mask leave a row unchanged (the
  other rows are as long as the batch: no padding)."""
  assert len(PROMPTS[1]) < len(PROMPTS[0]) == len(PROMPTS[2])
  alone = generate(_model("lev", True), [PROMPTS[1]], max_new_tokens=N)
  assert alone == [_greedy("lev", True)[1]]


@pytest.mark.parametrize("embedding,scan", [("lev", False), ("tied", True)])
def test_prefill_and_step_logits_equal_full_forward(embedding, scan):
  """Left-padded prefill, then one cached step: logits of each row == its own forward."""
  model = _model(embedding, scan)
  rows, nxt = [[5, 6, 7, 8, 9], [10, 11, 12]], 20
  p = 5

  @nnx.jit
  def cached(m):
    ids = jnp.array([rows[0], [0, 0] + rows[1]], jnp.int32)
    valid = jnp.array([[True] * 5 + [True], [False, False] + [True] * 4])
    pos = jnp.array([[0, 1, 2, 3, 4, 5], [0, 0, 0, 1, 2, 3]])
    cache = m.init_cache(2, p + 1)
    pre, cache = m.decode(ids, pos[:, :p], cache, 0, valid)
    step, cache = m.decode(jnp.full((2, 1), nxt, jnp.int32), pos[:, p:], cache, p, valid)
    return pre, step, cache

  pre, step, cache = cached(model)
  assert cache["k"].shape == (2, 2, p + 1, 2, 8)  # [layers, B, S, kv_heads, head_dim]
  # The reference: each row alone from position 0, right-padded (causal: harmless).
  full = np.asarray(nnx.jit(lambda m, i: m(i))(
      model, jnp.array([rows[0] + [nxt], rows[1] + [nxt, 0, 0]])))
  for b, row in enumerate(rows):
    np.testing.assert_allclose(np.asarray(pre[b, p - len(row):]), full[b, :len(row)],
                               atol=2e-5)
    np.testing.assert_allclose(np.asarray(step[b, 0]), full[b, len(row)], atol=2e-5)


def test_cache_index_out_of_range_is_an_error():
  model = _model("tied", False)
  with pytest.raises(ValueError, match=r"cache_index = 4: .*cache length S = 5"):
    model.decode(jnp.zeros((1, 2), jnp.int32), jnp.zeros((1, 2), jnp.int32),
                 model.init_cache(1, 5), 4, jnp.ones((1, 5), bool))


def _first_only_in_row(out):
  """(row, index, id): an id whose first occurrence is in one row only."""
  for r, row in enumerate(out):
    for j, t in enumerate(row):
      if j == row.index(t) and all(t not in o for i, o in enumerate(out) if i != r):
        return r, j, t
  raise AssertionError(f"no row-specific token in {out}")


def test_stop_id_ends_its_row_only_and_is_included():
  full = _greedy()
  r, j, t = _first_only_in_row(full)
  out = generate(_model("tied", False), PROMPTS, max_new_tokens=N, stop_ids=[t])
  assert out[r] == full[r][:j + 1] and out[r][-1] == t
  assert [o for i, o in enumerate(out) if i != r] == [o for i, o in enumerate(full) if i != r]


def test_generation_ends_when_every_row_stopped():
  full = _greedy()
  out = generate(_model("tied", False), PROMPTS, max_new_tokens=N,
                 stop_ids=[row[0] for row in full])
  assert out == [row[:1] for row in full]


def test_sampling_is_seeded_and_never_picks_padded_ids():
  model = _model("tied", False)
  a = generate(model, PROMPTS, max_new_tokens=N, temperature=1.0, seed=3)
  assert a == generate(model, PROMPTS, max_new_tokens=N, temperature=1.0, seed=3)
  assert a != generate(model, PROMPTS, max_new_tokens=N, temperature=1.0, seed=4)
  assert a != _greedy()
  # A huge temperature flattens every logit, -1e9 included (to -1e-3): the 84 padded ids
  # must still never come.
  hot = generate(model, PROMPTS, max_new_tokens=N, temperature=1e12, seed=0)
  assert all(0 <= t < 300 for r in hot for t in r) and len({t for r in hot for t in r}) > 5


def test_top_k_one_is_greedy():
  out = generate(_model("tied", False), PROMPTS, max_new_tokens=N, temperature=1.0, top_k=1,
                 seed=5)
  assert out == _greedy()


_filter = jax.jit(filter_logits)  # one compile for every top_k, top_p below


def _kept(logits, top_k=0, top_p=1.0):
  out = np.asarray(_filter(jnp.asarray([logits], jnp.float32), top_k, top_p))[0]
  return sorted(np.flatnonzero(np.isfinite(out)).tolist())


def test_filter_logits_top_p_keeps_smallest_set_with_mass_p():
  logits = np.log([0.15, 0.5, 0.05, 0.3])  # mass sorted: 0.5, 0.3, 0.15, 0.05
  assert _kept(logits, top_p=0.4) == [1]
  assert _kept(logits, top_p=0.75) == [1, 3]
  assert _kept(logits, top_p=0.81) == [0, 1, 3]
  assert _kept(logits, top_p=0.97) == [0, 1, 2, 3]
  assert _kept(logits, top_p=1.0) == [0, 1, 2, 3]
  kept = np.asarray(_filter(jnp.asarray([logits], jnp.float32), 0, 0.75))[0]
  np.testing.assert_array_equal(kept[[1, 3]], np.float32(logits[[1, 3]]))


def test_filter_logits_top_k_then_top_p_on_the_renormalised_rest():
  logits = np.log([0.15, 0.5, 0.05, 0.3])
  assert _kept(logits, top_k=2) == [1, 3]
  assert _kept(logits, top_k=0) == [0, 1, 2, 3]
  assert _kept(logits, top_k=99) == [0, 1, 2, 3]
  assert _kept(logits, top_p=0.52) == [1, 3]  # 0.5 < 0.52: needs a second token
  assert _kept(logits, top_k=3, top_p=0.52) == [1]  # 0.5 / 0.95 > 0.52 after top-3


def test_filter_logits_off_is_a_bitwise_no_op():
  """top_k = 0 (or >= V) and top_p = 1.0 keep every id bit for bit, also when one logit
  holds all but 1e-10 of the mass: a float32 cumulative sum reaches 1.0 at the first id
  there, and comparing with it removed the other 2,047 (mlx-lm #1912, gemma #789)."""
  rng = np.random.default_rng(0)
  logits = rng.standard_normal((3, 2048)).astype(np.float32)
  logits[0, 7] = 30.0  # the rest: ~1e-10 of the mass in all
  logits[1, 9], logits[1, 10] = 29.0, 29.0
  logits[2, :100] = -np.inf  # masked (padded) ids stay -inf
  for top_k in (0, 2048, 5000):
    out = np.asarray(_filter(jnp.asarray(logits), top_k, 1.0))
    np.testing.assert_array_equal(out.view(np.uint32), logits.view(np.uint32),
                                  err_msg=f"top_k={top_k}")
  top3 = np.asarray(_filter(jnp.asarray(logits), 3, 1.0))  # top-p off after top-k too
  assert (np.isfinite(top3).sum(axis=1) == [3, 3, 3]).all()


@pytest.mark.parametrize("temperature", [1e-38, 5e-324, 1e39])
def test_a_temperature_outside_float32s_normal_range_is_refused(temperature):
  """A subnormal float32 temperature overflowed the logits to inf (the same ids for
  every prompt, vLLM #1623); 0 alone means greedy, so these are errors, not greedy."""
  with pytest.raises(ValueError, match=r"temperature = .*: expected 0 \(greedy\) or a "
                     r"normal float32 number, 1.1754944e-38 to 3.4028235e\+38"):
    generate(_model("tied", False), PROMPTS, max_new_tokens=2, temperature=temperature)


@pytest.mark.parametrize("kwargs,match", [
    (dict(prompts=[]), r"prompts: expected at least one prompt"),
    (dict(prompts=[[1, 2], []]), r"prompts\[1\] is empty"),
    (dict(prompts=[[1, 300]]), r"prompts\[0\]\[1\] = 300: expected a token id in \[0, "
                               r"vocab_size = 300\)"),
    (dict(prompts=[[-1]]), r"prompts\[0\]\[0\] = -1"),
    (dict(max_new_tokens=0), r"max_new_tokens = 0"),
    (dict(max_new_tokens=2045), r"prompts\[0\] has 4 tokens; \+ max_new_tokens = 2045 is "
                                r"2049 > config.model.max_seq_len = 2048"),
    (dict(temperature=-0.5), r"temperature = -0.5: expected a finite number >= 0"),
    (dict(temperature=float("nan")), r"temperature = nan"),
    (dict(top_k=-1), r"top_k = -1: expected an integer >= 0"),
    (dict(top_k=2.5), r"top_k = 2.5"),
    (dict(top_p=0.0), r"top_p = 0.0: expected a number in \(0, 1\]"),
    (dict(top_p=1.5), r"top_p = 1.5"),
    (dict(stop_ids=[1, 384]), r"stop_ids\[1\] = 384"),
    (dict(pad_id=300), r"pad_id = 300"),
])
def test_bad_input_errors(kwargs, match):
  args = dict(prompts=[[1, 2, 3, 4], [5]], max_new_tokens=4) | kwargs
  with pytest.raises(ValueError, match=match):
    generate(_model("tied", False), args.pop("prompts"), **args)
