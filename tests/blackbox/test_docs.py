"""The reference docs against the binary they describe: every setting the
binary has is in docs/configuration.md, every metric it serves (and every
fixed label value) in docs/operations.md, and every link between the docs
resolves inside the repository."""

import re
import unicodedata

from conftest import REPO_ROOT, get, run_binary

DOCS = REPO_ROOT / "docs"
# Links may leave the repository only for these (optional tools beside it).
OUTSIDE_ALLOWED = ("../shared/tools/k6",)
# Labels whose values are not a fixed set (the version, the pools in use,
# histogram buckets) or are written as a range in the docs (1xx ... 5xx).
OPEN_LABELS = {"version", "pool", "class", "le"}

LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def markdown_files():
    files = [REPO_ROOT / "README.md", REPO_ROOT / "loadtest" / "README.md"]
    files += sorted(DOCS.glob("*.md"))
    return [f for f in files if f.is_file()]


def slug(heading):
    """The anchor GitHub gives a heading."""
    text = re.sub(r"[`*]|\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip().lower())
    text = "".join(c for c in text if c in " -_" or unicodedata.category(c)[0] in "LN")
    return text.replace(" ", "-")


def anchors(path):
    text = FENCE.sub("", path.read_text())
    return {slug(m.group(1)) for m in re.finditer(r"^#{1,6}\s+(.*)$", text, re.M)}


def test_every_doc_link_resolves_inside_the_repository():
    bad = []
    for md in markdown_files():
        text = FENCE.sub("", md.read_text())
        for target in LINK.findall(text):
            if re.match(r"[a-z]+:", target):
                continue  # https:, mailto:
            path, _, anchor = target.partition("#")
            dest = (md.parent / path).resolve() if path else md
            where = f"{md.relative_to(REPO_ROOT)}: {target}"
            if not dest.is_relative_to(REPO_ROOT):
                if not any(path.endswith(a) for a in OUTSIDE_ALLOWED):
                    bad.append(f"{where} leaves the repository")
            elif not dest.exists():
                bad.append(f"{where} does not exist")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                bad.append(f"{where}: no such heading")
    assert not bad, "\n".join(bad)


def test_every_setting_is_in_the_configuration_reference():
    rc, out, err = run_binary("--check-config")
    assert rc == 0, err
    names = [ln.split(" = ", 1)[0] for ln in out.splitlines() if " = " in ln]
    assert len(names) > 20, out
    doc = (DOCS / "configuration.md").read_text()
    missing = [n for n in names if not re.search(rf"^\| `{n}` \|", doc, re.M)]
    assert not missing, f"settings without a row in docs/configuration.md: {missing}"


def test_every_metric_is_in_the_operations_reference(server):
    r = get(server.port, "/metrics")
    assert r.status == 200
    text = r.body.decode()
    families = re.findall(r"^# TYPE (\S+) ", text, re.M)
    assert "pilotlight_parked_now" in families, text[:500]
    values = set()
    for labels in re.findall(r"^\w+\{([^}]*)\}", text, re.M):
        for name, value in re.findall(r'(\w+)="([^"]*)"', labels):
            if name not in OPEN_LABELS:
                values.add(f"{name}={value}")
    doc = (DOCS / "operations.md").read_text()
    missing = [f for f in families if f"`{f}" not in doc]
    missing += [v for v in sorted(values) if f"`{v.split('=', 1)[1]}`" not in doc]
    assert not missing, f"not in docs/operations.md: {missing}"
