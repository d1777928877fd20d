#!/usr/bin/env bash
# `make demo`: the end-to-end run of what longhaul can do today. Until the networked RL demo
# (serve + workers over emulated WAN links) exists, it creates a tiny model, scores token
# sequences with it, benchmarks training steps, samples text with the rollout engine, teaches a
# character model arithmetic with sft, improves it with rl and evaluates both on held-out tasks.
# Exits non-zero if any step fails.
# Usage: bash scripts/demo.sh LONGHAUL_BIN   (outputs go to $DEMO_DIR, default ./demo)
set -euo pipefail

BIN=${1:?usage: scripts/demo.sh LONGHAUL_BIN}
DIR=${DEMO_DIR:-demo}

echo "the networked RL demo is not built yet; this demo runs init-model, score, bench train, generate," \
  "sft, rl and eval on a tiny model in $DIR/"
[ -x "$BIN" ] || {
  echo "demo: $BIN is not an executable (run make build first)" >&2
  exit 1
}
rm -rf "$DIR"
mkdir -p "$DIR"

echo
echo "== 1. init-model: a tiny Qwen2-style model, seed 1"
"$BIN" init-model --arch qwen2 --preset tiny --seed 1 --out "$DIR/tiny-qwen2"
ls -l "$DIR/tiny-qwen2"
VOCAB=$(sed -n 's/.*"vocab_size": *\([0-9][0-9]*\).*/\1/p' "$DIR/tiny-qwen2/config.json")
[ -n "$VOCAB" ] || {
  echo "demo: no vocab_size in $DIR/tiny-qwen2/config.json" >&2
  exit 1
}

echo
echo "== 2. score: log-probabilities of each token after the first (untrained: about" \
  "-ln($VOCAB) each)"
cat >"$DIR/sequences.jsonl" <<EOF
[1, 2, 3, 4, 5, 6, 7, 8]
[$((VOCAB - 1)), 0, $((VOCAB - 1)), 0]
[42, 42, 42, 42, 42, 42]
EOF
"$BIN" score --model "$DIR/tiny-qwen2" --input "$DIR/sequences.jsonl" | tee "$DIR/scores.jsonl"
LINES=$(wc -l <"$DIR/scores.jsonl")
[ "$LINES" -eq 3 ] || {
  echo "demo: score printed $LINES lines for 3 sequences" >&2
  exit 1
}

echo
echo "== 3. bench train: forward + backward + AdamW on 4 sequences of 64 tokens"
"$BIN" bench train --model "$DIR/tiny-qwen2" --batch 4 --seq 64 --steps 5

echo
echo
echo "== 4. generate: 3 samples from an untrained model with the character tokenizer (random text)"
"$BIN" init-model --arch qwen2 --preset tiny --tokenizer chars --seed 2 --out "$DIR/tiny-chars"
"$BIN" generate --model "$DIR/tiny-chars" --prompt "12+34=" --max-new 24 --n 3 --seed 7 \
  --json | tee "$DIR/samples.jsonl"
SAMPLES=$(wc -l <"$DIR/samples.jsonl")
if [ "$SAMPLES" -ne 3 ]; then
  echo "demo: generate printed $SAMPLES samples, expected 3" >&2
  exit 1
fi

echo
echo "== 5. sft: teach the character model 1-digit arithmetic from reference solutions, then ask it"
"$BIN" sft --model "$DIR/tiny-chars" --env arith:digits=1 --steps 300 --batch 32 --log-every 100 \
  --out "$DIR/tiny-chars-sft"
for p in "3+4=" "8-5=" "6+2="; do
  printf '%s ' "$p"
  "$BIN" generate --model "$DIR/tiny-chars-sft" --prompt "$p" --temperature 0 --max-new 4
done

echo
echo "== 6. rl: GRPO (TIS loss) teaches a briefly sft-trained model to sort 4 digits (reward only)"
"$BIN" sft --model "$DIR/tiny-chars" --env sort:count=4,digits=1 --steps 110 --batch 32 \
  --log-every 110 --out "$DIR/sort-base"
"$BIN" rl --model "$DIR/sort-base" --env sort:count=4,digits=1 --steps 300 --lr 2e-4 \
  --max-new 16 --log-every 50 --save-every 150 --out "$DIR/sort-rl"

echo
echo "== 7. eval: held-out pass@1 of the rl policy against its starting point (paired)"
"$BIN" eval --model "$DIR/sort-rl" --env sort:count=4,digits=1 --n 500 \
  --compare "$DIR/sort-base"

echo "demo finished: models, inputs, scores, samples and the rl run are in $DIR/"
