"""Sentence-experiment reports: the runs' results as statistics (:func:`summarize`, with the tests of
:mod:`~mtsa_fairseq.experiments.significance`), Markdown tables and a dev-curve plot; :func:`write_report` writes
them to ``OUT/report.json``, ``report.md`` and ``dev-curves.png``."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from mtsa_fairseq.experiments.files import write_atomic, write_json
from mtsa_fairseq.experiments.plotting import pyplot, save_figure
from mtsa_fairseq.experiments.sentence.runs import ExperimentError, TaskConfig
from mtsa_fairseq.experiments.significance import (
    SignificanceError,
    anchor_test,
    binomial_se,
    corrected_resampled_t_test,
    paired_t_test,
    t_interval,
    t_test,
)
from mtsa_fairseq.experiments.tables import markdown_table

CV_KINDS = ("chosen", "best", "last")  # the honest number first
LOWER_IS_BETTER = {"mse"}  # metrics for which the one-sided test asks whether the reference is lower
ANCHOR_KINDS = {"chosen": "chosen on the other folds", "best": "best (test-selected)", "last": "last"}


def write_report(config: TaskConfig, results: list[dict[str, Any]], reference: str, split: str | None,
                 lr_from: dict[str, Any] | None, out: Path) -> str:
    """Summarize the results (evaluated on ``split``, default test or the held-out fold; learning rates from the
    search ``lr_from``) into OUT/report.json, report.md and dev-curves.png; returns the Markdown."""
    summary = summarize(config, results, reference)
    summary["split"] = split or ("held-out fold" if "cross_validation" in summary else "test")
    if lr_from is not None:
        summary["lr_from"] = lr_from
    summary["runs"] = [{"run": r["run"], "arch": r["arch"], "seed": r["seed"], "fold": r["fold"],
                        "metrics": r["metrics"], "max_update": r["max_update"], "lr": r.get("lr"),
                        "best_checkpoint_updates": r["num_updates"],
                        "num_params_without_embeddings": r["num_params_without_embeddings"],
                        "train_words_per_second": r["train_words_per_second"], "split": r["split"],
                        "dev_curve": r.get("dev_curve")} for r in results]
    markdown = publish(out / "report", summary, markdown=report_markdown(summary))
    plot_dev_curves(summary["runs"], config.metric, config.name, out / "dev-curves.png")
    return markdown


def publish(stem: Path, report: dict[str, Any], markdown: str) -> str:
    """Write ``report`` to ``STEM.json`` and its ``markdown`` to ``STEM.md``; returns the Markdown."""
    write_json(stem.with_suffix(".json"), report)
    write_atomic(stem.with_suffix(".md"), markdown)
    return markdown


def summarize(config: TaskConfig, results: list[dict[str, Any]], reference: str) -> dict[str, Any]:
    """Per architecture the metric per seed (CV: mean over folds), mean and sd, and Welch's t-test of ``reference``
    against each other architecture; the task's other metrics (SICK: rho, MSE) the same under ``other_metrics``."""
    summary = {"experiment": config.name, "dataset": config.dataset, "metric": config.metric,
               "reference": reference, **_compare(results, config.metric, reference)}
    others = [m for m in results[0]["metrics"] if m != config.metric] if results else []
    if others:
        summary["other_metrics"] = {metric: _compare(results, metric, reference) for metric in others}
    if any(result.get("fold") is not None for result in results):
        summary["cross_validation"] = cross_validation(summary, results)
    return summary


def _spread(values: Sequence[float]) -> dict[str, float | None]:
    """Mean and sample standard deviation (None: no values, or one)."""
    return {"mean": float(np.mean(values)) if len(values) else None,
            "std": float(np.std(values, ddof=1)) if len(values) > 1 else None}


def _mean_sd(spread: dict[str, Any], f: str) -> str:
    """A :func:`_spread` as ``mean ± sd`` in format ``f`` (— without a mean)."""
    if spread["mean"] is None:
        return "—"
    return f"{spread['mean']:{f}}" + ("" if spread["std"] is None else f" ± {spread['std']:{f}}")


def _compare(results: list[dict[str, Any]], metric: str, reference: str) -> dict[str, Any]:
    """:func:`summarize`'s ``archs`` and Welch's tests (``welch_vs_reference``) for one metric."""
    per_seed: dict[str, dict[int, list[float]]] = {}
    for result in results:
        per_seed.setdefault(result["arch"], {}).setdefault(result["seed"], []).append(result["metrics"][metric])
    archs: dict[str, Any] = {}
    for arch, seeds in per_seed.items():
        values = [float(np.mean(v)) for _, v in sorted(seeds.items())]
        archs[arch] = {"seeds": sorted(seeds), "values": values, **_spread(values),
                       "folds_per_seed": [len(v) for _, v in sorted(seeds.items())]}
    tests: dict[str, Any] = {}
    for arch in archs if reference in archs else []:
        if arch == reference:
            continue
        try:
            stats = t_test(archs[arch]["values"], archs[reference]["values"])
        except SignificanceError as exc:
            tests[arch] = {"error": str(exc)}
            continue
        tests[arch] = {"t": stats.t, "df": stats.df, "p_two_sided": stats.p_two_sided,
                       "p_greater": stats.p_greater, "difference": stats.mean_system - stats.mean_baseline}
    return {"archs": archs, "welch_vs_reference": tests}


def cross_validation(summary: dict[str, Any], results: list[dict[str, Any]]) -> dict[str, Any]:
    """Cross-validation of the summary's ``metric`` (one to maximise) per architecture: mean and sd over its (seed,
    fold) runs of the three :func:`held_out_numbers`, and paired t-tests of the ``reference`` against each other
    architecture over the runs both have (by seed and fold): naive, and under ``corrected`` Nadeau and Bengio's
    corrected resampled t-test (test/train ratio 1/(k - 1))."""
    if missing := next((result for result in results if not result.get("dev_curve")), None):
        raise ExperimentError(f"{missing['run']} has no held-out curve: its last-update metric is unknown")
    runs = {arch: {key: {kind: number[0] for kind, number in numbers.items() if number is not None}
                   for key, numbers in held_out_numbers(summary, by_run).items()}
            for arch, by_run in _runs_by_arch({**summary, "runs": results}).items()}
    archs = {arch: {"runs": len(by_run), **{kind: _spread([by_run[key][kind] for key in sorted(by_run)
                                                           if kind in by_run[key]]) for kind in CV_KINDS}}
             for arch, by_run in runs.items()}
    reference = summary["reference"]
    tests: dict[str, Any] = {}
    for arch in runs if reference in runs else []:
        if arch == reference:
            continue
        shared = sorted(set(runs[arch]) & set(runs[reference]))
        tests[arch] = {}
        for kind in CV_KINDS:
            pairs = [(runs[arch][key][kind], runs[reference][key][kind]) for key in shared
                     if kind in runs[arch][key] and kind in runs[reference][key]]
            try:
                stats = paired_t_test([a for a, _ in pairs], [r for _, r in pairs])
            except SignificanceError as exc:
                tests[arch][kind] = {"error": str(exc)}
                continue
            ratio = test_train_ratio(shared)
            corrected = corrected_resampled_t_test([a for a, _ in pairs], [r for _, r in pairs], ratio)
            tests[arch][kind] = {"n": stats.n, "difference": stats.mean_difference, "t": stats.t, "df": stats.df,
                                 "p_two_sided": stats.p_two_sided, "p_greater": stats.p_greater,
                                 "corrected": {"test_train_ratio": ratio, "t": corrected.t,
                                               "p_two_sided": corrected.p_two_sided,
                                               "p_greater": corrected.p_greater}}
    return {"archs": archs, "paired_vs_reference": tests}


def test_train_ratio(runs: Sequence[tuple[int, int]]) -> float:
    """n_test / n_train of a k-fold cross-validation whose (seed, fold) ``runs`` name k folds: 1 / (k - 1)."""
    return 1 / (len({fold for _, fold in runs}) - 1)


def chosen_steps(curves: dict[tuple[int, int], dict[int, float]]) -> dict[tuple[int, int], int]:
    """Per (seed, fold) run of one architecture, the step (of those every run has) its ``chosen`` number is read at:
    the earliest that maximises the mean held-out metric of the runs on the other folds (none without another fold)."""
    steps = sorted(set.intersection(*(set(curve) for curve in curves.values())))
    chosen = {}
    for key in curves:
        others = [c for (_, fold), c in curves.items() if fold != key[1]]
        if others:
            chosen[key] = max(steps, key=lambda u: (np.mean([c[u] for c in others]), -u))
    return chosen


def report_markdown(summary: dict[str, Any]) -> str:
    """The summary as a Markdown table."""
    metric, ref = summary["metric"], summary["reference"]
    lines = [f"### {summary['experiment']}: {summary.get('split', 'test')} {metric} of the best-dev checkpoints "
             f"(mean ± sd over seeds; Welch's t-test of {ref} vs each)", ""]
    if "lr_from" in summary:
        source = summary["lr_from"]
        lines += [f"Learning rates: each architecture's, chosen on {source['dataset']} {source['split']} data by the "
                  f"search {source['experiment']} ({source['search']}; rule: {source['rule']}).", ""]
    lines += summary_table(summary)
    for other in summary.get("other_metrics", {}):
        lines += ["", f"{summary.get('split', 'test')} {other}:", "", *summary_table(summary, metric=other)]
    if "cross_validation" in summary:
        lines += ["", f"### Cross-validation: held-out {metric}, mean ± sd over runs (seeds x folds); paired t-test "
                  f"of {ref} vs each, matched by seed and fold", "",
                  "chosen: at the update best on average over the other folds; best (test-selected): the best "
                  "checkpoint on the held-out fold (the papers' protocol, which selects on that fold); last: after the "
                  "last update.", "",
                  *cross_validation_table(summary)]
    if "runs" in summary:
        lines += ["", "### Runs", "", *(runs_table(summary) if "cross_validation" not in summary
                                        else folds_table(summary))]
    return "\n".join(lines) + "\n"


def metric_format(metric: str) -> str:
    return ".2f" if metric == "accuracy" else ".4f"


def _p(p: float) -> str:
    return "< 0.001" if p < 0.0005 else f"{p:.3f}"


def _with_metric(summary: dict[str, Any], metric: str | None) -> dict[str, Any]:
    """``summary`` with ``metric`` (one of its ``other_metrics``) in place of the task's; None: unchanged."""
    if metric in (None, summary["metric"]):
        return summary
    if "cross_validation" in summary:
        raise ValueError(f"metric={metric}: a cross-validation report has one metric, {summary['metric']}")
    if metric not in summary.get("other_metrics", {}):
        known = ", ".join([summary["metric"], *summary.get("other_metrics", {})])
        raise ValueError(f"metric={metric}: the report has {known}")
    return {**summary, **summary["other_metrics"][metric], "metric": metric}


def summary_table(summary: dict[str, Any], names: dict[str, str] | None = None,
                  metric: str | None = None) -> list[str]:
    """Per architecture: the ``metric`` (default: the task's) per seed, mean ± sd, Welch's t-test of the reference
    against it with its 95% interval, one-sided for the reference being better, and a search's learning rate."""
    summary = _with_metric(summary, metric)
    metric, ref, f, name = summary["metric"], summary["reference"], metric_format(summary["metric"]), names or {}
    ref = name.get(ref, ref)
    rates = summary["lr_from"]["chosen"] if "lr_from" in summary else None
    lower = metric in LOWER_IS_BETTER
    header = ["architecture", *(["lr"] if rates else []), "seeds", f"{metric} per seed", "mean ± sd", f"{ref} − it",
              "95% CI", "t", "df", "p (two-sided)", f"p ({ref} {'<' if lower else '>'} it)"]
    rows = []
    for arch, row in summary["archs"].items():
        cells = [name.get(arch, arch), *([f"{rates[arch]:g}"] if rates else []), str(len(row["values"])),
                 ", ".join(f"{v:{f}}" for v in row["values"]), _mean_sd(row, f)]
        test = summary["welch_vs_reference"].get(arch)
        if test is None or "error" in test:
            cells += ["—" if test is None else test["error"], *["—"] * 5]
        else:
            cells += [f"{test['difference']:+{f}}", _interval(test, test["t"], test["df"], f), f"{test['t']:.2f}",
                      f"{test['df']:.1f}", _p(test["p_two_sided"]),
                      _p(1 - test["p_greater"] if lower else test["p_greater"])]
        rows.append(cells)
    return markdown_table(header, rows)


def _interval(test: dict[str, Any], t: float, df: float, f: str) -> str:
    """The 95% confidence interval of a test's ``difference`` at its statistic ``t`` and ``df``."""
    if t == 0:
        return "—"
    low, high = t_interval(test["difference"], t, df)
    return f"{low:+{f}} to {high:+{f}}"


def cross_validation_table(summary: dict[str, Any], names: dict[str, str] | None = None) -> list[str]:
    """Per architecture: chosen, best (test-selected) and last held-out metric (mean ± sd over runs) and the
    paired tests: the difference, its 95% interval by the corrected resampled t-test, and the two-sided p of that
    test, the naive paired one beside it (and each architecture's learning rate when a search chose them)."""
    cv, ref, f, name = summary["cross_validation"], summary["reference"], metric_format(summary["metric"]), names or {}
    rates = summary["lr_from"]["chosen"] if "lr_from" in summary else None
    header = ["architecture", *(["lr"] if rates else []), "runs", "chosen", "best (test-selected)", "last",
              f"{name.get(ref, ref)} − it, chosen: corrected 95% CI (p: corrected; paired)", "best", "last"]
    rows = []
    for arch, row in cv["archs"].items():
        cells = [name.get(arch, arch), *([f"{rates[arch]:g}"] if rates else []), str(row["runs"])]
        cells += [_mean_sd(row[kind], f) for kind in CV_KINDS]
        test = cv["paired_vs_reference"].get(arch)
        for kind in CV_KINDS:
            if test is None:
                cells.append("—")
            elif "error" in test[kind]:
                cells.append(test[kind]["error"])
            else:
                corrected = test[kind]["corrected"]
                interval = _interval(test[kind], corrected["t"], test[kind]["df"], f)
                cells.append(f"{test[kind]['difference']:+{f}}: {interval} ({_p(corrected['p_two_sided'])}; "
                             f"{_p(test[kind]['p_two_sided'])})")
        rows.append(cells)
    return markdown_table(header, rows)


def _curve(run: dict[str, Any]) -> dict[int, float]:
    return {int(u): v for u, v in run.get("dev_curve") or []}


def runs_table(summary: dict[str, Any], names: dict[str, str] | None = None) -> list[str]:
    """One row per run (by architecture, then seed): the tested checkpoint's metric, update and dev metric, the first
    update that reached that dev value (fairseq keeps the later of equally good checkpoints), the last validation."""
    metric, f, name = summary["metric"], metric_format(summary["metric"]), names or {}
    split = summary.get("split", "test")
    header = ["architecture", "seed", f"{split} {metric}", "tested checkpoint: update", f"its dev {metric}",
              f"first update with that dev {metric}", "last validation: update", f"dev {metric} there"]
    order, rows = list(summary["archs"]), []
    for run in sorted(summary["runs"], key=lambda r: (order.index(r["arch"]), r["seed"])):
        curve, tested = _curve(run), run["best_checkpoint_updates"]
        dev = last = ["—", "—"]  # no validation in its log, or none at the tested update
        if tested in curve:
            dev = [f"{curve[tested]:{f}}", f"{min(u for u, v in curve.items() if v == curve[tested]):,}"]
        if curve:
            last = [f"{max(curve):,}", f"{curve[max(curve)]:{f}}"]
        rows.append([name.get(run["arch"], run["arch"]), str(run["seed"]), f"{run['metrics'][metric]:{f}}",
                     f"{tested:,}", *dev, *last])
    return markdown_table(header, rows)


def _runs_by_arch(summary: dict[str, Any], archs: list[str] | None = None) -> dict[str, dict[tuple[int, int], Any]]:
    """The runs of each architecture (all, or ``archs``) keyed by (seed, fold), in the summary's order."""
    by_arch: dict[str, dict[tuple[int, int], dict[str, Any]]] = {}
    for run in summary["runs"]:
        if archs is None or run["arch"] in archs:
            by_arch.setdefault(run["arch"], {})[(run["seed"], run["fold"])] = run
    if archs is not None and set(archs) - set(by_arch):
        raise KeyError(f"no runs of {sorted(set(archs) - set(by_arch))}")
    return {arch: by_arch[arch] for arch in summary["archs"] if arch in by_arch}


def held_out_numbers(summary: dict[str, Any], runs: dict[tuple[int, int], Any]) -> dict[tuple[int, int], dict]:
    """Per (seed, fold) run of one architecture (rows of a summary's ``runs``, or results) its held-out numbers as
    ``(value, update)``: best (the tested checkpoint's, selected on the held-out fold: the papers' protocol; update
    None for a result), chosen (at the update the other folds chose; None without other folds) and last."""
    chosen = chosen_steps({key: _curve(run) for key, run in runs.items()})
    numbers = {}
    for key, run in runs.items():
        curve, step = _curve(run), chosen.get(key)
        numbers[key] = {"best": (run["metrics"][summary["metric"]], run.get("best_checkpoint_updates")),
                        "chosen": None if step is None else (curve[step], step),
                        "last": (curve[max(curve)], max(curve))}
    return numbers


def folds_table(summary: dict[str, Any], names: dict[str, str] | None = None,
                archs: list[str] | None = None) -> list[str]:
    """One row per (seed, fold), per architecture (all, or ``archs``) its held-out metric: chosen (with the update
    the other folds chose), best (the tested checkpoint's, with its update; test-selected) and last."""
    f, name = metric_format(summary["metric"]), names or {}
    numbers = {arch: held_out_numbers(summary, runs) for arch, runs in _runs_by_arch(summary, archs).items()}
    seeds = {seed for runs in numbers.values() for seed, _ in runs}
    head = ["seed", "fold"] if len(seeds) > 1 else ["fold"]
    for arch in numbers:
        head += [f"{name.get(arch, arch)}: chosen (update)", "best, test-selected (update)", "last"]
    rows = []
    for key in sorted(set().union(*(set(runs) for runs in numbers.values()))):
        cells = [str(key[0]), str(key[1])] if len(seeds) > 1 else [str(key[1])]
        for arch in numbers:
            run = numbers[arch].get(key)
            if run is None:
                cells += ["—"] * 3
                continue
            cells += ["—" if run["chosen"] is None else f"{run['chosen'][0]:{f}} ({run['chosen'][1]:,})",
                      f"{run['best'][0]:{f}} ({run['best'][1]:,})",
                      f"{run['last'][0]:{f}}"]
        rows.append(cells)
    return markdown_table(head, rows)


def anchor_table(summary: dict[str, Any], names: dict[str, str] | None = None, value: float = 0.0,
                 label: str = "anchor", metric: str | None = None, anchor_n: int | None = None) -> list[str]:
    """One-sample t-tests of every architecture's numbers against a published figure ``value`` (``label``): the
    per-seed ``metric`` (default: the task's) of a fixed split, or per fold the three held-out numbers of a
    cross-validation (corrected test), one-sided for the mean being better; ``anchor_n`` (an accuracy on that many
    test items) adds the figure's binomial standard error (``anchor_test``), the plain test beside it."""
    summary = _with_metric(summary, metric)
    f, name = metric_format(summary["metric"]), names or {}
    lower = summary["metric"] in LOWER_IS_BETTER
    cross_validation = "cross_validation" in summary
    if anchor_n is not None and summary["metric"] != "accuracy":
        raise ValueError(f"n={anchor_n}: a binomial standard error needs an accuracy, not {summary['metric']}")
    samples: list[tuple[str, str, list[float]]] = []
    ratio = 0.0
    if cross_validation:
        by_arch = _runs_by_arch(summary)
        ratio = test_train_ratio([key for runs in by_arch.values() for key in runs])
        for arch, runs in by_arch.items():
            numbers = held_out_numbers(summary, runs).values()
            samples += [(arch, title, [n[kind][0] for n in numbers if n[kind] is not None])
                        for kind, title in ANCHOR_KINDS.items()]
    else:
        samples = [(arch, "per seed", row["values"]) for arch, row in summary["archs"].items()]
    error = {} if anchor_n is None else {"anchor_se": binomial_se(value, anchor_n), "anchor_df": anchor_n - 1}
    lead = [*(["corrected"] if cross_validation else []),
            *([f"{label} ± {error['anchor_se']:.2f} on {anchor_n:,} items"] if error else [])]
    besides = {}  # the tests beside the leading one: the correction alone, and the plain one-sample t-test
    if cross_validation and error:
        besides["p (corrected, figure exact)"] = {"test_train_ratio": ratio}
    if lead:
        besides[f"p (naive: {'folds independent, ' if cross_validation else ''}figure exact)"] = {}
    t_head = f"t ({'; '.join(lead)})" if lead else "t"
    header = ["architecture", "number", "n", "mean ± sd", label, f"mean − {label}", t_head, "p (two-sided)",
              f"p (mean {'<' if lower else '>'} {label})", *besides]
    rows = []
    for arch, title, values in samples:
        spread = _spread(values)
        cells = [name.get(arch, arch), title, str(len(values)), _mean_sd(spread, f), f"{value:{f}}",
                 f"{spread['mean'] - value:+{f}}"]
        if not spread["std"]:
            cells += ["—"] * (3 + len(besides))  # one value, or no spread: no t-test
        else:
            test = anchor_test(values, value, test_train_ratio=ratio, **error)
            cells += [f"{test.t:.2f}", _p(test.p_two_sided), _p(1 - test.p_greater if lower else test.p_greater)]
            cells += [_p(anchor_test(values, value, **options).p_two_sided) for options in besides.values()]
        rows.append(cells)
    return markdown_table(header, rows)


def plot_dev_curves(runs: list[dict[str, Any]], metric: str, name: str, path: Path) -> None:
    """Dev (cross-validation: held-out fold) ``metric`` against updates per architecture (PNG, titled ``name``):
    the mean over runs at each validation step all of them reached, the min-max band, and each run's own curve."""
    curves: dict[str, list[dict[int, float]]] = {}
    for run in runs:
        if run.get("dev_curve"):
            curves.setdefault(run["arch"], []).append(_curve(run))
    fig, ax = pyplot().subplots(figsize=(7, 4.2))
    for arch, per_run in curves.items():
        steps = sorted(set.intersection(*(set(c) for c in per_run)))
        values = np.array([[c[u] for u in steps] for c in per_run])
        line, = ax.plot(steps, values.mean(axis=0), label=f"{arch.removesuffix('_encoder')} (n = {len(per_run)})")
        if len(per_run) > 1:
            ax.fill_between(steps, values.min(axis=0), values.max(axis=0), color=line.get_color(), alpha=0.2)
            for curve in per_run:  # each run to its own end (runs stopped early end sooner)
                ax.plot(sorted(curve), [curve[u] for u in sorted(curve)], color=line.get_color(), lw=0.6, alpha=0.4)
    ax.set_xlabel("updates")
    split = "held-out fold" if any(run.get("fold") is not None for run in runs) else "dev"
    ax.set_ylabel(f"{split} {metric}")
    ax.set_title(f"{name}: {split} {metric} (mean, band: min to max over runs)", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, path, dpi=120)
