#!/usr/bin/env bash
# Set up the environment, then train a fairseq Transformer and its MTSA-encoder twin on a synthetic
# reordering/agreement corpus, translate the test set with each, and print BLEU.
#   MTSA_DEMO_DIR  output directory (default: demo-output)   MTSA_DEMO_UPDATES  updates per model (default 300)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/setup_env.sh"
bin="${MTSA_VENV:-$root/.venv}/bin"
out="${MTSA_DEMO_DIR:-$root/demo-output}"
updates="${MTSA_DEMO_UPDATES:-300}"
user_dir="$root/mtsa_fairseq"
export PYTHONWARNINGS=ignore OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}"

echo "[demo] corpus -> $out/raw"
"$bin/python" "$root/scripts/make_toy_corpus.py" "$out/raw"
"$bin/fairseq-preprocess" --source-lang en --target-lang de --trainpref "$out/raw/train" \
  --validpref "$out/raw/valid" --testpref "$out/raw/test" --destdir "$out/bin" --joined-dictionary \
  --workers 1 --log-format simple > "$out/preprocess.log" 2>&1

for arch in transformer_tiny transformer_mtsa_tiny; do
  echo "[demo] training $arch for $updates updates"
  "$bin/fairseq-train" "$out/bin" --user-dir "$user_dir" --arch "$arch" --cpu --seed 1 \
    --encoder-embed-dim 128 --decoder-embed-dim 128 --encoder-ffn-embed-dim 256 --decoder-ffn-embed-dim 256 \
    --encoder-attention-heads 4 --decoder-attention-heads 4 --share-all-embeddings \
    --optimizer adam --adam-betas '(0.9, 0.98)' --lr 2e-3 --lr-scheduler inverse_sqrt --warmup-updates 150 \
    --criterion label_smoothed_cross_entropy --label-smoothing 0.1 --dropout 0.1 \
    --max-tokens 2048 --max-update "$updates" --num-workers 0 --no-epoch-checkpoints \
    --save-dir "$out/checkpoints/$arch" \
    --log-format simple --log-interval 100 --disable-validation 2>&1 \
    | tee "$out/train-$arch.log" | grep --line-buffered -E "epoch [0-9]+ \| loss|done training" || true
  "$bin/fairseq-generate" "$out/bin" --user-dir "$user_dir" --path "$out/checkpoints/$arch/checkpoint_last.pt" \
    --cpu --beam 4 --batch-size 128 --remove-bpe --quiet > "$out/generate-$arch.log" 2>&1
  echo "[demo] $arch test $(grep -o 'BLEU4 = [0-9.]*' "$out/generate-$arch.log")"
done
