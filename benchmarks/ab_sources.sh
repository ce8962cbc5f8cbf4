#!/usr/bin/env bash
# One command timed twice in one GPU call: on the tree, then with some of its files replaced by
# another revision's, so a kernel change and its baseline run side by side on the same card
# (the device copy of the tree has no git history, so the base files travel in an ignored folder).
#
#   # here, before the call: the base revision's copies of the files under .ab/<rev>/ (git-ignored)
#   bash benchmarks/ab_sources.sh prepare 202bead python/opmux/kernels/jit/csrc/sampling_cuda.cu
#   # on the GPU machine (run's carry: [".ab", ...]); {side} in the command becomes "tree" or "base"
#   bash benchmarks/ab_sources.sh run .ab/202bead -- python3 benchmarks/bench_sampling.py --out OUT/{side} --forced jit
#
# `run` swaps the base copies in for the second run and always puts the tree's files back (a trap),
# so a JIT cache keyed on the sources rebuilds for each side. Exit status: the first failure's.
set -uo pipefail
cmd=${1:-}
shift || true
case $cmd in
    prepare)
        rev=${1:?usage: ab_sources.sh prepare REV FILE...}
        shift
        [[ $# -gt 0 ]] || { echo "ab_sources.sh prepare: name the files to take from $rev" >&2; exit 2; }
        out=.ab/$rev
        rm -rf "$out" && mkdir -p "$out" || exit 1
        git archive "$rev" -- "$@" | tar -x -C "$out" || { echo "ab_sources.sh: git archive $rev failed" >&2; exit 1; }
        (cd "$out" && find . -type f ! -name .files | sed "s|^\./||" | sort) > "$out/.files"
        echo "ab_sources.sh: $(wc -l < "$out/.files") file(s) of $rev in $out" ;;
    run)
        base=${1:?usage: ab_sources.sh run BASE_DIR -- COMMAND...}
        shift
        [[ ${1:-} == -- ]] && shift
        [[ $# -gt 0 && -f $base/.files ]] || { echo "ab_sources.sh run: $base/.files missing (prepare first)" >&2; exit 2; }
        keep=$(mktemp -d)
        mapfile -t files < "$base/.files"
        restore() { for f in "${files[@]}"; do [[ -f $keep/$f ]] && cp "$keep/$f" "$f"; done; rm -rf "$keep"; }
        trap restore EXIT
        for f in "${files[@]}"; do mkdir -p "$keep/$(dirname "$f")" && cp "$f" "$keep/$f" || exit 1; done
        rc=0
        for side in tree base; do
            if [[ $side == base ]]; then
                for f in "${files[@]}"; do cp "$base/$f" "$f" || exit 1; done
            fi
            echo "== ab_sources.sh: $side"
            "${@//\{side\}/$side}" || { r=$?; [[ $rc -eq 0 ]] && rc=$r; }
        done
        exit $rc ;;
    *)
        echo "usage: ab_sources.sh prepare REV FILE... | run BASE_DIR -- COMMAND..." >&2
        exit 2 ;;
esac
