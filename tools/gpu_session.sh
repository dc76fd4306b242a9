#!/usr/bin/env bash
# One call on a GPU machine: the `gpu` tests, then the bench of both data sets at
# this checkout's code, then the tuned recipe's choices over ten seeds; everything under $OUT.
#
#   OUT=/tmp/gpu-out tools/gpu_session.sh MIRROR COMMIT [BENCH_ARGS...]
#
# MIRROR: a folder with mnist/ and fashion-mnist/ (the four IDX .gz files each), carried with
# the checkout since the shared data does not travel. COMMIT: the short commit the results
# are recorded under. BENCH_ARGS go to `standalone-bench` (a CPU dry run: --device cpu
# --epochs 2 --sample-steps 2; SEEDS=1 RECIPES=write-up shorten the recipe part). Each part's output is kept whole in $OUT/<part>.txt; a failed
# part does not stop the next, and the script's status is the first failure's.
set -u
mirror=${1:?usage: OUT=... tools/gpu_session.sh MIRROR COMMIT [BENCH_ARGS...]}
commit=${2:?usage: OUT=... tools/gpu_session.sh MIRROR COMMIT [BENCH_ARGS...]}
shift 2
out=${OUT:?set OUT to the folder the results go to}
mkdir -p "$out"
# Scratch (Parquet, shards: hundreds of MB) outside $OUT, whose files come back whole: gone
# however the script ends, a timeout's kill included where the shell gets to run its trap.
scratch=$(mktemp -d "${TMPDIR:-/tmp}/gpu-session.XXXXXX")
trap 'rm -rf "$scratch"' EXIT
status=0
part() {  # part NAME COMMAND...: run it, its output kept whole and its tail shown
    local name=$1
    shift
    echo "== $name: $*"
    "$@" >"$out/$name.txt" 2>&1
    local rc=$?
    tail -n 25 "$out/$name.txt"
    echo "== $name: exit $rc"
    if [ "$rc" -ne 0 ] && [ "$status" -eq 0 ]; then status=$rc; fi
}
python -c 'import torch; print(torch.__version__, torch.cuda.is_available() and torch.cuda.get_device_name(0))'
part gpu_tests python -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu.py
part bench python -m pipeline standalone-bench --mirror "$mirror" --out "$out/results" \
    --work "$scratch/work" --commit "$commit" "$@"
part tuned_recipe python benchmarks/tuned_recipe.py --mirror "$mirror" --work "$scratch/recipe" --seeds "${SEEDS:-10}" \
    ${RECIPES:+--only "$RECIPES"}
exit "$status"
