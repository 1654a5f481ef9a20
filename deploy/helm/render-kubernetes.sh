#!/usr/bin/env bash
# render-kubernetes.sh -- writes deploy/kubernetes/ from the chart in
# deploy/helm/pilotlight, for `kubectl apply -k` without Helm: the chart is
# the one source, these files its output (tests/interop/test_helm.py
# renders them again and compares). Run it after changing the chart.
#
#   deploy/helm/render-kubernetes.sh [OUTDIR]    (default deploy/kubernetes)
#
# Rendered as release "pilotlight" with the chart's defaults, except that
# the token Secret is not created (it would hold a random value): create
# it before applying (deploy/kubernetes/kustomization.yaml says how).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
chart="$here/pilotlight"
out=${1:-$here/../kubernetes}

helm=${HELM:-}
if [ -z "$helm" ]; then
    for h in /opt/pilotlight-tools/helm "${XDG_CACHE_HOME:-$HOME/.cache}/pilotlight/helm" \
        "$(command -v helm || true)"; do
        [ -n "$h" ] && [ -x "$h" ] && { helm=$h; break; }
    done
fi
[ -n "$helm" ] || { echo "helm not found: deploy/install-deps.sh --test installs it" >&2; exit 1; }

header="# Written by deploy/helm/render-kubernetes.sh from deploy/helm/pilotlight:
# change the chart and run the script again."

render() { # render FILE TEMPLATE [helm args...]
    local file=$1 template=$2
    shift 2
    {
        echo "$header"
        "$helm" template pilotlight "$chart" --set tokens.existingSecret=pilotlight-tokens \
            --show-only "templates/$template" "$@"
    } >"$out/$file"
}

mkdir -p "$out/optional"
render configmap.yaml configmap.yaml
render deployment.yaml deployment.yaml
render services.yaml services.yaml
render pdb.yaml pdb.yaml
render optional/servicemonitor.yaml servicemonitor.yaml --set serviceMonitor.enabled=true
render optional/networkpolicy.yaml networkpolicy.yaml --set networkPolicy.enabled=true

cat >"$out/kustomization.yaml" <<'KUSTOMIZATION'
# Written by deploy/helm/render-kubernetes.sh from deploy/helm/pilotlight:
# change the chart and run the script again.
#
# The chart's defaults as plain manifests, release name "pilotlight":
#
#   kubectl -n NS create secret generic pilotlight-tokens \
#       --from-literal=WORKLOAD_TOKEN_SECRET="$(openssl rand -hex 32)"
#   kubectl -n NS apply -k deploy/kubernetes
#
# NS is the namespace of Trigger.dev's supervisor, which reads the same
# Secret (deploy/helm/trigger-values.yaml). optional/ holds the
# ServiceMonitor (Prometheus Operator CRDs) and the NetworkPolicy, for
# `kubectl apply -f`.
---
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - configmap.yaml
  - deployment.yaml
  - services.yaml
  - pdb.yaml
# Point the image at your registry:
# images:
#   - name: pilotlight
#     newName: registry.example.com/pilotlight
#     newTag: "0.1.0"
KUSTOMIZATION
