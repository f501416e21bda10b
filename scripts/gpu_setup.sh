#!/usr/bin/env bash
# Make a bare GPU machine that cannot reach a package index ready to run this checkout in minutes.
# A CUDA image with torch and triton (and numpy, scipy, sacrebleu, sentencepiece, pyyaml, pytest) lacks
# fairseq and a few small packages; bring them along in one folder:
#
#   bash scripts/gpu_setup.sh fetch DIR     # after scripts/setup_env.sh, where pip reaches an index: fairseq-
#                                           # fixed's sdist and the wheels the GPU machine's Python
#                                           # (GPU_PYTHON, default 3.12) lacks
#   bash scripts/gpu_setup.sh wheel DIR     # optional, here: builds fairseq-fixed's wheel for the GPU machine's
#                                           # Python (GPU_PYTHON_BIN: an interpreter of that version here)
#                                           # without its torch extensions (libbase, libnat: BASE layers and
#                                           # non-autoregressive models only), so no torch is needed to build it
#   bash scripts/gpu_setup.sh install DIR   # on the GPU machine: installs them into its python3, builds
#                                           # fairseq-fixed against its torch (about 3 minutes) unless DIR holds
#                                           # a wheel built for that torch or by `wheel`, then this checkout
#                                           # (editable), and prints what it runs on
#
# After `wheel`, or with DIR/fairseq_fixed-*.whl and DIR/built-against copied back after a first install, a
# bare machine installs in seconds instead of compiling.
set -euo pipefail
usage() { echo "usage: bash scripts/gpu_setup.sh {fetch|wheel|install} DIR" >&2; exit 2; }
[[ $# -eq 2 ]] || usage
mode="$1" dir="$2"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
fairseq_pin="$(grep -o '^fairseq-fixed==[0-9.]*' "$root/requirements/fairseq.txt")"
fairseq_hash="$(grep -o 'sha256:[0-9a-f]*' "$root/requirements/fairseq.txt")"

case "$mode" in
  fetch)
    py="${GPU_PYTHON:-3.12}"
    mkdir -p "$dir"
    # the project's environment (scripts/setup_env.sh): pip reads the sdist's metadata with its torch
    pip=("${PYTHON:-$root/.venv/bin/python}" -m pip --disable-pip-version-check)
    "${pip[@]}" download -q --no-deps --no-binary :all: --no-build-isolation -d "$dir" "$fairseq_pin"
    sdist="$(ls "$dir"/fairseq[_-]fixed-*.tar.gz 2>/dev/null | head -1)"
    [[ -f "$sdist" ]] || { echo "[gpu-setup] error: could not download $fairseq_pin's sdist" >&2; exit 1; }
    [[ "sha256:$(sha256sum "$sdist" | cut -d' ' -f1)" == "$fairseq_hash" ]] || {
      echo "[gpu-setup] error: $sdist does not match requirements/fairseq.txt's hash" >&2; exit 1; }
    # fairseq's and this project's runtime needs that CUDA images usually lack (antlr4 4.9 is an sdist: built here)
    "${pip[@]}" download -q --no-deps --only-binary=:all: --python-version "$py" --implementation cp \
      --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
      -d "$dir" hydra-core==1.3.2 omegaconf==2.3.0 bitarray sacremoses submitit
    "${pip[@]}" wheel -q --no-deps -w "$dir" antlr4-python3-runtime==4.9.3
    echo "[gpu-setup] fetched into $dir: $(ls "$dir" | tr '\n' ' ')"
    ;;
  wheel)
    python="${GPU_PYTHON_BIN:?set GPU_PYTHON_BIN to a Python here of the version the GPU machine runs, e.g. 3.12}"
    sdist="$(ls "$dir"/fairseq[_-]fixed-*.tar.gz 2>/dev/null | head -1)"
    [[ -f "$sdist" ]] || { echo "[gpu-setup] error: no fairseq-fixed sdist in $dir (run fetch first)" >&2; exit 1; }
    work="$(mktemp -d)"
    trap 'rm -rf "$work"' EXIT
    "$python" -m venv "$work/venv"
    "$work/venv/bin/python" -m pip install -q --disable-pip-version-check "numpy>=2" cython setuptools wheel
    tar xzf "$sdist" -C "$work"
    src=("$work"/fairseq[_-]fixed-*/)
    # setup.py without torch: the extensions that need no torch (libbleu, the Cython data utilities) stay
    "$work/venv/bin/python" - "${src[0]}setup.py" <<'EOF'
import re, sys
path = sys.argv[1]
text = open(path).read()
text = text.replace("from torch.utils import cpp_extension\n", "")
text = re.sub(r"\nextensions\.extend\(.*?\ncmdclass = \{\"build_ext\": cpp_extension\.BuildExtension\}\n",
              "\ncmdclass = {}\n", text, flags=re.S)
if "cpp_extension" in text:
    sys.exit("[gpu-setup] error: fairseq-fixed's setup.py has changed; cannot leave its torch extensions out")
open(path, "w").write(text)
EOF
    rm -f "$dir"/fairseq_fixed-*.whl
    "$work/venv/bin/python" -m pip wheel -q --disable-pip-version-check --no-deps --no-build-isolation \
      -w "$dir" "${src[0]}"
    echo without-torch-extensions > "$dir/built-against"
    echo "[gpu-setup] built $(cd "$dir" && ls fairseq_fixed-*.whl) (without fairseq's torch extensions)"
    ;;
  install)
    [[ -d "$dir" ]] || { echo "[gpu-setup] error: $dir is not a directory" >&2; exit 1; }
    pip=(python3 -m pip --disable-pip-version-check -q)
    "${pip[@]}" install --no-index --no-deps "$dir"/*-none-any.whl "$dir"/bitarray-*.whl
    torch_version="$(python3 -c 'import torch; print(torch.__version__)')"
    wheel=("$dir"/fairseq_fixed-*.whl)
    built_against="$(cat "$dir/built-against" 2>/dev/null || true)"
    if [[ ! -f "${wheel[0]}" || ( "$built_against" != "$torch_version" && "$built_against" != without-torch-extensions ) ]]
    then
      echo "[gpu-setup] building $fairseq_pin against torch $torch_version (once)"
      rm -f "$dir"/fairseq_fixed-*.whl
      # CUDA_HOME unset: fairseq's optional CUDA extensions (non-autoregressive models) are not built
      env -u CUDA_HOME MAX_JOBS="$(nproc)" "${pip[@]}" wheel --no-deps --no-build-isolation -w "$dir" \
        "$dir"/fairseq[_-]fixed-*.tar.gz
      echo "$torch_version" > "$dir/built-against"
      wheel=("$dir"/fairseq_fixed-*.whl)
    fi
    "${pip[@]}" install --no-index --no-deps "${wheel[0]}"
    MTSA_FAIRSEQ_OWN_FAIRSEQ=1 "${pip[@]}" install --no-deps --no-build-isolation -e "$root"
    python3 - <<'EOF'
import fairseq, torch, triton
import mtsa_fairseq  # noqa: F401
name = torch.cuda.get_device_name() if torch.cuda.is_available() else "no CUDA device"
print(f"[gpu-setup] {name}, torch {torch.__version__}, triton {triton.__version__}, fairseq {fairseq.__version__}")
EOF
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || true
    ;;
  *) usage ;;
esac
