#!/usr/bin/env bash
# What one call on the lent H200 runs (no internet there; the CUDA wheel and the peers' wheels
# travel with the call: carry [".whl", "dist/cuda"]). From the repository root:
#
#   bash benchmarks/h200_run.sh OUT_DIR "prewarm parity bench" [bench_gpu.py args...]
#   CHAIN_ARGS="--quick" bash benchmarks/h200_run.sh OUT_DIR "prewarm chain"
#   NCU_BENCH=docs/benchmarks/h200.json NCU_ARGS="--top 6" bash benchmarks/h200_run.sh OUT_DIR "prewarm ncu"
#   OPMUX_FROM_TREE=1 MOE_PEER_CONFIGS=.scratch/peer_configs MOE_TUNE="--models DeepSeek-V3 --m 1,8 --budget-s 70; \
#       --models Qwen3-30B-A3B --m 1,256,1024 --budget-s 80" bash benchmarks/h200_run.sh OUT_DIR "prewarm moe-tune moe-bench"
#   OPMUX_FROM_TREE=1 bash benchmarks/h200_run.sh OUT_DIR "prewarm moe-grid prefill decode sampling"
#
# prewarm: JIT-compile every CUDA module for this GPU in parallel (the jit backend's cache; $PREWARM_BUDGET_S s);
# parity:  the parity-cuda harness against the installed wheel (coverage matrix -> OUT_DIR/cuda.*),
#          in $PARITY_WORKERS pytest-xdist processes (default 12) where the image has pytest-xdist,
#          $PARITY_K a pytest -k filter (a run split over calls: 8 workers on an H100 took 580 s for
#          1,064 of its 1,071 tests, session 38);
# bridge:  the torch-linked bridge and the serving lanes alone (test_torch_kernels, test_lanes), every
#          test's outcome listed (OUT_DIR/bridge.log);
# bench:   benchmarks/bench_gpu.py (OUT_DIR/bench.*);
# sweeps:  benchmarks/tune/run_sweeps.sh, the launch-layout sweeps ($SWEEPS families; OUT_DIR/sweeps);
# host:    benchmarks/host_overhead.py --device cuda (OUT_DIR/host_overhead_cuda.*), more arguments
#          from $HOST_ARGS (e.g. "--rounds 9");
# sanitize: compute-sanitizer memcheck over the KV-cache bad-index tests and the parity cases of
#          $SANITIZE_K (pytest -k; default: the block-table, MLA, batched-align, sigmoid and fused
#          fp8 ops), the caching allocator off so that every tensor is its own allocation
#          (OUT_DIR/sanitize.log);
# compat:  tools/engine_compat.py --device cuda over each folder of $COMPAT_DIRS (upstream test
#          files carried in an ignored folder, default ".upstream/vllm .upstream/sgl"), pytest -k
#          from $COMPAT_K_<folder name>, each folder stopped after $COMPAT_TIMEOUT s (default 300)
#          (OUT_DIR/compat_<folder name>.log);
# shards:  tools/engine_compat.py --device cuda over the folder $SHARDS_DIR, one process per pytest -k
#          expression of $SHARDS_K (";"-separated), side by side, each stopped after
#          $COMPAT_TIMEOUT s, the cores shared out among them (OMP_NUM_THREADS) (OUT_DIR/shard_<n>.log):
#          long upstream grids such as vLLM's swap_blocks;
# gemm-decode: the skinny-M kernel's tuner (M 1, 8, 16) and the select race at M 1, 4, 16 over every
#          backend, on top of the shipped tables, then bench_gemm.py at those M (OUT_DIR/gemm_decode/);
#          this GPU's tables in OUT_DIR/gemm_decode_tables.tgz (for python/opmux/kernels/configs/);
# gemm-prefill: the same for the CUTLASS kernel's configs (--backend cuda) and the race at
#          $GEMM_PREFILL_M (default 128,512,2048,8192): OUT_DIR/gemm_prefill/, gemm_prefill_tables.tgz;
#          budgets $GEMM_PREFILL_TUNE_S / $GEMM_PREFILL_RACE_S (150 s each; gemm-decode: $GEMM_DECODE_*),
#          extra tuner arguments $GEMM_PREFILL_TUNE_ARGS, the benchmark's $GEMM_TABLES_BENCH_S (0: none);
# gemm-jit: JIT-build gemm_cuda (a cache carried in OPMUX_CACHE_DIR is used when its key matches);
# gemm-grid / gemm-tune / gemm-bench: gemm.w8a8_block_fp8_matmul's vLLM grid (OUT_DIR/gemm_grid.log), its
#          tuner over the models' linear shapes into $GEMM_TUNE_OUT (default OUT_DIR/configs; the shipped
#          folder resumes from the shipped tables), one run per backend of $GEMM_TUNE_BACKENDS (default
#          triton; "triton cuda skinny select": select last; skinny takes M <= 16), arguments $GEMM_TUNE_ARGS, its benchmark
#          (OUT_DIR/gemm.{json,md}, $GEMM_BENCH_ARGS) with those tables in OPMUX_TUNED_CONFIG_DIR;
# moe-tune: moe.fused_experts's tuner, one --retune run per ";"-separated argument string of
#          $MOE_TUNE (e.g. "--models DeepSeek-V3 --m 1,8 --budget-s 70; --models Qwen3-30B-A3B --m 1
#          --budget-s 40"), into $OUT/moe_configs seeded with the shipped tables; vLLM's files in
#          $MOE_PEER_CONFIGS (a folder) are read as the user's, so a retune times their entries first;
# moe-bench: benchmarks/bench_moe.py, the four models with --layer, on $OUT/moe_configs when a
#          moe-tune stage wrote it (OUT_DIR/moe_bench.*), vLLM's files as the peer's ($MOE_PEER_CONFIGS);
# moe-decode: benchmarks/bench_moe.py at decode sizes (M 1, 4, 8, 16, 64), opmux's call forced onto
#          each backend (cuda, triton, cutlass) and the fastest written as select tables per shape
#          and M (OUT_DIR/moe_decode.{json,md}, OUT_DIR/moe_select.tgz: moe.fused_experts/<table>.json
#          for python/opmux/kernels/configs/; $MOE_DECODE_ARGS replaces the default budget); after a
#          moe-tune stage on its native decode tables only (MOE_TUNE="--backend cuda ..."), which go
#          into the archive too;
# moe-grid: tests/parity/test_moe_grid.py on every backend (decode path included), then
#          compute-sanitizer over its bad-id, expert_map and decode bad-id cases (OUT_DIR/moe_grid.log);
# comm:    the comm ops' parity cells on one GPU (one rank: the peer-buffer kernels' arithmetic and
#          bounds), compute-sanitizer over them, and the 2-8 GPU grid where the kind has the GPUs
#          (OUT_DIR/comm.log);
# prefill: attention.paged_prefill's GPU grid and parity samples (custom masks, non-causal), compute-sanitizer over its bad page tables and mask offsets, and
#          benchmarks/bench_attention_prefill.py (OUT_DIR/prefill*) with its select tables
#          (OUT_DIR/select.tgz: attention.paged_prefill/<table>.json, for python/opmux/kernels/configs/);
# decode:  attention.paged_decode's GPU grid (Triton, the native cuda unit, torch; forced split
#          counts, graph replay), its parity cells on cuda, compute-sanitizer over its bad page
#          tables, and benchmarks/bench_attention_decode.py (triton vs cuda; OUT_DIR/decode*) with
#          its select tables (OUT_DIR/decode_select.tgz: attention.paged_decode/<table>.json);
# sampling: the sampling ops' parity cells on cuda (every backend, the native unit included), their
#          statistical tests on the GPU (OPMUX_TEST_DEVICE=cuda; FlashInfer's too where installed),
#          compute-sanitizer memcheck over the native unit's and racecheck over its clustered draw
#          (OUT_DIR/sampling_sanitize.log), and
#          benchmarks/bench_sampling.py (OUT_DIR/sampling*), opmux's call also forced to each backend
#          of $SAMPLING_FORCED (default "jit,flashinfer"), with its select tables
#          (OUT_DIR/sampling_select.tgz: sampling.<op>/<table>.json, for python/opmux/kernels/configs/),
#          then bench_sampling.py again with those tables as OPMUX_TUNED_CONFIG_DIR: opmux's default
#          on them beside the peers (OUT_DIR/sampling_default*, #29's bar);
# tiles:   benchmarks/tune/decode_tiles.py and prefill_tiles.py, the attention kernels' launch
#          sweeps (OUT_DIR/decode_tiles, OUT_DIR/prefill_tiles) and the tuned tables they write
#          (OUT_DIR/tables.tgz: <op>/<table>.json, for python/opmux/kernels/configs/);
# pdl:     the two-kernel Triton launches with and without PDL between their kernels, side by side:
#          benchmarks/tune/decode_splits.py over $PDL_CASES (default: its own cases and short ones;
#          the merge off / from the split's start / after its stores beside the default, tile 32x4pf,
#          OUT_DIR/pdl_decode) and benchmarks/tune/moe_decode_pdl.py (OUT_DIR/pdl_moe; the group
#          quant on Triton: no JIT build in the stage); $PDL_BUDGET_S seconds for the first (140);
#          both take the `pdl` knobs of session 35's launches: a wheel of that tree, or OPMUX_FROM_TREE=1;
# "" (no stage): install only, into $SITE (a later command of the same call runs a script itself).
# OPMUX_FROM_TREE=1: test the tree's python/ (JIT only) instead of dist/cuda's wheel.
# chain:   benchmarks/bench_chain.py, the decoder-layer chains (OUT_DIR/bench_chain.{json,md},
#          chain.log); its arguments from $CHAIN_ARGS (default --budget-s 360).
# ncu:     benchmarks/ncu_gaps.py, Nsight Compute profiles of the cases where opmux's default is
#          slower than the fastest peer (OUT_DIR/ncu_gaps.{json,md}, ncu.log), on $NCU_BENCH (default
#          OUT_DIR/bench.json, i.e. a bench stage in the same call; a relative path is taken from the
#          repository root, e.g. NCU_BENCH=docs/benchmarks/h200.json); its arguments from $NCU_ARGS
#          (default --budget-s 420).
set -uo pipefail
OUT=${1:?usage: h200_run.sh OUT_DIR STAGES [bench args]}
STAGES=${2-"prewarm parity bench"}  # empty: install only
shift 2 || shift $#
REPO=$PWD
SITE=/tmp/opmux-env/site-packages   # a "site-packages" path: the parity harness refuses a tree
export PYTHONPATH=$SITE PYTHONUNBUFFERED=1 OPMUX_CACHE_DIR=${OPMUX_CACHE_DIR:-/tmp/opmux-jit-cache}
PARITY_TREE=()
if [[ ${OPMUX_FROM_TREE:-0} == 1 ]]; then
    # development runs: the tree's python/ (JIT kernels only, no AOT library), peers from .whl
    export PYTHONPATH=$REPO/python:$SITE
    PARITY_TREE=(--allow-tree)
    [[ -d $SITE/tvm_ffi ]] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
        --target "$SITE" .whl/*.whl || exit 1
elif [[ ! -d $SITE/opmux ]]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" \
        .whl/*.whl dist/cuda/opmux-*.whl || exit 1
fi
cd /tmp
python3 - <<'PY'
import opmux, torch, triton
print("opmux", opmux.__version__, opmux.__file__, opmux.build_info()["archs"], opmux.build_info()["aot"])
print("torch", torch.__version__, "triton", triton.__version__, torch.cuda.get_device_name())
PY
# gemm_tables NAME BACKEND TUNE_M RACE_M TUNE_S RACE_S EXTRA: one kernel's tuner (--backend BACKEND at
# TUNE_M) and the select race over every backend at RACE_M, on top of the shipped tables (entries
# already there are kept: EXTRA="--retune" times them again), then bench_gemm.py at RACE_M on them
# (OUT/gemm_NAME/; GEMM_TABLES_BENCH_S seconds, default 200, 0: none); the CUTLASS unit builds
# during the first tuner (before it, when that tuner is the CUTLASS kernel's own). This GPU's
# tables come back as one archive, OUT/gemm_NAME_tables.tgz (the shipped ones of other GPUs
# unchanged, left out).
gemm_tables() {
    local name=$1 backend=$2 tune_m=$3 race_m=$4 tune_s=$5 race_s=$6 extra=$7 fail=0 pre dev
    local cfgd=$OUT/gemm_configs
    local models="--models DeepSeek-V3,Qwen3-235B-A22B,Qwen3-32B,Llama-3.1-70B,Llama-3.1-8B --shapes 24576,7168"
    rm -rf "$cfgd"; mkdir -p "$cfgd"
    cp "$(python3 -c "from opmux.kernels import tuned; print(tuned.shipped_dir('gemm.w8a8_block_fp8_matmul'))")"/*.json "$cfgd/"
    (python3 -m opmux.kernels.jit prewarm --device cuda -j 8 --budget 300 --modules gemm_cuda > "$OUT/gemm_prewarm.log" 2>&1) &
    pre=$!
    # the CUDA kernel's own tuner needs the unit built
    [[ $backend == cuda ]] && { wait "$pre" || fail=1; tail -1 "$OUT/gemm_prewarm.log"; }
    # shellcheck disable=SC2086  # $models, $extra: words on purpose
    timeout $((tune_s + 60)) python3 -m opmux.kernels.tune gemm.w8a8_block_fp8_matmul --backend "$backend" $models \
        --m "$tune_m" --budget-s "$tune_s" --out "$cfgd" $extra 2>&1 | tee "$OUT/gemm_$name.log" | tail -2
    [[ ${PIPESTATUS[0]} -eq 0 ]] || fail=1
    [[ $backend == cuda ]] || { wait "$pre" || fail=1; tail -1 "$OUT/gemm_prewarm.log"; }
    # shellcheck disable=SC2086
    OPMUX_TUNED_CONFIG_DIR=$cfgd timeout $((race_s + 80)) python3 -m opmux.kernels.tune gemm.w8a8_block_fp8_matmul \
        --backend select $models --m "$race_m" --retune --budget-s "$race_s" --out "$cfgd" 2>&1 | tee -a "$OUT/gemm_$name.log" | tail -2
    [[ ${PIPESTATUS[0]} -eq 0 ]] || fail=1
    local bench_s=${GEMM_TABLES_BENCH_S:-200}  # 0: no benchmark
    if (( bench_s > 0 )); then
        OPMUX_TUNED_CONFIG_DIR=$cfgd timeout "$bench_s" python3 "$REPO/benchmarks/bench_gemm.py" --out "$OUT/gemm_$name" \
            --m "$race_m" --budget-s $(( bench_s * 3 / 4 )) 2>&1 | tee "$OUT/gemm_${name}_bench.log" | tail -1
        [[ ${PIPESTATUS[0]} -eq 0 ]] || fail=1
    fi
    dev=$(python3 -c "import torch; print(torch.cuda.get_device_name().replace(' ', '_'))")
    if compgen -G "$cfgd/*device_name=${dev},*" > /dev/null; then
        (cd "$OUT" && tar czf "gemm_${name}_tables.tgz" gemm_configs/*"device_name=${dev},"*) || fail=1
    else
        echo "gemm-$name: no tables for $dev"; fail=1
    fi
    rm -rf "$cfgd"
    return $fail
}

rc=0
for stage in $STAGES; do
    start=$(date +%s)
    case $stage in
        # $PREWARM_BUDGET_S (default 240): gemm_cuda, the CUTLASS unit, takes ~146 s alone on an
        # H100 and was cut at 150 (session 38), and its parity cell, building it under 8 workers'
        # load, failed there (it passed once the unit was built)
        prewarm) python3 -m opmux.kernels.jit prewarm --device cuda -j 8 --budget "${PREWARM_BUDGET_S:-240}" || rc=1 ;;
        # -v: every test's outcome by name in parity.log, so a run the call's limit cuts short still
        # says which failed (session 36: a -q log stopped at 26% showed seven F and no names)
        # -n: pytest-xdist's workers ($PARITY_WORKERS) where the image has it: the run is
        # mostly Triton compiling each cell's kernels on the CPU (session 37: one process reached 33%
        # of the suite in 530 s on an H100); the workers' matrix cells merge in the controller
        # (-p no:benchmark: the image's pytest-benchmark warns under xdist, an error in our config)
        parity) xd=(); python3 -c "import xdist" 2>/dev/null && xd=(-n "${PARITY_WORKERS:-12}" -p no:benchmark)
                pk=(); [[ -n ${PARITY_K:-} ]] && pk=(-k "$PARITY_K")
                python3 -m pytest "$REPO/tests/parity" --target cuda --matrix-out "$OUT/cuda.json" "${PARITY_TREE[@]}" "${xd[@]}" "${pk[@]}" \
                    -p no:cacheprovider --import-mode=importlib -v -ra --rootdir "$REPO" 2>&1 \
                    | tee "$OUT/parity.log" | grep -E "FAILED|ERROR|passed|failed" | tail -40; [[ ${PIPESTATUS[0]} -eq 0 ]] || rc=1 ;;
        bridge) python3 -m pytest "$REPO/tests/parity/test_torch_kernels.py" "$REPO/tests/parity/test_lanes.py" --target cuda \
                    "${PARITY_TREE[@]}" -p no:cacheprovider --import-mode=importlib -q -rA --rootdir "$REPO" 2>&1 \
                    | tee "$OUT/bridge.log" | grep -v '^PASSED' | tail -40; [[ ${PIPESTATUS[0]} -eq 0 ]] || rc=1 ;;
        bench) python3 "$REPO/benchmarks/bench_gpu.py" --out "$OUT" "$@" 2>&1 | tee "$OUT/bench.log" \
                    | grep -v '^ ' | tail -60; [[ ${PIPESTATUS[0]} -eq 0 ]] || rc=1 ;;
        # shellcheck disable=SC2086  # CHAIN_ARGS: words on purpose
        chain) python3 "$REPO/benchmarks/bench_chain.py" --out "$OUT" ${CHAIN_ARGS:---budget-s 360} 2>&1 \
                    | tee "$OUT/chain.log" | grep -v '^ ' | tail -60; [[ ${PIPESTATUS[0]} -eq 0 ]] || rc=1 ;;
        sweeps) (cd "$REPO" && bash benchmarks/tune/run_sweeps.sh "$OUT/sweeps" ${SWEEPS:-act norm quant}) \
                    || rc=1 ;;
        host) python3 "$REPO/benchmarks/host_overhead.py" --device cuda --out "$OUT" ${HOST_ARGS:-} 2>&1 \
                    | tee "$OUT/host.log" | tail -40; [[ ${PIPESTATUS[0]} -eq 0 ]] || rc=1 ;;
        ncu) nb=${NCU_BENCH:-$OUT/bench.json}; [[ $nb == /* ]] || nb=$REPO/$nb
             # shellcheck disable=SC2086  # NCU_ARGS: words on purpose
             python3 "$REPO/benchmarks/ncu_gaps.py" "$nb" --out "$OUT" ${NCU_ARGS:---budget-s 420} 2>&1 \
                    | tee "$OUT/ncu.log" | grep -v '^ ' | tail -60; [[ ${PIPESTATUS[0]} -eq 0 ]] || rc=1 ;;
        sanitize) PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout 420 compute-sanitizer --tool memcheck \
                    --error-exitcode 9 --print-limit 20 python3 -m pytest "$REPO/tests/parity/test_kvcache_bad_indices.py" \
                    "$REPO/tests/parity/test_parity.py" --target cuda "${PARITY_TREE[@]}" -p no:cacheprovider \
                    --import-mode=importlib -q -ra --rootdir "$REPO" \
                    -k "bad_indices or ${SANITIZE_K:-copy_blocks or gather_cache or concat_and_cache_mla or batched_moe or topk_sigmoid or static_quant_fp8}" \
                    2>&1 | tee "$OUT/sanitize.log" | tail -30; [[ ${PIPESTATUS[0]} -eq 0 ]] || rc=1 ;;
        compat) for d in ${COMPAT_DIRS:-.upstream/vllm .upstream/sgl}; do
                    n=$(basename "$d"); kv=COMPAT_K_${n//[^A-Za-z0-9_]/_}; k=${!kv:-}
                    timeout "${COMPAT_TIMEOUT:-300}" python3 "$REPO/tools/engine_compat.py" --device cuda "$REPO/$d" -- -q \
                        ${k:+-k "$k"} 2>&1 | tee "$OUT/compat_$n.log" | tail -45; [[ ${PIPESTATUS[0]} -eq 0 ]] || rc=1
                done ;;
        shards) # one upstream folder ($SHARDS_DIR), its -k shards ($SHARDS_K, ";"-separated) side by side
                : "${SHARDS_DIR:?SHARDS_DIR: a folder of upstream test files}"
                IFS=';' read -ra all <<< "${SHARDS_K:?SHARDS_K: pytest -k expressions separated by ;}"
                ks=(); for k in "${all[@]}"; do [[ -n ${k// /} ]] && ks+=("$k"); done  # no empty -k (= all)
                (( ${#ks[@]} )) || { echo "shards: SHARDS_K has no -k expression"; exit 2; }
                # the cores shared out: every shard with torch's default pool (all cores) thrashes
                threads=$(( $(nproc) / ${#ks[@]} )); (( threads > 0 )) || threads=1
                pids=(); i=0
                for k in "${ks[@]}"; do
                    i=$((i + 1))
                    OMP_NUM_THREADS=$threads timeout "${COMPAT_TIMEOUT:-300}" python3 "$REPO/tools/engine_compat.py" --device cuda \
                        "$REPO/$SHARDS_DIR" -- -q -k "$k" \
                        > "$OUT/shard_$i.log" 2>&1 &
                    pids+=("$!")
                done
                for p in "${pids[@]}"; do wait "$p" || rc=1; done
                for ((j = 1; j <= i; j++)); do echo "shard $j (${ks[j-1]}): $(tail -1 "$OUT/shard_$j.log")"; done ;;
        # gemm.w8a8_block_fp8_matmul: vLLM's grid on every backend, the tuner (resumable: the
        # tables already in $OUT/configs are kept), the benchmark against its peers
        gemm-jit) python3 -c "from opmux.kernels import jit; jit.load_module('gemm_cuda')" || rc=1 ;;
        gemm-grid) timeout "${GEMM_GRID_TIMEOUT:-200}" python3 -m pytest "$REPO/tests/parity/test_gemm_grid.py" --target cuda "${PARITY_TREE[@]}" \
                    -p no:cacheprovider --import-mode=importlib -q -rA --rootdir "$REPO" 2>&1 \
                    | tee "$OUT/gemm_grid.log" | tail -30; [[ ${PIPESTATUS[0]} -eq 0 ]] || rc=1 ;;
        # shellcheck disable=SC2086  # GEMM_TUNE_ARGS: words on purpose
        gemm-tune) for be in ${GEMM_TUNE_BACKENDS:-triton}; do  # select last: it races the others' tables
                    timeout "${GEMM_TUNE_TIMEOUT:-400}" python3 -m opmux.kernels.tune gemm.w8a8_block_fp8_matmul \
                        --out "${GEMM_TUNE_OUT:-$OUT/configs}" --backend "$be" \
                        ${GEMM_TUNE_ARGS:---models DeepSeek-V3,Qwen3-235B-A22B,Qwen3-32B,Llama-3.1-70B,Llama-3.1-8B --budget-s 300} \
                        2>&1 | tee -a "$OUT/gemm_tune.log" | tail -12; [[ ${PIPESTATUS[0]} -eq 0 ]] || rc=1
                    done ;;
        # shellcheck disable=SC2086  # GEMM_BENCH_ARGS: words on purpose
        gemm-bench) OPMUX_TUNED_CONFIG_DIR=${OPMUX_TUNED_CONFIG_DIR:-$OUT/configs} timeout "${GEMM_BENCH_TIMEOUT:-400}" python3 "$REPO/benchmarks/bench_gemm.py" \
                    --out "$OUT" ${GEMM_BENCH_ARGS:---budget-s 300} 2>&1 | tee "$OUT/gemm_bench.log" | tail -60; \
                    [[ ${PIPESTATUS[0]} -eq 0 ]] || rc=1 ;;
        gemm-decode) # the skinny kernel's tables and the select race at decode sizes (M <= 16)
                gemm_tables decode skinny 1,8,16 1,4,16 "${GEMM_DECODE_TUNE_S:-150}" "${GEMM_DECODE_RACE_S:-220}" \
                    "${GEMM_DECODE_TUNE_ARGS:-}" || rc=1 ;;
        gemm-prefill) # the CUTLASS kernel's configs and the select race at prefill sizes
                gemm_tables prefill cuda "${GEMM_PREFILL_M:-128,512,2048,8192}" "${GEMM_PREFILL_M:-128,512,2048,8192}" \
                    "${GEMM_PREFILL_TUNE_S:-150}" "${GEMM_PREFILL_RACE_S:-150}" "${GEMM_PREFILL_TUNE_ARGS:-}" || rc=1 ;;
        moe-tune) mkdir -p "$OUT/moe_configs"
                cp "$(python3 -c "from opmux.kernels import tuned; print(tuned.shipped_dir('moe.fused_experts'))")"/*.json "$OUT/moe_configs/"
                IFS=';' read -ra runs <<< "${MOE_TUNE:?MOE_TUNE: tuner arguments separated by ;}"
                for a in "${runs[@]}"; do
                    # shellcheck disable=SC2086  # one run's arguments: words on purpose
                    OPMUX_TUNED_CONFIG_DIR=${MOE_PEER_CONFIGS:+$REPO/$MOE_PEER_CONFIGS} timeout "${MOE_TUNE_TIMEOUT:-300}" \
                        python3 -m opmux.kernels.tune moe.fused_experts --retune --out "$OUT/moe_configs" $a 2>&1 \
                        | tee -a "$OUT/moe_tune.log" | grep -v '^  ' | tail -6; [[ ${PIPESTATUS[0]} -eq 0 ]] || rc=1
                done ;;
        moe-bench) cfg=(); [[ -d $OUT/moe_configs ]] && cfg=(env "OPMUX_TUNED_CONFIG_DIR=$OUT/moe_configs")
                # shellcheck disable=SC2086  # MOE_BENCH_ARGS: words on purpose
                "${cfg[@]}" timeout "${MOE_BENCH_TIMEOUT:-200}" python3 "$REPO/benchmarks/bench_moe.py" --out "$OUT" \
                    ${MOE_PEER_CONFIGS:+--peer-configs "$REPO/$MOE_PEER_CONFIGS"} --layer \
                    --models Mixtral-8x7B,Qwen3-30B-A3B,Qwen3-235B-A22B,DeepSeek-V3 ${MOE_BENCH_ARGS:---budget-s 180} \
                    2>&1 | tee "$OUT/moe_bench.log" | tail -8; [[ ${PIPESTATUS[0]} -eq 0 ]] || rc=1 ;;
        moe-decode) rm -rf "$OUT/moe_select" "$OUT/moe_decode" "$OUT/moe_cuda_tables"
                # only a moe-tune stage's native decode tables (--backend cuda): the select tables
                # must compare them against the Triton tables that ship, not a retune's
                cfg=()
                if [[ -d $OUT/moe_configs ]] && compgen -G "$OUT/moe_configs/*backend=cuda.json" > /dev/null; then
                    mkdir -p "$OUT/moe_cuda_tables" && cp "$OUT"/moe_configs/*backend=cuda.json "$OUT/moe_cuda_tables/"
                    cfg=(env "OPMUX_TUNED_CONFIG_DIR=$OUT/moe_cuda_tables")
                fi
                # shellcheck disable=SC2086  # MOE_DECODE_ARGS: words on purpose
                "${cfg[@]}" timeout "${MOE_DECODE_TIMEOUT:-240}" python3 "$REPO/benchmarks/bench_moe.py" --out "$OUT/moe_decode" \
                    --models Mixtral-8x7B,Qwen3-30B-A3B,Qwen3-235B-A22B,DeepSeek-V3 --m 1,4,8,16,64 \
                    --forced cuda,triton,cutlass --select-out "$OUT/moe_select" ${MOE_DECODE_ARGS:---budget-s 200} \
                    2>&1 | tee "$OUT/moe_decode.log" | tail -8; [[ ${PIPESTATUS[0]} -eq 0 ]] || rc=1
                for f in moe.json moe.md; do [[ -f $OUT/moe_decode/$f ]] && mv "$OUT/moe_decode/$f" "$OUT/moe_decode.${f#moe.}"; done
                rm -rf "$OUT/moe_decode"
                # the native decode tables the select tables were measured on go with them (a moe-tune
                # stage seeds its folder with the shipped ones: those come back unchanged unless retuned)
                if [[ -d $OUT/moe_cuda_tables ]]; then
                    mkdir -p "$OUT/moe_select/moe.fused_experts" && cp "$OUT"/moe_cuda_tables/*.json "$OUT/moe_select/moe.fused_experts/"
                    rm -rf "$OUT/moe_cuda_tables"
                fi
                # the tables' names hold characters the lent machine does not return: one archive
                [[ -d $OUT/moe_select ]] && (cd "$OUT" && tar czf moe_select.tgz moe_select && rm -rf moe_select) ;;
        moe-grid) timeout 300 python3 -m pytest "$REPO/tests/parity/test_moe_grid.py" --target cuda "${PARITY_TREE[@]}" \
                    -p no:cacheprovider --import-mode=importlib -q -ra --rootdir "$REPO" 2>&1 \
                    | tee "$OUT/moe_grid.log" | tail -8; [[ ${PIPESTATUS[0]} -eq 0 ]] || rc=1
                PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout 300 compute-sanitizer --tool memcheck --error-exitcode 9 \
                    python3 -m pytest "$REPO/tests/parity/test_moe_grid.py" --target cuda "${PARITY_TREE[@]}" \
                    -p no:cacheprovider --import-mode=importlib -q -ra --rootdir "$REPO" \
                    -k "decode_path_bad_ids or cuda_decode_bad_ids or ids_outside or expert_map" 2>&1 | tee -a "$OUT/moe_grid.log" | tail -6
                [[ ${PIPESTATUS[0]} -eq 0 ]] || rc=1 ;;
        prefill) timeout 300 python3 -m pytest "$REPO/tests/parity/test_attention_prefill_grid.py" --target cuda \
                    "${PARITY_TREE[@]}" -p no:cacheprovider --import-mode=importlib -q -ra --rootdir "$REPO" 2>&1 \
                    | tee "$OUT/prefill_grid.log" | tail -8; [[ ${PIPESTATUS[0]} -eq 0 ]] || rc=1
                # the op's parity samples on the GPU (custom masks, non-causal, fp8, MLA among them):
                # compile-bound (each sample a Triton specialisation; one process did two of its
                # nine cells in 120 s on an H100), so one process per query dtype, side by side
                pids=()
                # (-k matches substrings: "float16" alone would take bfloat16's cells too)
                for dt in float32 float16 bfloat16; do
                    case $dt in
                        float32) k="float32 or bad_input" ;;
                        float16) k="float16 and not bfloat16" ;;
                        *) k=$dt ;;
                    esac
                    timeout 300 python3 -m pytest "$REPO/tests/parity/test_parity.py" --target cuda "${PARITY_TREE[@]}" \
                        -p no:cacheprovider --import-mode=importlib -q -ra --rootdir "$REPO" \
                        -k "paged_prefill and ($k)" > "/tmp/prefill_parity_$dt.log" 2>&1 &
                    pids+=("$!")
                done
                for p in "${pids[@]}"; do wait "$p" || rc=1; done
                for dt in float32 float16 bfloat16; do  # one log back (the device tool returns 8 files)
                    cat "/tmp/prefill_parity_$dt.log" >> "$OUT/prefill_grid.log"
                    echo "prefill parity $dt: $(tail -1 "/tmp/prefill_parity_$dt.log")"
                done
                PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout 300 compute-sanitizer --tool memcheck --error-exitcode 9 \
                    python3 -m pytest "$REPO/tests/parity/test_attention_prefill_grid.py" --target cuda "${PARITY_TREE[@]}" \
                    -p no:cacheprovider --import-mode=importlib -q -ra --rootdir "$REPO" -k bad_page_tables 2>&1 \
                    | tee -a "$OUT/prefill_grid.log" | tail -6; [[ ${PIPESTATUS[0]} -eq 0 ]] || rc=1
                timeout 400 python3 "$REPO/benchmarks/bench_attention_prefill.py" --out "$OUT/prefill" --budget-s 300 \
                    --select-out "$OUT/select/attention.paged_prefill" 2>&1 \
                    | tee "$OUT/prefill_bench.log" | tail -8; [[ ${PIPESTATUS[0]} -eq 0 ]] || rc=1
                [[ -d $OUT/select ]] && (cd "$OUT" && tar czf select.tgz select && rm -rf select) ;;
        decode) timeout 420 python3 -m pytest "$REPO/tests/parity/test_attention_decode_grid.py" --target cuda \
                    "${PARITY_TREE[@]}" -p no:cacheprovider --import-mode=importlib -q -ra --rootdir "$REPO" 2>&1 \
                    | tee "$OUT/decode_grid.log" | tail -8; [[ ${PIPESTATUS[0]} -eq 0 ]] || rc=1
                timeout 300 python3 -m pytest "$REPO/tests/parity/test_parity.py" --target cuda "${PARITY_TREE[@]}" \
                    -p no:cacheprovider --import-mode=importlib -q -ra --rootdir "$REPO" -k paged_decode 2>&1 \
                    | tee -a "$OUT/decode_grid.log" | tail -6; [[ ${PIPESTATUS[0]} -eq 0 ]] || rc=1
                PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout 300 compute-sanitizer --tool memcheck --error-exitcode 9 \
                    python3 -m pytest "$REPO/tests/parity/test_attention_decode_grid.py" --target cuda "${PARITY_TREE[@]}" \
                    -p no:cacheprovider --import-mode=importlib -q -ra --rootdir "$REPO" -k "bad_page_tables or forced_split" 2>&1 \
                    | tee -a "$OUT/decode_grid.log" | tail -6; [[ ${PIPESTATUS[0]} -eq 0 ]] || rc=1
                timeout 400 python3 "$REPO/benchmarks/bench_attention_decode.py" --out "$OUT/decode" --budget-s 300 \
                    --select-out "$OUT/decode_select/attention.paged_decode" 2>&1 \
                    | tee "$OUT/decode_bench.log" | tail -8; [[ ${PIPESTATUS[0]} -eq 0 ]] || rc=1
                [[ -d $OUT/decode_select ]] && (cd "$OUT" && tar czf decode_select.tgz decode_select && rm -rf decode_select) ;;
        pdl) cases=${PDL_CASES:-Llama-3-8B:16:512,Qwen3-30B-A3B:16:512,Llama-3-8B:4:2048,Llama-3-8B:4:512,Qwen3-30B-A3B:16:1024,Llama-3-8B:16:4096,Llama-3-8B:1:4096,Llama-3-8B:1:32768,Qwen3-30B-A3B:16:32768,Llama-3-8B:64:512,Qwen3-30B-A3B:64:512,Llama-3-8B:256:512,Qwen3-30B-A3B:1:1024,Qwen3-30B-A3B:64:32768}
             timeout $(( ${PDL_BUDGET_S:-140} + 40 )) python3 "$REPO/benchmarks/tune/decode_splits.py" --out "$OUT/pdl_decode" \
                 --cases "$cases" --tiles 32x4pf --budget-s "${PDL_BUDGET_S:-140}" 2>&1 | tee "$OUT/pdl.log" \
                 | sed -n '/^|/p'; [[ ${PIPESTATUS[0]} -eq 0 ]] || rc=1
             OPMUX_KERNEL_BACKEND="quantization.*=triton" timeout 200 python3 "$REPO/benchmarks/tune/moe_decode_pdl.py" \
                 --out "$OUT/pdl_moe" 2>&1 | tee -a "$OUT/pdl.log" | tail -12; [[ ${PIPESTATUS[0]} -eq 0 ]] || rc=1 ;;
        sampling) timeout 300 python3 -m pytest "$REPO/tests/parity/test_parity.py" "$REPO/tests/parity/test_lanes.py" \
                    "$REPO/tests/parity/test_contract.py" --target cuda "${PARITY_TREE[@]}" -p no:cacheprovider \
                    --import-mode=importlib -q -ra --rootdir "$REPO" -k "sampling or top_k or top_p or greedy or min_p" \
                    2>&1 | tee "$OUT/sampling_parity.log" | tail -8; [[ ${PIPESTATUS[0]} -eq 0 ]] || rc=1
                # the statistics (mask, chi-square, determinism) on the GPU's backends, the native unit too
                OPMUX_TEST_DEVICE=cuda TRITON_INTERPRET=0 timeout 300 python3 -m pytest "$REPO/tests/unit/test_sampling_stats.py" \
                    -p no:cacheprovider --import-mode=importlib -q -ra --rootdir "$REPO" 2>&1 \
                    | tee -a "$OUT/sampling_parity.log" | tail -6; [[ ${PIPESTATUS[0]} -eq 0 ]] || rc=1
                # compute-sanitizer over the native unit's renorm / mask / long-row / past-L2 / buffer tests
                OPMUX_TEST_DEVICE=cuda TRITON_INTERPRET=0 PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout 200 compute-sanitizer \
                    --tool memcheck --error-exitcode 9 --print-limit 20 python3 -m pytest "$REPO/tests/unit/test_sampling_stats.py" \
                    -p no:cacheprovider --import-mode=importlib -q -ra --rootdir "$REPO" \
                    -k "jit and (long_rows or mask or renorm or past_l2 or caller or per_row)" 2>&1 \
                    | tee "$OUT/sampling_sanitize.log" | tail -4; [[ ${PIPESTATUS[0]} -eq 0 ]] || rc=1
                # racecheck over the clustered top-k-first draw (distributed shared memory)
                OPMUX_TEST_DEVICE=cuda TRITON_INTERPRET=0 timeout 200 compute-sanitizer --tool racecheck \
                    --error-exitcode 9 --print-limit 20 python3 -m pytest "$REPO/tests/unit/test_sampling_stats.py" \
                    -p no:cacheprovider --import-mode=importlib -q -ra --rootdir "$REPO" -k "clustered_kept_union_small" \
                    2>&1 | tee -a "$OUT/sampling_sanitize.log" | tail -4; [[ ${PIPESTATUS[0]} -eq 0 ]] || rc=1
                timeout 400 python3 "$REPO/benchmarks/bench_sampling.py" --out "$OUT/sampling" --budget-s 300 \
                    --forced "${SAMPLING_FORCED-jit,flashinfer}" --select-out "$OUT/sampling_select" 2>&1 \
                    | tee "$OUT/sampling_bench.log" | tail -8; [[ ${PIPESTATUS[0]} -eq 0 ]] || rc=1
                # the default on the tables just written (they alone decide it: one per vocabulary),
                # beside the peers: the bar's own table (OUT_DIR/sampling_default*)
                if [[ -d $OUT/sampling_select ]]; then
                    OPMUX_TUNED_CONFIG_DIR=$OUT/sampling_select timeout 400 python3 "$REPO/benchmarks/bench_sampling.py" \
                        --out "$OUT/sampling_default" --budget-s 300 2>&1 | tee "$OUT/sampling_default.log" | tail -4
                    [[ ${PIPESTATUS[0]} -eq 0 ]] || rc=1
                    (cd "$OUT" && tar czf sampling_select.tgz sampling_select && rm -rf sampling_select)
                fi ;;
        comm) # one GPU: the comm ops' parity cells at one rank (the peer-buffer kernels' arithmetic
              # and bounds: their barriers are no-ops), then compute-sanitizer over them; the 2-8 GPU
              # grid and benchmarks/bench_comm.py need a multi-GPU kind
              timeout 300 python3 -m pytest "$REPO/tests/parity/test_parity.py" --target cuda "${PARITY_TREE[@]}" \
                    -p no:cacheprovider --import-mode=importlib -q -ra --rootdir "$REPO" -k "comm" 2>&1 \
                    | tee "$OUT/comm.log" | tail -8; [[ ${PIPESTATUS[0]} -eq 0 ]] || rc=1
              PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout 300 compute-sanitizer --tool memcheck --error-exitcode 9 \
                    python3 -m pytest "$REPO/tests/parity/test_parity.py" --target cuda "${PARITY_TREE[@]}" \
                    -p no:cacheprovider --import-mode=importlib -q --rootdir "$REPO" -k "comm and (oneshot or twoshot)" \
                    2>&1 | tee -a "$OUT/comm.log" | tail -8; [[ ${PIPESTATUS[0]} -eq 0 ]] || rc=1
              OPMUX_TEST_COMM_GPUS=1 timeout 400 python3 -m pytest "$REPO/tests/unit/test_comm_groups.py" -k gpu \
                    -p no:cacheprovider --import-mode=importlib -q -ra --rootdir "$REPO" 2>&1 \
                    | tee -a "$OUT/comm.log" | tail -8; [[ ${PIPESTATUS[0]} -eq 0 ]] || rc=1 ;;
        # the attention kernels' launch sweeps (the data behind their tile_config)
        tiles) timeout 200 python3 "$REPO/benchmarks/tune/decode_tiles.py" --out "$OUT/decode_tiles" --budget-s 120 \
                    --table-out "$OUT/tables/attention.paged_decode" 2>&1 | tail -40; [[ ${PIPESTATUS[0]} -eq 0 ]] || rc=1
                timeout 200 python3 "$REPO/benchmarks/tune/prefill_tiles.py" --out "$OUT/prefill_tiles" --budget-s 120 \
                    --table-out "$OUT/tables/attention.paged_prefill" 2>&1 | tail -40; [[ ${PIPESTATUS[0]} -eq 0 ]] || rc=1
                # the tables' names hold '=' and ',': the device tool returns them only inside a tar
                (cd "$OUT" && tar czf tables.tgz tables && rm -rf tables) ;;
        *) echo "unknown stage $stage"; exit 2 ;;
    esac
    echo "== $stage: $(( $(date +%s) - start )) s"
done
exit $rc
