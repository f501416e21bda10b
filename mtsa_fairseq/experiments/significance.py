"""Is one system's BLEU better than another's? Tests over training runs and over sentences.

Input: result files of ``scripts/score.py`` (``mtsa-fairseq.result.v1``) for a baseline and a system, grouped
by the results' ``setup`` and ``test_set`` (e.g. setup1 and setup2 of the MTSA paper's Table 6).

* Over runs (the variance that training seeds cause, Clark et al. 2011): Welch's t-test (default; the
  Welch-Satterthwaite degrees of freedom) or Student's pooled-variance t-test on the per-run BLEU values.
  The statistic and degrees of freedom are computed here; p-values come from ``scipy.stats.t``, two-sided
  and one-sided for the alternative "system > baseline". Means and sample standard deviations (ddof=1)
  are reported; a t-test needs at least two runs per system, and with few runs it has little power.
* Over sentences, for each pair of runs trained with the same seed: sacreBLEU's paired bootstrap
  resampling (Koehn 2004) and paired approximate randomization (Riezler and Maxwell 2005), both
  two-sided, with sacreBLEU's default BLEU on the hypotheses files against the references (whatever
  metric the runs are compared on), sampled from a fixed seed (``SACREBLEU_SEED``) so the p-values are
  reproducible. sacreBLEU's resampling is used as it is; only its count is corrected: a resample counts
  when its statistic is at least as extreme as the observed one, ties included, and p = (count + 1) /
  (samples + 1) (the add-one convention of Koehn 2004 and Riezler and Maxwell 2005). sacreBLEU counts
  strictly larger statistics only, which gives two identical systems its smallest p-value; here they get
  p = 1. A run whose hypotheses no longer give the sacreBLEU recorded in its result file is refused.
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from mtsa_fairseq.contracts import BLEU_METRICS, RESULT_SCHEMA, read_json, read_lines, record_path
from mtsa_fairseq.experiments.plotting import pyplot

TESTS = ("welch", "student")
TEST_NAMES = {"welch": "Welch's t-test", "student": "Student's t-test"}
METRIC_NAMES = {"sacrebleu": "sacreBLEU", "tokenized_compound_split": "tokenized compound-split BLEU",
                "t2t_intl": "t2t-bleu (intl, cased)"}
GroupKey = tuple[str | None, str]  # (setup, test set)
_REQUIRED = ("system", "test_set", "num_params", "num_sentences", "hypotheses", "references", "bleu")


class SignificanceError(ValueError):
    """Bad input for a comparison: the message is one line naming the problem."""


@dataclass(frozen=True)
class RunResult:
    """One result file with its hypotheses and references read."""

    path: Path
    system: str
    setup: str | None
    test_set: str
    seed: int | None
    num_params: int
    bleu: dict[str, Any]
    hypotheses: list[str] = field(repr=False)
    references: list[str] = field(repr=False)


def load_result(path: Path, metric: str = "sacrebleu", ref_cache: dict[Path, list[str]] | None = None) -> RunResult:
    """Read and check one result file: schema, fields, and hypotheses/references line counts.

    ``ref_cache`` maps reference paths to their lines, so that runs sharing a reference file read it once.
    """
    path = Path(path)
    data = read_json(path, RESULT_SCHEMA, "result file", SignificanceError)
    missing = [key for key in _REQUIRED if data.get(key) is None]
    if missing:
        raise SignificanceError(f"{path} lacks {', '.join(missing)}")
    if not isinstance(data["bleu"], dict):
        raise SignificanceError(f"{path}: bleu must be an object of BLEU values, not {type(data['bleu']).__name__}")
    for name in dict.fromkeys((metric, "sacrebleu")):  # the paired tests recompute sacreBLEU and compare
        value = data["bleu"].get(name)
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise SignificanceError(f"{path} has no numeric bleu.{name} (got {value!r})")
        if not math.isfinite(value):
            raise SignificanceError(f"{path}: bleu.{name} is {value}, not a finite number")
    if not isinstance(data["num_sentences"], int) or isinstance(data["num_sentences"], bool):
        raise SignificanceError(f"{path}: num_sentences must be an integer, got {data['num_sentences']!r}")
    files = {}
    for key in ("hypotheses", "references"):
        file = record_path(data[key], path.parent)  # relative to the result's folder, or absolute (older results)
        if not file.is_file():
            raise SignificanceError(f"{key} file of {path} not found: {file}")
        files[key] = file
    cache = {} if ref_cache is None else ref_cache
    if files["references"] not in cache:
        cache[files["references"]] = read_lines(files["references"], SignificanceError)
    hyps, refs = read_lines(files["hypotheses"], SignificanceError), cache[files["references"]]
    n = data["num_sentences"]
    if not len(hyps) == len(refs) == n:
        raise SignificanceError(
            f"{path}: hypotheses have {len(hyps)} lines, references {len(refs)}, num_sentences is {n}"
        )
    return RunResult(path=path, system=str(data["system"]), setup=data.get("setup"), test_set=str(data["test_set"]),
                     seed=data.get("seed"), num_params=int(data["num_params"]), bleu=data["bleu"],
                     hypotheses=hyps, references=refs)


@dataclass(frozen=True)
class TTestResult:
    """A two-sample t-test of system vs baseline; ``p_greater`` is for the alternative system > baseline."""

    test: str
    n_baseline: int
    n_system: int
    mean_baseline: float
    mean_system: float
    std_baseline: float
    std_system: float
    t: float
    df: float
    p_two_sided: float
    p_greater: float


def t_test(baseline: Sequence[float], system: Sequence[float], test: str = "welch") -> TTestResult:
    """Welch's or Student's t-test; means and sample standard deviations (ddof=1) of both samples."""
    from scipy import stats

    if test not in TESTS:
        raise ValueError(f"unknown test {test!r}, expected one of {TESTS}")
    a, b = np.asarray(baseline, dtype=float), np.asarray(system, dtype=float)
    n_a, n_b = len(a), len(b)
    if n_a < 2 or n_b < 2:
        raise SignificanceError(f"a t-test needs at least 2 runs per system, got {n_a} and {n_b}")
    var_a, var_b = a.var(ddof=1), b.var(ddof=1)
    if var_a == 0 and var_b == 0:
        raise SignificanceError("every run of both systems has the same BLEU: the t statistic is undefined")
    if test == "welch":  # Welch-Satterthwaite
        se2_a, se2_b = var_a / n_a, var_b / n_b
        se2 = se2_a + se2_b
        df = se2**2 / (se2_a**2 / (n_a - 1) + se2_b**2 / (n_b - 1))
    else:  # pooled variance
        df = n_a + n_b - 2
        se2 = ((n_a - 1) * var_a + (n_b - 1) * var_b) / df * (1 / n_a + 1 / n_b)
    t = (b.mean() - a.mean()) / math.sqrt(se2)
    return TTestResult(
        test=test, n_baseline=n_a, n_system=n_b, mean_baseline=float(a.mean()), mean_system=float(b.mean()),
        std_baseline=float(math.sqrt(var_a)), std_system=float(math.sqrt(var_b)), t=float(t), df=float(df),
        p_two_sided=float(2 * stats.t.sf(abs(t), df)), p_greater=float(stats.t.sf(t, df)),
    )


@dataclass(frozen=True)
class PairedTTestResult:
    """A paired t-test of system vs baseline over matched units (e.g. cross-validation folds)."""

    n: int
    mean_difference: float
    std_difference: float
    t: float
    df: int
    p_two_sided: float
    p_greater: float


def paired_t_test(baseline: Sequence[float], system: Sequence[float]) -> PairedTTestResult:
    """The t-test of the per-unit differences ``system - baseline`` (``scipy.stats.ttest_rel``); ``p_greater``
    is for the alternative system > baseline."""
    from scipy import stats

    a, b = np.asarray(baseline, dtype=float), np.asarray(system, dtype=float)
    if len(a) != len(b):
        raise SignificanceError(f"a paired t-test needs matched units, got {len(a)} and {len(b)}")
    if len(a) < 2:
        raise SignificanceError(f"a paired t-test needs at least 2 matched units, got {len(a)}")
    diff = b - a
    if diff.std() == 0:
        raise SignificanceError("every difference is the same: the t statistic is undefined")
    result = stats.ttest_rel(b, a)
    t, df = float(result.statistic), len(a) - 1
    return PairedTTestResult(n=len(a), mean_difference=float(diff.mean()), std_difference=float(diff.std(ddof=1)),
                             t=t, df=df, p_two_sided=float(result.pvalue), p_greater=float(stats.t.sf(t, df)))


def p_value_ties_count(stats: np.ndarray, observed: float) -> float:
    """(resampled statistics at least as extreme as the observed one, + 1) / (resamples + 1)."""
    return (int(np.sum(stats >= observed)) + 1) / (len(stats) + 1)


@contextlib.contextmanager
def _ties_count() -> Iterator[None]:
    """sacreBLEU's paired tests with :func:`p_value_ties_count` in place of its strict count."""
    import sacrebleu.significance as sacrebleu_significance

    strict = sacrebleu_significance._compute_p_value
    sacrebleu_significance._compute_p_value = p_value_ties_count
    try:
        yield
    finally:
        sacrebleu_significance._compute_p_value = strict


@contextlib.contextmanager
def _sacrebleu_seed(seed: int) -> Iterator[None]:
    old = os.environ.get("SACREBLEU_SEED")
    os.environ["SACREBLEU_SEED"] = str(seed)
    try:
        yield
    finally:
        if old is None:
            del os.environ["SACREBLEU_SEED"]
        else:
            os.environ["SACREBLEU_SEED"] = old


def paired_test(
    baseline: Sequence[str], system: Sequence[str], references: Sequence[str], test_type: str, n_samples: int, seed: int
) -> tuple[float, float, float]:
    """sacreBLEU's paired test (``"bs"`` bootstrap or ``"ar"`` approximate randomization), ties counted.

    Returns (baseline BLEU, system BLEU, two-sided p-value). ``seed`` must be positive (sacreBLEU treats 0
    as "unseeded").
    """
    from sacrebleu.metrics import BLEU
    from sacrebleu.significance import PairedTest

    if seed < 1:
        raise ValueError("the sampling seed must be a positive integer")
    with _sacrebleu_seed(seed), _ties_count():
        paired = PairedTest(named_systems=[("baseline", list(baseline)), ("system", list(system))],
                            metrics={"BLEU": BLEU(references=[list(references)])}, references=None,
                            test_type=test_type, n_samples=n_samples)
        _, scores = paired()
    base, sys_ = scores["BLEU"]
    return float(base.score), float(sys_.score), float(sys_.p_value)


@dataclass(frozen=True)
class PairedResult:
    """Paired tests for one seed trained in both systems."""

    seed: int
    baseline_bleu: float
    system_bleu: float
    p_bootstrap: float
    p_ar: float


@dataclass
class GroupComparison:
    """Baseline vs system runs on one (setup, test set)."""

    setup: str | None
    test_set: str
    baseline: list[RunResult]
    system: list[RunResult]
    ttest: TTestResult
    paired: list[PairedResult]
    unmatched_baseline: list[int | None]
    unmatched_system: list[int | None]

    @property
    def label(self) -> str:
        return f"{self.setup} · {self.test_set}" if self.setup else self.test_set


@dataclass
class Comparison:
    """Everything a report needs."""

    groups: list[GroupComparison]
    metric: str
    test: str
    signature: str
    bootstrap_samples: int
    ar_samples: int
    seed: int


def _check_group(key: GroupKey, baseline: list[RunResult], system: list[RunResult]) -> None:
    where = f"{key[0]} · {key[1]}" if key[0] else key[1]
    for side, runs in (("baseline", baseline), ("system", system)):
        if len(runs) < 2:
            raise SignificanceError(f"{where}: the {side} has {len(runs)} run(s); a t-test needs at least 2 per system")
        seeds = [r.seed for r in runs if r.seed is not None]
        duplicates = sorted({s for s in seeds if seeds.count(s) > 1})
        if duplicates:
            raise SignificanceError(f"{where}: the {side} has several runs with seed {duplicates[0]}")
    first = baseline[0]
    for run in baseline[1:] + system:
        if run.references != first.references:
            raise SignificanceError(f"{where}: {run.path} and {first.path} were scored against different references")


def group_results(
    baseline: list[RunResult], system: list[RunResult]
) -> dict[GroupKey, tuple[list[RunResult], list[RunResult]]]:
    """Group both sides by (setup, test set); each group must exist on both sides with >= 2 runs each."""
    groups: dict[GroupKey, tuple[list[RunResult], list[RunResult]]] = {}
    for index, runs in ((0, baseline), (1, system)):
        for run in runs:
            groups.setdefault((run.setup, run.test_set), ([], []))[index].append(run)
    one_sided = [(key, "baseline" if b else "system") for key, (b, s) in groups.items() if not (b and s)]
    if one_sided:
        key, side = one_sided[0]
        where = f"setup {key[0]!r}, test set {key[1]!r}"
        raise SignificanceError(f"only the {side} has results for {where}: both systems need the same setups and "
                                "test sets")
    for key, (b, s) in groups.items():
        _check_group(key, b, s)
    return dict(sorted(groups.items(), key=lambda item: (item[0][0] or "", item[0][1])))


def load_side(paths: Sequence[Path], metric: str, cache: dict[Path, list[str]]) -> list[RunResult]:
    """Load one side's result files; they must all name the same system."""
    resolved = [Path(p).resolve() for p in paths]
    if len(set(resolved)) != len(resolved):
        raise SignificanceError("a result file is given twice")
    runs = [load_result(p, metric, cache) for p in paths]
    systems = sorted({r.system for r in runs})
    if len(systems) > 1:
        raise SignificanceError(f"results of different systems on one side: {', '.join(systems)}")
    return runs


def compare(
    baseline_paths: Sequence[Path],
    system_paths: Sequence[Path],
    *,
    metric: str = "sacrebleu",
    test: str = "welch",
    bootstrap_samples: int = 1000,
    ar_samples: int = 10000,
    seed: int = 12345,
) -> Comparison:
    """Load, check and compare; raises ``SignificanceError`` on bad input before any test runs."""
    if metric not in BLEU_METRICS:
        raise SignificanceError(f"unknown metric {metric!r}, expected one of {', '.join(BLEU_METRICS)}")
    cache: dict[Path, list[str]] = {}
    baseline = load_side(baseline_paths, metric, cache)
    system = load_side(system_paths, metric, cache)
    overlap = {r.path.resolve() for r in baseline} & {r.path.resolve() for r in system}
    if overlap:
        raise SignificanceError(f"{sorted(overlap)[0]} is given as both baseline and system")
    signatures = sorted({str(r.bleu.get("signature")) for r in baseline + system})
    if len(signatures) > 1:
        raise SignificanceError(f"mixed sacreBLEU signatures: {' vs '.join(signatures)}")
    groups = group_results(baseline, system)

    comparisons = []
    for (setup, test_set), (base_runs, sys_runs) in groups.items():
        stats = t_test([r.bleu[metric] for r in base_runs], [r.bleu[metric] for r in sys_runs], test)
        by_seed = {r.seed: r for r in sys_runs if r.seed is not None}
        base_seeds = {r.seed for r in base_runs if r.seed is not None}
        paired = []
        for run in sorted((r for r in base_runs if r.seed in by_seed), key=lambda r: r.seed):
            other = by_seed[run.seed]
            bleu_a, bleu_b, p_bs = paired_test(run.hypotheses, other.hypotheses, run.references, "bs",
                                               bootstrap_samples, seed)
            _, _, p_ar = paired_test(run.hypotheses, other.hypotheses, run.references, "ar", ar_samples, seed)
            for result, score in ((run, bleu_a), (other, bleu_b)):
                recorded = result.bleu.get("sacrebleu")
                if isinstance(recorded, (int, float)) and abs(recorded - score) > 0.01:
                    raise SignificanceError(f"{result.path}: its hypotheses give sacreBLEU {score:.2f}, the file "
                                            f"records {recorded:.2f} (changed since scoring?)")
            paired.append(PairedResult(run.seed, bleu_a, bleu_b, p_bs, p_ar))
        comparisons.append(GroupComparison(
            setup=setup, test_set=test_set, baseline=base_runs, system=sys_runs, ttest=stats, paired=paired,
            unmatched_baseline=sorted((r.seed for r in base_runs if r.seed not in by_seed), key=_seed_key),
            unmatched_system=sorted((r.seed for r in sys_runs if r.seed not in base_seeds), key=_seed_key),
        ))
    return Comparison(groups=comparisons, metric=metric, test=test, signature=signatures[0],
                      bootstrap_samples=bootstrap_samples, ar_samples=ar_samples, seed=seed)


def _seed_key(seed: int | None) -> tuple[bool, int]:
    return (seed is None, seed or 0)


def format_p(p: float) -> str:
    """Three decimals, or scientific notation below 0.001."""
    return f"{p:.3f}" if p >= 0.001 else f"{p:.1e}"


def format_params(runs: Sequence[RunResult]) -> str:
    """Parameter counts in millions, e.g. ``61.58M`` (several values joined by ``/``)."""
    return " / ".join(f"{n / 1e6:.2f}M" for n in sorted({r.num_params for r in runs}))


def default_names(comparison: Comparison) -> tuple[str, str]:
    """The systems' names from their result files (marked when both sides use the same name)."""
    group = comparison.groups[0]
    base, system = group.baseline[0].system, group.system[0].system
    return (base, system) if base != system else (f"{base} (baseline)", f"{system} (system)")


def render_markdown(comparison: Comparison, names: tuple[str, str]) -> str:
    """The report in the form of the MTSA paper's Table 6, then per-seed paired tests for each group."""
    base, sys_ = names
    groups = comparison.groups
    test = TEST_NAMES[comparison.test]
    all_base = [r for g in groups for r in g.baseline]
    all_sys = [r for g in groups for r in g.system]

    def row(cells: Sequence[str]) -> str:
        return "| " + " | ".join(cells) + " |"

    lines = [
        f"## BLEU over training runs: {base} vs {sys_}",
        "",
        f"Metric: {METRIC_NAMES[comparison.metric]}"
        + (f" (`{comparison.signature}`)" if comparison.metric == "sacrebleu" else
           f" (the runs' sacreBLEU signature: `{comparison.signature}`)")
        + "; mean ± sample standard deviation over runs.",
        "",
        row(["Model", "Param#", *(f"{g.label} BLEU" for g in groups)]),
        row(["---", "---:", *("---:" for _ in groups)]),
        row([base, format_params(all_base),
             *(f"{g.ttest.mean_baseline:.2f} ± {g.ttest.std_baseline:.2f}" for g in groups)]),
        row([sys_, format_params(all_sys), *(f"{g.ttest.mean_system:.2f} ± {g.ttest.std_system:.2f}" for g in groups)]),
        row([f"p-value ({test}, one-sided: {sys_} > {base})", "", *(format_p(g.ttest.p_greater) for g in groups)]),
        row([f"p-value ({test}, two-sided)", "", *(format_p(g.ttest.p_two_sided) for g in groups)]),
        row(["t (degrees of freedom)", "", *(f"{g.ttest.t:.2f} ({g.ttest.df:.1f})" for g in groups)]),
        row([f"runs ({base} / {sys_})", "", *(f"{g.ttest.n_baseline} / {g.ttest.n_system}" for g in groups)]),
        "",
        "With this few runs per system the t-test has little power: a large p-value is no evidence that the systems "
        "are equal (Clark et al., 2011).",
    ]
    for g in groups:
        lines += [
            "",
            f"### {g.label}: paired tests per seed",
            "",
            f"sacreBLEU of the two runs trained with the same seed; paired bootstrap resampling "
            f"({comparison.bootstrap_samples} resamples) and approximate randomization ({comparison.ar_samples} "
            f"trials), two-sided, sampling seed {comparison.seed}.",
            "",
        ]
        if g.paired:
            lines += [row(["seed", f"{base} BLEU", f"{sys_} BLEU", "bootstrap p", "AR p"]),
                      row(["---:"] * 5)]
            lines += [row([str(p.seed), f"{p.baseline_bleu:.2f}", f"{p.system_bleu:.2f}", format_p(p.p_bootstrap),
                           format_p(p.p_ar)]) for p in g.paired]
        else:
            lines.append("No seed was trained in both systems: no paired tests.")
        if g.unmatched_baseline or g.unmatched_system:
            def seeds(values: list[int | None]) -> str:
                return ", ".join("none" if s is None else str(s) for s in values) or "-"

            lines += ["", f"Unmatched seeds (skipped): {base} {seeds(g.unmatched_baseline)}; "
                          f"{sys_} {seeds(g.unmatched_system)}."]
    return "\n".join(lines) + "\n"


def comparison_to_json(comparison: Comparison, names: tuple[str, str]) -> dict[str, Any]:
    """A JSON-serialisable summary of the comparison."""

    def side(runs: list[RunResult], name: str) -> dict[str, Any]:
        return {"name": name, "num_params": sorted({r.num_params for r in runs}),
                "runs": [{"seed": r.seed, "bleu": r.bleu[comparison.metric], "result": str(r.path)} for r in runs]}

    return {
        "schema": "mtsa-fairseq.significance.v1",
        "metric": comparison.metric,
        "signature": comparison.signature,
        "test": comparison.test,
        "bootstrap_samples": comparison.bootstrap_samples,
        "ar_samples": comparison.ar_samples,
        "seed": comparison.seed,
        "groups": [
            {
                "setup": g.setup,
                "test_set": g.test_set,
                "baseline": side(g.baseline, names[0]),
                "system": side(g.system, names[1]),
                "t_test": vars(g.ttest),
                "paired": [vars(p) for p in g.paired],
                "unmatched_seeds": {"baseline": g.unmatched_baseline, "system": g.unmatched_system},
            }
            for g in comparison.groups
        ],
    }


def plot(comparison: Comparison, names: tuple[str, str], path: Path) -> None:
    """BLEU per seed for both systems, one panel per group, means as horizontal lines (PNG)."""
    plt = pyplot()

    groups = comparison.groups
    fig, axes = plt.subplots(1, len(groups), figsize=(4.5 * len(groups), 3.6), squeeze=False)
    for ax, g in zip(axes[0], groups):
        ordered = sorted(g.baseline + g.system, key=lambda r: (_seed_key(r.seed), r.path.stem))
        labels = list(dict.fromkeys(_seed_label(r) for r in ordered))
        position = {label: i for i, label in enumerate(labels)}
        for runs, name, mean, colour, offset in ((g.baseline, names[0], g.ttest.mean_baseline, "tab:blue", -0.08),
                                                 (g.system, names[1], g.ttest.mean_system, "tab:orange", 0.08)):
            ax.plot([position[_seed_label(r)] + offset for r in runs], [r.bleu[comparison.metric] for r in runs],
                    "o", color=colour, label=name)
            ax.axhline(mean, color=colour, linestyle="--", linewidth=1, label=f"{name} mean")
        ax.set_xticks(range(len(labels)), labels)
        ax.set_xlabel("seed")
        ax.set_ylabel(f"{METRIC_NAMES[comparison.metric]}")
        ax.set_title(f"{g.label} (p = {format_p(g.ttest.p_greater)}, one-sided)", fontsize=9)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, format="png", dpi=120)
    plt.close(fig)


def _seed_label(run: RunResult) -> str:
    return str(run.seed) if run.seed is not None else run.path.stem
