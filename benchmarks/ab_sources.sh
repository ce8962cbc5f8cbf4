#!/usr/bin/env bash
# One command timed twice in one GPU call: on the tree, then with some of its files replaced by
# another revision's, so a kernel change and its baseline run side by side on the same card
# (the device copy of the tree has no git history, so the base files travel in an ignored folder).
#
#   # here, before the call: the base revision's copies of the files under .ab/<rev>/ (git-ignored)
#   bash benchmarks/ab_sources.sh prepare 202bead python/opmux/kernels/jit/csrc/sampling_cuda.cu
#   # on the GPU machine (run's carry: [".ab", ...]); {side} in the command becomes "tree", then each
#   # base folder's name (a revision's slashes become '_': .ab/wip_x for wip/x)
#   bash benchmarks/ab_sources.sh run .ab/202bead -- python3 benchmarks/bench_sampling.py --out OUT/{side} --forced jit
#   bash benchmarks/ab_sources.sh run .ab/main .ab/wip_x -- COMMAND   # the tree and two bases, in that order
#
# `run` swaps each base's copies in for its run (files a base lacks stay the tree's) and always puts
# the tree's files back (a trap), so a JIT cache keyed on the sources rebuilds for each side. Exit
# status: the first failure's.
#
# AB_PREWARM="sampling_cuda ..." builds those JIT modules for every side at once before the runs,
# instead of one side after the other inside them: each side's python/ (the tree's, with the side's
# files over it) is copied under a scratch folder and prewarmed into its own cache,
# $AB_CACHE_ROOT/<side> (default ${TMPDIR:-/tmp}/ab_cache, kept: a later call with the same sources
# builds nothing), the cores shared out (-j); each side's command then runs with OPMUX_CACHE_DIR set
# to its cache. The cache key is the sources' content, so the swapped tree finds the copy's build.
# AB_PREWARM_CMD replaces the prewarm command ("python3 -m opmux.kernels.jit prewarm --device cuda";
# "-j N --modules ..." follow it).
set -uo pipefail
cmd=${1:-}
shift || true
case $cmd in
    prepare)
        rev=${1:?usage: ab_sources.sh prepare REV FILE...}
        shift
        [[ $# -gt 0 ]] || { echo "ab_sources.sh prepare: name the files to take from $rev" >&2; exit 2; }
        out=.ab/${rev//\//_}
        rm -rf "$out" && mkdir -p "$out" || exit 1
        git archive "$rev" -- "$@" | tar -x -C "$out" || { echo "ab_sources.sh: git archive $rev failed" >&2; exit 1; }
        (cd "$out" && find . -type f ! -name .files | sed "s|^\./||" | sort) > "$out/.files"
        echo "ab_sources.sh: $(wc -l < "$out/.files") file(s) of $rev in $out" ;;
    run)
        bases=()
        while [[ $# -gt 0 && $1 != -- ]]; do bases+=("$1"); shift; done
        [[ ${1:-} == -- ]] && shift
        [[ ${#bases[@]} -gt 0 && $# -gt 0 ]] || { echo "usage: ab_sources.sh run BASE_DIR... -- COMMAND..." >&2; exit 2; }
        sides=(tree "${bases[@]}") names=(tree)  # names[i]: side i's {side}
        seen=" tree "
        for b in "${bases[@]}"; do
            [[ -f $b/.files ]] || { echo "ab_sources.sh run: $b/.files missing (prepare first)" >&2; exit 2; }
            n=$(basename "$b")
            # each side's name ({side}) must be its own: two alike would write one output twice
            [[ $seen != *" $n "* ]] || { echo "ab_sources.sh run: two sides would be named '$n' (bases' folder names must differ, and not be 'tree')" >&2; exit 2; }
            seen+="$n "
            names+=("$n")
        done
        keep=$(mktemp -d)
        files=()
        for b in "${bases[@]}"; do mapfile -t -O "${#files[@]}" files < "$b/.files"; done
        restore() { for f in "${files[@]}"; do [[ -f $keep/$f ]] && cp "$keep/$f" "$f"; done; rm -rf "$keep"; }
        trap restore EXIT
        for f in "${files[@]}"; do
            [[ -f $f ]] || { echo "ab_sources.sh run: $f is not in the tree (a base may only replace files)" >&2; exit 2; }
            [[ -f $keep/$f ]] || { mkdir -p "$keep/$(dirname "$f")" && cp "$f" "$keep/$f"; } || exit 1
        done
        cache_root=${AB_CACHE_ROOT:-${TMPDIR:-/tmp}/ab_cache}
        [[ $cache_root == /* ]] || cache_root=$PWD/$cache_root  # opmux refuses a relative cache
        if [[ -n ${AB_PREWARM:-} ]]; then
            read -ra modules <<< "$AB_PREWARM"
            read -ra prewarm <<< "${AB_PREWARM_CMD:-python3 -m opmux.kernels.jit prewarm --device cuda}"
            [[ ${#modules[@]} -gt 0 ]] || { echo "ab_sources.sh run: AB_PREWARM names no module" >&2; exit 2; }
            [[ -d python ]] || { echo "ab_sources.sh run: AB_PREWARM needs the tree's python/" >&2; exit 2; }
            jobs=$(( $(nproc) / ${#sides[@]} )); (( jobs > 0 )) || jobs=1
            pids=()
            for i in "${!sides[@]}"; do
                side=${sides[$i]} name=${names[$i]}
                copy=$keep/sides/$name
                # the tree is still its own here (the swaps come later): its python/, the side's files over it
                # (a cache folder only its owner may write: opmux refuses a group-writable one)
                mkdir -p "$copy" && mkdir -p -m 700 "$cache_root" "$cache_root/$name" && cp -r python "$copy/" || exit 1
                if [[ $side != tree ]]; then
                    mapfile -t own < "$side/.files"
                    for f in "${own[@]}"; do
                        [[ $f != python/* ]] || cp "$side/$f" "$copy/$f" || exit 1
                    done
                fi
                (OPMUX_CACHE_DIR=$cache_root/$name PYTHONPATH=$copy/python${PYTHONPATH:+:$PYTHONPATH} \
                    "${prewarm[@]}" -j "$jobs" --modules "${modules[@]}" > "$copy.log" 2>&1) &
                pids+=($!)
            done
            # every build waited for, failed or not (none left running over the copies the trap removes)
            failed=0
            for i in "${!sides[@]}"; do
                name=${names[$i]}
                if wait "${pids[$i]}"; then
                    echo "== ab_sources.sh: prewarm $name: $(tail -1 "$keep/sides/$name.log")"
                else
                    echo "== ab_sources.sh: prewarm $name failed:" >&2; tail -5 "$keep/sides/$name.log" >&2; failed=1
                fi
            done
            [[ $failed -eq 0 ]] || exit 1
        fi
        rc=0
        for i in "${!sides[@]}"; do
            side=${sides[$i]} name=${names[$i]}
            for f in "${files[@]}"; do cp "$keep/$f" "$f" || exit 1; done  # the tree's, then this side's
            if [[ $side != tree ]]; then
                mapfile -t own < "$side/.files"
                for f in "${own[@]}"; do cp "$side/$f" "$f" || exit 1; done
            fi
            echo "== ab_sources.sh: $name"
            # (a subshell: the side's cache, when prewarmed, for this side only; quoted: '&' stays itself)
            ( [[ -z ${AB_PREWARM:-} ]] || export OPMUX_CACHE_DIR=$cache_root/$name
              "${@//\{side\}/"$name"}" ) || { r=$?; [[ $rc -eq 0 ]] && rc=$r; }
        done
        exit $rc ;;
    *)
        echo "usage: ab_sources.sh prepare REV FILE... | run BASE_DIR... -- COMMAND..." >&2
        exit 2 ;;
esac
