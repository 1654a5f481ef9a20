"""What tests/interop/test_helm.py and test_deploy.py share about the chart
in deploy/helm/pilotlight and the manifests rendered from it: finding the
helm and kubectl that deploy/install-deps.sh --test pins, rendering the
chart, reading the objects and the config file they carry, and turning that
config file into one the binary can check on this machine."""

import base64
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import REPO_ROOT, run_binary

CHART = REPO_ROOT / "deploy" / "helm" / "pilotlight"
INSTALL_DEPS = "deploy/install-deps.sh --test"
# Where deploy/install-deps.sh --test puts helm and kubectl (as root, else
# as another user); PL_TOOLS_DIR overrides both, as it does there.
TOOL_DIRS = [Path(d) for d in (os.environ.get("PL_TOOLS_DIR"),) if d] + [
    Path("/opt/pilotlight-tools"),
    Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "pilotlight",
]
# Settings the chart writes that a binary built before them refuses (see
# runnable_config).
NEWER_SETTINGS = ("dispatch_allow", "warm_starts")


def pinned_tool(name):
    """The path of helm or kubectl: the pinned one, else one on PATH; None
    when there is neither."""
    for d in TOOL_DIRS:
        if os.access(d / name, os.X_OK):
            return str(d / name)
    return shutil.which(name)


def need_tool(name):
    exe = pinned_tool(name)
    if exe is None:
        pytest.skip(f"{name} is not installed ({INSTALL_DEPS} installs it)")
    return exe


def need_yaml():
    return pytest.importorskip("yaml", reason=f"python3-yaml is not installed ({INSTALL_DEPS})")


def helm(*args, check=True):
    p = subprocess.run([need_tool("helm"), *args], capture_output=True, text=True, timeout=120)
    if check:
        assert p.returncode == 0, f"helm {' '.join(args)}:\n{p.stdout}\n{p.stderr}"
    return p


def template(*sets, release="pilotlight", namespace="trigger", check=True):
    """`helm template` of the chart with --set <sets>; the objects as a
    list, or (with check=False) the finished process."""
    args = ["template", release, str(CHART), "--namespace", namespace]
    for s in sets:
        args += ["--set", s]
    p = helm(*args, check=check)
    if not check:
        return p
    return [d for d in need_yaml().safe_load_all(p.stdout) if d]


def objects_of(docs):
    """{kind: [object, ...]}."""
    out = {}
    for d in docs:
        out.setdefault(d["kind"], []).append(d)
    return out


def one(docs, kind, name=None):
    found = [d for d in docs if d["kind"] == kind and name in (None, d["metadata"]["name"])]
    assert len(found) == 1, f"expected one {kind} {name or ''}, got {len(found)}"
    return found[0]


def config_text(docs):
    (text,) = one(docs, "ConfigMap")["data"].values()
    return text


def config_lines(text):
    """{name: value} of a config file's lines, comments dropped."""
    out = {}
    for ln in text.splitlines():
        ln = ln.split("#", 1)[0].strip()
        if ln:
            k, v = (s.strip() for s in ln.split("=", 1))
            out[k] = v
    return out


def secret_value(secret, key):
    return base64.b64decode(secret["data"][key]).decode()


def binary_settings():
    """The effective configuration with nothing set, from --check-config."""
    rc, out, err = run_binary("--check-config")
    assert rc == 0, err
    return dict(re.findall(r"^(\w+) = (.*)$", out, re.M))


def binary_lacks_newer_settings():
    """The settings of NEWER_SETTINGS this binary does not have yet."""
    have = binary_settings()
    return [s for s in NEWER_SETTINGS if s not in have]


def runnable_config(text, tmp_path, token_secret="a-workload-token-secret"):
    """The config file as a pod runs it, made checkable here: the token
    file it names (a Secret mounted in the pod) written under <tmp_path>
    with <token_secret>, and the lines of NEWER_SETTINGS dropped when this
    binary predates them (test_helm.py checks them with a binary that has
    them). Returns (path of the file written, {name: value} kept)."""
    lacking = binary_lacks_newer_settings()
    secret = tmp_path / "token_secret"
    secret.write_text(token_secret + "\n")
    out = []
    for ln in text.splitlines():
        name = ln.split("#", 1)[0].split("=", 1)[0].strip()
        if name == "token_secret_file":
            ln = f"token_secret_file = {secret}"
        elif name in lacking:
            continue
        out.append(ln)
    path = tmp_path / "pilotlight.conf"
    path.write_text("\n".join(out) + "\n")
    return path, config_lines(path.read_text())


def expand(value, env):
    """A container env value with its $(NAME) references to the variables
    defined before it replaced, as the kubelet does; fails on any other."""
    def ref(m):
        assert m.group(1) in env, f"$({m.group(1)}) is not defined before it is used"
        return env[m.group(1)]
    return re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", ref, value)


def port_of(listen):
    return int(listen.rsplit(":", 1)[1])


def env_of(container):
    """[(name, value or valueFrom)] of a container, in order."""
    return [(e["name"], e.get("value", e.get("valueFrom"))) for e in container.get("env", [])]


def pod_template(docs):
    return one(docs, "Deployment")["spec"]["template"]


def container_of(docs):
    (c,) = pod_template(docs)["spec"]["containers"]
    return c


def container_port(docs, name_or_number):
    if isinstance(name_or_number, int):
        return name_or_number
    (p,) = [p for p in container_of(docs)["ports"] if p["name"] == name_or_number]
    return p["containerPort"]


def selects(selector, labels):
    """Whether a Service selector / matchLabels picks pods with <labels>."""
    return bool(selector) and selector.items() <= labels.items()
