#!/usr/bin/env bash
# install-deps.sh -- installs the Debian packages pilotlight needs to build
# (and, with --test, to run its test suites). Installs only what is missing;
# runs `apt-get update` once, the first time something is missing.
set -eu

build_pkgs="build-essential meson ninja-build pkg-config libuv1-dev libcjson-dev uthash-dev node-llhttp libssl-dev"
# the suites: pytest; clang for the fuzzers; valgrind; iproute2 for the
# network-namespace tests (nftables for their virtual IP); haproxy, yamllint,
# systemd-analyze and docker-compose for deploy/; prometheus (and its
# promtool) for the metrics, alert rules and dashboard; chromium for the
# status page in a real browser (driven by playwright-core, from npm)
test_pkgs="python3 python3-pytest python3-yaml clang libclang-rt-dev valgrind iproute2 nftables haproxy yamllint systemd docker-compose prometheus chromium"
test_pkgs="$test_pkgs libjansson-dev" # the dispatch fuzzer's strict JSON oracle
[ "${1:-}" = "--test" ] && pkgs="$build_pkgs $test_pkgs" || pkgs="$build_pkgs"

missing=""
for p in $pkgs; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ "${1:-}" = "--test" ] && ! command -v npm >/dev/null 2>&1; then
    missing="$missing nodejs npm"
fi
if [ -n "$missing" ]; then
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    echo "installing:$missing" >&2
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends $missing >/dev/null
fi
