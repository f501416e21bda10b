"""scripts/multi30k_study.py: input checks and the per-run table (the training itself is the pipeline's, tested
in test_pipeline.py; the study's configs are checked in test_configs.py)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from mtsa_fairseq.contracts import RESULT_SCHEMA, RUN_SCHEMA
from mtsa_fairseq.experiments.commands import multi30k_study as study
from mtsa_fairseq.experiments.translation.train_config import is_mtsa_option, load_config

pytestmark = pytest.mark.slow  # end-to-end runs of fairseq's and the project's commands

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "multi30k_study.py"


def test_systems_differ_only_in_the_encoder_self_attention():
    base, mtsa = (load_config(study.CONFIGS[k]) for k in ("baseline", "system"))
    assert (base.arch, mtsa.arch) == ("transformer", "transformer_mtsa")
    strip = lambda options: {k: v for k, v in options.items() if k != "arch" and not is_mtsa_option(k)}  # noqa: E731
    assert strip(base.fairseq) == strip(mtsa.fairseq)
    assert mtsa.fairseq["encoder-self-attention-type"] == "mtsa" and base.max_update == mtsa.max_update == 1000


def test_missing_release_file_stops_before_anything_is_written(tmp_path):
    raw = tmp_path / "multi30k"
    raw.mkdir()
    for split in ("train", "val", "test_2016_flickr"):
        for lang in ("en", "de"):
            (raw / f"{split}.{lang}").write_text("a\n")
    proc = subprocess.run([sys.executable, str(SCRIPT), "--multi30k", str(raw), "--out", str(tmp_path / "out")],
                          capture_output=True, text=True)
    assert proc.returncode != 0
    assert "neither test_2017_flickr.en nor test_2017_flickr.en.gz" in proc.stderr
    assert not (tmp_path / "out").exists()


def test_runs_table_has_one_row_per_run(tmp_path):
    for config, bleu in (("multi30k_transformer", 30.0), ("multi30k_mtsa", 31.5)):
        run_dir = tmp_path / "runs" / config / "seed7"
        run_dir.mkdir(parents=True)
        (run_dir / "run.json").write_text(json.dumps({
            "schema": RUN_SCHEMA, "num_updates": 1000, "wall_seconds": 1500.0,
            "train_target_tokens_per_second": 1234.4, "peak_rss_mb": 1100.2}))
        for offset, test in enumerate(study.TESTS):
            (tmp_path / "results").mkdir(exist_ok=True)
            (tmp_path / "results" / f"{config}_seed7_{test}.json").write_text(json.dumps({
                "schema": RESULT_SCHEMA, "num_params": 9_000_000, "bleu": {"sacrebleu": bleu - offset}}))
    table = study.runs_table(tmp_path, [7]).splitlines()
    assert len(table) == 4
    assert table[2] == "| multi30k_transformer | 7 | 1000 | 25.0 | 1234 | 1100 | 9,000,000 | 30.00 | 29.00 |"
    assert table[3].startswith("| multi30k_mtsa | 7 |") and table[3].endswith("| 31.50 | 30.50 |")
    (tmp_path / "results" / "multi30k_mtsa_seed7_test_2017_flickr.json").unlink()
    with pytest.raises(RuntimeError, match="result not found"):
        study.runs_table(tmp_path, [7])
