#!/usr/bin/env bash
# run.sh -- the whole test suite, as CI runs it: installs what is missing;
# builds pilotlight plain, as released (deploy/build.sh) and with
# AddressSanitizer + UBSan; runs the unit tests against the plain and the
# sanitizer build, the black-box suite (tests/blackbox/) and the tests of
# pilotlight with other programs (tests/interop/) against the released
# build, and the parts of both whose paths only a whole suite reaches
# against the sanitizer build, the black-box suite once more under valgrind
# (the plain build), a
# short soak, and the libFuzzer targets (their own clang build); ends with
# one line of totals: "N passed, N failed" (after the skipped count and the
# time taken).
#
# While working, run the part you touch: `meson test -C build --suite unit`
# (every unit test, in seconds), or one pytest file (tests/README.md).
set -u
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
# PL_TEST_OUT=DIR keeps the logs and JUnit files there (each test's time
# is in them); else they go with a temporary directory.
if [ -n "${PL_TEST_OUT:-}" ]; then
    out=$PL_TEST_OUT
    mkdir -p "$out"
else
    out=$(mktemp -d)
    trap 'rm -rf "$out"' EXIT
fi

deploy/install-deps.sh --test || { echo "dependency install failed"; echo "0 passed, 1 failed"; exit 1; }

build() { # build DIR [meson options...]
    local dir=$1; shift
    [ -f "$dir/build.ninja" ] || meson setup "$dir" "$@" >"$out/setup-$dir.log" 2>&1 ||
        { cat "$out/setup-$dir.log"; return 1; }
    ninja -C "$dir" >"$out/ninja-$dir.log" 2>&1 || { cat "$out/ninja-$dir.log"; return 1; }
}

passed=0 failed=0 skipped=0
add() { passed=$((passed + $1)); failed=$((failed + $2)); skipped=$((skipped + ${3:-0})); }

# Unit tests: each RUN() line of each test binary counts once.
unit() { # unit BUILDDIR LABEL
    local t0=$SECONDS
    meson test -C "$1" --suite unit --print-errorlogs --verbose >"$out/unit-$2.log" 2>&1
    local rc=$? ok bad
    ok=$(grep -cE '^ok  ' "$out/unit-$2.log")
    bad=$(grep -cE '^FAIL ' "$out/unit-$2.log")
    [ $rc -ne 0 ] && [ "$bad" -eq 0 ] && bad=1 # a crash before any RUN line
    echo "unit ($2): $ok passed, $bad failed ($((SECONDS - t0)) s)"
    [ "$bad" -gt 0 ] && grep -E 'FAIL|failed|ERROR|Sanitizer|runtime error' "$out/unit-$2.log" | head -40
    add "$ok" "$bad"
}

# The pytest suites, against the real binary, counted from JUnit XML:
# tests/blackbox/ (pilotlight alone) and tests/interop/ (pilotlight with
# other programs: Trigger.dev's client, HAProxy, Prometheus, k6, Compose,
# the manifests, the load tools).
pysuite() { # pysuite DIR BINARY LABEL [pytest args...] (DIR/*.py among them: those only)
    local dir=$1 bin=$2 label=$3 what res counts t0=$SECONDS whole=$1 a
    shift 3
    for a in "$@"; do case $a in "$dir"/*.py) whole="" ;; esac; done
    what=$(basename "$dir")
    [ "$what" = blackbox ] && what=black-box
    res="$out/$(basename "$dir")-$label"
    PILOTLIGHT_BIN="$bin" /usr/bin/python3 -m pytest -q -p no:cacheprovider \
        --junitxml="$res.xml" "$@" $whole >"$res.log" 2>&1
    counts=$(/usr/bin/python3 - "$res.xml" <<'PY'
import sys, xml.etree.ElementTree as ET
try:
    t = ET.parse(sys.argv[1]).getroot()
except Exception:
    print(0, 1, 0); sys.exit()
s = t if t.tag == "testsuite" else t.find("testsuite")
tests, fail = int(s.get("tests")), int(s.get("failures")) + int(s.get("errors"))
skip = int(s.get("skipped"))
print(tests - fail - skip, fail, skip)
PY
)
    set -- $counts
    echo "$what ($label): $1 passed, $2 failed, $3 skipped ($((SECONDS - t0)) s)"
    [ "$2" -gt 0 ] && tail -60 "$res.log"
    add "$1" "$2" "$3"
}

if build build; then
    unit build plain
else
    echo "build failed"; add 0 1
fi

# The black-box suite runs against what the README's first command builds:
# deploy/build.sh, release, LTO and profile-guided; the build must have trained
# and used its profile.
t0=$SECONDS
if deploy/build.sh build-release >"$out/release.log" 2>&1 &&
        ls build-release/pilotlight.p/*.gcda >/dev/null 2>&1 &&
        grep -q -- '-fprofile-use' build-release/build.ninja; then
    echo "release build (profile-guided): 1 passed, 0 failed ($((SECONDS - t0)) s)"; add 1 0
    pysuite tests/blackbox "$root/build-release/pilotlight" release
    pysuite tests/interop "$root/build-release/pilotlight" release
else
    echo "release build (profile-guided): 0 passed, 1 failed"; tail -30 "$out/release.log"; add 0 1
fi

export ASAN_OPTIONS=detect_leaks=1:abort_on_error=0:halt_on_error=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
if build build-asan -Db_sanitize=address,undefined -Db_lundef=false; then
    unit build-asan asan
    # The impaired-network matrix and the key ring under load measure
    # timing-dependent delivery: they run against the release build only,
    # where their timings are the real ones. So does the pool's 100,000
    # operations (a count of the pools' own chunks, which a sanitizer's
    # allocator does not change; their paths are every other test's), and
    # the suites of malformed input, whose paths the fuzz targets run under
    # ASan below.
    pysuite tests/blackbox "$root/build-asan/pilotlight" asan \
        --ignore=tests/blackbox/test_impaired.py --ignore=tests/blackbox/test_pool_flat.py \
        --ignore=tests/blackbox/test_validation.py --ignore=tests/blackbox/test_config.py \
        --ignore=tests/blackbox/test_identity.py \
        --ignore=tests/blackbox/test_opaque_ids_and_names.py
    # Of tests/interop/, what drives pilotlight with another program in the
    # loop: Trigger.dev's client, HAProxy, the browser, the token vectors
    # (the files checked there, and the load tools, are what the released
    # build's pass ran against them; nothing of theirs depends on the build).
    pysuite tests/interop "$root/build-asan/pilotlight" asan \
        tests/interop/test_compat.py tests/interop/test_haproxy.py \
        tests/interop/test_status_page.py tests/interop/test_token_vectors.py
else
    echo "sanitizer build failed"; add 0 1
fi
unset ASAN_OPTIONS UBSAN_OPTIONS

# Once more under valgrind memcheck: any error or definitely-lost byte makes
# the server exit 99, which each test's teardown reports. tests/interop/ is
# left out here (it tests other programs, and the unit driver the token
# vectors run), and so are the impaired-network suites and the key ring's
# (several instances checking each other every 100 ms), whose timings
# valgrind's slowdown would turn into failures of their own, and the suites
# of malformed input (framing, dispatch bodies, configuration, tokens, ids):
# their paths are the fuzz targets', run below under libFuzzer with ASan,
# and they would double this pass's time. Valgrind runs a server on one
# core: two test files at a time (pytest-xdist), one server each.
mkdir -p "$out/valgrind"
PL_VALGRIND_BIN="$root/build/pilotlight" PL_VALGRIND_LOGS="$out/valgrind" \
    pysuite tests/blackbox "$root/tests/harness/valgrind-wrap.sh" valgrind \
    -n 2 --dist loadfile \
    --ignore=tests/blackbox/test_impaired.py --ignore=tests/blackbox/test_vanished.py \
    --ignore=tests/blackbox/test_ring.py --ignore=tests/blackbox/test_ring_leave.py \
    --ignore=tests/blackbox/test_hostile.py --ignore=tests/blackbox/test_validation.py \
    --ignore=tests/blackbox/test_config.py --ignore=tests/blackbox/test_identity.py \
    --ignore=tests/blackbox/test_opaque_ids_and_names.py
# A log says something when it holds more than valgrind's note that it does
# not know SIOCOUTQNSD (0x894b), which confirm asks on every delivery.
for log in "$out"/valgrind/vg.*.log; do
    [ -s "$log" ] || continue
    grep -v -e 'unhandled ioctl 0x894b' -e 'could cause spurious value errors' \
        -e 'README_MISSING_SYSCALL_OR_IOCTL' "$log" | grep -q . || continue
    echo "== $log"; head -40 "$log"
done

# A short soak (loadtest/soak runs the long one): churn, then a full house;
# fails on a broken ledger, a poll left behind, or RSS creeping up.
t0=$SECONDS
if loadtest/soak --short "$root/build" >"$out/soak.log" 2>&1; then
    echo "soak (short): 1 passed, 0 failed ($((SECONDS - t0)) s)"; add 1 0
else
    echo "soak (short): 0 passed, 1 failed"; tail -20 "$out/soak.log"; add 0 1
fi
grep '^soak:' "$out/soak.log"

# libFuzzer: replay every committed corpus, then fuzz each target briefly
# (tests/fuzz/run.sh SECONDS fuzzes for longer).
t0=$SECONDS
tests/fuzz/run.sh "${PL_FUZZ_SECONDS:-5}" >"$out/fuzz.log" 2>&1
line=$(grep -E '^fuzz: [0-9]+ passed, [0-9]+ failed' "$out/fuzz.log" | tail -1)
if [ -n "$line" ]; then
    set -- $line
    echo "$line ($((SECONDS - t0)) s)"
    add "$2" "$4"
    [ "$4" -gt 0 ] && tail -40 "$out/fuzz.log"
else
    echo "fuzz: did not run"; tail -40 "$out/fuzz.log"; add 0 1
fi

echo "$skipped skipped; $SECONDS s in all"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
