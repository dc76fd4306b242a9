"""The layout's two promises, checked from the code itself:

- every DVC stage lists, in dvc.yaml, all the project code its command runs (the stage
  module that `cli.py` calls and everything it imports, walked with `ast`), so an edit to any
  of it reruns the stage and the cache never serves outputs of code that no longer exists;
- the shard library imports no stage and loads neither polars, pyarrow, dvc nor pydantic.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "pipeline"


def module_file(name: str) -> Path | None:
    """The file of a project module (`pipeline.x.y`), or None for anything else."""
    if name != "pipeline" and not name.startswith("pipeline."):
        return None
    base = ROOT / name.replace(".", "/")
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def imported(path: Path) -> set[str]:
    """Every project module `path` imports, at the top or inside a function (a lazy import
    runs too), with the packages Python initialises on the way (`pipeline.a` for `pipeline.a.b`)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        else:
            continue
        for name in found:
            parts = name.split(".")
            names.update(".".join(parts[:i]) for i in range(2, len(parts) + 1))
    return {name for name in names if module_file(name)}


def closure(roots: set[str]) -> set[Path]:
    """The files of `roots` and of every project module they import, transitively."""
    seen: set[str] = set()
    todo = [".".join(name.split(".")[:i]) for name in roots for i in range(2, name.count(".") + 2)]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        todo.extend(imported(module_file(name)))
    return {module_file(name) for name in seen}


def cli_targets() -> dict[str, set[str]]:
    """{command name: the project modules its function in cli.py imports}."""
    tree = ast.parse((PACKAGE / "cli.py").read_text())
    commands: dict[str, set[str]] = {}
    for node in tree.body:
        if not isinstance(node, ast.FunctionDef):
            continue
        name = None
        for decorator in node.decorator_list:
            if isinstance(decorator, ast.Call) and getattr(decorator.func, "attr", None) == "command":
                name = decorator.args[0].value if decorator.args else node.name.replace("_", "-")
        if name:
            inner = ast.Module(body=node.body, type_ignores=[])
            commands[name] = {n.module for n in ast.walk(inner)
                              if isinstance(n, ast.ImportFrom) and n.module and n.module.startswith("pipeline.")}
    return commands


def stage_definitions() -> dict[str, dict]:
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    return {name: stage.get("do", stage) for name, stage in stages.items()}


def code_deps(stage: dict) -> list[Path]:
    return [ROOT / dep for dep in stage.get("deps", []) if str(dep).startswith("pipeline")]


def covered(path: Path, deps: list[Path]) -> bool:
    return any(path == dep or dep in path.parents for dep in deps)


# What every command runs besides its stage: the params check (cli.load_checked).
COMMON = {"pipeline.core.params", "pipeline.core.schema"}


def stage_code(stage: dict) -> set[Path]:
    command = stage["cmd"].split("-m pipeline ", 1)[1].split()[0]
    return closure(cli_targets()[command] | COMMON) - {PACKAGE / "__init__.py"}


@pytest.mark.parametrize("name", sorted(stage_definitions()))
def test_every_stage_depends_on_all_the_code_it_runs(name):
    stage = stage_definitions()[name]
    deps = code_deps(stage)
    missing = sorted(str(p.relative_to(ROOT)) for p in stage_code(stage) if not covered(p, deps))
    assert not missing, f"dvc.yaml stage {name!r} runs {missing} but does not list it in deps"
    for dep in deps:
        assert dep.exists(), f"dvc.yaml stage {name!r} lists {dep.relative_to(ROOT)}, which does not exist"


def test_the_closure_walk_sees_lazy_and_package_imports():
    files = {p.relative_to(ROOT).as_posix() for p in stage_code(stage_definitions()["shard"])}
    assert {"pipeline/stages/shard.py", "pipeline/shards/writer.py", "pipeline/shards/__init__.py",
            "pipeline/core/parquet.py", "pipeline/core/schema.py", "pipeline/core/variants.py"} <= files
    assert "pipeline/stages/convert.py" not in files  # polars: not the shard stage's
    assert not covered(ROOT / "pipeline/stages/idx.py", [ROOT / "pipeline/stages/convert.py"])
    assert covered(ROOT / "pipeline/core/errors.py", [ROOT / "pipeline/core"])


def test_the_shard_library_imports_no_stage():
    library = closure({f"pipeline.shards.{p.stem}" for p in (PACKAGE / "shards").glob("*.py")})
    outside = sorted(str(p.relative_to(ROOT)) for p in library
                     if "shards" not in p.parts and p.parent != PACKAGE / "core")
    assert not outside, f"the shard library imports {outside}"
    assert PACKAGE / "core" / "params.py" not in library


def test_importing_the_shard_library_loads_no_heavy_dependency():
    code = ("import sys, pipeline.shards as s; s.read_split, s.DeviceBatches, s.ShardDataset, s.ShardWriter, s.merge_parts, s.ShardSampler; "
            "print(sorted(m for m in ('polars', 'pyarrow', 'dvc', 'pydantic', 'pandas') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]"


def test_plot_titles_embed_safely_in_dvc_plots_page():
    """DVC writes each plot's title into the page's JavaScript unescaped: a quote, backslash
    or angle bracket there leaves that chart blank in a browser."""
    plots = yaml.safe_load((ROOT / "dvc.yaml").read_text())["plots"]
    titles = [next(iter(plot)) for plot in plots]
    assert len(titles) == 6
    assert not [title for title in titles if set(title) & set("'\"\\<>`\n")], titles
