#!/usr/bin/env python3
"""embed_page.py -- builds the status page's template into the binary.

    embed_page.py status.html status_html.c

Writes a C file defining pl_status_html (the template's bytes, as numbers:
nothing is escaped by hand), its length, and pl_status_html_csp, a
Content-Security-Policy that lets the page run its one inline script and
style sheet (named by their SHA-256) and fetch from its own origin only."""

import base64
import hashlib
import re
import sys


def digest(body):
    return "'sha256-" + base64.b64encode(hashlib.sha256(body).digest()).decode() + "'"


def main(src, dst):
    page = open(src, "rb").read()
    scripts = re.findall(rb"<script>(.*?)</script>", page, re.S)
    styles = re.findall(rb"<style>(.*?)</style>", page, re.S)
    if len(scripts) != 1 or len(styles) != 1:
        sys.exit(f"{src}: wants one <script> and one <style>, has {len(scripts)} and {len(styles)}")
    csp = (f"default-src 'none'; script-src {digest(scripts[0])}; style-src {digest(styles[0])}; "
           "connect-src 'self'; img-src data:; base-uri 'none'; form-action 'none'; "
           "frame-ancestors 'none'")
    rows = [", ".join(str(b) for b in page[i:i + 24]) for i in range(0, len(page), 24)]
    with open(dst, "w") as out:
        out.write(f"/* Generated from {src.split('/')[-1]} by embed_page.py: edit that. */\n")
        out.write('#include "src/status_html.h"\n\n')
        out.write("const char pl_status_html[] = {\n    " + ",\n    ".join(rows) + "\n};\n")
        out.write(f"const size_t pl_status_html_len = {len(page)};\n")
        out.write(f'const char pl_status_html_csp[] = "{csp}";\n')


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
