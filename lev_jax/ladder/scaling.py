"""Scaling-law arithmetic for tied vs Leviathan ladders: power-law fits, effective
parameters, tokens to reach a target loss.

  fit = fit_power_law(n_params_tied, final_loss_tied)      L(N) = E + A * N**-alpha
  effective_params(fit, final_loss_leviathan)              N with L(N) = that loss
  tokens_to_reach(tokens, losses, target)                  first crossing of a curve
  token_efficiency(tied_curve, leviathan_curve)            tied tokens / Leviathan tokens
                                                           to reach the tied final loss

The Leviathan paper reports effective-parameter ratios of 1.47-2.11x (v1) and a 2.1x
token efficiency (arXiv 2601.22040; ../shared/LEV.md "targets"). The fit is a weighted
least-squares fit (`scipy.optimize.curve_fit`, https://docs.scipy.org/doc/scipy/reference/
generated/scipy.optimize.curve_fit.html) of the saturating power law of Kaplan et al.
(2020) / Hoffmann et al. (2022, Eq. 2 with the data term folded into E), with its
covariance; uncertainties of derived figures come from sampling that covariance.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np
from scipy import optimize

# Three parameters, so at least one more point than that for an uncertainty.
MIN_POINTS = 4


class ScalingError(ValueError):
  """Inputs that cannot give a meaningful fit or crossing; the message says why."""


@dataclasses.dataclass(frozen=True)
class PowerLawFit:
  """L(N) = E + A * N**-alpha, N in parameters, L in nats per token.

  Attributes:
    E, A, alpha: the fitted parameters (E the irreducible loss).
    cov: float64 [3, 3] covariance of (E, log A, alpha) from the fit.
    n_points: points fitted; residual_rms: RMS of the residuals (nats).
  """

  E: float
  A: float
  alpha: float
  cov: np.ndarray = dataclasses.field(repr=False)
  n_points: int
  residual_rms: float

  @property
  def stderr(self) -> dict[str, float]:
    """One-sigma errors of E, A (delta method on log A) and alpha."""
    sd = np.sqrt(np.clip(np.diag(self.cov), 0.0, None))
    return {"E": float(sd[0]), "A": float(self.A * sd[1]), "alpha": float(sd[2])}

  def loss(self, n_params) -> np.ndarray:
    """L(N) for an array of parameter counts."""
    n = np.asarray(n_params, np.float64)
    return self.E + self.A * n ** -self.alpha


def _law(log_n, e, log_a, alpha):
  return e + np.exp(log_a - alpha * log_n)


def _check_pairs(xs, ys, x_name: str, y_name: str) -> tuple[np.ndarray, np.ndarray]:
  x, y = np.asarray(xs, np.float64), np.asarray(ys, np.float64)
  if x.ndim != 1 or x.shape != y.shape:
    raise ScalingError(f"{x_name} and {y_name} must be 1-D and of equal length; got shapes "
                       f"{x.shape} and {y.shape}")
  if not (np.isfinite(x).all() and np.isfinite(y).all()):
    raise ScalingError(f"{x_name} / {y_name} hold a NaN or infinity: {list(x)}, {list(y)}")
  if (x <= 0).any():
    raise ScalingError(f"{x_name} must be positive; got {list(x)}")
  return x, y


def fit_power_law(n_params: Sequence[float], losses: Sequence[float]) -> PowerLawFit:
  """Fits L(N) = E + A * N**-alpha to (parameter count, final loss) points.

  Args:
    n_params: N of each rung (parameters, e.g. the tied rungs' totals from lev-params).
    losses: final validation loss of each rung, nats per token.

  Returns:
    The fit, with the covariance of (E, log A, alpha).

  Raises:
    ScalingError: fewer than MIN_POINTS distinct N (three parameters leave no degree of
      freedom for an uncertainty: no curve is faked), bad values, or a fit that does
      not converge or has no finite covariance.
  """
  n, loss = _check_pairs(n_params, losses, "n_params", "losses")
  distinct = np.unique(n)  # sorted
  if len(distinct) < MIN_POINTS:  # the distinct sizes listed, as counted (N of 2 rungs once)
    raise ScalingError(
        f"a power-law fit L(N) = E + A N^-alpha needs at least {MIN_POINTS} rungs with "
        f"distinct sizes (3 parameters + 1 for an uncertainty); got {len(distinct)}: "
        f"{distinct.tolist()}"
        + (f" (from {len(n)} rungs)" if len(distinct) < len(n) else ""))
  log_n = np.log(n)
  e0 = 0.9 * loss.min()
  # Initial slope and scale from a straight line through log(L - E0) vs log N.
  slope, intercept = np.polyfit(log_n, np.log(loss - e0), 1)
  p0 = (e0, intercept, max(-slope, 1e-3))
  bounds = ([0.0, -50.0, 1e-4], [loss.min(), 100.0, 5.0])
  try:
    params, cov = optimize.curve_fit(_law, log_n, loss, p0=p0, bounds=bounds,
                                     maxfev=20_000)
  except (RuntimeError, ValueError) as e:
    raise ScalingError(f"the power-law fit did not converge on {len(n)} points: {e}") from e
  if not np.isfinite(cov).all():
    raise ScalingError(f"the power-law fit on {len(n)} points has no finite covariance "
                       "(degenerate points?); add rungs")
  e, log_a, alpha = (float(v) for v in params)
  residuals = loss - _law(log_n, e, log_a, alpha)
  return PowerLawFit(E=e, A=math.exp(log_a), alpha=alpha, cov=np.asarray(cov),
                     n_points=len(n), residual_rms=float(np.sqrt(np.mean(residuals ** 2))))


def _invert(e, log_a, alpha, loss):
  """N with E + A N^-alpha = loss, in log space; inf where loss <= E (or N overflows)."""
  gap = np.asarray(loss - e, np.float64)
  with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
    log_n = (log_a - np.log(np.where(gap > 0, gap, 1.0))) / alpha
    return np.where((gap > 0) & (log_n < 700.0), np.exp(np.minimum(log_n, 700.0)), np.inf)


def effective_params(fit: PowerLawFit, loss: float, *, samples: int = 4000,
                     seed: int = 0) -> dict[str, float]:
  """The parameter count a model on the fitted (tied) curve needs to reach `loss`.

  Args:
    fit: a `fit_power_law` result (of the tied rungs).
    loss: a Leviathan rung's final loss, nats per token.
    samples, seed: draws from the fit's covariance for the interval.

  Returns:
    ``{"n_eff": N, "lo": 16th, "hi": 84th percentile}`` (parameters); ``inf`` where
    the loss is at or below the fitted irreducible loss E.

  Raises:
    ScalingError: a non-finite or non-positive loss.
  """
  if not math.isfinite(loss) or loss <= 0:
    raise ScalingError(f"loss = {loss!r}: expected a positive finite number of nats")
  n_eff = float(_invert(fit.E, math.log(fit.A), fit.alpha, loss))
  rng = np.random.default_rng(seed)
  draws = rng.multivariate_normal([fit.E, math.log(fit.A), fit.alpha], fit.cov, samples,
                                  check_valid="ignore")
  spread = _invert(draws[:, 0], draws[:, 1], np.clip(draws[:, 2], 1e-4, None), loss)
  lo, hi = np.percentile(spread, [16, 84], method="nearest")  # inf-safe: no interpolation
  return {"n_eff": n_eff, "lo": float(lo), "hi": float(hi)}


def tokens_to_reach(tokens: Sequence[float], losses: Sequence[float], target: float
                    ) -> float | None:
  """Tokens at which a loss curve first reaches `target`.

  Linear interpolation in log(tokens) between the last point above the target and the
  first at or below it (eval curves are logged every train.eval_every steps).

  Args:
    tokens: increasing token counts of the curve's points (> 0).
    losses: the loss at each point, nats per token.
    target: the loss to reach.

  Returns:
    The token count, or None when the curve never reaches the target.

  Raises:
    ScalingError: tokens not strictly increasing, mismatched lengths, bad values.
  """
  t, loss = _check_pairs(tokens, losses, "tokens", "losses")
  if len(t) and (np.diff(t) <= 0).any():
    raise ScalingError(f"tokens must be strictly increasing; got {list(t)}")
  hit = np.flatnonzero(loss <= target)
  if not hit.size:
    return None
  i = int(hit[0])
  if i == 0:
    return float(t[0])
  frac = (loss[i - 1] - target) / (loss[i - 1] - loss[i])
  return float(np.exp(np.log(t[i - 1]) + frac * (np.log(t[i]) - np.log(t[i - 1]))))


def token_efficiency(tied_tokens, tied_losses, leviathan_tokens, leviathan_losses
                     ) -> dict[str, float | None]:
  """How many fewer tokens Leviathan needs to reach its tied twin's final loss.

  Returns:
    ``{"target": the tied final loss, "tied_tokens": tokens of the tied run's final
    point, "leviathan_tokens": tokens Leviathan needed (None: never reached), "ratio":
    tied_tokens / leviathan_tokens (None when not reached)}``; the paper's figure is
    2.1x.

  Raises:
    ScalingError: an empty or malformed curve.
  """
  t_tied, l_tied = _check_pairs(tied_tokens, tied_losses, "tied tokens", "tied losses")
  if not len(t_tied):
    raise ScalingError("the tied curve has no points")
  target = float(l_tied[-1])
  reached = tokens_to_reach(leviathan_tokens, leviathan_losses, target)
  return {"target": target, "tied_tokens": float(t_tied[-1]), "leviathan_tokens": reached,
          "ratio": None if reached is None else float(t_tied[-1]) / reached}
