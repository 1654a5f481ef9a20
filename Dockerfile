# pilotlight container image.
#
#   docker build -t pilotlight .
#   docker run --rm -p 8080:8080 pilotlight
#
# Stage 1 builds on Debian bookworm with the same packages as the README.
# Stage 2 starts FROM scratch and receives only the binary, the shared
# libraries `ldd` lists for it (libuv, libcjson, libcrypto, libc, libm, the
# loader) and a static busybox for the HEALTHCHECK: about 9 MB, against
# ~75 MB for debian:bookworm-slim. Copying exactly what ldd shows keeps
# Debian's security-maintained libraries (rebuild the image to pick up their
# updates) without the work of a fully static glibc build, whose resolver and
# locale parts cannot be linked statically anyway.
#
# BASE_IMAGE lets a build use a local Debian base instead of pulling one
# (deploy/container-test.sh imports a debootstrap'ed bookworm that way).

ARG BASE_IMAGE=debian:bookworm-slim

FROM ${BASE_IMAGE} AS build
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        build-essential meson ninja-build pkg-config \
        libuv1-dev libcjson-dev libssl-dev uthash-dev node-llhttp busybox-static \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
# deploy/build.sh: the README's release build, LTO and profile-guided (it
# trains on 127.0.0.1 inside this stage for about 10 s).
RUN deploy/build.sh /build \
 && strip /build/pilotlight
# The runtime tree: the binary, each library ldd resolves (by its real file,
# under the path the loader looks for), the loader itself, a passwd/group
# naming the unprivileged user, and busybox for the health check.
RUN set -eu; \
    mkdir -p /rootfs/usr/local/bin /rootfs/etc /rootfs/tmp; \
    cp /build/pilotlight /rootfs/usr/local/bin/pilotlight; \
    ldd /build/pilotlight | awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }' \
      | sort -u > /tmp/libs; \
    while read -r lib; do \
        mkdir -p "/rootfs$(dirname "$lib")"; \
        cp -L "$lib" "/rootfs$lib"; \
    done < /tmp/libs; \
    cp /bin/busybox /rootfs/usr/local/bin/busybox; \
    echo 'pilotlight:x:65532:65532:pilotlight:/nonexistent:/sbin/nologin' > /rootfs/etc/passwd; \
    echo 'pilotlight:x:65532:' > /rootfs/etc/group; \
    chmod 1777 /rootfs/tmp; \
    chroot /rootfs /usr/local/bin/pilotlight --version

FROM scratch
COPY --from=build /rootfs/ /
USER 65532:65532
# Settings come from PILOTLIGHT_* variables (or flags, or a file named by
# PILOTLIGHT_CONFIG); see `pilotlight --help`. By default port 8080 serves
# controllers, dispatches and /metrics; with
# PILOTLIGHT_DISPATCH_LISTEN=0.0.0.0:8081, dispatches and /metrics move to
# 8081 and 8080 serves only the controllers.
ENV PILOTLIGHT_LISTEN=0.0.0.0:8080
EXPOSE 8080 8081
STOPSIGNAL SIGTERM
# Probes /healthz on the port PILOTLIGHT_LISTEN names (set the port there,
# not in a config file, for this check to follow it).
HEALTHCHECK --interval=10s --timeout=3s --start-period=2s --retries=3 \
    CMD ["/usr/local/bin/busybox", "sh", "-c", "exec /usr/local/bin/busybox wget -q -O /dev/null http://127.0.0.1:${PILOTLIGHT_LISTEN##*:}/healthz"]
ENTRYPOINT ["/usr/local/bin/pilotlight"]
