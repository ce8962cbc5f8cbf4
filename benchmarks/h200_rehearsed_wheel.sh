#!/usr/bin/env bash
# On the H200: the cu13 wheel the release rehearsal built (copied to .reh/, with tests/tools/benchmarks
# of the same commit under .reh/src via `git archive HEAD tests tools benchmarks` and the peer and
# apache-tvm-ffi wheels under .reh/whl), carried as [".reh"]: parity-cuda, then benchmarks/host_overhead.py.
# STAGES (default "parity host") picks the stages; "bench" runs benchmarks/bench_gpu.py (OUT/bench.*,
# OUT/bench.log; arguments from $BENCH_ARGS, default --budget-s 420); "chain" runs benchmarks/bench_chain.py, the
# decoder-layer chains (OUT/bench_chain.{json,md}, OUT/chain.log; arguments from $CHAIN_ARGS, default
# --budget-s 360), e.g. `STAGES=chain OUT=$OUT bash .reh/src/benchmarks/h200_rehearsed_wheel.sh`.
# "ncu" runs benchmarks/ncu_gaps.py (Nsight Compute profiles of the cases where opmux's default is
# slower than the fastest peer: OUT/ncu_gaps.{json,md}, OUT/ncu.log) on $NCU_BENCH (default
# OUT/bench.json; a relative path is taken from the directory this is started in, e.g. a bench.json
# carried as .reh/bench.json); arguments from $NCU_ARGS (default --budget-s 420).
set -uo pipefail
OUT=${OUT:?}
STAGES=${STAGES:-"parity host"}
R=$PWD/.reh
TOP=$PWD
SITE=/tmp/opmux-env/site-packages
export PYTHONPATH=$SITE PYTHONUNBUFFERED=1 OPMUX_CACHE_DIR=/tmp/opmux-jit-cache
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" $R/whl/*.whl $R/opmux-*.whl || exit 1
cd /tmp
python3 -c "import opmux; i=opmux.build_info(); print(i['commit'], i['cuda'])"
python3 -m opmux.kernels.jit prewarm --device cuda -j 12 --budget 200 2>&1 | tail -2
prc=0 brc=0 hrc=0 crc=0 nrc=0
if [[ " $STAGES " == *" parity "* ]]; then
    start=$(date +%s)
    python3 -m pytest $R/src/tests/parity --target cuda --matrix-out "$OUT/cuda.json" -p no:cacheprovider --import-mode=importlib -q -ra --rootdir $R/src 2>&1 | tee "$OUT/parity.log" | tail -4
    prc=${PIPESTATUS[0]}
    echo "== parity $(( $(date +%s) - start )) s rc=$prc"
fi
if [[ " $STAGES " == *" bench "* ]]; then
    start=$(date +%s)
    # shellcheck disable=SC2086  # BENCH_ARGS: words on purpose
    timeout 540 python3 $R/src/benchmarks/bench_gpu.py --out "$OUT" ${BENCH_ARGS:---budget-s 420} 2>&1 | tee "$OUT/bench.log" | grep -v '^ ' | tail -30
    brc=${PIPESTATUS[0]}
    echo "== bench $(( $(date +%s) - start )) s rc=$brc"
fi
if [[ " $STAGES " == *" host "* ]]; then
    start=$(date +%s)
    python3 -c "import flashinfer; print('flashinfer', flashinfer.__version__)" 2>&1 | tail -1
    timeout 420 python3 $R/src/benchmarks/host_overhead.py --device cuda --out "$OUT" 2>&1 | tee "$OUT/host.log" | tail -45
    hrc=${PIPESTATUS[0]}
    echo "== host_overhead $(( $(date +%s) - start )) s rc=$hrc"
fi
if [[ " $STAGES " == *" chain "* ]]; then
    start=$(date +%s)
    # shellcheck disable=SC2086  # CHAIN_ARGS: words on purpose
    timeout 420 python3 $R/src/benchmarks/bench_chain.py --out "$OUT" ${CHAIN_ARGS:---budget-s 360} 2>&1 | tee "$OUT/chain.log" | grep -v '^ ' | tail -45
    crc=${PIPESTATUS[0]}
    echo "== chain $(( $(date +%s) - start )) s rc=$crc"
fi
if [[ " $STAGES " == *" ncu "* ]]; then
    start=$(date +%s)
    nb=${NCU_BENCH:-$OUT/bench.json}; [[ $nb == /* ]] || nb=$TOP/$nb
    # shellcheck disable=SC2086  # NCU_ARGS: words on purpose
    timeout 540 python3 $R/src/benchmarks/ncu_gaps.py "$nb" --out "$OUT" ${NCU_ARGS:---budget-s 420} 2>&1 | tee "$OUT/ncu.log" | grep -v '^ ' | tail -45
    nrc=${PIPESTATUS[0]}
    echo "== ncu $(( $(date +%s) - start )) s rc=$nrc"
fi
exit $(( prc || brc || hrc || crc || nrc ))
