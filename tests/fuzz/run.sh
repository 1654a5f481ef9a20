#!/usr/bin/env bash
# run.sh -- the libFuzzer targets: replay each committed corpus, then fuzz.
#
#   tests/fuzz/run.sh [SECONDS]
#
# Sets up and builds build-fuzz when it is missing (clang, ASan + UBSan,
# libFuzzer; the build dir can be changed with FUZZ_BUILD_DIR). Then, for
# each of fuzz_token, fuzz_request, fuzz_message and fuzz_config:
#   1. replays tests/fuzz/corpus/<name>/ (-runs=0: every seed once, leak
#      checks on), reading the committed corpus and never writing to it;
#   2. fuzzes for SECONDS (default 10; 0 skips this step) with the target's
#      dictionary, starting from a temporary copy of the corpus.
# Each replay and each timed run counts as one test; the last line is
#   fuzz: <P> passed, <F> failed
# and the exit status is non-zero when any crash, leak, timeout or
# out-of-memory was found. Findings (crash-*, leak-*, timeout-*, oom-*) are
# printed in base64 with the sanitizer's report, and kept in FUZZ_ARTIFACTS
# (a directory) when that is set. FUZZ_OUT=DIR keeps each grown corpus in
# DIR/<name>/ for review (merge into the committed one with -merge=1).
set -u
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"

secs=${1:-10}
case $secs in
'' | *[!0-9]*) echo "usage: $0 [SECONDS]" >&2; exit 2 ;;
esac
bdir=${FUZZ_BUILD_DIR:-build-fuzz}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# name : -max_len (fuzz_token reads at most PL_TOKEN_MAX + 64 bytes; the
# request target's biggest limits are 16 KiB of headers and 64 KiB of body,
# but short inputs reach everything and run faster; a config line is at
# most 1024 bytes)
targets="fuzz_token:4200 fuzz_request:8192 fuzz_message:8192 fuzz_config:8192"
ntests=$(echo $targets | wc -w)
[ "$secs" -gt 0 ] && ntests=$((ntests * 2))

give_up() {
    echo "$1"
    echo "fuzz: 0 passed, $ntests failed"
    exit 1
}

if [ ! -f "$bdir/build.ninja" ]; then
    CC=clang meson setup "$bdir" -Dfuzzing=true -Db_sanitize=address,undefined \
        -Db_lundef=false >"$tmp/setup.log" 2>&1 ||
        { tail -30 "$tmp/setup.log"; give_up "fuzz: meson setup of $bdir failed"; }
fi
exes=""
for t in $targets; do exes="$exes tests/fuzz/${t%%:*}"; done
# shellcheck disable=SC2086
ninja -C "$bdir" $exes >"$tmp/ninja.log" 2>&1 ||
    { tail -40 "$tmp/ninja.log"; give_up "fuzz: build failed (is $bdir set up with -Dfuzzing=true?)"; }

# UBSan findings must stop the run, whatever the caller set before.
export UBSAN_OPTIONS="${UBSAN_OPTIONS:+$UBSAN_OPTIONS:}halt_on_error=1:print_stacktrace=1"

passed=0 failed=0

# Prints what a failed run left behind: the report and each artifact.
report() { # report LOG ARTDIR
    grep -E -A 24 'ERROR: |runtime error|check failed|SUMMARY' "$1" | head -60
    for a in "$2"/*; do
        [ -f "$a" ] || continue
        echo "  artifact $(basename "$a") ($(stat -c %s "$a") bytes), base64:"
        base64 -w 76 "$a" | head -60 | sed 's/^/    /'
        if [ -n "${FUZZ_ARTIFACTS:-}" ]; then
            mkdir -p "$FUZZ_ARTIFACTS" && cp "$a" "$FUZZ_ARTIFACTS/"
        fi
    done
}

# The last "cov: N" of a libFuzzer status line matching PATTERN.
cov_of() { # cov_of LOG PATTERN
    grep -E "$2" "$1" | tail -1 | sed -n 's/.* cov: \([0-9]*\).*/\1/p'
}

stat_of() { # stat_of LOG NAME
    sed -n "s/^stat::$2: *\([0-9]*\).*/\1/p" "$1" | tail -1
}

for t in $targets; do
    name=${t%%:*} maxlen=${t#*:}
    short=${name#fuzz_}
    bin="$bdir/tests/fuzz/$name"
    corpus="tests/fuzz/corpus/$short"
    dict="tests/fuzz/$short.dict"
    art="$tmp/art-$name"
    mkdir -p "$art"

    # 1. replay
    log="$tmp/replay-$name.log"
    "$bin" -runs=0 -max_len="$maxlen" -timeout=10 -artifact_prefix="$art/" \
        "$corpus" >"$log" 2>&1
    rc=$?
    files=$(sed -n 's/.*seed corpus: files: \([0-9]*\).*/\1/p' "$log" | tail -1)
    cov=$(cov_of "$log" 'INITED|DONE')
    if [ $rc -eq 0 ] && [ -z "$(ls -A "$art")" ]; then
        echo "$name replay: ${files:-?} inputs, coverage ${cov:-?} edges: ok"
        passed=$((passed + 1))
    else
        echo "$name replay: ${files:-?} inputs: FAILED (exit $rc)"
        report "$log" "$art"
        failed=$((failed + 1))
    fi

    # 2. fuzz for a while, from a copy of the corpus
    [ "$secs" -gt 0 ] || continue
    work="$tmp/corpus-$name"
    rm -rf "$work" "$art"
    mkdir -p "$art"
    cp -r "$corpus" "$work"
    log="$tmp/fuzz-$name.log"
    "$bin" -max_total_time="$secs" -max_len="$maxlen" -timeout=10 -rss_limit_mb=2048 \
        -dict="$dict" -print_final_stats=1 -artifact_prefix="$art/" "$work" >"$log" 2>&1
    rc=$?
    execs=$(stat_of "$log" number_of_executed_units)
    rate=$(stat_of "$log" average_exec_per_sec)
    units=$(stat_of "$log" new_units_added)
    cov0=$(cov_of "$log" 'INITED')
    cov1=$(cov_of "$log" '^#[0-9]+')
    found=$(ls -A "$art" | wc -l)
    line="$name fuzz ${secs}s: ${execs:-?} executions, ${rate:-?} exec/s, coverage ${cov0:-?} -> ${cov1:-?} edges, ${units:-?} new inputs, $found crashes"
    if [ $rc -eq 0 ] && [ "$found" -eq 0 ]; then
        echo "$line: ok"
        passed=$((passed + 1))
    else
        echo "$line: FAILED (exit $rc)"
        report "$log" "$art"
        failed=$((failed + 1))
    fi
    if [ -n "${FUZZ_OUT:-}" ]; then
        mkdir -p "$FUZZ_OUT" && rm -rf "${FUZZ_OUT:?}/$short" && cp -r "$work" "$FUZZ_OUT/$short"
    fi
done

echo "fuzz: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
