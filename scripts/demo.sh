#!/usr/bin/env bash
# Set up the environment, then run the whole experiment pipeline (scripts/pipeline.py): by default on the
# synthetic reordering/agreement corpus, 3 seeds of transformer_tiny and of transformer_mtsa_tiny on CPU,
# BLEU, Welch's t-test, paired bootstrap / approximate randomization and the Table-6-style report.
# Any pipeline.py option passes through, e.g. your own data and configs:
#   bash scripts/demo.sh --out runs/wmt14 --train ... --test ... --baseline-config configs/setup1_transformer.yaml \
#       --system-config configs/setup1_mtsa.yaml --seeds 1 2 3 4 5 6
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/setup_env.sh"
export PYTHONWARNINGS=ignore
if [ "$#" -eq 0 ]; then  # the embedded demo: both systems train side by side, one core each
  set -- --parallel --threads 1 --cpu
fi
exec "${MTSA_VENV:-$root/.venv}/bin/python" "$root/scripts/pipeline.py" "$@"
