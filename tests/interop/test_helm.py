"""The Helm chart deploy/helm/pilotlight and deploy/helm/trigger-values.yaml,
with the real helm (deploy/install-deps.sh --test pins it): `helm lint`;
`helm template` with the defaults, a ring of three, the NetworkPolicy, the
tokens, the ServiceMonitor and one listener, each parsed and checked for
what must agree (Services and their pods, ports and probes, the ring's
headless Service and ring_dns, the PDB, the NetworkPolicy's rules, the
token Secret and where it is mounted); the rendered config file fed to the
binary's --check-config; deploy/kubernetes/ as the chart renders it today.

trigger-values.yaml is checked against the chart's names, and rendered
with Trigger.dev's own chart (hosting/k8s/helm) when a copy is here: a
chart directory named by PL_TRIGGER_CHART, else the hosting/k8s/helm of a
local clone of Trigger.dev's repository at TRIGGER_REPO (a bare git
directory works). Nothing of that chart is kept in this repository; the
render runs on a copy in a temporary directory, without its datastore
subcharts (which need the network). Without a copy, only the file's
structure is checked.

Skipped, saying why, where helm (or python3-yaml) is missing.
"""

import filecmp
import os
import shutil
import subprocess
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from conftest import REPO_ROOT, run_binary
from manifests import (CHART, NEWER_SETTINGS, binary_lacks_newer_settings, config_lines,
                       config_text, container_of, container_port, env_of, expand, helm,
                       need_tool, need_yaml, objects_of, one, pod_template, port_of,
                       runnable_config, secret_value, selects, template)

HELM_DIR = REPO_ROOT / "deploy" / "helm"
TRIGGER_VALUES = HELM_DIR / "trigger-values.yaml"
RENDER_SCRIPT = HELM_DIR / "render-kubernetes.sh"
K8S = REPO_ROOT / "deploy" / "kubernetes"
# The labels Trigger.dev's chart and supervisor put on the pods pilotlight
# serves: the supervisor (release "trigger") and the run pods it starts.
SUPERVISOR_LABELS = {"app.kubernetes.io/name": "trigger", "app.kubernetes.io/instance": "trigger",
                     "app.kubernetes.io/component": "supervisor"}
RUN_POD_LABELS = {"app": "task-run", "app.kubernetes.io/part-of": "trigger-worker"}
PROMETHEUS_LABELS = {"app.kubernetes.io/name": "prometheus"}
WARM_START_VARS = ("TRIGGER_WARM_START_URL", "TRIGGER_WARM_START_DISPATCH_URL",
                   "TRIGGER_WARM_START_VERIFY_ENABLED")
TOKEN_VARS = ("WORKLOAD_TOKEN_ENFORCEMENT", "WORKLOAD_TOKEN_SECRET")
DEFAULT_MIRROR = Path("/work/.mirror/triggerdotdev+trigger.dev/repo")


@pytest.fixture(autouse=True)
def _helm_present():
    need_tool("helm")
    need_yaml()


# --------------------------------------------------------------------------
# The chart alone
# --------------------------------------------------------------------------

def test_helm_lint_is_clean():
    for sets in ([], ["--set", "networkPolicy.enabled=true,serviceMonitor.enabled=true"]):
        p = helm("lint", "--strict", str(CHART), *sets)
        assert "[WARNING]" not in p.stdout and "[ERROR]" not in p.stdout, p.stdout
        assert "0 chart(s) failed" in p.stdout, p.stdout


def test_chart_values_and_trigger_values_pass_yamllint():
    exe = shutil.which("yamllint")
    if exe is None:
        pytest.skip("yamllint is not installed (deploy/install-deps.sh --test)")
    files = [CHART / "Chart.yaml", CHART / "values.yaml", TRIGGER_VALUES]
    r = subprocess.run([exe, "--strict", "-f", "parsable", *map(str, files)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr


def test_defaults_render_the_objects_and_nothing_optional():
    docs = template()
    kinds = sorted((d["kind"], d["metadata"]["name"]) for d in docs)
    assert kinds == sorted([
        ("ConfigMap", "pilotlight-config"), ("Deployment", "pilotlight"),
        ("PodDisruptionBudget", "pilotlight"), ("Secret", "pilotlight-tokens"),
        ("Service", "pilotlight-controllers"), ("Service", "pilotlight-dispatch"),
        ("Service", "pilotlight-ring")]), kinds
    # Named after another release, every name follows it.
    names = {d["metadata"]["name"] for d in template(release="warm")}
    assert "warm-pilotlight-ring" in names and "warm-pilotlight-tokens" in names, names


def check_services_ports_and_probes(docs):
    pod = pod_template(docs)
    labels, c = pod["metadata"]["labels"], container_of(docs)
    dep = one(docs, "Deployment")
    assert selects(dep["spec"]["selector"]["matchLabels"], labels)
    cfg = config_lines(config_text(docs))
    listen = port_of(cfg["listen"])
    assert container_port(docs, "http") == listen
    services = {s["metadata"]["labels"]["app.kubernetes.io/component"]: s
                for s in objects_of(docs)["Service"]}
    assert set(services) == {"controllers", "dispatch", "ring"}
    for s in services.values():
        assert selects(s["spec"]["selector"], labels), s["metadata"]["name"]
    # The controllers' and the ring's Services serve the pods' own port
    # number (a redirect names a pod's address at it).
    for component in ("controllers", "ring"):
        (p,) = services[component]["spec"]["ports"]
        assert container_port(docs, p["targetPort"]) == p["port"] == listen, component
    (p,) = services["dispatch"]["spec"]["ports"]
    dispatch_port = port_of(cfg.get("dispatch_listen", cfg["listen"]))
    assert container_port(docs, p["targetPort"]) == dispatch_port
    if "dispatch_listen" in cfg:
        assert p["port"] == dispatch_port != listen
    probes = {n: c[n]["httpGet"] for n in ("startupProbe", "livenessProbe", "readinessProbe")}
    assert probes["startupProbe"]["path"] == probes["livenessProbe"]["path"] == "/healthz"
    assert probes["readinessProbe"]["path"] == "/readyz"
    for p in probes.values():
        assert container_port(docs, p["port"]) == listen
    # A dead member leaves the Services within a few seconds.
    r = c["readinessProbe"]
    assert r["periodSeconds"] * r["failureThreshold"] + r["timeoutSeconds"] <= 5, r
    ann = pod["metadata"]["annotations"]
    assert int(ann["prometheus.io/port"]) == dispatch_port
    assert ann["prometheus.io/path"] == "/metrics"
    pdb = one(docs, "PodDisruptionBudget")
    assert selects(pdb["spec"]["selector"]["matchLabels"], labels)
    assert pdb["spec"]["maxUnavailable"] == 1
    return cfg


def test_defaults_services_ports_probes_and_pdb():
    docs = template()
    cfg = check_services_ports_and_probes(docs)
    assert port_of(cfg["listen"]) == 8080 and port_of(cfg["dispatch_listen"]) == 8081
    assert cfg["token_mode"] == "log" and cfg["warm_starts"] == "on"
    assert cfg["dispatch_allow"] == ""
    spec, c = pod_template(docs)["spec"], container_of(docs)
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["runAsUser"] != 0
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    assert c["securityContext"]["capabilities"]["drop"] == ["ALL"]
    assert "preStop" not in c.get("lifecycle", {})
    need = (int(cfg["drain_delay_ms"]) + int(cfg["shutdown_timeout_ms"])) / 1000
    assert spec["terminationGracePeriodSeconds"] >= need + 5


def check_ring(docs, namespace="team-a"):
    """ring_dns names the headless Service, in the pod's namespace, at the
    port every pod listens on; only ready pods are in it."""
    (ring,) = [s for s in objects_of(docs)["Service"] if s["spec"].get("clusterIP") == "None"]
    assert ring["spec"]["publishNotReadyAddresses"] is False
    assert selects(ring["spec"]["selector"], pod_template(docs)["metadata"]["labels"])
    listen = port_of(config_lines(config_text(docs))["listen"])
    (p,) = ring["spec"]["ports"]
    assert p["port"] == container_port(docs, p["targetPort"]) == listen
    env = dict(env_of(container_of(docs)))
    assert env["POD_NAMESPACE"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    names = [n for n, _ in env_of(container_of(docs))]
    assert names.index("POD_NAMESPACE") < names.index("PILOTLIGHT_RING_DNS")
    ring_dns = expand(env["PILOTLIGHT_RING_DNS"], {"POD_NAMESPACE": namespace})
    assert ring_dns == f"{ring['metadata']['name']}.{namespace}.svc.cluster.local:{listen}"
    # The ring is configured in one place: no list, no self, nothing in the file.
    assert not {"ring_peers", "ring_self", "ring_dns"} & set(config_lines(config_text(docs)))
    return ring_dns


def test_a_ring_of_three():
    docs = template("replicaCount=3")
    assert one(docs, "Deployment")["spec"]["replicas"] == 3
    check_ring(docs)


def test_the_ring_follows_the_listen_port_and_the_release():
    docs = template("service.ports.controllers=9090", "service.ports.dispatch=9091",
                    release="edge")
    check_services_ports_and_probes(docs)
    ring_dns = check_ring(docs)
    assert ring_dns.startswith("edge-pilotlight-ring.") and ring_dns.endswith(":9090")


def test_one_listener_for_older_supervisors():
    docs = template("dispatchListener.enabled=false")
    cfg = check_services_ports_and_probes(docs)
    assert "dispatch_listen" not in cfg
    assert [p["name"] for p in container_of(docs)["ports"]] == ["http"]
    # The dispatch Service stays, on the controllers' port, so the same
    # TRIGGER_WARM_START_DISPATCH_URL works.
    (p,) = one(docs, "Service", "pilotlight-dispatch")["spec"]["ports"]
    assert p["port"] == 8081 and p["targetPort"] == "http"


def test_the_rendered_config_is_accepted_by_the_binary(tmp_path):
    docs = template("replicaCount=3")
    path, kept = runnable_config(config_text(docs), tmp_path)
    env = dict(env_of(container_of(docs)))
    ring_dns = expand(env["PILOTLIGHT_RING_DNS"], {"POD_NAMESPACE": "trigger"})
    rc, out, err = run_binary("--check-config", "--config", str(path),
                              env={"PILOTLIGHT_RING_DNS": ring_dns})
    assert rc == 0, err
    effective = config_lines(out)
    for k, v in kept.items():
        if k == "park_timeout_ms" and v == "0":
            continue  # printed as the value it stands for
        if k == "token_secret_file":
            continue  # printed as (set)
        assert effective[k] == v, f"{k}: file {v!r}, effective {effective[k]!r}"
    assert effective["ring_dns"] == ring_dns and effective["ring_self"] == ""


def test_the_rendered_config_with_dispatch_allow_and_warm_starts(tmp_path):
    """The settings dispatch_allow and warm_starts as the chart writes them.
    The binary must have them: until it does this is skipped, saying so."""
    lacking = binary_lacks_newer_settings()
    if lacking:
        pytest.skip(f"this pilotlight has no {', '.join(lacking)} yet: the chart's lines for "
                    "them are checked by a binary that has them")
    for sets in ((), ("config.dispatch_allow=10.0.0.0/8\\,fd00::/8\\,192.0.2.7",
                      "config.warm_starts=off")):
        text = config_text(template(*sets))
        secret = tmp_path / "token_secret"
        secret.write_text("a-workload-token-secret\n")
        f = tmp_path / "pilotlight.conf"
        f.write_text(text.replace("/var/run/secrets/pilotlight/token_secret", str(secret)))
        rc, out, err = run_binary("--check-config", "--config", str(f))
        assert rc == 0, f"{sets}: {err}"
        want, got = config_lines(text), config_lines(out)
        for k in NEWER_SETTINGS:
            assert got[k] == want[k], (k, got[k], want[k])


def test_config_values_are_written_whole_and_owned_settings_refused():
    text = config_text(template("config.max_waiters=2000000", "config.warm_starts=false"))
    cfg = config_lines(text)
    assert cfg["max_waiters"] == "2000000" and cfg["warm_starts"] == "off"
    for owned in ("listen=0.0.0.0:1", "ring_peers=a:1", "token_secret=x"):
        p = template(f"config.{owned}", check=False)
        assert p.returncode != 0 and "set by the chart" in p.stderr, p.stderr


def test_a_grace_period_shorter_than_the_drain_is_refused():
    p = template("terminationGracePeriodSeconds=10", check=False)
    assert p.returncode != 0 and "terminationGracePeriodSeconds" in p.stderr, p.stderr
    p = template("terminationGracePeriodSeconds=10", "config.drain_delay_ms=0",
                 "config.shutdown_timeout_ms=5000", check=False)
    assert p.returncode == 0, p.stderr


# --------------------------------------------------------------------------
# Tokens: one Secret, mounted in the pods, named in trigger-values.yaml
# --------------------------------------------------------------------------

def token_mount(docs):
    """(the Secret's name, its key, the file path the container sees)."""
    spec, c = pod_template(docs)["spec"], container_of(docs)
    (vol,) = [v for v in spec["volumes"] if "secret" in v]
    (mount,) = [m for m in c["volumeMounts"] if m["name"] == vol["name"]]
    (item,) = vol["secret"]["items"]
    return vol["secret"]["secretName"], item["key"], f"{mount['mountPath']}/{item['path']}"


def test_tokens_secret_created_mounted_and_named_in_the_config():
    docs = template("tokens.value=s3cr3t-shared")
    name, key, path = token_mount(docs)
    secret = one(docs, "Secret")
    assert secret["metadata"]["name"] == name and key == "WORKLOAD_TOKEN_SECRET"
    assert secret_value(secret, key) == "s3cr3t-shared"
    # Not deleted with the release: the supervisor may still read it.
    assert secret["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert config_lines(config_text(docs))["token_secret_file"] == path
    assert "s3cr3t-shared" not in config_text(docs)
    # No value given: a random one, long enough for HMAC-SHA256.
    random = secret_value(one(template(), "Secret"), key)
    assert len(random) >= 32


def test_tokens_from_an_existing_secret():
    docs = template("tokens.existingSecret=platform-tokens", "tokens.secretKey=hmac")
    assert "Secret" not in objects_of(docs)
    assert token_mount(docs)[:2] == ("platform-tokens", "hmac")


def test_tokens_off():
    docs = template("tokens.enabled=false", "config.token_mode=disabled")
    assert "Secret" not in objects_of(docs)
    assert "token_secret_file" not in config_lines(config_text(docs))
    assert all("secret" not in v for v in pod_template(docs)["spec"]["volumes"])
    # Verifying needs the secret: refused without it.
    p = template("tokens.enabled=false", check=False)
    assert p.returncode != 0 and "tokens.enabled" in p.stderr, p.stderr


# --------------------------------------------------------------------------
# NetworkPolicy and ServiceMonitor
# --------------------------------------------------------------------------

def allowed_ports(policy, docs, peer_labels, same_namespace=True):
    """The container ports the policy lets pods with <peer_labels> reach."""
    out = set()
    for rule in policy["spec"]["ingress"]:
        for peer in rule["from"]:
            ns = peer.get("namespaceSelector")
            if ns is None and not same_namespace:
                continue
            if selects(peer["podSelector"].get("matchLabels", {}), peer_labels):
                out |= {container_port(docs, p["port"]) for p in rule["ports"]}
    return out


def test_network_policy_rules():
    docs = template("networkPolicy.enabled=true")
    pol = one(docs, "NetworkPolicy")
    pods = pod_template(docs)["metadata"]["labels"]
    assert selects(pol["spec"]["podSelector"]["matchLabels"], pods)
    assert pol["spec"]["policyTypes"] == ["Ingress"]
    http, dispatch = container_port(docs, "http"), container_port(docs, "dispatch")
    assert allowed_ports(pol, docs, RUN_POD_LABELS) == {http}
    assert allowed_ports(pol, docs, SUPERVISOR_LABELS) == {dispatch}
    assert allowed_ports(pol, docs, pods) == {http}
    assert allowed_ports(pol, docs, PROMETHEUS_LABELS, same_namespace=False) == {dispatch}
    # Anybody else: nothing.
    assert allowed_ports(pol, docs, {"app": "something-else"}) == set()


def test_network_policy_selectors_are_configurable():
    docs = template("networkPolicy.enabled=true",
                    "networkPolicy.supervisor.namespaceSelector.matchLabels"
                    ".kubernetes\\.io/metadata\\.name=trigger",
                    "networkPolicy.prometheus.enabled=false",
                    "dispatchListener.enabled=false")
    pol = one(docs, "NetworkPolicy")
    peers = [p for r in pol["spec"]["ingress"] for p in r["from"]]
    assert {"matchLabels": {"kubernetes.io/metadata.name": "trigger"}} in \
        [p.get("namespaceSelector") for p in peers]
    assert allowed_ports(pol, docs, PROMETHEUS_LABELS, same_namespace=False) == set()
    # One listener: the supervisor's rule names the controllers' port.
    assert allowed_ports(pol, docs, SUPERVISOR_LABELS) == {container_port(docs, "http")}


def test_service_monitor_scrapes_the_dispatch_service():
    docs = template("serviceMonitor.enabled=true", "serviceMonitor.labels.release=kube-prom")
    sm = one(docs, "ServiceMonitor")
    assert sm["metadata"]["labels"]["release"] == "kube-prom"
    (ep,) = sm["spec"]["endpoints"]
    assert ep["path"] == "/metrics"
    (svc,) = [s for s in objects_of(docs)["Service"]
              if selects(sm["spec"]["selector"]["matchLabels"], s["metadata"]["labels"])]
    assert svc["metadata"]["name"] == "pilotlight-dispatch"
    assert ep["port"] in [p["name"] for p in svc["spec"]["ports"]]


# --------------------------------------------------------------------------
# deploy/kubernetes is the chart's output
# --------------------------------------------------------------------------

def test_deploy_kubernetes_is_what_the_chart_renders(tmp_path):
    env = dict(os.environ, HELM=need_tool("helm"))
    r = subprocess.run([str(RENDER_SCRIPT), str(tmp_path)], capture_output=True, text=True,
                       env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    fresh = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if p.is_file())
    kept = sorted(p.relative_to(K8S) for p in K8S.rglob("*") if p.is_file())
    assert fresh == kept, "deploy/kubernetes holds other files than the script writes"
    stale = [str(p) for p in fresh if not filecmp.cmp(tmp_path / p, K8S / p, shallow=False)]
    assert not stale, f"run deploy/helm/render-kubernetes.sh: {stale} differ from the chart"


# --------------------------------------------------------------------------
# trigger-values.yaml
# --------------------------------------------------------------------------

def trigger_values_env():
    yaml = need_yaml()
    values = yaml.safe_load(TRIGGER_VALUES.read_text())
    assert list(values) == ["supervisor"] and list(values["supervisor"]) == ["extraEnvVars"]
    return values["supervisor"]["extraEnvVars"]


def test_trigger_values_point_at_the_charts_services_and_secret():
    env = {e["name"]: e for e in trigger_values_env()}
    assert set(env) == set(WARM_START_VARS + TOKEN_VARS)
    docs = template()
    services = {s["metadata"]["name"]: s for s in objects_of(docs)["Service"]}
    for var, svc in (("TRIGGER_WARM_START_URL", "pilotlight-controllers"),
                     ("TRIGGER_WARM_START_DISPATCH_URL", "pilotlight-dispatch")):
        url = urlsplit(env[var]["value"])
        assert url.scheme == "http" and url.path in ("", "/"), url
        assert url.hostname == svc, (var, url.hostname)
        (p,) = services[svc]["spec"]["ports"]
        assert url.port == p["port"], (var, url.port)
    assert env["TRIGGER_WARM_START_VERIFY_ENABLED"]["value"] == "true"
    assert env["WORKLOAD_TOKEN_ENFORCEMENT"]["value"] in ("log", "enforce")
    # The one Secret: the supervisor reads the key pilotlight mounts.
    ref = env["WORKLOAD_TOKEN_SECRET"]["valueFrom"]["secretKeyRef"]
    assert "value" not in env["WORKLOAD_TOKEN_SECRET"]
    assert (ref["name"], ref["key"]) == token_mount(docs)[:2]
    assert ref["name"] == one(docs, "Secret")["metadata"]["name"]


def trigger_chart(tmp_path):
    """A copy of Trigger.dev's chart under <tmp_path>, prepared to render
    offline, or None when there is none here."""
    src = os.environ.get("PL_TRIGGER_CHART")
    dest = tmp_path / "trigger-chart"
    if src:
        shutil.copytree(src, dest)
    else:
        repo = Path(os.environ.get("TRIGGER_REPO", DEFAULT_MIRROR))
        git_dir = repo if (repo / "HEAD").is_file() else repo / ".git"
        if not (git_dir / "HEAD").is_file() or shutil.which("git") is None:
            return None
        archive = subprocess.run(["git", f"--git-dir={git_dir}", "archive", "HEAD",
                                  "hosting/k8s/helm"], capture_output=True, timeout=120)
        if archive.returncode != 0:
            return None
        subprocess.run(["tar", "-x", "-C", str(tmp_path)], input=archive.stdout, check=True)
        (tmp_path / "hosting" / "k8s" / "helm").rename(dest)
    # Offline: its datastore subcharts come from a registry, and its test
    # hooks read their values. Neither touches the supervisor.
    yaml = need_yaml()
    chart_yaml = dest / "Chart.yaml"
    meta = yaml.safe_load(chart_yaml.read_text())
    meta.pop("dependencies", None)
    chart_yaml.write_text(yaml.safe_dump(meta))
    (dest / "Chart.lock").unlink(missing_ok=True)
    shutil.rmtree(dest / "templates" / "tests", ignore_errors=True)
    return dest


def supervisor_env(chart, values_file):
    args = ["template", "trigger", str(chart), "--show-only", "templates/supervisor.yaml",
            "-f", str(values_file)]
    lint_values = chart / "ci" / "lint-values.yaml"
    if lint_values.is_file():
        args[3:3] = ["-f", str(lint_values)]
    docs = [d for d in need_yaml().safe_load_all(helm(*args).stdout) if d]
    (dep,) = [d for d in docs if d["kind"] == "Deployment"]
    (c,) = [c for c in dep["spec"]["template"]["spec"]["containers"] if c["name"] == "supervisor"]
    return {e["name"]: e for e in c["env"]}


# What the README used to show: a key Trigger.dev's chart does not read.
OLD_README_VALUES = """\
supervisor:
  extraEnv:
    - name: TRIGGER_WARM_START_URL
      value: http://pilotlight-controllers.pilotlight.svc.cluster.local:8080
    - name: TRIGGER_WARM_START_DISPATCH_URL
      value: http://pilotlight-dispatch.pilotlight.svc.cluster.local:8081
"""


def test_trigger_dev_chart_gives_the_supervisor_the_variables(tmp_path):
    chart = trigger_chart(tmp_path)
    if chart is None:
        pytest.skip("no copy of Trigger.dev's chart here (PL_TRIGGER_CHART or TRIGGER_REPO): "
                    "trigger-values.yaml checked by structure only")
    env = supervisor_env(chart, TRIGGER_VALUES)
    want = {e["name"]: e for e in trigger_values_env()}
    for name in WARM_START_VARS + TOKEN_VARS:
        assert env.get(name) == want[name], (name, env.get(name))
    # The key the README used to give is dropped without a word.
    old = tmp_path / "old-readme-values.yaml"
    old.write_text(OLD_README_VALUES)
    env = supervisor_env(chart, old)
    assert not [n for n in env if n.startswith("TRIGGER_WARM_START_")], sorted(env)
