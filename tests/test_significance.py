"""scripts/significance.py and mtsa_fairseq.experiments.significance on small result files written here."""

import json
import math
import os
import random
import runpy
import statistics
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from sacrebleu.metrics import BLEU
from sacrebleu.significance import PairedTest
from scipy import stats

from mtsa_fairseq.contracts import relative_path
from mtsa_fairseq.experiments import significance
from mtsa_fairseq.experiments.translation import scoring
from mtsa_fairseq.experiments.translation.toy_corpus import write_corpus

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "significance.py"
ENV = {**os.environ, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1"}
FAST = ["--bootstrap-samples", "200", "--ar-samples", "300"]
NOISE = ["xx", "yy", "der", "die", "das", "und"]
BASELINE = [2.1, 3.4, 2.9, 3.0, 2.5]
SYSTEM = [3.3, 3.9, 4.4, 3.1]


def _hypotheses(refs: list[str], rate: float, rng: random.Random) -> list[str]:
    return [" ".join(rng.choice(NOISE) if rng.random() < rate else w for w in line.split()) for line in refs]


def _write_result(root: Path, refs_path: Path, system: str, setup: str, seed: int, rate: float,
                  num_params: int) -> Path:
    refs = scoring.read_lines(refs_path)
    hyp_path = root / f"{system}_{setup}_seed{seed}.hyp.txt"
    scoring.write_lines(hyp_path, _hypotheses(refs, rate, random.Random(f"{system}/{setup}/{seed}")))
    hyps = scoring.read_lines(hyp_path)
    result = scoring.build_result(
        system=system, setup=setup, arch=f"{system}_arch", seed=seed, checkpoint=root / "ckpt.pt",
        num_params=num_params, test_set="toytest", subset="test", hypotheses=hyp_path, references=refs_path,
        num_sentences=len(refs), bleu=scoring.bleu_scores(hyps, refs, "de"),
        generation={"beam": 4, "lenpen": 0.6, "max_len_a": 0, "max_len_b": 200}, folder=root,
    )
    path = root / f"{system}_{setup}_seed{seed}.json"
    path.write_text(json.dumps(result))
    return path


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    root = tmp_path_factory.mktemp("results")
    write_corpus(root / "raw", {"test": 40}, seed=5)
    refs = root / "raw" / "test.de"
    files = {"base": [], "mtsa": []}
    for setup, base_seeds, sys_seeds in (("setup1", [1, 2, 3], [1, 2, 4]), ("setup2", [1, 2], [1, 2])):
        files["base"] += [_write_result(root, refs, "transformer", setup, s, 0.45, 61_378_560) for s in base_seeds]
        files["mtsa"] += [_write_result(root, refs, "mtsa", setup, s, 0.3, 61_578_240) for s in sys_seeds]
    return root, files


def _load(path: Path) -> dict:
    return json.loads(path.read_text())


def _moved(path: Path, folder: Path) -> dict:
    """Result ``path`` as a copy of it in ``folder`` says it: naming the same files, from ``folder``."""
    data = _load(path)
    return {**data, **{key: relative_path(scoring.result_file(data, key, path), folder)
                       for key in ("checkpoint", "hypotheses", "references")}}


def _lines(path: Path, key: str) -> list[str]:
    """The lines of the file that result ``path`` names under ``key`` (relative to its folder)."""
    return scoring.read_lines(scoring.result_file(_load(path), key, path))


def _run_main(monkeypatch, *argv: str) -> None:
    monkeypatch.setattr(sys, "argv", [str(SCRIPT), *argv])
    runpy.run_path(str(SCRIPT), run_name="__main__")


@pytest.mark.parametrize("test,equal_var", [("welch", False), ("student", True)])
def test_t_test_matches_scipy(test, equal_var):
    ours = significance.t_test(BASELINE, SYSTEM, test)
    for alternative, p in (("two-sided", ours.p_two_sided), ("greater", ours.p_greater)):
        ref = stats.ttest_ind(SYSTEM, BASELINE, equal_var=equal_var, alternative=alternative)
        assert ours.t == pytest.approx(ref.statistic, rel=1e-12)
        assert ours.df == pytest.approx(ref.df, rel=1e-12)
        assert p == pytest.approx(ref.pvalue, rel=1e-10)
    # system worse than baseline: the one-sided p for "system > baseline" is large
    flipped = significance.t_test(SYSTEM, BASELINE, test)
    assert flipped.p_greater == pytest.approx(1 - ours.p_greater, rel=1e-10)
    assert ours.std_baseline == pytest.approx(statistics.stdev(BASELINE))
    assert (ours.n_baseline, ours.n_system) == (5, 4)


def test_t_test_hand_computed():
    # baseline 1, 2, 3: mean 2, s^2 1; system 2, 4, 6, 8: mean 5, s^2 20/3
    welch = significance.t_test([1, 2, 3], [2, 4, 6, 8], "welch")
    assert welch.t == pytest.approx(3 / math.sqrt(1 / 3 + 5 / 3))  # = 2.1213
    assert welch.df == pytest.approx(2**2 / ((1 / 3) ** 2 / 2 + (5 / 3) ** 2 / 3))  # = 216/53
    assert welch.df == pytest.approx(216 / 53)
    student = significance.t_test([1, 2, 3], [2, 4, 6, 8], "student")
    pooled = (2 * 1 + 3 * 20 / 3) / 5  # 4.4
    assert student.t == pytest.approx(3 / math.sqrt(pooled * (1 / 3 + 1 / 4)))  # = 1.8726
    assert student.df == 5
    assert student.p_greater == pytest.approx(stats.t.sf(student.t, 5))
    assert student.p_two_sided == pytest.approx(2 * student.p_greater)


def test_t_test_rejects_single_runs_and_zero_variance():
    with pytest.raises(significance.SignificanceError, match="at least 2 runs"):
        significance.t_test([1.0], [2.0, 3.0])
    with pytest.raises(significance.SignificanceError, match="same BLEU"):
        significance.t_test([1.0, 1.0], [2.0, 2.0])


def test_paired_t_test_matches_scipy_and_the_differences():
    baseline, system = [80.1, 78.4, 82.0, 79.5, 81.2], [81.0, 79.9, 82.4, 81.5, 81.1]
    ours = significance.paired_t_test(baseline, system)
    diff = [b - a for a, b in zip(baseline, system)]
    assert ours.t == pytest.approx(statistics.mean(diff) / (statistics.stdev(diff) / math.sqrt(5)), rel=1e-12)
    assert ours.t == pytest.approx(stats.ttest_rel(system, baseline).statistic, rel=1e-12)
    assert (ours.n, ours.df) == (5, 4) and ours.mean_difference == pytest.approx(statistics.mean(diff))
    assert ours.p_greater == pytest.approx(stats.t.sf(ours.t, 4), rel=1e-10)
    assert ours.p_two_sided == pytest.approx(2 * ours.p_greater, rel=1e-10)
    # unpaired, the same numbers are far from significant: the pairing removes the units' own spread
    assert significance.t_test(baseline, system).p_two_sided > 0.2 > 0.1 > ours.p_two_sided
    with pytest.raises(significance.SignificanceError, match="matched units"):
        significance.paired_t_test([1.0, 2.0], [1.0, 2.0, 3.0])
    with pytest.raises(significance.SignificanceError, match="same"):
        significance.paired_t_test([1.0, 2.0], [2.0, 3.0])


def test_cross_validation_summary_pairs_runs_by_fold():
    """Per architecture over its folds: the held-out-selected best, the value at the update the other folds
    choose, and the last; paired t-tests over the folds both architectures have."""
    from mtsa_fairseq.experiments.sentence.report import report_markdown, summarize
    from mtsa_fairseq.experiments.sentence.runs import TaskConfig

    config = TaskConfig(path=Path("cv.yaml"), name="cv", dataset="cr", metric="accuracy", fairseq={}, arch_overrides={})
    best = {"mtsa_encoder": [81.0, 83.0, 80.0, 82.0], "multi_head_encoder": [80.0, 81.5, 79.0, 80.5]}
    early = {"mtsa_encoder": [80.0, 82.0, 79.0, 81.0], "multi_head_encoder": [70.0, 71.0, 95.0, 72.0]}
    last = {"mtsa_encoder": [78.0, 79.0, 77.0, 76.0], "multi_head_encoder": [79.0, 78.0, 77.5, 77.5]}
    results = [{"run": f"{arch}_seed1_fold{fold}", "arch": arch, "seed": 1, "fold": fold,
                "metrics": {"accuracy": best[arch][fold]},
                "dev_curve": [[100, early[arch][fold]], [150 + fold, 50.0], [200, last[arch][fold]]]}
               for arch in best for fold in range(4)]
    summary = summarize(config, results, "mtsa_encoder")
    cv = summary["cross_validation"]
    assert cv["archs"]["mtsa_encoder"]["best"]["mean"] == pytest.approx(81.5)
    assert cv["archs"]["multi_head_encoder"]["last"]["mean"] == pytest.approx(78.0)
    assert cv["archs"]["mtsa_encoder"]["last"]["std"] == pytest.approx(statistics.stdev(last["mtsa_encoder"]))
    # MTSA's other folds always prefer update 100 (the 150 + fold steps are not shared, so never chosen).
    # Multi-head's fold 2 peaks at 95 at update 100: that pulls the other folds' choice to update 100, while
    # fold 2's own number comes from the others' choice (update 200: 77.5), never from its own peak.
    assert cv["archs"]["mtsa_encoder"]["chosen"]["mean"] == pytest.approx(80.5)
    assert cv["archs"]["multi_head_encoder"]["chosen"]["mean"] == pytest.approx(statistics.mean([70, 71, 77.5, 72]))
    test = cv["paired_vs_reference"]["multi_head_encoder"]
    ref = stats.ttest_rel(best["mtsa_encoder"], best["multi_head_encoder"])
    assert test["best"]["t"] == pytest.approx(ref.statistic)
    assert test["best"]["p_two_sided"] == pytest.approx(ref.pvalue)
    assert test["best"]["difference"] == pytest.approx(1.25) and test["last"]["difference"] == pytest.approx(-0.5)
    corrected = stats.ttest_rel(best["mtsa_encoder"], best["multi_head_encoder"]).statistic * math.sqrt(
        (1 / 4) / (1 / 4 + 1 / 3))  # Nadeau and Bengio: 4 folds, n_test/n_train = 1/3
    assert test["best"]["corrected"]["t"] == pytest.approx(corrected)
    assert test["best"]["corrected"]["test_train_ratio"] == pytest.approx(1 / 3)
    assert "error" in summary["welch_vs_reference"]["multi_head_encoder"]  # one seed: no t-test over seeds
    assert "| multi_head_encoder | 4 | 72.62 ± 3.35 | 80.25 ± 1.04 |" in report_markdown(summary)  # chosen first
    # a fold only one architecture has is left out of the pairing
    summary = summarize(config, results[:-1], "mtsa_encoder")
    assert summary["cross_validation"]["paired_vs_reference"]["multi_head_encoder"]["best"]["n"] == 3


def _sacrebleu_test(h0, h1, refs, test_type, n, seed, monkeypatch):
    """sacreBLEU's own paired test (its strict count) of h1 against h0: the system's p-value."""
    with monkeypatch.context() as m:
        m.setenv("SACREBLEU_SEED", str(seed))
        _, scores = PairedTest(named_systems=[("baseline", h0), ("system", h1)],
                               metrics={"BLEU": BLEU(references=[refs])}, references=None,
                               test_type=test_type, n_samples=n)()
    return scores["BLEU"][0].score, scores["BLEU"][1].score, scores["BLEU"][1].p_value


def test_paired_tests_are_deterministic_and_match_sacrebleu(results, monkeypatch):
    """The Moses-style bootstrap and approximate randomization are sacreBLEU's, on its own draws."""
    _, files = results
    base, mtsa = _load(files["base"][0]), _load(files["mtsa"][0])
    h0, h1 = _lines(files["base"][0], "hypotheses"), _lines(files["mtsa"][0], "hypotheses")
    refs = _lines(files["base"][0], "references")
    monkeypatch.delenv("SACREBLEU_SEED", raising=False)
    first = significance.paired_tests(h0, h1, refs, bootstrap_samples=200, ar_samples=300, seed=7)
    assert significance.paired_tests(h0, h1, refs, bootstrap_samples=200, ar_samples=300, seed=7) == first
    assert "SACREBLEU_SEED" not in os.environ
    for test_type, n, p in (("bs", 200, first.p_bootstrap_moses), ("ar", 300, first.p_ar)):
        assert (first.baseline_bleu, first.system_bleu, p) == _sacrebleu_test(h0, h1, refs, test_type, n, 7,
                                                                             monkeypatch)
    assert (first.baseline_bleu, first.system_bleu) == pytest.approx((base["bleu"]["sacrebleu"],
                                                                       mtsa["bleu"]["sacrebleu"]))
    assert 0 < first.p_bootstrap_moses <= first.p_bootstrap_two_sided <= 1 and 0 < first.p_ar <= 1


def test_identical_systems_get_p_one_where_sacrebleu_gives_its_smallest(results, monkeypatch):
    """Ties count (Koehn 2004; Riezler and Maxwell 2005): a system compared with itself is never significant."""
    _, files = results
    h0, refs = _lines(files["base"][0], "hypotheses"), _lines(files["base"][0], "references")
    same = significance.paired_tests(h0, list(h0), refs, bootstrap_samples=200, ar_samples=300, seed=7)
    assert (same.p_bootstrap_two_sided, same.p_bootstrap_moses, same.p_ar) == (1.0, 1.0, 1.0)
    for test_type, n in (("bs", 200), ("ar", 300)):
        p = _sacrebleu_test(h0, list(h0), refs, test_type, n, 7, monkeypatch)[2]
        assert p == pytest.approx(1 / (n + 1))  # sacreBLEU's strict count


def _systems(n: int, shift: float, seed: int) -> tuple[list[str], list[str], list[str]]:
    """Synthetic references and two systems' hypotheses: each word of a reference replaced by noise with a
    per-sentence rate, the system's rate ``shift`` lower (a real difference for shift > 0)."""
    rng = random.Random(seed)
    vocabulary = [f"w{i}" for i in range(60)]
    refs = [" ".join(rng.choice(vocabulary) for _ in range(rng.randint(6, 14))) for _ in range(n)]
    base, system = [], []
    for line in refs:
        rate = rng.uniform(0.2, 0.6)
        base.append(" ".join(rng.choice(NOISE) if rng.random() < rate else w for w in line.split()))
        system.append(" ".join(rng.choice(NOISE) if rng.random() < rate - shift else w for w in line.split()))
    return base, system, refs


def test_the_two_sided_bootstrap_agrees_with_approximate_randomization_and_moses_is_one_sided_like():
    """On the same pairs the centred bootstrap's p and approximate randomization's agree within their sampling
    error, while sacreBLEU's (Moses) bootstrap gives about half of either."""
    n_bs = n_ar = 2000
    for shift, seed in ((0.0, 1), (0.005, 3), (0.02, 2)):
        base, system, refs = _systems(300, shift, seed)
        tests = significance.paired_tests(base, system, refs, bootstrap_samples=n_bs, ar_samples=n_ar, seed=11)
        p_bs, p_ar = tests.p_bootstrap_two_sided, tests.p_ar
        assert 0.1 < p_ar < 0.9  # cases where the Moses bootstrap differs from both
        error = 3 * math.sqrt(p_ar * (1 - p_ar) / n_ar + p_bs * (1 - p_bs) / n_bs)
        assert abs(p_bs - p_ar) < error + 0.25 * p_ar  # sampling error, plus the tests' own small difference
        assert tests.p_bootstrap_moses < 0.65 * p_bs


def test_equivalence_is_two_one_sided_welch_tests():
    test = significance.t_test(BASELINE, SYSTEM)
    sides = (test.mean_baseline, test.std_baseline, 5, test.mean_system, test.std_system, 4)
    result = significance.equivalence_test(*sides, 0.45)
    lower = stats.ttest_ind([x + 0.45 for x in SYSTEM], BASELINE, equal_var=False, alternative="greater")
    upper = stats.ttest_ind([x - 0.45 for x in SYSTEM], BASELINE, equal_var=False, alternative="less")
    assert (result.p_lower, result.p_upper) == pytest.approx((lower.pvalue, upper.pvalue))
    assert result.p == max(result.p_lower, result.p_upper) > 0.05  # a difference of 0.9: not equivalent
    close = significance.equivalence_test(40.0, 0.1, 10, 40.05, 0.1, 10, 0.45)
    assert close.p < 0.05 < stats.ttest_ind_from_stats(40.05, 0.1, 10, 40.0, 0.1, 10, equal_var=False).pvalue
    with pytest.raises(ValueError, match="positive"):
        significance.equivalence_test(*sides, 0.0)


def test_the_detectable_difference_has_the_stated_power():
    """At the detectable difference Welch's test rejects with probability 0.8 (noncentral t)."""
    sd_a, sd_b, n = 0.41, 0.56, 6
    delta = significance.detectable_difference(sd_a, n, sd_b, n)
    se, df = significance.welch_se_df(sd_a, n, sd_b, n)
    critical = stats.t.ppf(0.975, df)
    assert stats.nct.sf(critical, df, delta / se) + stats.nct.cdf(-critical, df, delta / se) == pytest.approx(0.8)
    assert 0.85 < delta < 0.95  # the Multi30k study's spread at the last checkpoint on test_2016_flickr
    assert significance.detectable_difference(sd_a, 4 * n, sd_b, 4 * n) == pytest.approx(delta / 2, rel=0.15)
    assert significance.detectable_difference(0.2, 3, 0.67, 3) > 1.5  # few runs, small df: no NaN from scipy


def test_the_corrected_resampled_t_test_inflates_the_variance_of_the_folds():
    """Nadeau and Bengio (2003): 10 folds, n_test/n_train = 1/9; the variance factor 1/10 + 1/9 replaces 1/10."""
    baseline = [80.1, 78.4, 82.0, 79.5, 81.2, 80.0, 79.9, 81.5, 78.8, 80.6]
    system = [81.0, 79.9, 82.4, 81.5, 81.1, 80.2, 81.3, 81.9, 79.0, 82.1]
    naive = significance.paired_t_test(baseline, system)
    corrected = significance.corrected_resampled_t_test(baseline, system, 1 / 9)
    diff = np.subtract(system, baseline)
    assert corrected.t == pytest.approx(diff.mean() / math.sqrt((1 / 10 + 1 / 9) * diff.var(ddof=1)))
    assert corrected.df == naive.df == 9 and corrected.mean_difference == naive.mean_difference
    assert corrected.p_two_sided == pytest.approx(2 * stats.t.sf(abs(corrected.t), 9))
    assert naive.p_two_sided < corrected.p_two_sided
    no_overlap = significance.corrected_resampled_t_test(baseline, system, 0.0)
    assert no_overlap.p_two_sided == pytest.approx(naive.p_two_sided)


def test_an_anchor_test_adds_the_figures_own_error():
    values = [46.5, 45.8, 46.9]
    plain = significance.anchor_test(values, 45.0)
    assert plain.p_two_sided == pytest.approx(stats.ttest_1samp(values, 45.0).pvalue) and plain.df == 2
    se = significance.binomial_se(45.0, 2210)
    assert se == pytest.approx(100 * math.sqrt(0.45 * 0.55 / 2210)) and 1.05 < se < 1.07  # Kim's SST-5 test set
    both = significance.anchor_test(values, 45.0, anchor_se=se, anchor_df=2209)
    se2_mean = np.var(values, ddof=1) / 3
    assert both.t == pytest.approx(plain.difference / math.sqrt(se2_mean + se**2))
    assert both.df == pytest.approx((se2_mean + se**2) ** 2 / (se2_mean**2 / 2 + se**4 / 2209))
    assert both.p_two_sided > 0.2 > 0.05 > plain.p_two_sided  # the figure's error is as large as the gap
    folds = significance.anchor_test(values, 45.0, test_train_ratio=1 / 9)
    assert folds.t == pytest.approx(plain.difference / math.sqrt((1 / 3 + 1 / 9) * np.var(values, ddof=1)))


def test_holm_adjusts_step_down():
    """Holm (1979) on the sentence page's five MTSA-vs-baseline p-values as the naive tests gave them."""
    adjusted = significance.holm([0.488, 0.042, 0.090, 0.097, 0.004])
    assert adjusted == pytest.approx([0.488, 0.168, 0.27, 0.27, 0.02])
    assert [p < 0.05 for p in adjusted] == [False, False, False, False, True]  # only the smallest survives
    assert significance.holm([0.5, 0.9]) == [1.0, 1.0] and significance.holm([]) == []


def test_p_value_counts_ties_and_adds_one():
    stats = np.array([0.0, 0.5, 1.0, 2.0])
    assert significance.p_value_ties_count(stats, 1.0) == 3 / 5  # 1.0 and 2.0, plus one
    assert significance.p_value_ties_count(np.zeros(9), 0.0) == 1.0
    assert significance.p_value_ties_count(stats, 3.0) == 1 / 5


def test_table6_markdown(results):
    _, files = results
    comparison = significance.compare(files["base"], files["mtsa"], bootstrap_samples=200, ar_samples=300, seed=3)
    text = significance.render_markdown(comparison, ("Transformer", "MTSA"))
    values = {(side, setup): [] for side in ("base", "mtsa") for setup in ("setup1", "setup2")}
    for side in ("base", "mtsa"):
        for path in files[side]:
            values[side, _load(path)["setup"]].append(_load(path)["bleu"]["sacrebleu"])

    def cell(side, setup):
        v = values[side, setup]
        return f"{statistics.mean(v):.2f} ± {statistics.stdev(v):.2f}"

    def p(setup, alternative):
        ref = stats.ttest_ind(values["mtsa", setup], values["base", setup], equal_var=False, alternative=alternative)
        return significance.format_p(ref.pvalue)

    assert "| Model | Param# | setup1 · toytest BLEU | setup2 · toytest BLEU |" in text
    assert "over runs. Every run scored at `ckpt.pt`." in text
    assert f"| Transformer | 61.38M | {cell('base', 'setup1')} | {cell('base', 'setup2')} |" in text
    assert f"| MTSA | 61.58M | {cell('mtsa', 'setup1')} | {cell('mtsa', 'setup2')} |" in text
    assert (f"| p-value (Welch's t-test, one-sided: MTSA > Transformer) |  | {p('setup1', 'greater')} | "
            f"{p('setup2', 'greater')} |") in text
    two_sided = f"{p('setup1', 'two-sided')} | {p('setup2', 'two-sided')}"
    assert f"| p-value (Welch's t-test, two-sided) |  | {two_sided} |" in text
    assert "| runs (Transformer / MTSA) |  | 3 / 3 | 2 / 2 |" in text
    assert "little power" in text and "Clark et al., 2011" in text
    assert "Unmatched seeds (skipped): Transformer 3; MTSA 4." in text
    # per-seed rows: the two-sided bootstrap and approximate randomization on the same files
    group = comparison.groups[0]
    assert [r.seed for r in group.paired] == [1, 2]
    b, s = _load(files["base"][0]), _load(files["mtsa"][0])
    refs = _lines(files["base"][0], "references")
    h0, h1 = _lines(files["base"][0], "hypotheses"), _lines(files["mtsa"][0], "hypotheses")
    tests = significance.paired_tests(h0, h1, refs, bootstrap_samples=200, ar_samples=300, seed=3)
    row = (f"| 1 | {b['bleu']['sacrebleu']:.2f} | {s['bleu']['sacrebleu']:.2f} | "
           f"{significance.format_p(tests.p_bootstrap_two_sided)} | {significance.format_p(tests.p_ar)} |")
    assert row in text and "| seed | Transformer BLEU | MTSA BLEU | bootstrap p (two-sided) | AR p |" in text
    assert "detectable difference (Welch, 80% power, two-sided α = 0.05)" in text
    assert "equivalence within" not in text  # no margin given: no equivalence test, and none is cited
    assert "only an equivalence test (--equivalence-margin) can show a difference within a margin." in text
    moses = significance.render_markdown(
        significance.compare(files["base"], files["mtsa"], bootstrap="moses", bootstrap_samples=200, ar_samples=300,
                             seed=3), ("Transformer", "MTSA"))
    assert "bootstrap p (Moses, one-sided-like)" in moses and "one-sided-like) and approximate" in moses
    summary = significance.comparison_to_json(comparison, ("Transformer", "MTSA"))
    assert summary["bootstrap"] == "two-sided" and "one-sided-like" in summary["paired_tests"]["p_bootstrap_moses"]
    assert summary["groups"][0]["paired"][0] == {"seed": 1, **vars(tests)} and summary["equivalence_margin"] is None
    with_margin = significance.compare(files["base"], files["mtsa"], equivalence_margin=0.45, bootstrap_samples=50,
                                       ar_samples=50, seed=3)
    with_margin_text = significance.render_markdown(with_margin, ("Transformer", "MTSA"))
    assert "| p-value (equivalence within ±0.45, two one-sided Welch t-tests) |" in with_margin_text
    assert "only the equivalence test (p < 0.05) shows a difference within its margin." in with_margin_text
    assert significance.comparison_to_json(with_margin, ("T", "M"))["groups"][0]["equivalence"]["margin"] == 0.45
    assert f"| {significance.format_p(tests.p_bootstrap_moses)} | {significance.format_p(tests.p_ar)} |" in moses


@pytest.mark.slow
def test_script_writes_report_json_and_png(results, tmp_path):
    _, files = results
    out = tmp_path / "report"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--baseline", *map(str, files["base"]), "--system", *map(str, files["mtsa"]),
         "--names", "Transformer", "MTSA", "--test", "student", "--markdown", f"{out}.md", "--json", f"{out}.json",
         "--plot", f"{out}.png", *FAST],
        capture_output=True, text=True, env=ENV, timeout=1200,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = Path(f"{out}.md").read_text()
    assert report in proc.stdout and "Student's t-test" in report
    summary = json.loads(Path(f"{out}.json").read_text())
    assert [g["setup"] for g in summary["groups"]] == ["setup1", "setup2"]
    assert summary["groups"][0]["unmatched_seeds"] == {"baseline": [3], "system": [4]}
    png = Path(f"{out}.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and png[12:16] == b"IHDR" and png[-8:-4] == b"IEND"
    width, height = int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")
    assert width > height > 100  # two panels side by side


@pytest.mark.slow
@pytest.mark.parametrize("case", ["one_run", "line_count"])
def test_script_errors_write_nothing(results, tmp_path, case):
    root, files = results
    base, mtsa = list(files["base"]), list(files["mtsa"])
    if case == "one_run":
        base = [f for f in base if _load(f)["setup"] == "setup1"] + [base[-1]]  # setup2: one baseline run
        message = "has 1 run(s); a t-test needs at least 2"
    else:
        short = _moved(mtsa[0], tmp_path)
        hyp = tmp_path / "short.hyp.txt"
        scoring.write_lines(hyp, _lines(mtsa[0], "hypotheses")[:-1])
        short["hypotheses"] = str(hyp)
        (tmp_path / "short.json").write_text(json.dumps(short))
        mtsa[0] = tmp_path / "short.json"
        message = "hypotheses have 39 lines, references 40, num_sentences is 40"
    md = tmp_path / "out.md"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--baseline", *map(str, base), "--system", *map(str, mtsa),
         "--markdown", str(md), "--plot", str(tmp_path / "out.png"), *FAST],
        capture_output=True, text=True, env=ENV, timeout=1200,
    )
    assert proc.returncode != 0
    assert message in proc.stderr
    assert not md.exists() and not (tmp_path / "out.png").exists()


def _variant(path: Path, tmp_path: Path, name: str, **changes) -> Path:
    data = _moved(path, tmp_path)
    for key, value in changes.items():
        if key == "signature":
            data["bleu"]["signature"] = value
        else:
            data[key] = value
    out = tmp_path / name
    out.write_text(json.dumps(data))
    return out


@pytest.mark.parametrize("case", ["signature", "test_set", "missing", "schema", "duplicate_seed", "nan", "bleu_string",
                                  "empty_file", "seed_string", "params_float", "diverged", "directory", "twice"])
def test_bad_inputs_exit_with_a_message(results, tmp_path, monkeypatch, capsys, case):
    _, files = results
    base, mtsa = list(files["base"]), list(files["mtsa"])
    if case == "signature":
        base[0] = _variant(base[0], tmp_path, "sig.json",
                           signature="nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.0.0")
        message = f"mixed sacreBLEU signatures: {base[1]} has nrefs:1|"
    elif case == "test_set":
        base.append(_variant(base[0], tmp_path, "other.json", test_set="newstest2017"))
        message = "only the baseline has results for setup 'setup1', test set 'newstest2017'"
    elif case == "missing":
        mtsa.append(tmp_path / "nope.json")
        message = "result file not found"
    elif case == "schema":
        mtsa[0] = _variant(mtsa[0], tmp_path, "schema.json", schema="mtsa-fairseq.result.v0")
        message = "expected 'mtsa-fairseq.result.v1'"
    elif case == "nan":
        data = _moved(mtsa[0], tmp_path)
        data["bleu"]["sacrebleu"] = float("nan")
        mtsa[0] = tmp_path / "nan.json"
        mtsa[0].write_text(json.dumps(data))  # Python writes NaN, which is not JSON but parses
        message = f"{mtsa[0]}: bleu.sacrebleu is nan, not a finite number"
    elif case == "bleu_string":
        mtsa[0] = _variant(mtsa[0], tmp_path, "str.json", bleu="")
        message = f"{mtsa[0]}: bleu must be an object of BLEU values, not str"
    elif case == "seed_string":  # beside a result of seed 1 on the other side
        mtsa[0] = _variant(mtsa[0], tmp_path, "seed.json", seed="1")
        message = f"{mtsa[0]}: seed must be int, got '1'"
    elif case == "diverged":
        mtsa[1] = _variant(mtsa[1], tmp_path, "diverged.json", diverged=True)
        message = f"{mtsa[1]} is the result of a diverged run: pass --allow-diverged to compare it anyway"
    elif case == "params_float":
        base[1] = _variant(base[1], tmp_path, "params.json", num_params=6.5e7)
        message = f"{base[1]}: num_params must be int, got 65000000.0"
    elif case == "directory":
        mtsa.append(Path("."))
        message = "result file . is a directory, not a file"
    elif case == "twice":
        mtsa.append(mtsa[0])
        message = f"result file {mtsa[0]} is given twice"
    elif case == "empty_file":
        mtsa[0] = tmp_path / "empty.json"
        mtsa[0].write_text("")
        message = str(mtsa[0])
    else:
        mtsa[0] = _variant(mtsa[0], tmp_path, "dup.json", seed=2)
        message = "several runs with seed 2"
    md = tmp_path / "out.md"
    with pytest.raises(SystemExit) as exc:
        _run_main(monkeypatch, "--baseline", *map(str, base), "--system", *map(str, mtsa), "--markdown", str(md),
                  *FAST)
    assert exc.value.code not in (0, None)
    assert message in str(exc.value.code)
    assert not md.exists()
    assert capsys.readouterr().out == ""


def test_nonpositive_seed_is_a_usage_error(results, tmp_path, monkeypatch, capsys):
    _, files = results
    with pytest.raises(SystemExit) as exc:
        _run_main(monkeypatch, "--baseline", *map(str, files["base"]), "--system", *map(str, files["mtsa"]),
                  "--seed", "0")
    assert exc.value.code == 2
    assert "--seed must be a positive integer" in capsys.readouterr().err


def test_markdown_names_the_metric_and_keeps_the_signature_apart(results):
    _, files = results
    for metric, header in (("sacrebleu", "Metric: sacreBLEU (`nrefs"),
                           ("tokenized_compound_split", "Metric: tokenized compound-split BLEU; the paired tests below "
                                                        "use cased sacreBLEU (`nrefs"),
                           ("sacrebleu_lc", "Metric: sacreBLEU, lowercased; the paired tests below use cased")):
        comparison = significance.compare(files["base"], files["mtsa"], metric=metric, bootstrap_samples=50,
                                          ar_samples=50, seed=3)
        assert header in significance.render_markdown(comparison, ("Transformer", "MTSA"))


def test_existing_outputs_need_overwrite_and_are_replaced_whole(results, tmp_path, monkeypatch, capsys):
    _, files = results
    md, js = tmp_path / "out.md", tmp_path / "out.json"
    md.write_text("old report")
    args = ["--baseline", *map(str, files["base"]), "--system", *map(str, files["mtsa"]), "--markdown", str(md),
            "--json", str(js), *FAST]
    with pytest.raises(SystemExit) as exc:
        _run_main(monkeypatch, *args)
    assert exc.value.code == 2 and f"{md} exists (pass --overwrite to replace it)" in capsys.readouterr().err
    assert md.read_text() == "old report" and not js.exists()
    _run_main(monkeypatch, *args, "--overwrite")
    assert md.read_text() == capsys.readouterr().out  # the new report, as printed
    assert json.loads(js.read_text())["schema"] == "mtsa-fairseq.significance.v1"
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []  # no temporary left


@pytest.mark.parametrize("output, message", [
    ("INPUT", "is one of the compared result files or their hypotheses: write the report elsewhere"),
    ("HYPOTHESES", "is one of the compared result files or their hypotheses: write the report elsewhere"),
    ("DIRECTORY", "is a directory, not a file"),
])
def test_an_output_that_would_replace_an_input_or_is_a_directory_is_refused(results, tmp_path, monkeypatch, capsys,
                                                                            output, message):
    _, files = results
    target = {"INPUT": files["mtsa"][0], "HYPOTHESES": files["mtsa"][0].with_name(f"{files['mtsa'][0].stem}.hyp.txt"),
              "DIRECTORY": tmp_path}[output]
    before = target.read_bytes() if target.is_file() else None
    with pytest.raises(SystemExit) as exc:
        _run_main(monkeypatch, "--baseline", *map(str, files["base"]), "--system", *map(str, files["mtsa"]),
                  "--json", str(target), "--overwrite", *FAST)
    assert exc.value.code == 2 and f"{target} {message}" in capsys.readouterr().err
    assert (target.read_bytes() if target.is_file() else None) == before


def test_results_of_other_checkpoints_are_not_compared(results, tmp_path):
    """A last checkpoint against an averaged one is no comparison of the systems: refused, naming both."""
    _, files = results
    averaged = []
    for path in files["mtsa"]:
        data = _moved(path, tmp_path)
        data["checkpoint"] = data["checkpoint"].replace("ckpt.pt", "checkpoint_avg5.pt")
        averaged.append(tmp_path / path.name)
        averaged[-1].write_text(json.dumps(data))
    message = "toytest: the baseline's results scored ckpt.pt, the system's checkpoint_avg5.pt: compare results of"
    with pytest.raises(significance.SignificanceError, match=message):
        significance.compare(files["base"], averaged, bootstrap_samples=20, ar_samples=20)


def test_checkpoint_kinds_are_compared_apart_and_never_mixed_within_a_side(results, tmp_path):
    _, files = results
    setup2 = [[path for path in files[side] if _load(path)["setup"] == "setup2"] for side in ("base", "mtsa")]
    averaged = [[_variant(path, tmp_path, f"avg_{path.name}", checkpoint="checkpoint_avg_last5.pt") for path in side]
                for side in setup2]
    both = significance.compare(setup2[0] + averaged[0], setup2[1] + averaged[1], bootstrap_samples=20,
                                ar_samples=20)
    assert [both.label(g) for g in both.groups] == ["setup2 · toytest · checkpoint_avg_last5.pt",
                                                   "setup2 · toytest · ckpt.pt"]
    summary = significance.comparison_to_json(both, ("T", "M"), tmp_path)
    assert [g["checkpoint"] for g in summary["groups"]] == ["checkpoint_avg_last5.pt", "ckpt.pt"]
    assert summary["groups"][0]["baseline"]["runs"][0]["result"] == averaged[0][0].name  # from the JSON's folder
    with pytest.raises(significance.SignificanceError, match="setup2 · toytest · ckpt.pt: the baseline has 1 run"):
        significance.compare([setup2[0][0], averaged[0][1]], [setup2[1][0], averaged[1][1]])


@pytest.mark.parametrize("case", ["edited_unpaired", "edited_lowercased", "other_model", "other_generation"])
def test_results_that_are_not_what_they_say_or_not_alike_are_refused(results, tmp_path, case):
    _, files = results
    base, mtsa = list(files["base"]), list(files["mtsa"])
    metric = "sacrebleu"
    if case in ("edited_unpaired", "edited_lowercased"):  # seed 3 of the baseline has no pair
        metric = "sacrebleu_lc" if case == "edited_lowercased" else "sacrebleu"
        data = _moved(base[2], tmp_path)
        recorded, data["bleu"][metric] = data["bleu"][metric], 99.0
        base[2] = tmp_path / "edited.json"
        base[2].write_text(json.dumps(data))
        name = "sacreBLEU, lowercased" if metric == "sacrebleu_lc" else "sacreBLEU"
        message = f"{base[2]}: its hypotheses give {name} {recorded:.2f}, the file records 99.00"
    elif case == "other_model":
        base[1] = _variant(base[1], tmp_path, "small.json", num_params=7_577_600)
        message = (f"setup1 · toytest · ckpt.pt: the baseline's runs are of different models: {base[0]} has "
                   f"61,378,560 parameters, {base[1]} 7,577,600")
    else:
        generation = {**_load(mtsa[1])["generation"], "beam": 1}
        mtsa[1] = _variant(mtsa[1], tmp_path, "beam1.json", generation=generation)
        message = f"{mtsa[1]} was generated with beam 1, {base[0]} with 4: score every run alike"
    with pytest.raises(significance.SignificanceError) as err:
        significance.compare(base, mtsa, metric=metric, bootstrap_samples=20, ar_samples=20)
    assert message in str(err.value)


def test_the_plot_is_a_png(results, tmp_path, monkeypatch, capsys):
    _, files = results
    with pytest.raises(SystemExit) as exc:
        _run_main(monkeypatch, "--baseline", *map(str, files["base"]), "--system", *map(str, files["mtsa"]),
                  "--plot", str(tmp_path / "p.pdf"), *FAST)
    assert exc.value.code == 2 and f"--plot writes a PNG image: name it OUT.png, not {tmp_path / 'p.pdf'}" in (
        capsys.readouterr().err)


def test_a_result_names_its_files_from_its_folder(tmp_path, monkeypatch):
    """A fresh result holds no absolute path, reads the same from another directory and after its tree moves."""
    study = tmp_path / "study"
    write_corpus(study / "data", {"test": 40}, seed=5)
    (study / "results").mkdir()
    path = _write_result(study / "results", study / "data" / "test.de", "mtsa", "setup1", 1, 0.3, 100)
    text = path.read_text()
    assert str(tmp_path) not in text and "\"/" not in text
    assert {key: json.loads(text)[key] for key in ("checkpoint", "hypotheses", "references")} == {
        "checkpoint": "ckpt.pt", "hypotheses": "mtsa_setup1_seed1.hyp.txt", "references": "../data/test.de"}
    expected = significance.load_result(path)
    monkeypatch.chdir(study / "data")
    assert significance.load_result(path) == expected
    (tmp_path / "elsewhere").mkdir()
    os.rename(study, tmp_path / "elsewhere" / "study")
    monkeypatch.chdir(tmp_path / "elsewhere")
    moved = significance.load_result(Path("study/results") / path.name)
    assert (moved.hypotheses, moved.references, moved.bleu) == (expected.hypotheses, expected.references, expected.bleu)
