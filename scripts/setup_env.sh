#!/usr/bin/env bash
# Create (or reuse) the virtual environment: torch, fairseq-fixed compiled against it, mtsa_fairseq.
#   MTSA_VENV   where the environment lives (default: .venv in the repository)
#   MTSA_TORCH  the torch requirement (default: torch==2.13.0; PyPI's Linux wheel is the CUDA build, and
#               PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu gives the CPU one)
#   MTSA_FAIRSEQ_OWN_FAIRSEQ=1  keep the fairseq already importable in that environment
#   PYTHON      the interpreter that creates the environment (default: python3, 3.10 or newer)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${MTSA_VENV:-$root/.venv}"
torch_req="${MTSA_TORCH:-torch==2.13.0}"
python="${PYTHON:-python3}"

stamp="$venv/.mtsa-setup"
want="$(cat "$root/setup.py" "$root"/requirements/*.txt | sha256sum | cut -c1-16) $torch_req ${MTSA_FAIRSEQ_OWN_FAIRSEQ:-0}"
if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
  echo "[setup] $venv is up to date"
  exit 0
fi

"$python" -c 'import sys; assert sys.version_info >= (3, 10), "Python >= 3.10 is needed"' || {
  echo "[setup] error: $python is older than Python 3.10" >&2; exit 1; }
[[ -x "$venv/bin/python" ]] || "$python" -m venv "$venv"
pip=("$venv/bin/python" -m pip --disable-pip-version-check)
export PIP_PROGRESS_BAR=off

echo "[setup] 1/4 (${SECONDS} s) build tools and $torch_req"
"${pip[@]}" install -q "$torch_req" -r "$root/requirements/build.txt"
# Everything with dependencies to resolve goes in before fairseq, which is installed last without its declared
# dependencies: pip then has nothing to report about the one it lacks on purpose (torchaudio, below).
echo "[setup] 2/4 (${SECONDS} s) runtime requirements"
"${pip[@]}" install -q "$torch_req" -r "$root/requirements/runtime.txt"
if [[ "${MTSA_FAIRSEQ_OWN_FAIRSEQ:-0}" == "1" ]]; then
  echo "[setup] 3/4 (${SECONDS} s) keeping the fairseq already installed"
  "$venv/bin/python" -c 'import fairseq' || { echo "[setup] error: no importable fairseq" >&2; exit 1; }
else
  echo "[setup] 3/4 (${SECONDS} s) fairseq-fixed, compiled against this torch (a few minutes), without torchaudio: fairseq's" \
       "text tasks never import it, and its releases do not load with $torch_req"
  "${pip[@]}" install -q --no-build-isolation --no-deps --no-binary fairseq-fixed --require-hashes \
    -r "$root/requirements/fairseq.txt"
fi
echo "[setup] 4/4 (${SECONDS} s) mtsa_fairseq (editable)"
MTSA_FAIRSEQ_OWN_FAIRSEQ=1 "${pip[@]}" install -q --no-deps --no-build-isolation -e "$root"
"$venv/bin/python" -c 'import mtsa_fairseq.plugin, fairseq; print("[setup] fairseq", fairseq.__version__, "ok")'
echo "[setup] done in ${SECONDS} s"
echo "$want" > "$stamp"
