"""The README stays true: every error code the tools can print is in its table."""

from __future__ import annotations

import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _sources() -> str:
    text = []
    for package in ("neuronx_cc_lite", "runtime", "isa"):
        for folder, _, files in os.walk(os.path.join(ROOT, package)):
            for name in files:
                if name.endswith(".py"):
                    with open(os.path.join(folder, name)) as f:
                        text.append(f.read())
    return "\n".join(text)


def test_every_error_code_is_in_the_readme_table():
    with open(os.path.join(ROOT, "README.md")) as f:
        readme = f.read()
    table = readme[readme.index("### Error codes"):]
    codes = set(re.findall(r'"((?:NCC|NRT)_[A-Z_]+)"', _sources())) - {"NCC_ISA"}
    missing = sorted(c for c in codes
                     if f"`{c}`" not in table and not (c.startswith("NCC_ISA_") and "`NCC_ISA_*`" in table))
    assert not missing, f"error codes missing from the README's table: {missing}"
