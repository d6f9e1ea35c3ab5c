"""`meta --fit`: a combination of the metrics fitted to the judgments (`caprecon.stats.fit`),
cross-validated by image on every file, optionally carried from one file to another
(`evaluate_on`), and saved for `score -m fused:FILE`."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from caprecon.apps.metabench.request import MetaError, MetaRequest
from caprecon.data.judgments import Judgments
from caprecon.stats.agreement import MetaRow


def check_fit_arguments(req: MetaRequest, files: Sequence[Judgments]) -> None:
    """Misuse of the --fit options stops the command before any scoring."""
    given = [name for name, value in (("--save", req.save), ("--fit-on", req.fit_on),
                                      ("--evaluate-on", req.evaluate_on)) if value]
    if given and not req.fit:
        raise MetaError(f"{', '.join(given)} need(s) --fit")
    if not req.fit:
        return
    if req.save and req.fit_model == "gbt":
        raise MetaError("--save writes linear and logistic models only: gradient-boosted trees have no plain-JSON "
                        "form in scikit-learn, and caprecon does not write pickles (opening one runs code)")
    for option, name in (("--fit-on", req.fit_on), ("--evaluate-on", req.evaluate_on)):
        if name:
            judgments_named(name, files, option)
    if req.evaluate_on and judgments_named(req.evaluate_on, files, "") is fit_on_file(req, files):
        raise MetaError("--evaluate-on names the same file the model is fitted on; its cross-validation is the "
                        "honest figure there")


def judgments_named(name: str, files: Sequence[Judgments], option: str) -> Judgments:
    for judgments in files:
        if name in (judgments.name, Path(judgments.name).stem, str(judgments.path)):
            return judgments
    raise MetaError(f"{option} {name!r} is none of the --judgments files ({', '.join(j.name for j in files)})")


def fit_on_file(req: MetaRequest, files: Sequence[Judgments]) -> Judgments:
    return judgments_named(req.fit_on, files, "--fit-on") if req.fit_on else files[0]


def refuse_unfittable_scores(judgments: Judgments, scores: Mapping[str, np.ndarray]) -> None:
    """A MetaError naming the rows, before any fitting, where a metric's scores cannot be fitted: an
    infinite score, or finite ones so large that standardising them overflows. A NaN is a caption
    the metric did not score (a row error, or missing from --scores): such rows are left out of the
    fit, as its report says."""
    ids = [f"{it.id}:{side}" for it in judgments.items for side in "ab"] if judgments.pairwise else \
        [it.id for it in judgments.items]
    for metric, raw in scores.items():
        values = np.asarray(raw, float)
        bad = np.flatnonzero(np.isinf(values))
        what = "infinite"
        if not len(bad):
            finite = values[np.isfinite(values)]
            with np.errstate(all="ignore"):
                overflows = len(finite) and not np.isfinite(np.std(finite))
            if not overflows:
                continue
            # a square summed over the rows overflows past this size: the rows above it are the culprits
            limit = math.sqrt(np.finfo(float).max / len(finite))
            bad = np.flatnonzero(np.abs(np.nan_to_num(values)) > limit)
            bad = bad if len(bad) else np.flatnonzero(np.abs(values) == np.max(np.abs(finite)))
            what = "so large that standardising them overflows"
        shown = ", ".join(f"{ids[k]} ({values[k]:g})" for k in bad[:5]) + (", ..." if len(bad) > 5 else "")
        raise MetaError(f"{judgments.name}: --fit: {metric}'s scores are {what} on caption(s) {shown}; "
                        "fix them in the --scores file, or leave the metric out of --metric")


def cross_validate_file(req: MetaRequest, judgments: Judgments, scores: dict[str, np.ndarray],
                        directions: Mapping[str, bool | None]):
    from caprecon.stats.fit import FitError, cross_validate

    refuse_unfittable_scores(judgments, scores)
    try:
        return cross_validate(req.fit_model, judgments, scores, list(scores), n_folds=req.folds,
                              tau_variant=req.tau, human_order=req.human_order, n_bootstrap=req.bootstrap,
                              seed=req.seed, higher_is_better=directions)
    except FitError as exc:
        raise MetaError(f"{judgments.name}: {exc}") from None


def finish_fit(req: MetaRequest, fits: list, notes: list[str]) -> tuple[list[MetaRow], list]:
    """The transfer (--evaluate-on), the fit report and --save; returns the transfer's rows for
    meta.csv, and every `FitResult` (each file's cross-validation, then the transfer)."""
    from caprecon.reports.fit import write_fit_report
    from caprecon.stats.fit import FitError, fused_model, transfer

    source = fit_on_file(req, [j for j, _, _, _ in fits])
    _, _, trained, _ = next(f for f in fits if f[0] is source)
    results = [fit for _, _, fit, _ in fits]
    rows: list[MetaRow] = []
    if req.evaluate_on:
        target = judgments_named(req.evaluate_on, [j for j, _, _, _ in fits], "--evaluate-on")
        _, target_scores, _, target_directions = next(f for f in fits if f[0] is target)
        try:
            moved = transfer(trained.final, source.name, target, target_scores, tau_variant=req.tau,
                             human_order=req.human_order, n_bootstrap=req.bootstrap, seed=req.seed,
                             higher_is_better=target_directions)
        except FitError as exc:
            raise MetaError(f"--evaluate-on {target.name}: {exc}") from None
        results.append(moved)
        rows.append(moved.rows[0])
    write_fit_report(results, req.out)
    if req.save:
        sha256 = fused_model(trained).save(req.save)
        notes.append(f"saved the {trained.kind} model fitted on all of {source.name} to {req.save} "
                     f"(sha256 {sha256[:12]}; the out-of-fold figure above estimates it on unseen images); "
                     f"use it with caprecon score -m fused:{req.save}")
    return rows, results
