"""Power-law fits, effective parameters and tokens-to-target on synthetic curves."""

import math

import numpy as np
import pytest

from lev_jax.ladder.scaling import (ScalingError, effective_params, fit_power_law, token_efficiency,
                             tokens_to_reach)

E, A, ALPHA = 1.69, 406.4, 0.34  # Hoffmann et al. (2022)-like values
SIZES = np.array([2e8, 4e8, 8e8, 1.2e9, 2.4e9, 4.8e9])


def _loss(n):
  return E + A * np.asarray(n) ** -ALPHA


def test_fit_recovers_known_parameters_from_noisy_points():
  noise = np.random.default_rng(0).normal(0.0, 0.002, SIZES.size)
  fit = fit_power_law(SIZES, _loss(SIZES) + noise)
  assert fit.n_points == 6 and fit.residual_rms < 0.005
  assert abs(fit.E - E) < 4 * fit.stderr["E"] + 0.05
  assert abs(fit.alpha - ALPHA) < 4 * fit.stderr["alpha"] + 0.05
  np.testing.assert_allclose(fit.loss(SIZES), _loss(SIZES), atol=0.01)
  assert all(v > 0 for v in fit.stderr.values())


def test_fit_is_exact_on_noiseless_points():
  fit = fit_power_law(SIZES, _loss(SIZES))
  assert fit.E == pytest.approx(E, abs=1e-4) and fit.alpha == pytest.approx(ALPHA, rel=1e-4)
  assert fit.A == pytest.approx(A, rel=1e-3)


def test_too_few_points_is_a_clear_error_not_a_curve():
  with pytest.raises(ScalingError, match=r"at least 4 rungs with distinct sizes .* got 3"):
    fit_power_law(SIZES[:3], _loss(SIZES[:3]))
  with pytest.raises(ScalingError, match="got 2"):  # repeated sizes do not count twice
    fit_power_law([2e8, 2e8, 4e8, 4e8], _loss([2e8, 2e8, 4e8, 4e8]))


def test_too_few_distinct_sizes_are_listed_as_counted():
  """Newcomer pass 13 (N185's summary): "no power-law fit: ... got 1: [688768.0,
  688768.0]" counted the distinct sizes but listed every rung's."""
  with pytest.raises(ScalingError, match=r"; got 1: \[688768.0\] \(from 2 rungs\)$"):
    fit_power_law([688768.0, 688768.0], [3.0, 3.1])
  with pytest.raises(ScalingError, match=r"; got 3: \[200000000.0, 400000000.0, "
                     r"800000000.0\]$"):
    fit_power_law(SIZES[:3], _loss(SIZES[:3]))


@pytest.mark.parametrize("n,loss,match", [
    ([1, 2, 3], [1.0, 2.0], "equal length"),
    ([1, 2, -3, 4], [3.0, 2.0, 1.5, 1.2], "positive"),
    ([1, 2, 3, 4], [3.0, float("nan"), 1.5, 1.2], "NaN"),
])
def test_bad_points(n, loss, match):
  with pytest.raises(ScalingError, match=match):
    fit_power_law(n, loss)


def test_effective_params_inverts_the_curve_with_an_interval():
  fit = fit_power_law(SIZES, _loss(SIZES) + np.random.default_rng(1).normal(0, 0.002, 6))
  target_n = 1.6e9
  out = effective_params(fit, float(fit.loss(target_n)))
  assert out["n_eff"] == pytest.approx(target_n, rel=1e-6)
  assert out["lo"] < out["n_eff"] < out["hi"]
  assert effective_params(fit, fit.E - 0.01)["n_eff"] == math.inf  # below the floor
  with pytest.raises(ScalingError, match="positive finite"):
    effective_params(fit, float("nan"))


def _curve(tokens, e=2.0, b=30.0, beta=0.2):
  return e + b * np.asarray(tokens) ** -beta


def test_tokens_to_reach_interpolates_in_log_tokens():
  tokens = np.geomspace(1e6, 1e9, 31)  # 10 points per decade
  losses = _curve(tokens)
  true = (30.0 / (3.0 - 2.0)) ** (1 / 0.2)  # L = 3.0 at T = (b / (L - e))^(1/beta)
  assert tokens_to_reach(tokens, losses, 3.0) == pytest.approx(true, rel=0.01)
  assert tokens_to_reach(tokens, losses, 100.0) == tokens[0]  # already below at the start
  assert tokens_to_reach(tokens, losses, 1.0) is None  # never reached
  with pytest.raises(ScalingError, match="strictly increasing"):
    tokens_to_reach(tokens[::-1], losses[::-1], 3.0)


def test_token_efficiency_on_a_curve_shifted_by_a_known_factor():
  """Leviathan's curve = tied curve at 2.1x the tokens: the ratio comes out 2.1."""
  tokens = np.geomspace(1e7, 1e10, 61)
  tied = _curve(tokens)
  leviathan = _curve(tokens * 2.1)
  out = token_efficiency(tokens, tied, tokens, leviathan)
  assert out["target"] == tied[-1] and out["ratio"] == pytest.approx(2.1, rel=0.01)
  worse = token_efficiency(tokens, tied, tokens, tied + 0.5)
  assert worse["leviathan_tokens"] is None and worse["ratio"] is None
