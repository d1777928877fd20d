#!/usr/bin/env bash
# `make results`: the experiments of docs/RESULTS.md, from scratch. Every model is the tiny
# Qwen2-style preset (0.8M parameters) with the character tokenizer; each run's command, log,
# metrics and eval JSON land in $RESULTS_DIR (default ./results), and summary.md collects the
# tables. Runs two jobs at a time, one thread each (the machine has 2 cores). About 1.5 hours.
# Usage: bash scripts/results.sh LONGHAUL_BIN [main|staleness|network|lag|all|env:NAME]
# (env:NAME runs the main stage of one environment of ENVS, e.g. env:sort.)
set -euo pipefail

BIN=$(realpath "${1:?usage: scripts/results.sh LONGHAUL_BIN [main|staleness|all]}")
WHAT=${2:-all}
HERE=$(dirname "$(realpath "$0")")
OUT=${RESULTS_DIR:-results}
mkdir -p "$OUT"
cd "$OUT"
export OMP_WAIT_POLICY=PASSIVE

EVAL_N=500     # held-out test tasks per evaluation
EVAL_SAMPLES=4 # samples per task for the temperature-1 evaluation
RL_STEPS=2000  # updates of the main RL runs (16 prompts x 8 completions each)
RL_LR=1e-4
STALE_STEPS=500
STALE_LR=2e-4

# name|target env|SFT steps for the base|easier env for the SFT control|loss flags of the RL run
# (countdown's policy collapses onto one answer per prompt without the KL penalty to its base:
# docs/RESULTS.md)
ENVS=(
  "countdown|countdown:count=3|900|countdown:count=2|--loss tis --kl-beta 0.05"
  "sort|sort:count=4,digits=1|110|sort:count=2,digits=1|--loss ppo"
  "arith|arith:digits=2|1500|arith:digits=1|--loss ppo"
)
STALE_ENV=sort:count=4,digits=1 # the staleness runs start from sort-base

# run NAME CMD...: runs CMD once (skipped when NAME.done exists), logging to NAME.log and
# recording the command and its wall time in NAME.cmd.
run() {
  local name=$1
  shift
  [ -f "$name.done" ] && return 0
  # a run stopped part-way (a session's end) leaves its output directory behind, and rl refuses
  # to write into one: start such a run over
  [ -d "$name" ] && rm -rf -- "$name"
  echo "$*" >"$name.cmd"
  local t0
  t0=$(date +%s.%N)
  "$@" >"$name.log" 2>&1 || {
    echo "results: $name failed; see $OUT/$name.log" >&2
    tail -n 5 "$name.log" >&2
    return 1
  }
  awk -v a="$(date +%s.%N)" -v b="$t0" 'BEGIN { printf "%.1f\n", a - b }' >"$name.seconds"
  touch "$name.done"
}
export -f run
export BIN OUT

# evaluate NAME MODEL ENV [COMPARE]: greedy pass@1 (eval-NAME.json), and pass@1 of the policy
# as RL samples it, temperature 1, from $EVAL_SAMPLES samples per task (eval-NAME-t1.json).
evaluate() {
  local name=$1 model=$2 env=$3
  shift 3
  run "eval-$name" "$BIN" eval --model "$model" --env "$env" --n $EVAL_N --threads 1 \
    --json "eval-$name.json" ${1:+--compare "$1"}
  run "eval-$name-t1" "$BIN" eval --model "$model" --env "$env" --n $EVAL_N --threads 1 \
    --samples $EVAL_SAMPLES --temperature 1 --json "eval-$name-t1.json" ${1:+--compare "$1"}
}

main_env() { # main_env NAME ENV SFT_STEPS EASY_ENV LOSS_FLAGS...
  local n=$1 env=$2 sft=$3 easy=$4
  shift 4
  run "init" "$BIN" init-model --arch qwen2 --preset tiny --tokenizer chars --seed 2 --out init
  run "$n-base" "$BIN" sft --force --model init --env "$env" --steps "$sft" --batch 32 --threads 1 \
    --out "$n-base"
  evaluate "$n-base" "$n-base" "$env"
  run "$n-rl" "$BIN" rl --model "$n-base" --env "$env" --steps $RL_STEPS --lr $RL_LR \
    "$@" --max-new 16 --threads 1 --save-every 500 --log-every 100 --out "$n-rl"
  local rl_s
  rl_s=$(cat "$n-rl.seconds")
  # SFT controls get the RL run's wall time: steps = its measured rate x that time.
  run "$n-rate" "$BIN" sft --force --model "$n-base" --env "$env" --steps 100 --batch 32 --threads 1 \
    --out "$n-rate-model"
  local steps
  steps=$(awk -v r="$(cat "$n-rate.seconds")" -v t="$rl_s" 'BEGIN { printf "%d", 100 / r * t }')
  run "$n-sft-easy" "$BIN" sft --force --model "$n-base" --env "$easy" --steps "$steps" --batch 32 \
    --lr 1e-3 --threads 1 --log-every 500 --out "$n-sft-easy"
  run "$n-sft-same" "$BIN" sft --force --model "$n-base" --env "$env" --steps "$steps" --batch 32 \
    --lr 1e-3 --threads 1 --log-every 500 --out "$n-sft-same"
  evaluate "$n-rl" "$n-rl/checkpoints/step-$(printf %06d $RL_STEPS)" "$env" "$n-base"
  evaluate "$n-sft-easy" "$n-sft-easy" "$env" "$n-base"
  evaluate "$n-sft-same" "$n-sft-same" "$env" "$n-base"
}
export -f main_env evaluate
export EVAL_N EVAL_SAMPLES RL_STEPS RL_LR

stale_run() { # stale_run LOSS K SEED; LOSS decoupled_mb4 is decoupled PPO over 4 minibatches
  local loss=$1 k=$2 seed=$3 name="stale-$1-k$2-s$3" mb=1
  [ "$loss" = decoupled_mb4 ] && loss=decoupled mb=4
  run "$name" "$BIN" rl --model sort-base --env $STALE_ENV --steps $STALE_STEPS \
    --lr $STALE_LR --max-new 16 --staleness "$k" --loss "$loss" --minibatches $mb \
    --seed "$seed" --threads 1 --save-every 0 --log-every 100 --out "$name" || return 1
  evaluate "$name" "$name/checkpoints/step-$(printf %06d $STALE_STEPS)" $STALE_ENV
}
export -f stale_run
export STALE_STEPS STALE_LR STALE_ENV

# net_run SEED: the networked loop (serve + 2 workers behind 150 ms links) from sort-base, as
# the staleness runs' TIS K=0 (500 updates, lr 2e-4), the default staleness bound of serve
net_run() {
  local seed=$1 name="net-s$1"
  run "$name" bash "$HERE/net_run.sh" "$BIN" sort-base $STALE_ENV $STALE_STEPS $STALE_LR "$seed" \
    "$name" || return 1
  evaluate "$name" "$name/checkpoints/step-$(printf %06d $STALE_STEPS)" $STALE_ENV sort-base
}
export -f net_run
export HERE

# The lag stage (issue 16): rl from each environment's base, LAG_STEPS updates at LAG_LR, with
# every batch K versions old (--staleness K, "delay") or each group from a version drawn from the
# last K + 1 (--staleness-mix K, "mix"). Loss names map to rl flags here; each run is skipped
# when done, so the table fills in over several sessions. LAG_ENVS, LAG_LOSSES, LAG_KS,
# LAG_MODES and LAG_SEEDS choose the runs (the screen: LAG_KS=16 LAG_SEEDS=1 LAG_ENVS=sort).
LAG_STEPS=500
LAG_LR=2e-4
lag_flags() {
  case $1 in
  tis) echo --loss tis ;;
  ppo) echo --loss ppo ;;
  m2po) echo --loss m2po ;;
  vcpo) echo --loss seqtis --ess-lr ;;
  seqtis) echo --loss seqtis ;;
  vespo) echo --loss vespo ;;
  dppo) echo --loss dppo ;;
  oapl) echo --loss oapl ;;
  snis) echo --loss snis ;;
  vespo_ess) echo --loss vespo --ess-lr ;;
  *)
    echo "results: unknown lag loss $1" >&2
    return 1
    ;;
  esac
}
lag_spec() {
  case $1 in
  sort) echo $STALE_ENV ;;
  countdown) echo countdown:count=3 ;;
  *)
    echo "results: unknown lag environment $1" >&2
    return 1
    ;;
  esac
}
lag_base() { # the bases as the main stage makes them (skipped when it did)
  run "init" "$BIN" init-model --arch qwen2 --preset tiny --tokenizer chars --seed 2 --out init
  case $1 in
  sort) run "sort-base" "$BIN" sft --force --model init --env $STALE_ENV --steps 110 --batch 32 \
    --threads 1 --out sort-base ;;
  countdown) run "countdown-base" "$BIN" sft --force --model init --env countdown:count=3 \
    --steps 900 --batch 32 --threads 1 --out countdown-base ;;
  esac
  evaluate "$1-base" "$1-base" "$(lag_spec "$1")"
}
lag_run() { # lag_run ENV LOSS MODE K SEED
  local env=$1 loss=$2 mode=$3 k=$4 seed=$5 flag=--staleness name
  [ "$mode" = mix ] && flag=--staleness-mix
  name="lag-$env-$loss-$mode$k-s$seed"
  [ "$k" = 0 ] && name="lag-$env-$loss-k0-s$seed" # on-policy: both modes are the same run
  local flags spec
  flags=$(lag_flags "$loss")
  spec=$(lag_spec "$env")
  # shellcheck disable=SC2086 # flags are words
  run "$name" "$BIN" rl --model "$env-base" --env "$spec" --steps $LAG_STEPS --lr $LAG_LR \
    --max-new 16 "$flag" "$k" $flags --seed "$seed" --threads 1 --save-every 0 \
    --log-every 100 --out "$name" || return 1
  evaluate "$name" "$name/checkpoints/step-$(printf %06d $LAG_STEPS)" "$spec" "$env-base"
}
export -f lag_flags lag_spec lag_run
export LAG_STEPS LAG_LR

if [ "$WHAT" = main ] || [ "$WHAT" = all ] || [ "${WHAT%%:*}" = env ]; then
  run "init" "$BIN" init-model --arch qwen2 --preset tiny --tokenizer chars --seed 2 --out init
  ONLY='[a-z]*'
  [ "${WHAT%%:*}" = env ] && ONLY=${WHAT#env:}
  printf '%s\n' "${ENVS[@]}" | grep "^$ONLY|" | tr '|' ' ' |
    xargs -P 2 -L 1 bash -c 'main_env "$@"' _
fi
if [ "$WHAT" = staleness ] || [ "$WHAT" = all ]; then
  [ -f sort-base.done ] || { echo "results: run the main stage first" >&2; exit 1; }
  for seed in 1 2; do for k in 0 2 8 16; do for loss in ${STALE_LOSSES:-ppo tis decoupled decoupled_mb4}; do
    echo "$loss $k $seed"
  done; done; done | xargs -P 2 -L 1 bash -c 'stale_run "$@"' _
fi
if [ "$WHAT" = network ] || [ "$WHAT" = all ]; then
  # the base, as the main stage makes it (skipped when it did)
  run "init" "$BIN" init-model --arch qwen2 --preset tiny --tokenizer chars --seed 2 --out init
  run "sort-base" "$BIN" sft --force --model init --env $STALE_ENV --steps 110 --batch 32 \
    --threads 1 --out sort-base
  evaluate "sort-base" "sort-base" $STALE_ENV
  # the single-process runs it is compared with (the staleness stage's TIS K=0), then the
  # networked ones, one at a time: each uses both cores
  for seed in 1 2; do stale_run tis 0 "$seed"; done
  for seed in 1 2; do net_run "$seed"; done
fi
if [ "$WHAT" = lag ] || [ "$WHAT" = all ]; then
  for env in ${LAG_ENVS:-sort countdown}; do lag_base "$env"; done
  # seed by seed, so that a partial table has every cell of its first seeds
  for seed in ${LAG_SEEDS:-1 2 3}; do for env in ${LAG_ENVS:-sort countdown}; do
    for k in ${LAG_KS:-0 8 16 32 64}; do for mode in ${LAG_MODES:-delay mix}; do
      [ "$k" = 0 ] && mode=delay # on-policy: one run for both modes
      for loss in ${LAG_LOSSES:-tis}; do echo "$env $loss $mode $k $seed"; done
    done; done
  done; done | awk '!seen[$0]++' | xargs -P 2 -L 1 bash -c 'lag_run "$@"' _
fi
/usr/bin/python3 "$HERE/results_table.py" . >summary.md
cat summary.md
