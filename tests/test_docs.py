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


def test_the_readme_operator_count_is_list_operators_count():
    from neuronx_cc_lite.ops.registry import INTERNAL_OPS, lowerings

    with open(os.path.join(ROOT, "README.md")) as f:
        readme = f.read()
    stated = re.search(r"(\d+) ONNX operators \(`neuronx-cc-lite list-operators`\)", readme)
    assert stated, "the README no longer states the operator count"
    assert int(stated.group(1)) == len(set(lowerings()) - INTERNAL_OPS)


def test_the_readme_links_work_from_a_clone():
    """Markdown links point inside the repository; the shared folder beside a checkout is named, not linked."""
    with open(os.path.join(ROOT, "README.md")) as f:
        readme = f.read()
    for target in re.findall(r"\]\(([^)#]+)\)", readme):
        if not target.startswith(("http://", "https://")):
            assert os.path.exists(os.path.join(ROOT, target)), f"README links to {target}, missing from a clone"
