"""What the run's other captions say about a caption's seed variance: the priors of adaptive
seeds' rules (`metrics/adaptive.py`, `--adaptive-rule`), fitted to the captions' sample
variances, and the interval half-width at one seed each gives a caption whose draws gave
s_i^2 with df degrees of freedom (written for the first stage, df = MIN - 1):

       stein      h_i = t(0.975, MIN - 1) s_i (the caption's own variance)
       pooled     h_i = t(0.975, the captions' df summed) x the root of their df-weighted mean s^2
       moderated  h_i = t(0.975, d0 + MIN - 1) sqrt(v_i), v_i = (d0 s0^2 + (MIN - 1) s_i^2) /
                  (d0 + MIN - 1), where the captions' variances are taken as drawn from a
                  scaled inverse chi-square distribution (d0, s0^2), fitted to the s_i^2 by
                  moments of log s^2 (Smyth 2004, the limma moderated t), d0 at most
                  (captions - 1) x (MIN - 1): the prior holds no more than the other captions'
                  draws;
       mixture    the same with a mixture of 1 to 3 such distributions (weights w_c, d_c, s_c^2),
                  fitted by maximum likelihood (s^2 / s_c^2 is F(MIN - 1, d_c)) with the number
                  of components by BIC, K only with 20 K captions, d_c at most (its share of the
                  captions - 1) x (MIN - 1). Given s_i^2 the caption's variance is component c's
                  posterior with c's posterior weight, so (mean - true) sqrt(N) is a mixture of
                  Student-t's; h_i is its two-sided 0.95 quantile. Two components hold a run of
                  specific and vague captions (a two-point spread of noise), which one smooth
                  shape cannot: fitted to one, its d0 is about 2 and a quiet caption's t has 4
                  degrees of freedom, twice the seeds it needs. Where BIC picks one component or
                  the shared variance, that one scaled inverse chi-square is not plugged in at
                  its estimate but integrated over the posterior of its (d0, s0^2) given every
                  caption's draws (`fit_integrated`, below).

The prior's own estimation error: a prior plugged in at its estimate is taken as known. With a
dozen captions a twofold spread of noise (sd sigma for half of them, 2 sigma for the others)
cannot be told from chance: the draws hardly tell a d0 of about 5 (that spread's) from an
infinite one (no spread), the estimate is often the pooled variance, and the noisier captions' intervals are too
short (0.85 of them covered, 0.92 of all, over 100 simulated runs of 12 captions). So the default rule,
where its fit has one component, integrates over (d0, s0^2): the caption's variance given its
draws and (d0, s0^2) is their posterior as above, and (d0, s0^2) has its posterior given every
caption's draws (which already holds this caption's: given (d0, s0^2) its variance depends on
the others through them alone), so h_i is the quantile of the mixture of Student-t's over that
posterior. The prior on (d0, s0^2) is uniform in B = d0 / (d0 + the captions' mean df), the
share of the prior in a typical caption's variance (the uniform shrinkage prior of hierarchical
models, Daniels 1999; B = 0 is stein, B = 1 pooled; proper, so the posterior is one for any
number of captions), and flat in log s0 (a scale's); it is evaluated on a grid in (logit B, log s0^2). With few captions the d0
that chance cannot rule out keep each caption's own variance some weight (the twofold spread
over 12 captions: 0.89 of the noisier covered, 0.94 of all); with many the posterior narrows to
the estimate, so large runs keep the plugged-in rule's seeds. A fit of two or three components
(40 captions or more) is still plugged in at its estimate.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from caprecon.metrics.seeds import LEVEL

RULES = ("mixture", "moderated", "pooled", "stein")
DEFAULT_RULE = "mixture"


def t_quantile(df: float, level: float = LEVEL) -> float:
    """The two-sided `level` quantile of Student's t with `df` degrees of freedom."""
    return float(t_quantile_array(df, level))


def trigamma_inverse(y: float) -> float:
    """x with trigamma(x) = y (y > 0), by Smyth's (2004) Newton iteration from 0.5 + 1/y."""
    from scipy.special import polygamma

    if y > 1e7:
        return 1 / math.sqrt(y)
    if y < 1e-6:
        return 1 / y
    x = 0.5 + 1 / y
    for _ in range(50):
        tri = float(polygamma(1, x))
        step = tri * (1 - tri / y) / float(polygamma(2, x))
        x += step
        if -step / x < 1e-8:
            break
    return x


@dataclass(frozen=True)
class VariancePrior:
    """What the other captions say about a caption's seed variance: `df` degrees of freedom at
    standard deviation `sd`. `pooled`: the caption's variance is the prior's alone (it already
    holds the caption's own draws)."""

    df: float
    sd: float
    pooled: bool = False

    def moderate(self, sd: float, df: int) -> tuple[float, float]:
        """(sd, degrees of freedom) of the interval of a caption whose first stage gave `sd` with `df`."""
        if self.pooled:
            return self.sd, self.df
        if self.df == 0:
            return sd, df
        total = self.df + df  # sqrt((d0 s0^2 + d s^2) / (d0 + d)), without squaring large values
        return math.hypot(math.sqrt(self.df / total) * self.sd, math.sqrt(df / total) * sd), total

    def half_width(self, sd: float, df: int, level: float = LEVEL) -> float:
        """The `level` interval's half-width at one seed of a caption whose first stage gave `sd` with
        `df` degrees of freedom: t(level, df') sd' of its moderated (sd', df')."""
        sd, df = self.moderate(sd, df)
        return t_quantile(df, level) * sd

    def to_json(self) -> dict[str, Any]:
        return {"df": self.df, "sd": self.sd, **({"pooled": True} if self.pooled else {})}


OWN = VariancePrior(0.0, 0.0)  # stein: nothing borrowed


def fit_prior(sds: Sequence[float], df: int | Sequence[int], rule: str = DEFAULT_RULE
              ) -> VariancePrior | MixturePrior | IntegratedPrior:
    """The prior `rule` takes from the captions' sds so far, each with `df` degrees of freedom (one
    count for all, or one per caption: after a later stage, captions have drawn different
    numbers of seeds): none for stein or for fewer than two captions; their pooled sd with the
    sum of their degrees of freedom; the moderated fit (module doc), from the captions
    whose sd is above 0 (log 0 has no moment); or the mixture fit (`fit_mixture`), where it has
    one component or the shared variance the one component integrated over the posterior of its
    parameters (`fit_integrated`). The fits are
    likelihoods (or moments) of each caption's variance at its own df, so a caption's draw count
    chosen from its earlier draws leaves them unbiased: the stopping rule's factor of the
    likelihood holds no parameter."""
    if rule not in RULES:
        raise ValueError(f"adaptive rule must be one of {', '.join(RULES)}, not {rule!r}")
    if rule == "stein" or len(sds) < 2:
        return OWN
    dfs = [float(d) for d in np.broadcast_to(np.asarray(df, float), len(sds))]
    if rule == "mixture":
        mixture = fit_mixture(sds, dfs)
        one_component = mixture.pooled if isinstance(mixture, VariancePrior) else len(mixture.weights) == 1
        return fit_integrated(sds, dfs) if one_component else mixture
    if rule == "pooled":
        scale = max(sds) or 1.0
        total = math.fsum(dfs)
        return VariancePrior(total, scale * math.sqrt(math.fsum(d * (s / scale) ** 2 for s, d in zip(sds, dfs)) / total),
                             pooled=True)
    from scipy.special import digamma, polygamma

    seen = [(2 * math.log(s), d) for s, d in zip(sds, dfs) if s > 0]
    if len(seen) < 2:
        return OWN
    # E[log s^2] - log sigma^2 at each caption's df, taken off its log s^2
    centred = [z - (float(digamma(d / 2)) - math.log(d / 2)) for z, d in seen]
    mean = math.fsum(centred) / len(centred)
    excess = (math.fsum((z - mean) ** 2 for z in centred) / (len(centred) - 1)
              - math.fsum(float(polygamma(1, d / 2)) for _, d in seen) / len(seen))
    most = (len(seen) - 1) * math.fsum(d for _, d in seen) / len(seen)  # no more draws than the other captions have
    prior_df = most if excess <= 0 else min(most, 2 * trigamma_inverse(excess))
    log_var = mean + float(digamma(prior_df / 2)) - math.log(prior_df / 2)
    return VariancePrior(prior_df, math.exp(log_var / 2))


MOST_COMPONENTS = 3
#: captions per component a mixture must have: in simulation, fewer could not tell two spreads of noise apart
CAPTIONS_PER_COMPONENT = 20


def _log_marginal(variance: Any, df: float, prior_df: Any, prior_var: Any) -> Any:
    """log of the density of a first-stage variance with `df` degrees of freedom when the caption's
    variance follows a scaled inverse chi-square (prior_df, prior_var), less the terms that do not
    depend on the prior: variance / prior_var is F(df, prior_df)."""
    from scipy.special import gammaln

    scale = prior_df * prior_var
    return (gammaln((df + prior_df) / 2) - gammaln(prior_df / 2) - df / 2 * np.log(scale)
            - (df + prior_df) / 2 * np.log1p(df * variance / scale))


@dataclass(frozen=True)
class MixturePrior:
    """The captions' seed variances as drawn from a mixture of scaled inverse chi-square
    distributions: component c has weight `weights[c]`, `dfs[c]` degrees of freedom at sd `sds[c]`.
    One component is `VariancePrior`'s moderated variance; two can hold specific and vague
    captions (a two-point spread of noise) that one smooth shape cannot."""

    weights: tuple[float, ...]
    dfs: tuple[float, ...]
    sds: tuple[float, ...]

    def half_width(self, sd: float, df: int, level: float = LEVEL) -> float:
        """The `level` interval's half-width at one seed of a caption whose first stage gave `sd` with
        `df` degrees of freedom: given it, the caption's variance is component c's posterior (scaled
        inverse chi-square, df_c + df degrees of freedom at (df_c sd_c^2 + df sd^2) / (df_c + df)) with
        the posterior weight of c, so (mean - true) sqrt(N) is that mixture of Student-t's; the
        half-width is its two-sided `level` quantile, between the components' own."""
        prior_df, prior_var = np.array(self.dfs), np.array(self.sds) ** 2
        log_post = np.log(self.weights) + _log_marginal(sd**2, df, prior_df, prior_var)
        post = np.exp(log_post - log_post.max())
        return t_mixture_quantile(post / post.sum(), prior_df, prior_var, sd, df, level)

    def to_json(self) -> dict[str, Any]:
        return {"components": [{"weight": w, "df": d, "sd": s} for w, d, s in zip(self.weights, self.dfs, self.sds)]}


def t_mixture_quantile(weights: Any, prior_df: Any, prior_var: Any, sd: float, df: float, level: float = LEVEL,
                       quantiles: Any = None) -> float:
    """The half-width h at one seed with sum_c weights_c (2 T(post_df_c, h / post_sd_c) - 1) = `level`: the
    two-sided quantile of (mean - true) sqrt(N) when the caption's variance is, with probability
    weights_c, the posterior of a scaled inverse chi-square (prior_df_c, prior_var_c) given its draws'
    sd `sd` at `df` degrees of freedom: (prior_df_c + df) degrees of freedom at (prior_df_c prior_var_c +
    df sd^2) / (prior_df_c + df). It lies between the components' own quantiles. `quantiles`: each
    component's t(level, post_df_c), where the caller holds them (computed here otherwise)."""
    from scipy.optimize import brentq
    from scipy.special import stdtr

    post_df = prior_df + df
    post_sd = np.sqrt((prior_df * prior_var + df * sd**2) / post_df)
    halves = (t_quantile_array(post_df, level) if quantiles is None else quantiles) * post_sd
    low, high = float(halves.min()), float(halves.max())

    def covered(half: float) -> float:
        return float(weights @ (2 * stdtr(post_df, half / post_sd) - 1)) - level

    if covered(low) >= 0:  # one component holds (nearly) all the posterior weight: its own quantile
        return low
    if covered(high) <= 0:  # rounding at the far end
        return high
    return float(brentq(covered, low, high, xtol=1e-14 * high, rtol=1e-12))


def t_quantile_array(df: Any, level: float = LEVEL) -> np.ndarray:
    """`t_quantile` of each of an array of degrees of freedom."""
    from scipy.special import stdtrit

    return stdtrit(np.asarray(df, float), 0.5 + level / 2)


def positive_variances(sds: Sequence[float], df: int | Sequence[float]) -> tuple[np.ndarray, np.ndarray, float] | None:
    """What the mixture and integrated fits take from the captions' sds, each with `df` degrees of freedom
    (one count for all or one per caption): (the variances of the sds above 0 in units of their geometric
    mean, so the fits work with values near 1; their df; that unit), or None for fewer than two."""
    sds = np.asarray(sds, dtype=float)
    df = np.broadcast_to(np.asarray(df, dtype=float), sds.shape)[sds > 0]
    variances = sds[sds > 0] ** 2
    if len(variances) < 2:
        return None
    unit = float(np.exp(np.log(variances).mean()))
    return variances / unit, df, unit


def fit_mixture(sds: Sequence[float], df: int | Sequence[float]) -> MixturePrior | VariancePrior:
    """The mixture of 1 to `MOST_COMPONENTS` scaled inverse chi-square distributions that fits the
    captions' sds (each with `df` degrees of freedom, one count for all or one per caption; those
    above 0) by maximum likelihood, the number of components by BIC, K only with
    `CAPTIONS_PER_COMPONENT` x K captions; a component's degrees of freedom at most (its share of
    the captions - 1) x the captions' mean df, what the other captions' draws in it hold. Where one
    variance shared by every caption fits better by BIC (one parameter: noise alike), the pooled
    variance (the df-weighted mean of the s^2), with the captions' df summed: a fitted
    d0 of 20 where the truth is infinite costs (t(22) / t(800))^2 = 1.12 times the seeds. Stein's own
    variance (`OWN`) for fewer than two captions with an sd above 0."""
    seen = positive_variances(sds, df)
    if seen is None:
        return OWN
    variances, df, unit = seen
    most = (len(variances) - 1) * float(df.mean())
    # one variance shared by every caption (a component of infinite df), one parameter: the pooled rule
    shared = float(df @ variances / df.sum())
    shared_loglik = float(np.sum(-df / 2 * np.log(2 * shared) - df * variances / (2 * shared)))
    best: tuple[float, MixturePrior | VariancePrior] = (
        -2 * shared_loglik + math.log(len(variances)),
        VariancePrior(float(df.sum()), math.sqrt(shared * unit), pooled=True))
    for k in range(1, MOST_COMPONENTS + 1):
        if k > 1 and len(variances) < CAPTIONS_PER_COMPONENT * k:
            break
        loglik, weights, dfs, prior_vars = _fit_components(variances, df, k, most)
        bic = -2 * loglik + (3 * k - 1) * math.log(len(variances))
        if bic < best[0]:
            best = bic, MixturePrior(tuple(map(float, weights)), tuple(map(float, dfs)),
                                     tuple(float(math.sqrt(v * unit)) for v in prior_vars))
    return best[1]


#: the grid of the one-component prior's (logit of its share, log variance): a coarse pass over the range the
#: captions' variances allow, then a fine one over the box where the coarse posterior is within
#: `GRID_SPAN` (log) of its peak; grid points below `GRID_MASS` of the posterior together are dropped
COARSE_GRID, FINE_GRID, GRID_SPAN, GRID_MASS = 41, 41, 15.0, 1e-7
#: logit of the prior's share in a typical caption's variance at the grid's ends: share e^-9 (the caption's own
#: variance) to 1 - e^-9 (the pooled one)
LOGIT_SPAN = 9.0
#: captions whose likelihood terms are taken at once over the whole grid: 41 x 41 x n values held at a
#: time would be 850 MB at n = 20,000; in chunks of 2,048 they are under 30 MB whatever n
LIKELIHOOD_CHUNK = 2048


@dataclass(frozen=True)
class IntegratedPrior:
    """One scaled inverse chi-square for the captions' variances, its (d0, s0^2) not plugged in at an
    estimate but integrated over their posterior given every caption's draws so far (`fit_integrated`):
    grid points with posterior weights `weights`, each `dfs[j]` degrees of freedom at sd `sds[j]`."""

    weights: tuple[float, ...]
    dfs: tuple[float, ...]
    sds: tuple[float, ...]

    def half_width(self, sd: float, df: int, level: float = LEVEL) -> float:
        """The `level` half-width at one seed of a caption whose draws so far gave `sd` with `df` degrees
        of freedom: given (d0, s0^2) its variance is their posterior (module doc), and (d0, s0^2) has
        the grid's posterior weights, which already hold this caption's draws (its variance depends on
        the other captions only through (d0, s0^2)), so the mean's error is that mixture of Student-t's."""
        weights, dfs, variances = self.arrays
        quantiles = self.quantiles.get((df, level))
        if quantiles is None:  # a run's captions share few dfs: each one's t quantiles over the grid once
            quantiles = self.quantiles[df, level] = t_quantile_array(dfs + df, level)
        return t_mixture_quantile(weights, dfs, variances, sd, df, level, quantiles)

    @cached_property
    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(weights, dfs, variances) as arrays, made once for every half-width the prior gives."""
        return np.array(self.weights), np.array(self.dfs), np.array(self.sds) ** 2

    @cached_property
    def quantiles(self) -> dict[tuple[float, float], np.ndarray]:
        """t(level, dfs + df) over the grid's points by (df, level), filled as half-widths ask for them."""
        return {}

    def to_json(self) -> dict[str, Any]:
        weights, dfs, sds = map(np.array, (self.weights, self.dfs, self.sds))

        def quantiles(values: np.ndarray) -> list[float]:
            order = np.argsort(values)
            mass = np.cumsum(weights[order])
            return [float(values[order][min(np.searchsorted(mass, q), len(mass) - 1)]) for q in (0.05, 0.5, 0.95)]

        return {"integrated": {"points": len(weights), "df_5_50_95": quantiles(dfs), "sd_5_50_95": quantiles(sds)}}


def fit_integrated(sds: Sequence[float], df: int | Sequence[float]) -> IntegratedPrior | VariancePrior:
    """The captions' variances as one scaled inverse chi-square (d0, s0^2), integrated over the posterior
    of (d0, s0^2) given every caption's sd (those above 0, each with its `df`): the likelihood is the
    product of each s_i^2's density (s_i^2 / s0^2 is F(df_i, d0)); the prior is uniform in the share
    B = d0 / (d0 + the captions' mean df) that the prior takes in a typical caption's variance (a proper
    prior from the caption's own variance, B = 0, to the pooled one, B = 1) and flat in log s0 (a scale's
    prior). Plugging in d0's maximum likelihood takes it as known: with a dozen captions a twofold
    spread of noise cannot be told from chance, the estimate is often the pooled variance, and the
    noisier captions' intervals are too short. Integrated, the d0 that chance cannot rule out keep
    each caption's own variance some weight; with many captions the posterior narrows to the
    estimate. Stein's own variance (`OWN`) for fewer than two captions with an sd above 0."""
    from scipy.special import expit

    seen = positive_variances(sds, df)
    if seen is None:
        return OWN
    scaled, df, unit = seen
    logs, mean_df = np.log(scaled), float(df.mean())

    def log_posterior(logit: np.ndarray, log_var: np.ndarray) -> np.ndarray:
        share = expit(logit)[:, None]
        prior_df = mean_df * np.exp(logit)[:, None]  # d0 = mean df x B / (1 - B)
        prior_var = np.exp(log_var)[None, :, None]
        chunks = (slice(at, at + LIKELIHOOD_CHUNK) for at in range(0, len(scaled), LIKELIHOOD_CHUNK))
        loglik = sum(_log_marginal(scaled[None, None, part], df[None, None, part], prior_df[..., None],
                                   prior_var).sum(axis=2) for part in chunks)
        return loglik + np.log(share * (1 - share))  # uniform in B: d(B) = B (1 - B) d(logit B)

    logit = np.linspace(-LOGIT_SPAN, LOGIT_SPAN, COARSE_GRID)
    log_var = np.linspace(logs.min() - 2, logs.max() + 2, COARSE_GRID)
    coarse = log_posterior(logit, log_var)
    near = np.argwhere(coarse >= coarse.max() - GRID_SPAN)
    low, high = near.min(axis=0) - 1, near.max(axis=0) + 1
    logit = np.linspace(logit[max(low[0], 0)], logit[min(high[0], COARSE_GRID - 1)], FINE_GRID)
    log_var = np.linspace(log_var[max(low[1], 0)], log_var[min(high[1], COARSE_GRID - 1)], FINE_GRID)
    fine = log_posterior(logit, log_var)
    weights = np.exp(fine - fine.max()).ravel()
    weights /= weights.sum()
    order = np.argsort(weights)[::-1]
    kept = order[: int(np.searchsorted(np.cumsum(weights[order]), 1 - GRID_MASS)) + 1]
    prior_df = np.repeat(mean_df * np.exp(logit), FINE_GRID)[kept]
    prior_sd = np.sqrt(np.tile(np.exp(log_var), FINE_GRID)[kept] * unit)
    weights = weights[kept] / weights[kept].sum()
    return IntegratedPrior(tuple(map(float, weights)), tuple(map(float, prior_df)), tuple(map(float, prior_sd)))


def _fit_components(variances: np.ndarray, df: np.ndarray, k: int, most: float) -> tuple[float, Any, Any, Any]:
    """(log-likelihood, weights, dfs, variances) of k components fitted by L-BFGS from two starts
    (components at the k quantiles of log s^2, df 4 and 40), each caption's variance at its own
    `df`. Parameters: the weights' logits against the first, log df and log variance of each
    component."""
    from scipy.optimize import minimize
    from scipy.special import digamma

    logs, mean_df, df = np.log(variances), float(df.mean()), df[None, :]

    def unpack(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        logits = np.concatenate([[0.0], x[: k - 1]])
        weights = np.exp(logits - logits.max())
        return weights / weights.sum(), np.exp(x[k - 1: 2 * k - 1]), np.exp(x[2 * k - 1:])

    def minus_loglik(x: np.ndarray) -> tuple[float, np.ndarray]:
        weights, dfs, prior_vars = unpack(x)
        a, scale = dfs[:, None], (dfs * prior_vars)[:, None]
        log_joint = np.log(weights)[:, None] + _log_marginal(variances[None, :], df, a, scale / a)
        top = log_joint.max(axis=0)
        total = top + np.log(np.exp(log_joint - top).sum(axis=0))
        share = np.exp(log_joint - total)  # each caption's posterior weight of each component
        ratio = df * variances[None, :] / scale
        by_scale = -df / 2 + (df + a) / 2 * ratio / (1 + ratio)  # d loglik / d log(df x variance)
        by_df = a / 2 * (digamma((df + a) / 2) - digamma(a / 2) - np.log1p(ratio))  # at a fixed scale
        gradient = np.concatenate([(share - weights[:, None]).sum(axis=1)[1:], (share * (by_df + by_scale)).sum(axis=1),
                                   (share * by_scale).sum(axis=1)])
        return -float(total.sum()), -gradient

    centres = np.quantile(logs, (np.arange(k) + 0.5) / k)
    bounds = ([(-20.0, 20.0)] * (k - 1) + [(math.log(0.01), math.log(most))] * k
              + [(logs.min() - 5, logs.max() + 5)] * k)
    fits = [minimize(minus_loglik, np.concatenate([np.zeros(k - 1), np.full(k, math.log(min(start, most))), centres]),
                     jac=True, method="L-BFGS-B", bounds=bounds) for start in (4.0, 40.0)]
    fit = min(fits, key=lambda f: f.fun)
    weights, dfs, prior_vars = unpack(fit.x)
    # a component knows no more than its other captions' draws hold: its share of the captions, less one
    dfs = np.clip(dfs, 0.01, np.maximum(len(variances) * weights - 1, 0.01) * mean_df)
    return -float(fit.fun), weights, dfs, prior_vars
