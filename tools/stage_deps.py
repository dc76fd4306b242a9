"""Write each DVC stage's code deps in dvc.yaml: exactly the project files its command runs.

A stage's code is what its `python -m pipeline <command>` imports inside its function in
cli.py (the stage's module and its settings model, the helpers of cli.py it calls followed),
and every project module these import, at the top or inside a function, walked with `ast`.
So an edit reruns the stages that run the edited file and no other: editing the fetch
stage's module leaves the bench's lock entry as it is. Two files are left out on purpose:
`pipeline/__init__.py` (a docstring and the version) and `pipeline/cli.py` (option parsing,
with no project import at its top; every path a stage uses is spelled in its `cmd`), so
their edits rerun nothing.

Only the `- pipeline/...` lines of each stage's deps are rewritten; the data deps, comments
and everything else in dvc.yaml stay as written.

    python tools/stage_deps.py            # rewrite dvc.yaml's code deps
    python tools/stage_deps.py --check    # exit 1 naming each stage whose code deps differ
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "pipeline"
LEFT_OUT = ("pipeline/__init__.py", "pipeline/cli.py")
UNSPLIT = ("pipeline", "pipeline/stages")  # never a dep as a whole
CODE_DEP = re.compile(r"^(\s+)- pipeline/\S*\s*(#.*)?$")
ANY_CODE_DEP = re.compile(r"^\s+- [\'\"]?pipeline/")
STAGE = re.compile(r"^  ([A-Za-z0-9_-]+):")


def module_file(name: str, root: Path = ROOT) -> Path | None:
    """The file of a project module (`pipeline.stages.fetch.stage`), or None for anything else."""
    if name != "pipeline" and not name.startswith("pipeline."):
        return None
    base = root / name.replace(".", "/")
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def imported(path: Path, root: Path = ROOT) -> set[str]:
    """Every project module `path` imports, at the top or inside a function (a lazy import
    runs too), with the packages Python initialises on the way (`pipeline.stages` for
    `pipeline.stages.fetch.stage`). A package that loads its names on first use (a module
    `__getattr__`) says where each lives in an `if TYPE_CHECKING:` block: nothing of that
    block runs when the package is imported, and `from package import name` runs the module
    of that name alone."""
    names: set[str] = set()
    tree = ast.parse(path.read_text())
    skipped = {id(node) for block in type_checking(tree) for node in ast.walk(block)}
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            lazy = lazy_names(node.module, root)
            found = [node.module] + [lazy.get(alias.name, f"{node.module}.{alias.name}") for alias in node.names]
        else:
            continue
        for name in found:
            parts = name.split(".")
            names.update(".".join(parts[:i]) for i in range(2, len(parts) + 1))
    return {name for name in names if module_file(name, root)}


def lazy_names(package: str, root: Path = ROOT) -> dict[str, str]:
    """{name: the module it is loaded from} for a package whose `__init__.py` names its lazy
    names in an `if TYPE_CHECKING:` block; {} for any other module."""
    init = module_file(package, root)
    if init is None or init.name != "__init__.py":
        return {}
    return {
        alias.asname or alias.name: node.module
        for block in type_checking(ast.parse(init.read_text()))
        for node in ast.walk(block)
        if isinstance(node, ast.ImportFrom) and node.module
        for alias in node.names
    }


def type_checking(tree: ast.Module) -> list[ast.If]:
    """The module's `if TYPE_CHECKING:` blocks."""
    return [
        node
        for node in tree.body
        if isinstance(node, ast.If) and getattr(node.test, "id", getattr(node.test, "attr", None)) == "TYPE_CHECKING"
    ]


def closure(roots: set[str], root: Path = ROOT) -> set[Path]:
    """The files of `roots` and of every project module they import, transitively."""
    seen: set[str] = set()
    todo = [".".join(name.split(".")[:i]) for name in roots for i in range(2, name.count(".") + 2)]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        todo.extend(imported(module_file(name, root), root))
    return {module_file(name, root) for name in seen}


def cli_targets(root: Path = ROOT) -> dict[str, set[str]]:
    """{command name: the project modules its function in cli.py imports}, with those of the
    cli.py helpers it calls (`check_world`, ...), followed call by call."""
    tree = ast.parse((root / "pipeline" / "cli.py").read_text())
    functions = {node.name: node for node in tree.body if isinstance(node, ast.FunctionDef)}

    def reached(node: ast.FunctionDef, seen: set[str]) -> set[str]:
        inner = ast.Module(body=node.body, type_ignores=[])
        found = {
            n.module
            for n in ast.walk(inner)
            if isinstance(n, ast.ImportFrom) and n.module and n.module.startswith("pipeline.")
        }
        for call in ast.walk(inner):
            name = getattr(call.func, "id", None) if isinstance(call, ast.Call) else None
            if name in functions and name not in seen:
                seen.add(name)
                found |= reached(functions[name], seen)
        return found

    commands: dict[str, set[str]] = {}
    for node in functions.values():
        name = None
        for decorator in node.decorator_list:
            if isinstance(decorator, ast.Call) and getattr(decorator.func, "attr", None) == "command":
                name = decorator.args[0].value if decorator.args else node.name.replace("_", "-")
        if name:
            commands[name] = reached(node, {node.name})
    return commands


def stage_command(stage: dict) -> str:
    """The `python -m pipeline <command>` a stage runs."""
    return stage["cmd"].split("-m pipeline ", 1)[1].split()[0]


def stage_files(stage: dict, root: Path = ROOT) -> list[str]:
    """The project files a stage's command runs, sorted."""
    files = closure(cli_targets(root)[stage_command(stage)], root)
    return sorted(
        path.relative_to(root).as_posix()
        for path in files
        if path.relative_to(root).as_posix() not in LEFT_OUT and not docstring_only(path)
    )


def docstring_only(path: Path) -> bool:
    """True for a package's `__init__.py` that holds a docstring and nothing else: it runs no
    code, so its edits rerun nothing."""
    body = ast.parse(path.read_text()).body
    return path.name == "__init__.py" and all(
        isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) for node in body
    )


def folder_modules(root: Path = ROOT) -> dict[str, set[str]]:
    """{folder under pipeline/: every module beneath it but a package's `__init__.py`}, for
    each folder a dep may name whole: not `pipeline` itself nor `pipeline/stages`, which
    hold every stage."""
    folders: dict[str, set[str]] = {}
    for path in sorted((root / "pipeline").rglob("*.py")):
        name = path.relative_to(root).as_posix()
        if path.name == "__init__.py":
            continue
        for parent in path.relative_to(root).parents:
            if parent.as_posix() not in UNSPLIT and len(parent.parts) > 1:
                folders.setdefault(parent.as_posix(), set()).add(name)
    return folders


def stage_code(stage: dict, root: Path = ROOT) -> list[str]:
    """A stage's code deps as dvc.yaml spells them: a folder where the stage runs every module
    of it (its own folder, a library it uses whole), each file it runs elsewhere. Exact: an
    edit reruns the stages that run the edited module and no other (a docstring-only
    `__init__.py` inside a listed folder is the one file whose edit reruns a stage in vain)."""
    files = set(stage_files(stage, root))
    deps: set[str] = set()
    for folder, modules in sorted(folder_modules(root).items(), key=lambda item: item[0].count("/")):
        if modules <= files:
            deps.add(folder)
            files = {name for name in files if not name.startswith(folder + "/")}
    return sorted(deps | files)


def stage_definitions(root: Path = ROOT) -> dict[str, dict]:
    """{stage name in dvc.yaml: its definition (a foreach/matrix stage's `do` or body)}."""
    stages = yaml.safe_load((root / "dvc.yaml").read_text())["stages"]
    return {name: stage.get("do", stage) for name, stage in stages.items()}


def rewrite(text: str, code: dict[str, list[str]]) -> str:
    """dvc.yaml's text with each stage's `- pipeline/...` deps lines replaced by `code[stage]`,
    at the place of the first one; every other line as it was."""
    out: list[str] = []
    stage = None
    written: set[str] = set()
    in_stages = False
    for line in text.splitlines(keepends=True):
        if not line.startswith(" ") and line.strip() and not line.lstrip().startswith("#"):
            in_stages = line.startswith("stages:")
            stage = None
        elif in_stages and STAGE.match(line):
            stage = STAGE.match(line).group(1)
        match = CODE_DEP.match(line)
        if stage is not None and not match and ANY_CODE_DEP.match(line):
            raise SystemExit(
                f"dvc.yaml: stage {stage}: write a code dep as `- pipeline/<path>` (no quotes): {line.strip()}"
            )
        if stage is None or not match:
            out.append(line)
            continue
        if stage not in written:
            written.add(stage)
            out.extend(f"{match.group(1)}- {path}\n" for path in code[stage])
    missing = set(code) - written
    if missing:
        raise SystemExit(f"dvc.yaml: stage(s) {sorted(missing)} list no pipeline/ dep to replace")
    return "".join(out)


def expected(root: Path = ROOT) -> str:
    """dvc.yaml as it should read, code deps exact."""
    code = {name: stage_code(stage, root) for name, stage in stage_definitions(root).items()}
    return rewrite((root / "dvc.yaml").read_text(), code)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare only; exit 1 when dvc.yaml differs")
    args = parser.parse_args(argv)
    path = ROOT / "dvc.yaml"
    current, wanted = path.read_text(), expected()
    if args.check:
        if current != wanted:
            stale = [
                name
                for name, stage in stage_definitions().items()
                if sorted(str(d) for d in stage.get("deps", []) if str(d).startswith("pipeline")) != stage_code(stage)
            ]
            print(
                f"dvc.yaml: the code deps of {stale or 'some stage'} are not what the stage runs; "
                "run python tools/stage_deps.py",
                file=sys.stderr,
            )
            return 1
        return 0
    if current != wanted:
        path.write_text(wanted)
        print("dvc.yaml: code deps rewritten")
    return 0


if __name__ == "__main__":
    sys.exit(main())
