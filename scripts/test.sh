#!/usr/bin/env bash
# Set up the environment (scripts/setup_env.sh), then run ruff and the test suite.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/setup_env.sh"
venv="${MTSA_VENV:-$root/.venv}"
cd "$root"
"$venv/bin/ruff" check mtsa_fairseq scripts tests
"$venv/bin/python" -m pytest tests "$@"
