#!/usr/bin/env bash
# Build and run the launch-layout sweeps (sweep_cuda.cu) on the GPU machine, families in
# parallel builds, runs one after another; results in OUT_DIR/sweeps.txt (one file: the device
# tool brings back at most 8). From the repository root, with tvm-ffi importable:
#   bash benchmarks/tune/run_sweeps.sh OUT_DIR [act norm quant sampling]
set -uo pipefail
OUT=${1:?usage: run_sweeps.sh OUT_DIR [families]}
shift
FAMILIES=${*:-act norm quant}
TI=$(python3 -c "import tvm_ffi, os; print(os.path.dirname(tvm_ffi.__file__))") || exit 1
NVCC=${NVCC:-nvcc}
mkdir -p "$OUT"
for f in $FAMILIES; do
  FLAG=$(echo "$f" | tr a-z A-Z)
  $NVCC -std=c++17 -O3 -gencode arch=compute_90a,code=sm_90a -Xptxas -v \
    -I python/opmux/kernels/jit/include -I python/opmux/kernels/jit/csrc -I "$TI/include" \
    -DSWEEP_$FLAG benchmarks/tune/sweep_cuda.cu -L "$TI/lib" -ltvm_ffi -Xlinker -rpath="$TI/lib" \
    -o "/tmp/sweep_$f" > "/tmp/sweep_build_$f.log" 2>&1 &
done
wait
for f in $FAMILIES; do
  if [[ -x /tmp/sweep_$f ]]; then
    echo "== sweep $f"; "/tmp/sweep_$f" 2>&1 | tee -a "$OUT/sweeps.txt"
  else
    echo "== sweep $f: build failed"; tail -20 "/tmp/sweep_build_$f.log" | tee -a "$OUT/sweeps.txt"
  fi
done
