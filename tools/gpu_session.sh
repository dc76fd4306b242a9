#!/usr/bin/env bash
# One call on a GPU machine: the `gpu` tests, then the bench of each data set at this
# checkout's code, then the tuned recipe with one step per CUDA graph (bench.graph: step),
# then the tuned rung warm and cold over 30 seeds (benchmarks/cold_start.py, COLD_SEEDS), with
# params.yaml's recipe and with the one-epoch recipe (ONE_EPOCH: its recipe flags), then the
# tuned recipe's choices over ten seeds, then where a step's time goes per execution
# (benchmarks/gpu_steps.py: kernels per step); everything under $OUT.
#
#   OUT=/tmp/gpu-out [DEADLINE=570] tools/gpu_session.sh MIRROR COMMIT [BENCH_ARGS...]
#
# MIRROR: a folder with mnist/ and fashion-mnist/ (the four IDX .gz files each), carried with
# the checkout since the shared data does not travel. COMMIT: the short commit the results
# are recorded under. BENCH_ARGS go to `standalone-bench` (a CPU dry run: --device cpu
# --epochs 2 --sample-steps 2; SEEDS=1 RECIPES=write-up shorten the recipe part). DATASETS
# (default "mnist fashion-mnist") runs one bench part each, in that order, so a data set
# whose bench ended has its results written before the next starts. DEADLINE: seconds from
# the script's start by which every part has ended: each runs under `timeout` for what is
# left, and a part with under 20 s left is skipped, so the call's own limit never cuts the
# script short and what ran comes back. Each part's output is kept whole in $OUT/<part>.txt;
# a failed part does not stop the next, and the script's status is the first failure's.
set -u
mirror=${1:?usage: OUT=... tools/gpu_session.sh MIRROR COMMIT [BENCH_ARGS...]}
commit=${2:?usage: OUT=... tools/gpu_session.sh MIRROR COMMIT [BENCH_ARGS...]}
shift 2
out=${OUT:?set OUT to the folder the results go to}
python=${PYTHON:-python3}
deadline=$((SECONDS + ${DEADLINE:-100000}))
export PYTHONUNBUFFERED=1
mkdir -p "$out"
# Scratch (Parquet, shards: hundreds of MB) outside $OUT, whose files come back whole: gone
# however the script ends, a timeout's kill included where the shell gets to run its trap.
scratch=$(mktemp -d "${TMPDIR:-/tmp}/gpu-session.XXXXXX")
trap 'rm -rf "$scratch"' EXIT
status=0
part() {  # part NAME COMMAND...: run it within the deadline, its output kept whole and its tail shown
    local name=$1
    shift
    local left=$((deadline - SECONDS))
    if [ "$left" -lt 20 ]; then
        echo "== $name: skipped, ${left} s left before the deadline"
        [ "$status" -eq 0 ] && status=124
        return
    fi
    echo "== $name ($left s left): $*"
    local started=$SECONDS
    timeout -k 5 "$left" "$@" >"$out/$name.txt" 2>&1
    local rc=$?
    tail -n 25 "$out/$name.txt"
    echo "== $name: exit $rc after $((SECONDS - started)) s"
    if [ "$rc" -ne 0 ] && [ "$status" -eq 0 ]; then status=$rc; fi
}
"$python" -c 'import torch; print(torch.__version__, torch.cuda.is_available() and torch.cuda.get_device_name(0))'
part gpu_tests "$python" -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu.py
for dataset in ${DATASETS:-mnist fashion-mnist}; do
    part "bench_$dataset" "$python" -m pipeline standalone-bench --mirror "$mirror" --out "$out/results" \
        --work "$scratch/work" --commit "$commit" --dataset "$dataset" "$@"
done
part tuned_recipe_step_graph "$python" benchmarks/tuned_recipe.py --mirror "$mirror" --work "$scratch/recipe" \
    --seeds "${SEEDS:-10}" --only "*" --graph step
part cold_start "$python" benchmarks/cold_start.py --mirror "$mirror" --work "$scratch/recipe" \
    --seeds "${COLD_SEEDS:-30}"
# shellcheck disable=SC2086 (ONE_EPOCH is a list of flags)
part cold_start_one_epoch "$python" benchmarks/cold_start.py --mirror "$mirror" --work "$scratch/recipe" \
    --seeds "${COLD_SEEDS:-30}" ${ONE_EPOCH:---epochs 1 --batch-size 64 --max-lr 0.02 --pct-start 0.15 --label-smoothing 0.1}
part tuned_recipe "$python" benchmarks/tuned_recipe.py --mirror "$mirror" --work "$scratch/recipe" \
    --seeds "${SEEDS:-10}" ${RECIPES:+--only "$RECIPES"}
part gpu_steps "$python" benchmarks/gpu_steps.py --mirror "$mirror" --work "$scratch/steps" --epochs "${STEP_EPOCHS:-5}"
exit "$status"
