"""Is one system's BLEU better than another's? Tests over training runs and over sentences.

Input: result files of ``scripts/score.py`` (``mtsa-fairseq.result.v1``) for a baseline and a system, grouped
by the results' ``setup``, ``test_set`` and scored checkpoint (e.g. setup1 and setup2 of the MTSA paper's Table 6),
each checked against its hypotheses (:func:`load_result`). Over runs:
Welch's or Student's t-test (:func:`t_test`), the detectable difference and the equivalence test; over
sentences, for runs trained with the same seed: sacreBLEU's paired bootstrap and approximate randomization
(:func:`paired_tests`), p = (count + 1) / (samples + 1), ties counted. The protocol is described in
docs/experiment.md (4. Significance).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from mtsa_fairseq.contracts import (
    BLEU_METRICS,
    SACREBLEU_OPTIONS,
    read_lines,
    read_result,
    record_path,
    relative_path,
)
from mtsa_fairseq.experiments.plotting import pyplot
from mtsa_fairseq.experiments.tables import markdown_table

TESTS = ("welch", "student")
BOOTSTRAPS = {"two-sided": "centred, two-sided", "moses": "as sacreBLEU and Moses compute it, one-sided-like"}
PAIRED_TESTS = {"p_bootstrap_two_sided": f"paired bootstrap, {BOOTSTRAPS['two-sided']}",
                "p_bootstrap_moses": f"paired bootstrap, {BOOTSTRAPS['moses']}",
                "p_ar": "paired approximate randomization, two-sided"}
POWER, ALPHA = 0.8, 0.05  # of the detectable difference: 80% power, two-sided alpha 0.05
TEST_NAMES = {"welch": "Welch's t-test", "student": "Student's t-test"}
METRIC_NAMES = {"sacrebleu": "sacreBLEU", "sacrebleu_lc": "sacreBLEU, lowercased",
                "tokenized_compound_split": "tokenized compound-split BLEU",
                "t2t_intl": "t2t-bleu (intl, cased)"}
GroupKey = tuple[str | None, str, str | None]  # (setup, test set, checkpoint file name)


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
    checkpoint: str | None = None  # the scored checkpoint's file name, e.g. checkpoint_last.pt
    generation: dict[str, Any] = field(default_factory=dict)  # the generation options it was scored with


def load_result(path: Path, metric: str = "sacrebleu", ref_cache: dict[Path, list[str]] | None = None,
                allow_diverged: bool = False) -> RunResult:
    """Read and check one result file: schema, fields, hypotheses/references line counts, and its recorded sacreBLEU
    and ``metric`` against what its hypotheses give (where sacreBLEU alone computes ``metric``:
    :data:`~mtsa_fairseq.contracts.SACREBLEU_OPTIONS`); the result of a diverged run is refused unless
    ``allow_diverged``. ``ref_cache`` (reference path -> lines) reads a reference file shared by several runs once."""
    path = Path(path)
    data = read_result(path, SignificanceError)
    if data.get("diverged") and not allow_diverged:
        raise SignificanceError(f"{path} is the result of a diverged run: pass --allow-diverged to compare it anyway")
    for name in dict.fromkeys((metric, "sacrebleu")):  # the paired tests recompute sacreBLEU and compare
        value = data["bleu"].get(name)
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise SignificanceError(f"{path} has no numeric bleu.{name} (got {value!r})")
        if not math.isfinite(value):
            raise SignificanceError(f"{path}: bleu.{name} is {value}, not a finite number")
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
        raise SignificanceError(f"{path}: hypotheses have {len(hyps)} lines, references {len(refs)}, "
                                f"num_sentences is {n}")
    from sacrebleu.metrics import BLEU

    for name in dict.fromkeys(("sacrebleu", metric)):
        if name in SACREBLEU_OPTIONS:
            score = BLEU(**SACREBLEU_OPTIONS[name]).corpus_score(hyps, [refs]).score
            if abs(score - data["bleu"][name]) > 0.01:
                raise SignificanceError(f"{path}: its hypotheses give {METRIC_NAMES[name]} {score:.2f}, the file "
                                        f"records {data['bleu'][name]:.2f} (changed since scoring?)")
    return RunResult(path=path, system=data["system"], setup=data.get("setup"), test_set=data["test_set"],
                     seed=data.get("seed"), num_params=data["num_params"], bleu=data["bleu"],
                     hypotheses=hyps, references=refs,
                     checkpoint=Path(data["checkpoint"]).name if data.get("checkpoint") else None,
                     generation=data.get("generation") or {})


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
    if test == "welch":
        se, df = welch_se_df(math.sqrt(var_a), n_a, math.sqrt(var_b), n_b)
        se2 = se**2
    else:  # pooled variance
        df = n_a + n_b - 2
        se2 = ((n_a - 1) * var_a + (n_b - 1) * var_b) / df * (1 / n_a + 1 / n_b)
    t = (b.mean() - a.mean()) / math.sqrt(se2)
    return TTestResult(
        test=test, n_baseline=n_a, n_system=n_b, mean_baseline=float(a.mean()), mean_system=float(b.mean()),
        std_baseline=float(math.sqrt(var_a)), std_system=float(math.sqrt(var_b)), t=float(t), df=float(df),
        p_two_sided=float(2 * stats.t.sf(abs(t), df)), p_greater=float(stats.t.sf(t, df)),
    )


def welch_se_df(sd_a: float, n_a: int, sd_b: float, n_b: int) -> tuple[float, float]:
    """The standard error of a difference of two means and its Welch-Satterthwaite degrees of freedom."""
    se2_a, se2_b = sd_a**2 / n_a, sd_b**2 / n_b
    return math.sqrt(se2_a + se2_b), (se2_a + se2_b) ** 2 / (se2_a**2 / (n_a - 1) + se2_b**2 / (n_b - 1))


def detectable_difference(sd_a: float, n_a: int, sd_b: float, n_b: int, power: float = POWER,
                          alpha: float = ALPHA) -> float:
    """The smallest |difference of means| that Welch's two-sided test at ``alpha`` detects with probability
    ``power``, for samples of these sizes and standard deviations (noncentral t, Welch-Satterthwaite df)."""
    from scipy import optimize, stats

    se, df = welch_se_df(sd_a, n_a, sd_b, n_b)
    critical = stats.t.ppf(1 - alpha / 2, df)

    def shortfall(nc: float) -> float:
        # the lower tail P(T < -critical) as sf at -nc: scipy's nct.cdf there can be NaN for large nc
        return stats.nct.sf(critical, df, nc) + stats.nct.sf(critical, df, -nc) - power

    high = critical + 1.0
    while shortfall(high) < 0:
        high *= 2
    return float(optimize.brentq(shortfall, 0.0, high) * se)


@dataclass(frozen=True)
class EquivalenceResult:
    """Two one-sided Welch t-tests (TOST, Schuirmann 1987) of |mean(system) - mean(baseline)| < ``margin``:
    ``p_lower`` against a difference <= -margin, ``p_upper`` against one >= +margin; ``p`` is the larger, and
    p < alpha shows equivalence at level alpha (the 1 - 2 alpha interval lies within ±margin)."""

    margin: float
    p_lower: float
    p_upper: float
    p: float


def equivalence_test(mean_a: float, sd_a: float, n_a: int, mean_b: float, sd_b: float, n_b: int,
                     margin: float) -> EquivalenceResult:
    """TOST of sample b (system) against sample a (baseline) from their means, sds (ddof=1) and sizes."""
    from scipy import stats

    if not margin > 0:
        raise ValueError(f"the equivalence margin must be positive, got {margin}")
    lower = stats.ttest_ind_from_stats(mean_b + margin, sd_b, n_b, mean_a, sd_a, n_a, equal_var=False,
                                       alternative="greater").pvalue
    upper = stats.ttest_ind_from_stats(mean_b - margin, sd_b, n_b, mean_a, sd_a, n_a, equal_var=False,
                                       alternative="less").pvalue
    return EquivalenceResult(margin=margin, p_lower=float(lower), p_upper=float(upper), p=float(max(lower, upper)))


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


def corrected_resampled_t_test(baseline: Sequence[float], system: Sequence[float],
                               test_train_ratio: float) -> PairedTTestResult:
    """Nadeau and Bengio's (2003) corrected resampled t-test of the differences ``system - baseline`` over J
    resampled train/test splits (e.g. the k folds of a cross-validation: ``test_train_ratio`` 1/(k - 1)): as the
    splits' training sets overlap, the variance of the mean difference is (1/J + n_test/n_train) s², not s²/J;
    J - 1 degrees of freedom. ``p_greater`` is for the alternative system > baseline."""
    from scipy import stats

    naive = paired_t_test(baseline, system)
    t = naive.t * math.sqrt((1 / naive.n) / (1 / naive.n + test_train_ratio))
    return PairedTTestResult(n=naive.n, mean_difference=naive.mean_difference, std_difference=naive.std_difference,
                             t=t, df=naive.df, p_two_sided=float(2 * stats.t.sf(abs(t), naive.df)),
                             p_greater=float(stats.t.sf(t, naive.df)))


@dataclass(frozen=True)
class AnchorTestResult:
    """A one-sample test of a mean against a published figure; ``p_greater`` for the alternative mean > figure."""

    n: int
    difference: float
    t: float
    df: float
    p_two_sided: float
    p_greater: float


def anchor_test(values: Sequence[float], anchor: float, *, test_train_ratio: float = 0.0, anchor_se: float = 0.0,
                anchor_df: float = math.inf) -> AnchorTestResult:
    """The t-test of mean(values) - ``anchor``: the mean's squared standard error (1/n + ``test_train_ratio``) s²
    (Nadeau and Bengio's correction for cross-validation folds; 0: the plain one-sample t-test) plus the anchor's
    own, ``anchor_se``², with Welch-Satterthwaite degrees of freedom (the anchor's ``anchor_df``)."""
    from scipy import stats

    x = np.asarray(values, dtype=float)
    n = len(x)
    if n < 2 or x.std() == 0:
        raise SignificanceError(f"a one-sample t-test needs at least 2 different values, got {list(values)}")
    se2_mean, se2_anchor = (1 / n + test_train_ratio) * x.var(ddof=1), anchor_se**2
    df = (se2_mean + se2_anchor) ** 2 / (se2_mean**2 / (n - 1) + se2_anchor**2 / anchor_df)
    t = (x.mean() - anchor) / math.sqrt(se2_mean + se2_anchor)
    return AnchorTestResult(n=n, difference=float(x.mean() - anchor), t=float(t), df=float(df),
                            p_two_sided=float(2 * stats.t.sf(abs(t), df)), p_greater=float(stats.t.sf(t, df)))


def binomial_se(accuracy: float, n: int) -> float:
    """The standard error of an accuracy in percent measured on ``n`` test items: 100 sqrt(p (1 - p) / n)."""
    p = accuracy / 100
    return 100 * math.sqrt(p * (1 - p) / n)


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's (1979) step-down adjusted p-values, in the order given: the i-th smallest p times (m - i + 1), made
    non-decreasing, at most 1; a test is rejected at family-wise level alpha when its adjusted p < alpha."""
    order = np.argsort(p_values, kind="stable")
    adjusted, running = [0.0] * len(p_values), 0.0
    for rank, index in enumerate(order):
        running = max(running, min(1.0, (len(p_values) - rank) * float(p_values[index])))
        adjusted[index] = running
    return adjusted


def t_interval(difference: float, t: float, df: float, level: float = 0.95) -> tuple[float, float]:
    """The confidence interval of a t-test's ``difference`` from its statistic and degrees of freedom: the
    difference ± t_{(1+level)/2, df} times its standard error difference / t."""
    from scipy import stats

    half = stats.t.ppf((1 + level) / 2, df) * abs(difference / t)
    return difference - half, difference + half


def p_value_ties_count(stats: np.ndarray, observed: float) -> float:
    """(resampled statistics at least as extreme as the observed one, + 1) / (resamples + 1)."""
    return (int(np.sum(stats >= observed)) + 1) / (len(stats) + 1)


@dataclass(frozen=True)
class PairedTests:
    """The paired tests over sentences of two runs on one test set: both runs' sacreBLEU and the p-values
    (:data:`PAIRED_TESTS`)."""

    baseline_bleu: float
    system_bleu: float
    p_bootstrap_two_sided: float
    p_bootstrap_moses: float
    p_ar: float


def paired_tests(baseline: Sequence[str], system: Sequence[str], references: Sequence[str], *,
                 bootstrap_samples: int, ar_samples: int, seed: int) -> PairedTests:
    """Both paired bootstraps on sacreBLEU's resamples (``default_rng(seed).choice(n, (samples, n))``) and
    approximate randomization on its swaps (``default_rng(seed).integers(2, (trials, n))``), ties counted.
    ``seed`` must be positive (sacreBLEU treats 0 as "unseeded")."""
    from sacrebleu.metrics import BLEU

    if seed < 1:
        raise ValueError("the sampling seed must be a positive integer")
    metric = BLEU(references=[list(references)])
    base, sys_ = (np.array(metric._extract_corpus_statistics(list(hyps), None), dtype=np.int64)
                  for hyps in (baseline, system))
    n = len(base)

    def bleu(totals: np.ndarray) -> np.ndarray:
        return np.array([metric._compute_score_from_stats(row.tolist()).score for row in totals])

    bleu_base, bleu_sys = bleu(np.stack([base.sum(0), sys_.sum(0)]))
    observed = abs(bleu_sys - bleu_base)
    draws = np.random.default_rng(seed).choice(n, size=(bootstrap_samples, n), replace=True)
    counts = np.stack([np.bincount(row, minlength=n) for row in draws])
    deltas = bleu(counts @ sys_) - bleu(counts @ base)
    swap = np.random.default_rng(seed).integers(2, size=(ar_samples, n), dtype=bool)
    shuffled = bleu(swap @ base + ~swap @ sys_) - bleu(~swap @ base + swap @ sys_)
    return PairedTests(
        baseline_bleu=float(bleu_base), system_bleu=float(bleu_sys),
        p_bootstrap_two_sided=p_value_ties_count(np.abs(deltas - deltas.mean()), observed),
        p_bootstrap_moses=p_value_ties_count(np.abs(deltas) - np.abs(deltas).mean(), observed),
        p_ar=p_value_ties_count(np.abs(shuffled), observed),
    )


@dataclass(frozen=True)
class PairedResult:
    """Paired tests for one seed trained in both systems."""

    seed: int
    tests: PairedTests


@dataclass
class GroupComparison:
    """Baseline vs system runs on one (setup, test set, scored checkpoint)."""

    setup: str | None
    test_set: str
    checkpoint: str | None
    baseline: list[RunResult]
    system: list[RunResult]
    ttest: TTestResult
    detectable: float
    equivalence: EquivalenceResult | None
    paired: list[PairedResult]
    unmatched_baseline: list[int | None]
    unmatched_system: list[int | None]


@dataclass
class Comparison:
    """Everything a report needs; ``label`` names a group in it."""

    groups: list[GroupComparison]
    metric: str
    test: str
    signature: str
    bootstrap: str
    equivalence_margin: float | None
    bootstrap_samples: int
    ar_samples: int
    seed: int

    @property
    def checkpoints(self) -> list[str | None]:
        return list(dict.fromkeys(g.checkpoint for g in self.groups))

    def label(self, group: GroupComparison) -> str:
        """``setup · test set``, and the scored checkpoint where the groups differ in it."""
        return _where((group.setup, group.test_set, group.checkpoint if len(self.checkpoints) > 1 else None))


def _where(key: GroupKey) -> str:
    """A group as reports name it: ``setup · test set · checkpoint``, each part where known."""
    return " · ".join(part for part in key if part)


def _check_group(key: GroupKey, baseline: list[RunResult], system: list[RunResult]) -> None:
    where = _where(key)
    for side, runs in (("baseline", baseline), ("system", system)):
        if len(runs) < 2:
            raise SignificanceError(f"{where}: the {side} has {len(runs)} run(s); a t-test needs at least 2 per system")
        seeds = [r.seed for r in runs if r.seed is not None]
        duplicates = sorted({s for s in seeds if seeds.count(s) > 1})
        if duplicates:
            raise SignificanceError(f"{where}: the {side} has several runs with seed {duplicates[0]}")
        other = next((r for r in runs if r.num_params != runs[0].num_params), None)
        if other is not None:
            raise SignificanceError(f"{where}: the {side}'s runs are of different models: {runs[0].path} has "
                                    f"{runs[0].num_params:,} parameters, {other.path} {other.num_params:,}")
    first = baseline[0]
    for run in baseline[1:] + system:
        if run.references != first.references:
            raise SignificanceError(f"{where}: {run.path} and {first.path} were scored against different references")
        differ = sorted(k for k in run.generation.keys() & first.generation.keys()
                        if run.generation[k] != first.generation[k])
        if differ:
            key = differ[0]
            raise SignificanceError(f"{where}: {run.path} was generated with {key} {run.generation[key]!r}, "
                                    f"{first.path} with {first.generation[key]!r}: score every run alike")


def group_results(baseline: list[RunResult],
                  system: list[RunResult]) -> dict[GroupKey, tuple[list[RunResult], list[RunResult]]]:
    """Group both sides by (setup, test set, scored checkpoint); each group must exist on both sides with >= 2 runs
    each, of one model per side, scored alike."""
    groups: dict[GroupKey, tuple[list[RunResult], list[RunResult]]] = {}
    for index, runs in ((0, baseline), (1, system)):
        for run in runs:
            groups.setdefault((run.setup, run.test_set, run.checkpoint), ([], []))[index].append(run)
    one_sided = [(key, "baseline" if b else "system") for key, (b, s) in groups.items() if not (b and s)]
    if one_sided:
        key, side = one_sided[0]
        kinds = [sorted({str(k[2]) for k, runs in groups.items() if k[:2] == key[:2] and runs[i]}) for i in (0, 1)]
        if all(kinds):
            raise SignificanceError(f"{_where(key[:2])}: the baseline's results scored {', '.join(kinds[0])}, the "
                                    f"system's {', '.join(kinds[1])}: compare results of the same checkpoints")
        where = f"setup {key[0]!r}, test set {key[1]!r}"
        raise SignificanceError(f"only the {side} has results for {where}: both systems need the same setups and "
                                "test sets")
    for key, (b, s) in groups.items():
        _check_group(key, b, s)
    return dict(sorted(groups.items(), key=lambda item: tuple(part or "" for part in item[0])))


def load_side(paths: Sequence[Path], metric: str, cache: dict[Path, list[str]],
              allow_diverged: bool = False) -> list[RunResult]:
    """Load one side's result files; they must all name the same system."""
    resolved = [Path(p).resolve() for p in paths]
    twice = next((p for p, r in zip(paths, resolved) if resolved.count(r) > 1), None)
    if twice is not None:
        raise SignificanceError(f"result file {twice} is given twice")
    runs = [load_result(p, metric, cache, allow_diverged) for p in paths]
    systems = sorted({r.system for r in runs})
    if len(systems) > 1:
        raise SignificanceError(f"results of different systems on one side: {', '.join(systems)}")
    return runs


def compare(baseline_paths: Sequence[Path], system_paths: Sequence[Path], *, metric: str = "sacrebleu",
            test: str = "welch", bootstrap: str = "two-sided", equivalence_margin: float | None = None,
            bootstrap_samples: int = 1000, ar_samples: int = 10000, seed: int = 12345,
            allow_diverged: bool = False) -> Comparison:
    """Load, check and compare; raises ``SignificanceError`` on bad input before any test runs. ``bootstrap``
    (one of :data:`BOOTSTRAPS`) is the paired bootstrap the Markdown report shows (the JSON holds both)."""
    if bootstrap not in BOOTSTRAPS:
        raise ValueError(f"unknown bootstrap {bootstrap!r}, expected one of {', '.join(BOOTSTRAPS)}")
    if metric not in BLEU_METRICS:
        raise SignificanceError(f"unknown metric {metric!r}, expected one of {', '.join(BLEU_METRICS)}")
    cache: dict[Path, list[str]] = {}
    baseline = load_side(baseline_paths, metric, cache, allow_diverged)
    system = load_side(system_paths, metric, cache, allow_diverged)
    overlap = {r.path.resolve() for r in baseline} & {r.path.resolve() for r in system}
    if overlap:
        raise SignificanceError(f"{sorted(overlap)[0]} is given as both baseline and system")
    first = (baseline + system)[0]
    odd = next((r for r in baseline + system if r.bleu.get("signature") != first.bleu.get("signature")), None)
    if odd is not None:
        raise SignificanceError(f"mixed sacreBLEU signatures: {odd.path} has {odd.bleu.get('signature')}, "
                                f"{first.path} {first.bleu.get('signature')}")
    groups = group_results(baseline, system)

    comparisons = []
    for (setup, test_set, checkpoint), (base_runs, sys_runs) in groups.items():
        stats = t_test([r.bleu[metric] for r in base_runs], [r.bleu[metric] for r in sys_runs], test)
        sides = ((stats.mean_baseline, stats.std_baseline, stats.n_baseline),
                 (stats.mean_system, stats.std_system, stats.n_system))
        equivalence = None if equivalence_margin is None else equivalence_test(*sides[0], *sides[1],
                                                                               equivalence_margin)
        by_seed = {r.seed: r for r in sys_runs if r.seed is not None}
        base_seeds = {r.seed for r in base_runs if r.seed is not None}
        paired = []
        for run in sorted((r for r in base_runs if r.seed in by_seed), key=lambda r: r.seed):
            other = by_seed[run.seed]
            tests = paired_tests(run.hypotheses, other.hypotheses, run.references,
                                 bootstrap_samples=bootstrap_samples, ar_samples=ar_samples, seed=seed)
            paired.append(PairedResult(run.seed, tests))
        comparisons.append(GroupComparison(
            setup=setup, test_set=test_set, checkpoint=checkpoint, baseline=base_runs, system=sys_runs, ttest=stats,
            detectable=detectable_difference(*sides[0][1:], *sides[1][1:]), equivalence=equivalence, paired=paired,
            unmatched_baseline=sorted((r.seed for r in base_runs if r.seed not in by_seed), key=_seed_key),
            unmatched_system=sorted((r.seed for r in sys_runs if r.seed not in base_seeds), key=_seed_key),
        ))
    return Comparison(groups=comparisons, metric=metric, test=test, signature=str(first.bleu.get("signature")),
                      bootstrap=bootstrap, equivalence_margin=equivalence_margin, bootstrap_samples=bootstrap_samples,
                      ar_samples=ar_samples, seed=seed)


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
    rows = [
        [base, format_params(all_base), *(f"{g.ttest.mean_baseline:.2f} ± {g.ttest.std_baseline:.2f}" for g in groups)],
        [sys_, format_params(all_sys), *(f"{g.ttest.mean_system:.2f} ± {g.ttest.std_system:.2f}" for g in groups)],
        [f"p-value ({test}, one-sided: {sys_} > {base})", "", *(format_p(g.ttest.p_greater) for g in groups)],
        [f"p-value ({test}, two-sided)", "", *(format_p(g.ttest.p_two_sided) for g in groups)],
        ["t (degrees of freedom)", "", *(f"{g.ttest.t:.2f} ({g.ttest.df:.1f})" for g in groups)],
        [f"runs ({base} / {sys_})", "", *(f"{g.ttest.n_baseline} / {g.ttest.n_system}" for g in groups)],
        [f"detectable difference (Welch, {POWER:.0%} power, two-sided α = {ALPHA})", "",
         *(f"{g.detectable:.2f}" for g in groups)],
    ]
    within = "only an equivalence test (--equivalence-margin) can show a difference within a margin"
    if comparison.equivalence_margin is not None:
        rows.append([f"p-value (equivalence within ±{comparison.equivalence_margin:g}, two one-sided Welch t-tests)",
                     "", *(format_p(g.equivalence.p) for g in groups)])
        within = "only the equivalence test (p < 0.05) shows a difference within its margin"
    lines = [
        f"## BLEU over training runs: {base} vs {sys_}",
        "",
        f"Metric: {METRIC_NAMES[comparison.metric]}"
        + (f" (`{comparison.signature}`)" if comparison.metric == "sacrebleu" else
           f"; the paired tests below use cased sacreBLEU (`{comparison.signature}`)")
        + "; mean ± sample standard deviation over runs."
        + (f" Every run scored at `{comparison.checkpoints[0]}`." if comparison.checkpoints[0] and
           len(comparison.checkpoints) == 1 else "")
        + ("" if comparison.metric in SACREBLEU_OPTIONS else
           f" {METRIC_NAMES[comparison.metric]} is taken as the result files record it (`mtsa-score --rescore` "
           "recomputes it)."),
        "",
        *markdown_table(["Model", "Param#", *(f"{comparison.label(g)} BLEU" for g in groups)], rows,
                        align="lr" + "r" * len(groups)),
        "",
        "With few runs per system the t-test has little power: a large p-value is no evidence that the systems "
        f"are equal (Clark et al., 2011); {within}.",
    ]
    bootstrap_column = {"two-sided": "bootstrap p (two-sided)", "moses": "bootstrap p (Moses, one-sided-like)"}
    bootstrap_field = {"two-sided": "p_bootstrap_two_sided", "moses": "p_bootstrap_moses"}[comparison.bootstrap]
    for g in groups:
        lines += [
            "",
            f"### {comparison.label(g)}: paired tests per seed",
            "",
            f"sacreBLEU of the two runs trained with the same seed; paired bootstrap resampling "
            f"({comparison.bootstrap_samples} resamples, {BOOTSTRAPS[comparison.bootstrap]}) and approximate "
            f"randomization ({comparison.ar_samples} trials, two-sided), sampling seed {comparison.seed}.",
            "",
        ]
        if g.paired:
            lines += markdown_table(
                ["seed", f"{base} BLEU", f"{sys_} BLEU", bootstrap_column[comparison.bootstrap], "AR p"],
                ([str(p.seed), f"{p.tests.baseline_bleu:.2f}", f"{p.tests.system_bleu:.2f}",
                  format_p(getattr(p.tests, bootstrap_field)), format_p(p.tests.p_ar)] for p in g.paired),
                align="r" * 5)
        else:
            lines.append("No seed was trained in both systems: no paired tests.")
        if g.unmatched_baseline or g.unmatched_system:
            def seeds(values: list[int | None]) -> str:
                return ", ".join("none" if s is None else str(s) for s in values) or "-"

            lines += ["", f"Unmatched seeds (skipped): {base} {seeds(g.unmatched_baseline)}; "
                          f"{sys_} {seeds(g.unmatched_system)}."]
    return "\n".join(lines) + "\n"


def comparison_to_json(comparison: Comparison, names: tuple[str, str], folder: Path | None = None) -> dict[str, Any]:
    """A JSON-serialisable summary of the comparison; result paths relative to ``folder`` (the JSON file's) if
    given."""

    def side(runs: list[RunResult], name: str) -> dict[str, Any]:
        return {"name": name, "num_params": sorted({r.num_params for r in runs}),
                "runs": [{"seed": r.seed, "bleu": r.bleu[comparison.metric],
                          "result": str(r.path) if folder is None else relative_path(r.path, folder)}
                         for r in runs]}

    c = comparison
    return {
        "schema": "mtsa-fairseq.significance.v1", "metric": c.metric, "signature": c.signature, "test": c.test,
        "bootstrap": c.bootstrap, "paired_tests": PAIRED_TESTS, "power": POWER, "alpha": ALPHA,
        "equivalence_margin": c.equivalence_margin, "bootstrap_samples": c.bootstrap_samples,
        "ar_samples": c.ar_samples, "seed": c.seed,
        "groups": [{"setup": g.setup, "test_set": g.test_set, "checkpoint": g.checkpoint,
                    "baseline": side(g.baseline, names[0]), "system": side(g.system, names[1]),
                    "t_test": vars(g.ttest), "detectable_difference": g.detectable,
                    "equivalence": None if g.equivalence is None else vars(g.equivalence),
                    "paired": [{"seed": p.seed, **vars(p.tests)} for p in g.paired],
                    "unmatched_seeds": {"baseline": g.unmatched_baseline, "system": g.unmatched_system}}
                   for g in c.groups],
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
        ax.set_title(f"{comparison.label(g)} (p = {format_p(g.ttest.p_greater)}, one-sided)", fontsize=9)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, format="png", dpi=120)
    plt.close(fig)


def _seed_label(run: RunResult) -> str:
    return str(run.seed) if run.seed is not None else run.path.stem
