#!/bin/bash
# container-test.sh -- build the Dockerfile and drive the image over HTTP,
# on a machine with no Docker engine and no registry access.
#
#   sudo deploy/container-test.sh
#
# Needs root and about a minute (more on the first run: debootstrap). Not
# part of the default test run. Steps:
#   1. installs Debian's buildah, podman, runc and debootstrap;
#   2. builds a bookworm base with `debootstrap --variant=minbase` from the
#      Debian mirror configured in /etc/apt/sources.list*, and imports it as
#      localhost/debian:bookworm (kept between runs);
#   3. builds the Dockerfile with BASE_IMAGE=localhost/debian:bookworm and
#      --pull=never, and reports the build time and the image size;
#   4. runs the image (runc runtime, host network, a free loopback port),
#      checks /connect, parks a poll, dispatches, checks the match, /metrics,
#      the HEALTHCHECK, the non-root user, and a clean exit on SIGTERM.
#
# Environment: PL_DEBIAN_MIRROR (default: from apt's sources),
# PL_CT_WORKDIR (default /var/tmp/pilotlight-container-test),
# PL_CT_STORAGE_DRIVER (default: podman's own; use vfs where overlay fails),
# PL_CT_REBUILD_BASE=1 to debootstrap again, PL_CT_NO_CACHE=1 to build
# without podman's layer cache.
set -eu

REPO=$(cd "$(dirname "$0")/.." && pwd)
WORK=${PL_CT_WORKDIR:-/var/tmp/pilotlight-container-test}
BASE=localhost/debian:bookworm
IMAGE=localhost/pilotlight:container-test
NAME=pilotlight-container-test-$$
# Known quirks of sandboxed hosts: crun refuses a hybrid cgroup setup (use
# runc), and container limits must stay within the host's hard limits.
NOFILE=$(ulimit -Hn)
[ "$NOFILE" = unlimited ] && NOFILE=1048576
[ "$NOFILE" -gt 65536 ] && NOFILE=65536
NPROC=$(ulimit -Hu)
{ [ "$NPROC" = unlimited ] || [ "$NPROC" -gt 32768 ]; } && NPROC=32768

say() { printf '== %s\n' "$*"; }
die() { printf 'container-test: %s\n' "$*" >&2; exit 1; }

[ "$(id -u)" -eq 0 ] || die "must run as root (podman, debootstrap)"

podman_() {
    if [ -n "${PL_CT_STORAGE_DRIVER:-}" ]; then
        podman --runtime runc --storage-driver "$PL_CT_STORAGE_DRIVER" "$@"
    else
        podman --runtime runc "$@"
    fi
}

# -- 1. tools ---------------------------------------------------------------
need=""
for t in buildah podman runc debootstrap; do
    command -v "$t" >/dev/null 2>&1 || need="$need $t"
done
if [ -n "$need" ]; then
    say "installing$need"
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $need >/dev/null
fi
command -v python3 >/dev/null 2>&1 || die "python3 is needed for the HTTP checks"

# -- 2. base image ----------------------------------------------------------
mirror_from_apt() {
    # deb822 files: the URIs of a stanza whose Suites include "bookworm".
    for f in /etc/apt/sources.list.d/*.sources; do
        [ -f "$f" ] || continue
        awk 'BEGIN { RS = ""; FS = "\n" }
             {
               uris = ""; ok = 0
               for (i = 1; i <= NF; i++) {
                 if ($i ~ /^URIs:/) { sub(/^URIs:[ \t]*/, "", $i); uris = $i }
                 if ($i ~ /^Suites:/ && $i ~ /[ \t]bookworm([ \t]|$)/) ok = 1
               }
               if (ok && uris != "") { split(uris, u, /[ \t]+/); print u[1]; exit }
             }' "$f"
    done
    # one-line files: deb [options] URI bookworm components...
    for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
        [ -f "$f" ] || continue
        sed -e 's/\[[^]]*\]//' "$f" | awk '$1 == "deb" && $3 == "bookworm" { print $2; exit }'
    done
}
MIRROR=${PL_DEBIAN_MIRROR:-$(mirror_from_apt | head -n 1)}
[ -n "$MIRROR" ] || MIRROR=http://deb.debian.org/debian

mkdir -p "$WORK"
if [ "${PL_CT_REBUILD_BASE:-0}" = 1 ] || ! podman_ image exists "$BASE"; then
    say "debootstrap --variant=minbase bookworm from $MIRROR"
    rm -rf "$WORK/rootfs"
    t0=$(date +%s)
    debootstrap --variant=minbase bookworm "$WORK/rootfs" "$MIRROR" >"$WORK/debootstrap.log" 2>&1 \
        || { tail -n 20 "$WORK/debootstrap.log" >&2; die "debootstrap failed (log: $WORK/debootstrap.log)"; }
    rm -rf "$WORK/rootfs/var/cache/apt/archives/"*.deb "$WORK/rootfs/var/lib/apt/lists/"*
    tar -C "$WORK/rootfs" -c . | podman_ import - "$BASE" >/dev/null
    rm -rf "$WORK/rootfs"
    say "base image $BASE ready in $(( $(date +%s) - t0 )) s"
else
    say "reusing $BASE (PL_CT_REBUILD_BASE=1 rebuilds it)"
fi

# -- 3. build -----------------------------------------------------------------
say "building $IMAGE"
t0=$(date +%s)
# --format docker: the OCI image format has no HEALTHCHECK.
nocache=""
[ "${PL_CT_NO_CACHE:-0}" = 1 ] && nocache="--no-cache"
podman_ build $nocache --format docker --pull=never --network host \
    --ulimit "nofile=$NOFILE:$NOFILE" --ulimit "nproc=$NPROC:$NPROC" \
    --build-arg "BASE_IMAGE=$BASE" -t "$IMAGE" -f "$REPO/Dockerfile" "$REPO" \
    >"$WORK/build.log" 2>&1 \
    || { tail -n 30 "$WORK/build.log" >&2; die "image build failed (log: $WORK/build.log)"; }
BUILD_S=$(( $(date +%s) - t0 ))
SIZE=$(podman_ image inspect --format '{{.Size}}' "$IMAGE")
say "built in ${BUILD_S} s; image size $SIZE bytes ($(( SIZE / 1024 )) KiB)"

# -- 4. run -------------------------------------------------------------------
PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
cleanup() { podman_ rm -f "$NAME" >/dev/null 2>&1 || true; }
trap cleanup EXIT INT TERM
say "running on 127.0.0.1:$PORT"
# The HEALTHCHECK is run by hand below (podman's timer needs systemd).
podman_ run -d --name "$NAME" --network host --health-interval disable \
    --ulimit "nofile=$NOFILE:$NOFILE" --ulimit "nproc=$NPROC:$NPROC" \
    -e "PILOTLIGHT_LISTEN=127.0.0.1:$PORT" "$IMAGE" >/dev/null

python3 - "$PORT" "$REPO" <<'PY'
import json, sys, threading, time, urllib.request
port, repo = int(sys.argv[1]), sys.argv[2]
base = f"http://127.0.0.1:{port}"

def call(method, path, body=None, headers=None, timeout=5):
    req = urllib.request.Request(base + path, data=body, method=method, headers=headers or {})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return r.status, r.read()

deadline = time.monotonic() + 10
while True:
    try:
        status, body = call("GET", "/healthz")
        break
    except OSError:
        if time.monotonic() > deadline:
            sys.exit("container did not answer /healthz within 10 s")
        time.sleep(0.1)

status, body = call("GET", "/connect")
cfg = json.loads(body)
assert status == 200 and cfg["connectionTimeoutMs"] > 0 and cfg["keepaliveMs"] > 0, body
print("connect:", body.decode())

with open(f"{repo}/tests/blackbox/data/dequeued-message.json") as f:
    msg = json.load(f)
headers = {
    "x-trigger-workload-controller-id": "controller_container_test",
    "x-trigger-deployment-id": msg["deployment"]["friendlyId"],
    "x-trigger-deployment-version": msg["backgroundWorker"]["version"],
    "x-trigger-machine-cpu": "0.5",
    "x-trigger-machine-memory": "0.5",
}
got = {}
def poll():
    got["status"], got["body"] = call("GET", "/warm-start", headers=headers, timeout=20)
t = threading.Thread(target=poll)
t.start()

def metric(name):
    text = call("GET", "/metrics")[1].decode()
    for ln in text.splitlines():
        if ln.startswith(name + " "):
            return float(ln.split()[1])
    raise AssertionError(f"{name} missing from /metrics")

deadline = time.monotonic() + 5
while metric("pilotlight_parked_now") < 1:
    assert time.monotonic() < deadline, "the poll never parked"
    time.sleep(0.05)
status, body = call("POST", "/warm-start", json.dumps({"dequeuedMessage": msg}).encode(),
                    {"Content-Type": "application/json"})
assert status == 200 and json.loads(body) == {"didWarmStart": True}, body
t.join(10)
assert got.get("status") == 200 and json.loads(got["body"]) == msg, got
print("park + dispatch: matched, payload identical")
status, body = call("POST", "/warm-start", json.dumps({"dequeuedMessage": msg}).encode(),
                    {"Content-Type": "application/json"})
assert json.loads(body) == {"didWarmStart": False}, body
print("second dispatch: didWarmStart false")
PY

if podman_ healthcheck run "$NAME" >/dev/null 2>&1; then
    say "HEALTHCHECK: healthy"
else
    die "HEALTHCHECK failed: podman healthcheck run $NAME"
fi
PID=$(podman_ inspect --format '{{.State.Pid}}' "$NAME")
UID_IN=$(awk '/^Uid:/ { print $2 }' "/proc/$PID/status")
[ "$UID_IN" != 0 ] || die "the server runs as root"
say "runs as uid $UID_IN"

podman_ stop -t 15 "$NAME" >/dev/null 2>&1 || true
CODE=$(podman_ inspect --format '{{.State.ExitCode}}' "$NAME")
[ "$CODE" = 0 ] || die "exit code $CODE after SIGTERM"
say "SIGTERM: exit code 0"
say "OK: build ${BUILD_S} s, image $(( SIZE / 1024 )) KiB"
