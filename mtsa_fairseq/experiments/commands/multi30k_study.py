"""The Multi30k study (docs/results-multi30k.md), end to end and resumable: Multi30k task 1 En-De,
configs/multi30k_transformer.yaml against configs/multi30k_mtsa.yaml, N seeds each, seed by seed (a seed's two runs
side by side, one CPU core each), each finished seed scored on both test sets at checkpoint_last.pt and at the
average of the last 5 epoch checkpoints: OUT/report[-avg5][-lowercased|-tokenized].md (Welch's t-test, paired
tests; sacreBLEU, lowercased or tokenized compound-split BLEU), OUT/runs.md, OUT/curves.png and OUT/study.json.

  python scripts/multi30k_study.py --multi30k path/to/multi30k --out multi30k-probe --seeds 1 \\
      --max-update 20000 --train-only
  python scripts/multi30k_study.py --multi30k path/to/multi30k --out multi30k-study --seeds 1 2 3 4 5 6 \\
      --budget-from multi30k-probe

The probe (--train-only) writes OUT/curves.json and .png with the plateau rule's verdict per run; --curves-only
shows a running probe's curves so far; --budget-from trains the study to the budget the probe fixes. Rerunning a
command skips finished runs and scores and resumes interrupted runs; a seed whose run.json says it finished and
whose four result files exist needs neither its checkpoints nor training again.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from mtsa_fairseq.experiments import command
from mtsa_fairseq.experiments.processes import run_command
from mtsa_fairseq.experiments.translation import study


def _main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--multi30k", type=Path,
                        help="directory with the Multi30k task 1 files {train,val,test_2016_flickr,"
                             "test_2017_flickr}.{en,de}[.gz] (github.com/multi30k/dataset, data/task1/raw); "
                             "required except with --curves-only")
    parser.add_argument("--out", type=Path, default=Path("multi30k-study"),
                        help="output directory (default: multi30k-study in the current directory)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3], help="seeds per system (default: 1 2 3)")
    parser.add_argument("--threads", type=int, default=1,
                        help="CPU threads per process (default 1: the two systems train at once, one core each)")
    parser.add_argument("--max-update", type=int,
                        help="train every run to this many updates instead of the configs' budget (a probe)")
    parser.add_argument("--train-only", action="store_true",
                        help="train, then stop: no test set is scored (the learning-curve probe that fixes the "
                             "budget: python scripts/multi30k_study.py --seeds 1 --max-update 20000 --train-only "
                             "--out multi30k-probe)")
    parser.add_argument("--curves-only", action="store_true",
                        help="train and score nothing: write OUT/curves-interim.json and .png from the runs' logs "
                             "as they stand and print each run's plateau verdict (safe while the runs train)")
    parser.add_argument("--budget-from", type=Path, metavar="PROBE",
                        help="the probe's output directory, or its curves report (OUT/curves.json; the project's "
                             "probe: results/multi30k/probe/curves.json): train every run to the budget its "
                             "validation curves fix (the first validation at which all its runs are on a "
                             "plateau); refused while there is none")
    parser.add_argument("--ablation", action="store_true",
                        help="the ablation instead of the study: configs/multi30k_mtsa_s2t_bias5.yaml (the MTSA "
                             "paper's Setup 1 source2token bias, --mtsa-s2t-bias-init 5) against "
                             "configs/multi30k_mtsa.yaml, reusing the study's MTSA runs in OUT; its reports go to "
                             "OUT/ablation/")
    parser.add_argument("--recipe", choices=sorted(study.RECIPES), default="base",
                        help="the model recipe of both systems: base, configs/multi30k_{transformer,mtsa}.yaml "
                             "(3+3 layers x 256, the default); tiny, configs/multi30k_tiny_{transformer,mtsa}.yaml "
                             "(Transformer-Tiny of Wu et al. 2021: 4+4 layers x 128, FFN 256, 8,192 tokens per "
                             "update)")
    args = parser.parse_args()
    if args.ablation and args.recipe != "base":
        parser.error("--ablation is of the base recipe: drop --recipe")
    comparison = study.ABLATION if args.ablation else study.RECIPES[args.recipe]
    if args.max_update is not None and args.max_update < 1:
        parser.error("--max-update must be positive")
    if args.budget_from is not None and (args.max_update is not None or args.train_only or args.curves_only):
        parser.error("--budget-from sets the budget of a study: drop --max-update, --train-only and --curves-only")
    if args.curves_only:
        if args.max_update is not None or args.train_only:
            parser.error("--curves-only trains nothing: drop --max-update and --train-only")
        study.interim_curves(args.out.resolve(), args.seeds, comparison)
        return
    if args.multi30k is None:
        parser.error("--multi30k is required (the Multi30k task 1 directory)")
    if not args.multi30k.is_dir():
        parser.error(f"--multi30k {args.multi30k} is not a directory")
    files = study.raw_files(args.multi30k)
    budget_record = None
    if args.budget_from is not None:
        budget_record = study.probe_budget(args.budget_from.resolve(), study.RECIPES[args.recipe])
        args.max_update = budget_record["max_update"]
        why = ("the recipe's cap, reached by every run of the probe with no validation before it at which all were"
               " on a plateau" if budget_record["capped"]
               else "the first validation at which every run of the probe is on a plateau")
        print(f"budget: {args.max_update} updates, {why} ({args.budget_from})")

    study.run_study(args.out, files, args.seeds, comparison, command, threads=args.threads,
                    max_update=args.max_update, train_only=args.train_only, budget_record=budget_record)


def main() -> None:
    """The command: one line, never a traceback, for a full disk, Ctrl-C (status 130) or SIGTERM (143)."""
    run_command(_main)


if __name__ == "__main__":
    main()
