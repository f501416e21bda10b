#!/usr/bin/env bash
# Set up the environment (scripts/setup_env.sh) and Slurm for its tests (scripts/slurm_test_cluster.sh install),
# then run ruff and the test suite (MTSA_TEST_WORKERS processes, default 2); further arguments go to pytest, e.g.
# -m "not slow".
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
setup_log="$(mktemp)"
trap 'rm -f "$setup_log"' EXIT
bash "$root/scripts/setup_env.sh" 2>&1 | tee "$setup_log"
if grep -q '^ERROR' "$setup_log"; then  # a setup that worked says nothing alarming
  echo "[test] the setup printed an ERROR line" >&2; exit 1
fi
venv="${MTSA_VENV:-$root/.venv}"
cd "$root"
# the launcher's tests against a real single-node Slurm (tests/test_slurm.py) need Debian's slurm-wlm and munge;
# where they cannot be installed (no root, no apt-get) those tests are skipped
bash "$root/scripts/slurm_test_cluster.sh" install
"$venv/bin/ruff" check mtsa_fairseq scripts tests
# two worker processes (pytest-xdist; a test file's tests stay in one), failures and every test phase of 20 s
# or more printed as they happen, and every thread's stack after 20 minutes in one test: a run stopped by a
# time limit still says what failed and where its time went
MTSA_TEST_REPORT_AT_ONCE=1 "$venv/bin/python" -m pytest tests -n "${MTSA_TEST_WORKERS:-2}" --dist loadfile \
  -o faulthandler_timeout=1200 --durations=15 "$@"
