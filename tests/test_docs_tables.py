"""Generated tables: every table of docs/results-sentence.md that names a JSON report equals what that report
holds (mtsa-docs-tables), the per-run table shows the checkpoint the run tested, stale and broken tables."""

import json
import sys
from pathlib import Path

import pytest
from scipy import stats

from mtsa_fairseq.experiments.bench import transformer as bench_transformer
from mtsa_fairseq.experiments.bench.fairseq_train import runs_table as fairseq_train_table
from mtsa_fairseq.experiments.commands import docs_tables
from mtsa_fairseq.experiments.sentence import lr_search
from mtsa_fairseq.experiments.sentence import report as sentence_report
from mtsa_fairseq.experiments.sentence import runs as sentence_runs
from mtsa_fairseq.experiments.sentence.report import anchor_table, runs_table, summary_table
from mtsa_fairseq.experiments.significance import detectable_difference, equivalence_test, format_p, t_test
from mtsa_fairseq.experiments.tables import render
from mtsa_fairseq.experiments.translation.curves import curves_table, plateau, plateau_table
from mtsa_fairseq.experiments.translation.study_tables import (
    bleu_kinds,
    study_paired_table,
    study_runs_table,
    study_table,
    welch_interval,
)

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "results-sentence.md"


@pytest.mark.parametrize("name, tables", [
    ("docs/results-sentence.md", 19), ("docs/results-sentence-earlier.md", 16), ("docs/results-multi30k.md", 6),
    ("docs/results-multi30k-earlier.md", 8),
    # the per-run tables of the chosen-rate studies without folds live beside their records
    ("results/sentence/trec-chosen-lr/CHRONICLE.md", 1), ("results/sentence/sst5-chosen-lr/CHRONICLE.md", 1),
    ("results/sentence/sick/CHRONICLE.md", 3), ("docs/benchmark-gpu.md", 4), ("docs/benchmark-launches.md", 1),
    ("docs/benchmark-transformer.md", 2), ("docs/benchmark-encoders.md", 2)])
def test_the_results_tables_equal_their_reports(name, tables):
    doc = ROOT / name
    text, changed = render(doc, docs_tables.KINDS)
    assert changed == [], f"run mtsa-docs-tables {doc.relative_to(ROOT)}: {changed}"
    assert text == doc.read_text(encoding="utf-8")
    assert doc.read_text(encoding="utf-8").count("<!-- table ") >= tables


def _report(tested: int) -> dict:
    run = {"run": "a_seed1", "arch": "a", "seed": 1, "fold": None, "metrics": {"accuracy": 80.0},
           "best_checkpoint_updates": tested, "dev_curve": [[100, 70.0], [200, 75.0], [300, 75.0], [400, 72.0]]}
    return {"experiment": "x", "metric": "accuracy", "reference": "a", "split": "test",
            "archs": {"a": {"seeds": [1], "values": [80.0], "mean": 80.0, "std": None}},
            "welch_vs_reference": {}, "runs": [run]}


def test_runs_table_shows_the_tested_checkpoint_and_the_first_equal_one():
    """fairseq keeps the later of equally good checkpoints: the row says which one was tested."""
    row = runs_table(_report(300), {"a": "A"})[-1]
    assert row == "| A | 1 | 80.00 | 300 | 75.00 | 200 | 400 | 72.00 |"


def test_runs_table_of_a_run_without_validations():
    report = _report(300)
    report["runs"][0]["dev_curve"] = None
    assert runs_table(report)[-1] == "| a | 1 | 80.00 | 300 | — | — | — | — |"


def _run(monkeypatch, *args: str) -> int:
    monkeypatch.setattr(sys, "argv", ["mtsa-docs-tables", *args])
    with pytest.raises(SystemExit) as exit_info:
        docs_tables.main()
        raise SystemExit(0)
    return exit_info.value.code


def test_check_names_a_stale_table_and_a_rewrite_fixes_it(tmp_path, monkeypatch, capsys):
    (tmp_path / "r.json").write_text(json.dumps(_report(300)))
    doc = tmp_path / "doc.md"
    doc.write_text("intro\n<!-- table r.json runs a=A -->\n| typed by hand |\n<!-- /table -->\nend\n")
    assert _run(monkeypatch, "--check", str(doc)) != 0
    assert f"differs: {doc}:2: r.json runs" in capsys.readouterr().out
    assert "typed by hand" in doc.read_text()
    assert _run(monkeypatch, str(doc)) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "1 generated table(s) in 1 document(s): 1 rewritten"
    assert "| A | 1 | 80.00 | 300 |" in doc.read_text() and doc.read_text().endswith("<!-- /table -->\nend\n")
    (tmp_path / "plain.md").write_text("no tables here\n")
    assert _run(monkeypatch, "--check", str(doc), str(tmp_path / "plain.md")) == 0
    assert capsys.readouterr().out.splitlines() == [
        f"note: {tmp_path / 'plain.md'} has no generated table (no <!-- table REPORT KIND --> line)",
        "1 generated table(s) in 2 document(s): all equal their reports"]


@pytest.mark.parametrize("marker, message", [
    ("<!-- table r.json runs -->\n", "no <!-- /table --> after this table marker"),
    ("<!-- table r.json -->\n<!-- /table -->\n", "not a table marker <!-- table REPORT KIND [OPTION=VALUE ...] -->"),
    ("<!-- table r.json nonsense -->\n<!-- /table -->\n", "unknown table kind 'nonsense'"),
    ("<!-- table missing.json runs -->\n<!-- /table -->\n", "cannot render runs of"),
    ("<!-- table r.json runs archs=a -->\n<!-- /table -->\n", "archs= is not an option of runs tables"),
    ("<!-- table r.json anchor label=CNN -->\n<!-- /table -->\n", "anchor tables need value="),
    ("<!-- table r.json anchor -->\n<!-- /table -->\n", "anchor tables need value= and label="),
    ("<!-- table r.json anchor value=x label=CNN -->\n<!-- /table -->\n", "value= must be a number, not 'x'"),
    ("<!-- table r.json anchor value=1 label=CNN n=3.5 -->\n<!-- /table -->\n",
     "n= must be a whole number of test items, not '3.5'"),
    ("<!-- table r.json study margin=wide -->\n<!-- /table -->\n", "margin= must be a number, not 'wide'"),
    ("<!-- table r.json study bleu=cased,bleu4 -->\n<!-- /table -->\n",
     "bleu= must be some of cased, lowercased, tokenized, comma-separated, not 'cased,bleu4'"),
    ("<!-- table r.json bench-encoders part=one -->\n<!-- /table -->\n", "part= must be a whole number, not 'one'"),
])
def test_a_broken_marker_is_one_line_naming_the_place(tmp_path, monkeypatch, capsys, marker, message):
    (tmp_path / "r.json").write_text(json.dumps(_report(300)))
    doc = tmp_path / "doc.md"
    doc.write_text("intro\n" + marker)
    before = doc.read_text()
    code = _run(monkeypatch, str(doc))
    assert code != 0 and f"{doc}:2: " in str(code) and message in str(code)
    assert doc.read_text() == before


def test_anchor_table_is_a_one_sample_t_test_of_each_number():
    from scipy import stats

    report = {"metric": "accuracy", "archs": {"a": {"values": [80.0, 82.0, 84.0]}, "b": {"values": [70.0]}}}
    rows = anchor_table(report, {"a": "A"}, value=79.8, label="CNN-rand")
    expected = stats.ttest_1samp([80.0, 82.0, 84.0], 79.8)
    assert rows[0].startswith("| architecture | number | n | mean ± sd | CNN-rand | mean − CNN-rand |")
    assert rows[2] == (f"| A | per seed | 3 | 82.00 ± 2.00 | 79.80 | +2.20 | {expected.statistic:.2f} | "
                       f"{expected.pvalue:.3f} | {expected.pvalue / 2:.3f} |")
    assert rows[3] == "| b | per seed | 1 | 70.00 | 79.80 | -9.80 | — | — | — |"  # one value: no test


def test_anchor_table_of_another_metric_asks_whether_a_lower_mse_is_better():
    """SICK's anchors are published per metric; for MSE the one-sided test is that of the mean being lower."""
    config = sentence_runs.TaskConfig(Path("sick.yaml"), "sick", "sick", "pearson", {}, {})
    mse = (0.30, 0.27, 0.26)
    results = [{"arch": "a", "seed": s, "metrics": {"pearson": 0.85, "spearman": 0.80 + s / 100, "mse": m}}
               for s, m in zip((1, 2, 3), mse)]
    summary = sentence_report.summarize(config, results, "a")
    rows = anchor_table(summary, value=0.2879, label="DiSAN", metric="mse")
    assert rows[0].endswith("| p (two-sided) | p (mean < DiSAN) |")
    less = stats.ttest_1samp(mse, 0.2879, alternative="less").pvalue
    assert rows[2].startswith("| a | per seed | 3 | 0.2767 ± 0.0208 | 0.2879 | -0.0112 |")
    assert rows[2].endswith(f"| {less:.3f} |") and less < 0.5
    assert anchor_table(summary, value=0.8, label="x", metric="spearman")[2].startswith("| a | per seed | 3 | 0.8200 ")
    assert anchor_table(summary, value=0.8, label="x", metric="pearson") == anchor_table(summary, value=0.8, label="x")
    assert anchor_table(summary, value=0.8, label="x")[0].endswith("| p (mean > x) |")
    cv = json.loads((ROOT / "results" / "sentence" / "cr" / "report.json").read_text())
    with pytest.raises(ValueError, match="a cross-validation report has one metric, accuracy"):
        anchor_table(cv, value=79.8, label="CNN-rand", metric="mse")
    with pytest.raises(ValueError, match="a cross-validation report has one metric, accuracy"):
        summary_table(cv, metric="mse")
    with pytest.raises(ValueError, match="metric=kendall: the report has pearson, spearman, mse"):
        summary_table(summary, metric="kendall")


def test_docs_tables_render_an_anchor_of_another_metric(tmp_path):
    config = sentence_runs.TaskConfig(Path("sick.yaml"), "sick", "sick", "pearson", {}, {})
    results = [{"arch": "a", "seed": s, "metrics": {"pearson": 0.8 + s / 100, "mse": 0.3 - s / 100}} for s in (1, 2)]
    (tmp_path / "report.json").write_text(json.dumps(sentence_report.summarize(config, results, "a")))
    doc = tmp_path / "doc.md"
    doc.write_text("<!-- table report.json anchor metric=mse value=0.2879 label=DiSAN a=MTSA -->\nstale\n"
                   "<!-- /table -->\n")
    text, _ = render(doc, docs_tables.KINDS)
    assert "| p (mean < DiSAN) |" in text and "| MTSA | per seed | 2 | 0.2850 ± 0.0071 | 0.2879 | -0.0029 |" in text


def test_anchor_table_of_a_cross_validation_uses_the_folds_chosen_numbers():
    report = json.loads((ROOT / "results" / "sentence" / "cr" / "report.json").read_text())
    rows = {tuple(cell.strip() for cell in row.split("|")[1:3]): row for row in anchor_table(report, value=79.8,
                                                                                              label="CNN-rand")}
    chosen = report["cross_validation"]["archs"]["mtsa_encoder"]["chosen"]
    assert f"| 10 | {chosen['mean']:.2f} ± {chosen['std']:.2f} |" in rows[("mtsa_encoder", "chosen on the other folds")]
    # beside the corrected test (folds share training data), the naive one: two-sided 0.119 (one-sided 0.060)
    chosen = rows[("mtsa_encoder", "chosen on the other folds")]
    assert chosen.endswith("| 0.119 |") and rows[("architecture", "number")].endswith(
        "| t (corrected) | p (two-sided) | p (mean > CNN-rand) | p (naive: folds independent, figure exact) |")
    assert float(chosen.split(" | ")[7]) > 0.119
    with_error = anchor_table(report, value=79.8, label="CNN-rand", anchor_n=3775)
    assert with_error[0].endswith("| p (corrected, figure exact) | p (naive: folds independent, figure exact) |")
    assert "t (corrected; CNN-rand ± 0.65 on 3,775 items)" in with_error[0]
    assert with_error[2].endswith(f"| {chosen.split(' | ')[7]} | 0.119 |")


def test_the_number_chosen_on_the_other_folds_leads_every_cross_validation_table():
    """The honest held-out number comes first; the fold-selected one is labelled test-selected."""
    report = json.loads((ROOT / "results" / "sentence" / "cr" / "report.json").read_text())
    cv = report["cross_validation"]["archs"]["mtsa_encoder"]
    head, _, mtsa = sentence_report.cross_validation_table(report)[:3]
    assert head.split(" | ")[2:5] == ["chosen", "best (test-selected)", "last"]
    assert mtsa.split(" | ")[2].startswith(f"{cv['chosen']['mean']:.2f} ± ")
    folds = sentence_report.folds_table(report, archs=["mtsa_encoder"])
    assert folds[0] == "| fold | mtsa_encoder: chosen (update) | best, test-selected (update) | last |"
    numbers = sentence_report.held_out_numbers(
        report, sentence_report._runs_by_arch(report, ["mtsa_encoder"])["mtsa_encoder"])
    fold0 = numbers[(1, 0)]
    assert folds[2] == (f"| 0 | {fold0['chosen'][0]:.2f} ({fold0['chosen'][1]:,}) | "
                        f"{fold0['best'][0]:.2f} ({fold0['best'][1]:,}) | {fold0['last'][0]:.2f} |")
    kinds = [row.split(" | ")[1] for row in anchor_table(report, value=79.8, label="CNN-rand")[2:5]]
    assert kinds == ["chosen on the other folds", "best (test-selected)", "last"]
    assert "chosen: at the update best on average over the other folds; best (test-selected)" in (
        sentence_report.report_markdown(report).replace("\n", " "))


def _search_run(arch: str, lr: float, curve: list[list[float]], status: str = "done") -> dict:
    run = {"arch": arch, "lr": lr, "status": status, "dev_curve": curve}
    return {**run, **lr_search.run_scores(run)}


def test_lr_search_rule_skips_nan_stops_and_breaks_ties_by_the_last_validation_then_the_larger_rate():
    runs = [_search_run("a", 1e-3, [[50, 90.0], [100, 95.0]], status="stopped"),  # best, but stopped: not eligible
            _search_run("a", 5e-4, [[50, 80.0], [100, 70.0]]),
            _search_run("a", 1e-4, [[50, 80.0], [100, 75.0]]),  # same best, better last validation
            _search_run("b", 1e-3, [[50, 60.0], [100, 60.0]]),
            _search_run("b", 5e-4, [[50, 60.0], [100, 60.0]]),  # a full tie: the larger rate
            _search_run("c", 1e-3, [], status="stopped")]
    assert lr_search.choose(runs, [1e-3, 5e-4, 1e-4]) == {"a": 1e-4}  # b and c have rates still to finish
    assert lr_search.choose(runs[3:5], [1e-3, 5e-4]) == {"b": 1e-3}
    assert lr_search.choose(runs[5:], [1e-3]) == {"c": None}
    assert (runs[2]["best_dev"], runs[2]["best_dev_update"], runs[2]["last_dev"]) == (80.0, 50, 75.0)


def test_search_table_marks_the_chosen_rate_and_the_stops():
    runs = [_search_run("mtsa_encoder", 1e-3, [[50, 81.0], [100, 84.5], [150, 84.5]]),
            _search_run("mtsa_encoder", 1e-4, [[50, 70.0]], status="stopped"),
            {**_search_run("multi_head_encoder", 1e-3, [], status="stopped")}]
    archs = ["mtsa_encoder", "multi_head_encoder", "bilstm_encoder"]
    chosen = lr_search.choose(runs, [1e-3, 1e-4])
    report = {"metric": "accuracy", "archs": archs, "lrs": [1e-3, 1e-4], "runs": runs, "chosen": chosen,
              "pending": [arch for arch in archs if arch not in chosen]}
    assert lr_search.search_table(report, {"mtsa_encoder": "MTSA"}) == [
        "| architecture | lr 0.001: best dev accuracy (update); last | lr 0.0001: best dev accuracy (update); last "
        "| chosen rate |",
        "|---|---|---|---|",
        "| MTSA | **84.50 (100)**; 84.50 | 70.00 (50); stopped (NaN/Inf) after 50 | 0.001 |",
        "| multi_head_encoder | stopped (NaN/Inf) before its first validation | not finished | pending |",
        "| bilstm_encoder | not finished | not finished | pending |"]


def test_curves_and_plateau_tables_of_a_curves_report():
    curve = [{"update": 100, "loss": 5.0, "bleu": 10.0}, {"update": 200, "loss": 4.5, "bleu": 20.0},
             {"update": 300, "loss": 4.25, "bleu": 20.1}, {"update": 400, "loss": 4.0, "bleu": 20.2}]
    report = {"runs": {"Transformer seed 1": {"curve": curve, "plateau": plateau(curve)},
                       "MTSA seed 1": {"curve": curve[:1], "plateau": plateau(curve[:1])}}}
    assert curves_table(report, {"Transformer seed 1": "Transformer", "MTSA seed 1": "MTSA"}) == [
        "| update | Transformer valid BLEU | MTSA valid BLEU | Transformer valid loss | MTSA valid loss |",
        "|---:|---:|---:|---:|---:|",
        "| 100 | 10.00 | 10.00 | 5.000 | 5.000 |",
        "| 200 | 20.00 | — | 4.500 | — |",
        "| 300 | 20.10 | — | 4.250 | — |",
        "| 400 | 20.20 | — | 4.000 | — |"]
    assert plateau_table(report)[2:] == [  # U = 400: best up to 300 is 20.1, after it 20.2
        "| Transformer seed 1 | 400 | 20.10 | 20.20 | +0.10 | yes |",
        "| MTSA seed 1 | 100 | — | — | — | no (too few validations) |"]


def test_chosen_rates_name_each_architecture_without_a_rate_and_why(tmp_path):
    report = {"schema": lr_search.SCHEMA, "experiment": "t", "dataset": "trec", "split": "valid", "seed": 1,
              "lrs": [1e-3, 5e-4], "rule": "r", "chosen": {"a": 1e-3}, "pending": ["c"]}
    path = tmp_path / "search.json"
    path.write_text(json.dumps(report))
    rates, source = lr_search.chosen_rates(path, ["a"])
    assert rates == {"a": 1e-3} and (source["experiment"], source["search"]) == ("t", str(path))
    with pytest.raises(sentence_runs.ExperimentError) as err:
        lr_search.chosen_rates(path, ["a", "c", "d"])
    assert str(err.value) == f"{path} chose no learning rate for c (rates still to finish), d (not searched)"
    report["chosen"]["b"] = None
    path.write_text(json.dumps(report))
    with pytest.raises(sentence_runs.ExperimentError, match=r"for b \(every rate stopped with NaN/Inf\)$"):
        lr_search.chosen_rates(path, ["b"])
    path.write_text(json.dumps({"schema": "other"}))
    with pytest.raises(sentence_runs.ExperimentError, match="has schema 'other'"):
        lr_search.chosen_rates(path, ["a"])


def test_command_lr_is_the_last_lr_of_a_command():
    assert sentence_runs.command_lr(["fairseq-train", "--lr", "0.001", "--cpu", "--lr", "5e-4"]) == 5e-4
    assert sentence_runs.command_lr(["fairseq-train", "--cpu"]) is None


def test_summary_table_shows_the_searched_rates():
    summary = {"metric": "accuracy", "reference": "a", "welch_vs_reference": {},
               "archs": {"a": {"values": [80.0, 82.0], "mean": 81.0, "std": 1.4142135623730951}},
               "lr_from": {"chosen": {"a": 5e-4}}}
    assert sentence_report.summary_table(summary)[::2] == [
        "| architecture | lr | seeds | accuracy per seed | mean ± sd | a − it | 95% CI | t | df | p (two-sided) | "
        "p (a > it) |",
        "| a | 0.0005 | 2 | 80.00, 82.00 | 81.00 ± 1.41 | — | — | — | — | — | — |"]
    del summary["lr_from"]
    assert sentence_report.summary_table(summary)[1] == "|---|---|---|---|---|---|---|---|---|---|"


def test_cross_validation_table_shows_the_searched_rates():
    report = json.loads((ROOT / "results" / "sentence" / "cr" / "report.json").read_text())
    plain = sentence_report.cross_validation_table(report)
    report["lr_from"] = {"chosen": {"mtsa_encoder": 3e-4, "multi_head_encoder": 5e-4, "fast_disa_encoder": 5e-4}}
    table = sentence_report.cross_validation_table(report)
    assert table[0] == plain[0].replace("| architecture | runs |", "| architecture | lr | runs |")
    assert table[1] == plain[1] + "---|"
    assert table[2] == plain[2].replace("| mtsa_encoder | 10 |", "| mtsa_encoder | 0.0003 | 10 |")
    assert table[3] == plain[3].replace("| multi_head_encoder | 10 |", "| multi_head_encoder | 0.0005 | 10 |")


def _study() -> dict:
    """A study.json of two seeds per system on one test set (the fields mtsa-multi30k-study writes)."""
    def row(base: float, system: float) -> dict:
        return {"Transformer": {"mean": base, "std": 0.5, "n": 2}, "MTSA": {"mean": system, "std": 0.25, "n": 2},
                "welch": {"t": -1.2, "df": 1.5, "p_two_sided": 0.4, "p_greater": 0.0004},
                "paired": [{"seed": 1, "baseline_bleu": 40.0, "system_bleu": 40.5, "p_bootstrap_two_sided": 0.2,
                            "p_bootstrap_moses": 0.09, "p_ar": 0.21}]}

    runs = [{"system": system, "seed": seed, "num_updates": 6864, "wall_seconds": 9000.0,
             "train_target_tokens_per_second": 900.4 if system == "MTSA" else None,
             "valid_bleu": [[264, 5.0], [528, 40.0], [792, 40.0], [1056, 39.5]],
             "plateau": {"last_update": 1056, "best_before": 40.0, "best_after": 39.5, "gain": -0.5,
                         "plateaued": True},
             "test": {"test_2016_flickr": {"last": 38.0 + seed, "avg5": 38.5 + seed}}}
            for system in ("Transformer", "MTSA") for seed in (1, 2)]
    return {"averaged_epochs": 5, "runs": runs,
            "summary": {"test_2016_flickr": {"last": row(39.5, 40.0), "avg5": row(40.0, 40.25)}},
            "summary_tokenized": {"test_2016_flickr": {"last": row(41.0, 41.5), "avg5": row(41.5, 41.75)}}}


def test_study_tables_show_both_checkpoints_both_bleus_the_pairs_and_every_run():
    report = _study()
    table = study_table(report, {"MTSA": "MTSA encoder"})
    assert table[0] == ("| test set | checkpoint | BLEU | Transformer | MTSA encoder | MTSA encoder − Transformer | "
                        "95% CI | t (df) | p (two-sided) | p (MTSA encoder > Transformer) | "
                        "p (equivalent within ±0.45) | detectable (80% power) |")
    # the columns before the equivalence test and the detectable difference
    assert [row.rsplit(" | ", 2)[0] + " |" for row in table[2:]] == [
        "| test_2016_flickr | last | sacreBLEU | 39.50 ± 0.50 (2) | 40.00 ± 0.25 (2) | +0.50 | -1.88 to +2.88 | "
        "-1.20 (1.5) | 0.400 | 4.0e-04 |",
        "| test_2016_flickr | last | tokenized, compound-split | 41.00 ± 0.50 (2) | 41.50 ± 0.25 (2) | +0.50 | "
        "-1.88 to +2.88 | -1.20 (1.5) | 0.400 | 4.0e-04 |",
        "| test_2016_flickr | average of the last 5 | sacreBLEU | 40.00 ± 0.50 (2) | 40.25 ± 0.25 (2) | +0.25 | "
        "-2.13 to +2.63 | -1.20 (1.5) | 0.400 | 4.0e-04 |",
        "| test_2016_flickr | average of the last 5 | tokenized, compound-split | 41.50 ± 0.50 (2) | "
        "41.75 ± 0.25 (2) | +0.25 | -2.13 to +2.63 | -1.20 (1.5) | 0.400 | 4.0e-04 |"]
    equivalence = equivalence_test(39.5, 0.5, 2, 40.0, 0.25, 2, 0.45)
    detectable = detectable_difference(0.5, 2, 0.25, 2)
    assert table[2].endswith(f"| {format_p(equivalence.p)} | {detectable:.2f} |")
    assert study_table(report, margin=1.0)[0].endswith("| p (equivalent within ±1) | detectable (80% power) |")
    paired = study_paired_table(report)
    assert len(paired) == 4 and paired[2] == "| test_2016_flickr | last | 1 | 40.00 | 40.50 | 0.200 | 0.210 | 0.090 |"
    assert paired[0].endswith("| p (paired bootstrap, two-sided) | p (approximate randomization) | "
                              "p (Moses bootstrap, one-sided-like) |")
    # a study scored with lowercased BLEU too: its rows after the cased ones (a study without it has none, above)
    lowercased = study_table({**report, "summary_lowercased": report["summary"]})
    assert [row.split(" | ")[2] for row in lowercased[2:]] == ["sacreBLEU", "sacreBLEU, lowercased",
                                                              "tokenized, compound-split"] * 2
    # bleu=: only the kinds named, in the table's order
    cased = study_table({**report, "summary_lowercased": report["summary"]}, bleu=bleu_kinds("cased"))
    assert cased == [lowercased[0], lowercased[1], lowercased[2], lowercased[5]]
    runs = study_runs_table(report)
    assert runs[0].endswith("| test_2016_flickr last | test_2016_flickr average of the last 5 |") and len(runs) == 6
    assert runs[2] == "| Transformer | 1 | 6,864 | 9,000 | — | 40.00 (528) | 39.50 | -0.50 | 39.00 | 39.50 |"
    assert runs[5].startswith("| MTSA | 2 | 6,864 | 9,000 | 900 |")


def test_the_study_interval_is_scipys_welch_interval_of_the_runs():
    baseline, system = [37.35, 37.70, 38.00, 38.11, 38.24, 38.51], [37.50, 37.61, 38.02, 38.33, 38.52, 38.98]
    test = t_test(baseline, system)
    row = {"Transformer": {"mean": test.mean_baseline, "std": test.std_baseline, "n": 6},
           "MTSA": {"mean": test.mean_system, "std": test.std_system, "n": 6}, "welch": {"df": test.df}}
    expected = stats.ttest_ind(system, baseline, equal_var=False).confidence_interval(0.95)
    assert welch_interval(row, "Transformer", "MTSA") == pytest.approx((expected.low, expected.high), abs=1e-12)
    low, high = welch_interval(row, "Transformer", "MTSA", 0.5)
    assert expected.low < low < test.mean_system - test.mean_baseline < high < expected.high


def test_docs_tables_render_a_study(tmp_path):
    (tmp_path / "study.json").write_text(json.dumps(_study()))
    doc = tmp_path / "doc.md"
    doc.write_text("".join(f"<!-- table study.json {kind} -->\nstale\n<!-- /table -->\n"
                           for kind in ("study", "study-paired", "study-runs")))
    text, changed = render(doc, docs_tables.KINDS)
    assert len(changed) == 3 and "stale" not in text
    assert text.count("| test_2016_flickr | average of the last 5 |") == 3


def test_a_relatedness_summary_tests_every_metric_and_renders_each():
    config = sentence_runs.TaskConfig(Path("sick.yaml"), "sick", "sick", "pearson", {}, {})
    results = [{"arch": arch, "seed": seed, "metrics": {"pearson": r, "spearman": r - 0.05, "mse": 0.3 - r / 10}}
               for arch, rs in (("mtsa_encoder", (0.85, 0.86, 0.87)), ("bilstm_encoder", (0.82, 0.84, 0.83)))
               for seed, r in zip((1, 2, 3), rs)]
    summary = sentence_report.summarize(config, results, "mtsa_encoder")
    assert summary["archs"]["mtsa_encoder"]["mean"] == pytest.approx(0.86)
    assert set(summary["other_metrics"]) == {"spearman", "mse"}
    mse = summary["other_metrics"]["mse"]
    assert mse["archs"]["bilstm_encoder"]["mean"] == pytest.approx(0.3 - 0.083)
    assert mse["welch_vs_reference"]["bilstm_encoder"]["difference"] == pytest.approx(-0.003)
    table = sentence_report.summary_table(summary, metric="spearman")
    assert table[0].startswith("| architecture | seeds | spearman per seed |")
    assert table[2].startswith("| mtsa_encoder | 3 | 0.8000, 0.8100, 0.8200 | 0.8100 ± 0.0100 |")
    assert sentence_report.summary_table(summary, metric="pearson") == sentence_report.summary_table(summary)
    # a lower MSE is better: the one-sided p asks whether MTSA's is lower, Welch's less-than alternative
    mse_table = sentence_report.summary_table(summary, metric="mse")
    assert mse_table[0].endswith("| p (two-sided) | p (mtsa_encoder < it) |")
    less = stats.ttest_ind([0.3 - r / 10 for r in (0.85, 0.86, 0.87)], [0.3 - r / 10 for r in (0.82, 0.84, 0.83)],
                           equal_var=False, alternative="less").pvalue
    assert mse_table[3].endswith(f"| {less:.3f} |") and less < 0.5
    assert sentence_report.summary_table(summary)[0].endswith("| p (mtsa_encoder > it) |")
    markdown = sentence_report.report_markdown(summary)
    assert "test spearman:" in markdown and "test mse:" in markdown
    accuracy = sentence_report.summarize(sentence_runs.TaskConfig(Path("t.yaml"), "t", "trec", "accuracy", {}, {}),
                                    [{"arch": "a", "seed": 1, "metrics": {"accuracy": 90.0}}], "a")
    assert "other_metrics" not in accuracy


def test_docs_tables_render_another_metric_of_a_summary(tmp_path):
    config = sentence_runs.TaskConfig(Path("sick.yaml"), "sick", "sick", "pearson", {}, {})
    results = [{"arch": "a", "seed": s, "metrics": {"pearson": 0.8 + s / 100, "mse": 0.3 - s / 100}} for s in (1, 2)]
    (tmp_path / "report.json").write_text(json.dumps(sentence_report.summarize(config, results, "a")))
    doc = tmp_path / "doc.md"
    doc.write_text("<!-- table report.json summary metric=mse a=MTSA -->\nstale\n<!-- /table -->\n")
    text, _ = render(doc, docs_tables.KINDS)
    assert "| architecture | seeds | mse per seed |" in text and "| MTSA | 2 | 0.2900, 0.2800 |" in text


def test_fairseq_train_table_lists_every_run_and_the_ratios_of_the_medians():
    result = {"archs": ["t", "m --k x"], "rows": [{
        "max_tokens": 8192, "tok_s": {"t": 100.0, "m --k x": 90.0}, "peak_mb": {"t": 1000.0, "m --k x": 1100.0},
        "runs": {"t": [{"tok_s": 100.0}, {"tok_s": 120.0}, {"tok_s": 80.0}],
                 "m --k x": [{"tok_s": 90.0}, {"tok_s": 70.0}, {"tok_s": 95.0}]}}]}
    assert fairseq_train_table(result, {"t": "T"})[2:] == [
        "| 8,192 | `T` | 100, 120, 80 | 100 | 1.000 | 1,000 | 1.000 |",
        "| 8,192 | `m --k x` | 90, 70, 95 | 90 | 0.900 | 1,100 | 1.100 |"]


def test_help_lists_every_table_kind(monkeypatch, capsys):
    assert _run(monkeypatch, "--help") == 0
    listed = capsys.readouterr().out.split("table kinds:\n")[1]
    assert [line.split()[0] for line in listed.splitlines() if not line.startswith(" " * 17)] == list(docs_tables.KINDS)


def test_a_benchmark_table_is_what_its_command_prints(tmp_path, monkeypatch, capsys):
    """A bench table is table part=N of the benchmark's own printout of its record; a part it does not print is
    one line naming the place."""
    record = ROOT / "results" / "benchmarks" / "transformer.json"
    printed = [block for block in bench_transformer.markdown(json.loads(record.read_text())).split("\n\n")
               if block.startswith("|")]
    doc = tmp_path / "doc.md"
    doc.write_text(f"<!-- table {record} bench-transformer part=2 -->\n<!-- /table -->\n")
    _run(monkeypatch, str(doc))
    assert doc.read_text().splitlines()[1:-1] == printed[1].splitlines()
    doc.write_text(f"<!-- table {record} bench-transformer part=3 -->\n<!-- /table -->\n")
    code = _run(monkeypatch, str(doc))
    assert f"{doc}:1: " in str(code) and "part=3: this record prints 2 tables" in str(code)
