"""Docstrings say what the code is, in names that exist: every dotted project name, module
attribute and file they cite resolves, the package's carry no measured figure (figures come
from generated files, which change with the machine), and none tells the code's history."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("pipeline", "benchmarks", "tools", "examples")
TICKED = re.compile(r"`([^`\s]+)`")
FILE = re.compile(r"\b([a-z_][a-z0-9_]*\.py)\b")
FIGURE = re.compile(r"\b\d+(?:[.,]\d+)?\s?(?:ms|us|µs|s|seconds?|minutes?|MB/s|GB/s|samples/s|x faster|%)(?![\w/])")
HISTORY = re.compile(r"\b(no longer|used to|previously|formerly|this session|the old code|\.\./shared)\b", re.I)


def sources() -> list[Path]:
    return [p for folder in FOLDERS for p in sorted((ROOT / folder).rglob("*.py"))]


def docstrings(path: Path) -> list[tuple[str, str]]:
    """(where, docstring) of the module, its classes and functions."""
    tree = ast.parse(path.read_text())
    out = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            text = ast.get_docstring(node, clean=False)
            if text:
                out.append((f"{path.relative_to(ROOT)}:{getattr(node, 'name', 'module')}", text))
    return out


def parameters(path: Path) -> dict[str, set[str]]:
    """{where: its parameters' names} of the functions `docstrings` names: in a function's
    docstring `settings.deadline_s` is its parameter's field, not module `settings`'s."""
    found: dict[str, set[str]] = {}
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = node.args
            names = {a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg) if a}
            found.setdefault(f"{path.relative_to(ROOT)}:{node.name}", set()).update(names)
    return found


def project_modules() -> dict[str, list[str]]:
    """{short name: dotted names} of the package's modules (`budget` -> pipeline.bench.budget)."""
    found: dict[str, list[str]] = {}
    for path in (ROOT / "pipeline").rglob("*.py"):
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        if not name.endswith("__main__"):
            found.setdefault(name.rsplit(".", 1)[-1], []).append(name)
    return found


def params_keys() -> set[str]:
    """`section.key` for every key of params.yaml: docstrings cite them the same way."""
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    return {f"{section}.{key}" for section, body in params.items() if isinstance(body, dict) for key in body}


def resolves(dotted: str) -> bool:
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


def test_cited_names_and_files_exist():
    modules, keys, wrong = project_modules(), params_keys(), []
    files = {p.name for folder in (*FOLDERS, "tests") for p in (ROOT / folder).rglob("*.py")} | {"conftest.py"}
    for path in sources():
        arguments = parameters(path)
        for where, text in docstrings(path):
            for name in TICKED.findall(text):
                name = name.rstrip(".,:;()")
                short = re.fullmatch(r"([a-z_]\w*)\.([A-Za-z_]\w*)", name)
                if re.fullmatch(r"pipeline(\.\w+)+", name):
                    ok = resolves(name)
                elif short and short[1] in modules and name not in keys and short[1] not in arguments.get(where, ()):
                    ok = any(hasattr(importlib.import_module(m), short[2]) for m in modules[short[1]])
                elif re.fullmatch(r"[\w.-]+(/[\w.-]+)+\.(py|md|yaml|json|txt|csv)", name):
                    ok = (ROOT / name).exists()
                else:
                    continue
                if not ok:
                    wrong.append(f"{where}: `{name}`")
            for file in FILE.findall(text):
                if file not in files:
                    wrong.append(f"{where}: {file}")
    assert not wrong, wrong


def test_the_package_docstrings_carry_no_measured_figure():
    found = [
        f"{where}: {m.group(0)!r}"
        for path in sorted((ROOT / "pipeline").rglob("*.py"))
        for where, text in docstrings(path)
        for m in FIGURE.finditer(text)
    ]
    assert not found, found


@pytest.mark.parametrize("folder", FOLDERS)
def test_docstrings_describe_the_code_not_its_history(folder):
    found = [
        f"{where}: {m.group(0)!r}"
        for path in sorted((ROOT / folder).rglob("*.py"))
        for where, text in docstrings(path)
        for m in HISTORY.finditer(text)
    ]
    assert not found, found
