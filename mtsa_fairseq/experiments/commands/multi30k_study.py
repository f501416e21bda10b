"""The Multi30k study (docs/results-multi30k.md), end to end and resumable.

Multi30k task 1 En-De (train 29,000 / val 1,014 / test_2016_flickr / test_2017_flickr) -> the project's data
script (joint 8k sentencepiece) -> configs/multi30k_transformer.yaml and configs/multi30k_mtsa.yaml, N seeds
each, trained side by side on one CPU core each -> BLEU on both test sets -> Welch's t-test, paired bootstrap
and approximate randomization (scripts/pipeline.py does all of that; OUT/report.md), the same t-test on the
tokenized, compound-split BLEU (OUT/report-tokenized.md) -> OUT/runs.md, one row per run with its wall time,
training throughput, peak memory, parameters and BLEU.

  python scripts/multi30k_study.py --multi30k ../shared/data/multi30k --out multi30k-study

Rerunning the same command skips finished runs (keyed by config and seed) and existing scores, continues an
interrupted run from its checkpoint_last.pt and rewrites the reports.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from mtsa_fairseq.contracts import RESULT_SCHEMA, RUN_SCHEMA, read_json
from mtsa_fairseq.experiments.files import write_atomic
from mtsa_fairseq.experiments.processes import run_command

ROOT = Path(__file__).resolve().parents[3]  # the repository (configs/, scripts/)

CONFIGS = {"baseline": ROOT / "configs/multi30k_transformer.yaml", "system": ROOT / "configs/multi30k_mtsa.yaml"}
TESTS = ("test_2016_flickr", "test_2017_flickr")


def raw_files(multi30k: Path) -> dict[str, tuple[Path, Path]]:
    """The release's split files (plain or .gz), by split name; exits naming the first missing one."""
    files = {}
    for split in ("train", "val", *TESTS):
        pair = []
        for lang in ("en", "de"):
            plain, gz = multi30k / f"{split}.{lang}", multi30k / f"{split}.{lang}.gz"
            if not (plain.is_file() or gz.is_file()):
                sys.exit(f"error: {multi30k} has neither {plain.name} nor {gz.name} (the Multi30k task 1 release)")
            pair.append(plain if plain.is_file() else gz)
        files[split] = (pair[0], pair[1])
    return files


def runs_table(out: Path, seeds: list[int]) -> str:
    """One Markdown row per run: updates, wall time, target tokens/s, peak RSS, parameters, sacreBLEU per test."""
    rows = ["| system | seed | updates | wall time (min) | target tokens/s | peak RSS (MB) | parameters | "
            + " | ".join(f"sacreBLEU {t}" for t in TESTS) + " |",
            "|---|---|---|---|---|---|---|" + "---|" * len(TESTS)]
    for config in CONFIGS.values():
        for seed in seeds:
            run = read_json(out / "runs" / config.stem / f"seed{seed}" / "run.json", RUN_SCHEMA, "run record",
                            RuntimeError)
            scores = [read_json(out / "results" / f"{config.stem}_seed{seed}_{t}.json", RESULT_SCHEMA, "result",
                                RuntimeError) for t in TESTS]
            rows.append(f"| {config.stem} | {seed} | {run['num_updates']} | {run['wall_seconds'] / 60:.1f} | "
                        f"{run['train_target_tokens_per_second']:.0f} | {run['peak_rss_mb']:.0f} | "
                        f"{scores[0]['num_params']:,} | " + " | ".join(f"{s['bleu']['sacrebleu']:.2f}" for s in scores)
                        + " |")
    return "\n".join(rows) + "\n"


def _main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--multi30k", type=Path, default=ROOT.parent / "shared/data/multi30k",
                        help="directory with the Multi30k task 1 files {train,val,test_2016_flickr,"
                             "test_2017_flickr}.{en,de}[.gz] (default: ../shared/data/multi30k)")
    parser.add_argument("--out", type=Path, default=ROOT / "multi30k-study", help="output directory")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3], help="seeds per system (default: 1 2 3)")
    parser.add_argument("--threads", type=int, default=1,
                        help="CPU threads per process (default 1: the two systems train at once, one core each)")
    parser.add_argument("--max-update", type=int,
                        help="train every run to this many updates instead of the configs' budget (a probe)")
    parser.add_argument("--train-only", action="store_true",
                        help="train, then stop: no test set is scored (the learning-curve probe that fixes the "
                             "budget: python scripts/multi30k_study.py --seeds 1 --max-update 20000 --train-only "
                             "--out multi30k-probe)")
    args = parser.parse_args()
    if args.max_update is not None and args.max_update < 1:
        parser.error("--max-update must be positive")
    if not args.multi30k.is_dir():
        parser.error(f"--multi30k {args.multi30k} is not a directory")
    files = raw_files(args.multi30k)

    cmd = [sys.executable, str(ROOT / "scripts/pipeline.py"), "--out", str(args.out), "--vocab-size", "8000",
           "--train", *map(str, files["train"]), "--valid", *map(str, files["val"]),
           "--baseline-config", str(CONFIGS["baseline"]), "--system-config", str(CONFIGS["system"]),
           "--seeds", *map(str, args.seeds), "--parallel", "--threads", str(args.threads)]
    for test in TESTS:
        cmd += ["--test", test, *map(str, files[test])]
    if args.max_update is not None:
        cmd += ["--train-args", f"--extra-args '--max-update {args.max_update}'"]
    if args.train_only:
        cmd.append("--train-only")
    if subprocess.run(cmd).returncode != 0:
        sys.exit("error: the pipeline failed (its logs are in --out)")
    if args.train_only:
        return
    out = args.out.resolve()
    results = {role: [str(out / "results" / f"{config.stem}_seed{seed}_{test}.json") for seed in args.seeds
                      for test in TESTS] for role, config in CONFIGS.items()}
    tokenized = [sys.executable, str(ROOT / "scripts/significance.py"), "--baseline", *results["baseline"],
                 "--system", *results["system"], "--names", "Transformer", "MTSA", "--metric",
                 "tokenized_compound_split", "--markdown", str(out / "report-tokenized.md"), "--json",
                 str(out / "report-tokenized.json"), "--overwrite"]
    if subprocess.run(tokenized, stdout=subprocess.DEVNULL).returncode != 0:
        sys.exit("error: the tokenized-BLEU significance report failed")
    table = runs_table(out, args.seeds)
    write_atomic(out / "runs.md", table)
    print(table + f"\nreports: {out / 'report.md'} (sacreBLEU), {out / 'report-tokenized.md'} (tokenized, "
          f"compound-split BLEU), {out / 'report.png'}, {out / 'runs.md'}")


def main() -> None:
    """The command: one line, never a traceback, for a full disk, Ctrl-C (status 130) or SIGTERM (143)."""
    run_command(_main)


if __name__ == "__main__":
    main()
