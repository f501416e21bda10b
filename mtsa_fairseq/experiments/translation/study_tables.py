"""The Markdown tables of a translation study's ``study.json`` (``mtsa-multi30k-study``), rendered into the docs
by ``mtsa-docs-tables`` (kinds ``study``, ``study-paired`` and ``study-runs``)."""

from __future__ import annotations

import math
from typing import Any

from mtsa_fairseq.experiments.significance import POWER, detectable_difference, equivalence_test, format_p
from mtsa_fairseq.experiments.tables import markdown_table

# a study.json's BLEU summaries: the name a marker's bleu= option gives, its key and the table's label
BLEU_KINDS = {"cased": ("summary", "sacreBLEU"), "lowercased": ("summary_lowercased", "sacreBLEU, lowercased"),
              "tokenized": ("summary_tokenized", "tokenized, compound-split")}


def bleu_kinds(text: str) -> tuple[str, ...]:
    """The BLEU kinds named by ``text`` (comma-separated names of :data:`BLEU_KINDS`); ValueError for another."""
    names = tuple(text.split(","))
    if not names or any(name not in BLEU_KINDS for name in names):
        raise ValueError(text)
    return names


def _systems(report: dict[str, Any], names: dict[str, str]) -> tuple[str, str, str, str]:
    """(baseline, system) as the report names them, then as the table shows them."""
    baseline, system = dict.fromkeys(run["system"] for run in report["runs"])
    return baseline, system, names.get(baseline, baseline), names.get(system, system)


def _checkpoint(report: dict[str, Any], kind: str) -> str:
    return {"last": "last", "avg5": f"average of the last {report['averaged_epochs']}"}[kind]


def welch_interval(row: dict[str, Any], baseline: str, system: str, level: float = 0.95) -> tuple[float, float]:
    """Welch's confidence interval of mean(system) - mean(baseline): the difference ± t_{(1+level)/2, df} times
    sqrt(sd_s^2 / n_s + sd_b^2 / n_b), with the Welch-Satterthwaite df the report's test used."""
    from scipy import stats  # imported here: the commands start without scipy (tests/test_plugin_imports.py)

    base, sys_ = row[baseline], row[system]
    diff = sys_["mean"] - base["mean"]
    half = stats.t.ppf((1 + level) / 2, row["welch"]["df"]) * math.sqrt(
        sys_["std"] ** 2 / sys_["n"] + base["std"] ** 2 / base["n"])
    return diff - half, diff + half


def study_table(report: dict[str, Any], names: dict[str, str] | None = None, margin: float = 0.45,
                bleu: tuple[str, ...] = tuple(BLEU_KINDS)) -> list[str]:
    """Per test set, checkpoint kind and BLEU (the kinds ``bleu`` of :data:`BLEU_KINDS`): both systems' mean ± sd
    (runs), the difference with its 95% confidence interval, Welch's test, the equivalence test within ±``margin``
    (two one-sided Welch t-tests) and the difference Welch's test detects with 80% power at these sds (two-sided
    alpha 0.05)."""
    baseline, system, base_name, sys_name = _systems(report, names or {})
    header = ["test set", "checkpoint", "BLEU", base_name, sys_name, f"{sys_name} − {base_name}", "95% CI", "t (df)",
              "p (two-sided)", f"p ({sys_name} > {base_name})", f"p (equivalent within ±{margin:g})",
              f"detectable ({POWER:.0%} power)"]
    rows = []
    for test, kinds in report["summary"].items():
        for kind in kinds:
            for key, label in (BLEU_KINDS[name] for name in bleu):
                if key not in report:  # a study scored before lowercased BLEU was recorded
                    continue
                row = report[key][test][kind]
                welch = row["welch"]
                sides = [f"{row[s]['mean']:.2f} ± {row[s]['std']:.2f} ({row[s]['n']})" for s in (baseline, system)]
                low, high = welch_interval(row, baseline, system)
                stats = [row[s][key] for s in (baseline, system) for key in ("mean", "std", "n")]
                equivalence = equivalence_test(*stats, margin)
                detectable = detectable_difference(*stats[1:3], *stats[4:6])
                rows.append([test, _checkpoint(report, kind), label, *sides,
                             f"{row[system]['mean'] - row[baseline]['mean']:+.2f}", f"{low:+.2f} to {high:+.2f}",
                             f"{welch['t']:.2f} ({welch['df']:.1f})", format_p(welch["p_two_sided"]),
                             format_p(welch["p_greater"]), format_p(equivalence.p), f"{detectable:.2f}"])
    return markdown_table(header, rows, align="lll" + "r" * 9)


def study_paired_table(report: dict[str, Any], names: dict[str, str] | None = None) -> list[str]:
    """Per test set, checkpoint kind and seed trained in both systems: their sacreBLEU, the two-sided paired
    bootstrap and approximate-randomization p-values, and the bootstrap as sacreBLEU and Moses compute it
    (one-sided-like)."""
    _, _, base_name, sys_name = _systems(report, names or {})
    header = ["test set", "checkpoint", "seed", f"{base_name} sacreBLEU", f"{sys_name} sacreBLEU",
              "p (paired bootstrap, two-sided)", "p (approximate randomization)", "p (Moses bootstrap, one-sided-like)"]
    rows = [[test, _checkpoint(report, kind), str(pair["seed"]), f"{pair['baseline_bleu']:.2f}",
             f"{pair['system_bleu']:.2f}", format_p(pair["p_bootstrap_two_sided"]), format_p(pair["p_ar"]),
             format_p(pair["p_bootstrap_moses"])]
            for test, kinds in report["summary"].items() for kind, row in kinds.items() for pair in row["paired"]]
    return markdown_table(header, rows, align="ll" + "r" * 6)


def study_runs_table(report: dict[str, Any], names: dict[str, str] | None = None) -> list[str]:
    """One row per run: updates, wall time, throughput, its best and last validation BLEU, the budget rule's
    gain over its whole curve (best validation BLEU after 0.75 U minus the best up to it), and its test
    sacreBLEU at both checkpoint kinds."""
    name = names or {}
    tests = list(report["summary"])
    kinds = list(report["summary"][tests[0]])
    columns = [f"{test} {_checkpoint(report, kind)}" for test in tests for kind in kinds]
    header = ["system", "seed", "updates", "wall time (s)", "target tokens/s", "best valid BLEU (update)",
              "last valid BLEU", "gain after 0.75 U", *columns]
    rows = []
    for run in report["runs"]:
        curve = run["valid_bleu"]
        best = max(bleu for _, bleu in curve)
        first = min(update for update, bleu in curve if bleu == best)
        tokens, gain = run["train_target_tokens_per_second"], run["plateau"]["gain"]
        rows.append([name.get(run["system"], run["system"]), str(run["seed"]), f"{run['num_updates']:,}",
                     f"{run['wall_seconds']:,.0f}", "—" if tokens is None else f"{tokens:,.0f}",
                     f"{best:.2f} ({first:,})", f"{curve[-1][1]:.2f}", "—" if gain is None else f"{gain:+.2f}",
                     *(f"{run['test'][test][kind]:.2f}" for test in tests for kind in kinds)])
    return markdown_table(header, rows, align="l" + "r" * (len(header) - 1))
