"""Write each pipeline command's code list, deps/<command>.sha256: the project files it runs.

A command's code is what its function in cli.py imports (the stage's module and its settings
model, the helpers of cli.py it calls followed), and every project module these import, at the
top or inside a function, walked with `ast`; and sources.yaml where the command reads it. Each
stage in dvc.yaml but the two first depends on its command's list alone, and the `code` stage,
which depends on the whole of pipeline/ (as the params check does), writes the lists: an edit
reruns that stage (a second), which rewrites only the lists of the commands that run the
edited file, so DVC reruns those stages and no other. A stage run alone (`dvc repro -s`)
skips the `code` stage and sees an edit only once the lists are rewritten: `dvc repro code`. Left out on purpose: `pipeline/__init__.py` (a docstring and the version),
`pipeline/cli.py` (option parsing, with no project import at its top; every path a stage uses
is spelled in its `cmd`) and a package's docstring-only `__init__.py`, so their edits rerun
nothing. The lists are `sha256sum` files (`sha256sum -c deps/bench.sha256` checks one), kept by
git beside dvc.lock.

    python tools/stage_deps.py --out deps            # write the lists (the `code` stage)
    python tools/stage_deps.py --out deps --check    # exit 1 naming each list that differs
"""

from __future__ import annotations

import argparse
import ast
import functools
import hashlib
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LEFT_OUT = ("pipeline/__init__.py", "pipeline/cli.py")
SOURCES = "sources.yaml"  # read by each command with a `sources_path` option (its default)
SUFFIX = ".sha256"


class CodeError(Exception):
    """A project file that cannot be walked: one line naming it."""


def parse(path: Path) -> ast.Module:
    """The module at `path`, parsed (once per version of the file: every command's walk
    passes the same modules); CodeError naming the file (and line) where it cannot be."""
    stat = path.stat()
    return _parsed(str(path), stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=1024)
def _parsed(path: str, mtime_ns: int, size: int) -> ast.Module:
    try:
        return ast.parse(Path(path).read_bytes().decode("utf-8"), filename=path)
    except SyntaxError as error:  # an edit being typed: the stage that runs the file would fail too
        raise CodeError(f"{path}{f':{error.lineno}' if error.lineno else ''}: {error.msg}") from None
    except (UnicodeDecodeError, ValueError) as error:  # not UTF-8; a NUL byte (Python < 3.12)
        raise CodeError(f"{path}: {error}") from None


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
    tree = parse(path)
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
        for block in type_checking(parse(init))
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
        file = module_file(name, root)
        if file is None:
            raise CodeError(f"{root / 'pipeline' / 'cli.py'}: imports {name}, which is no file of the project")
        todo.extend(imported(file, root))
    return {module_file(name, root) for name in seen}


def cli_targets(root: Path = ROOT) -> dict[str, set[str]]:
    """{command name: the project modules its function in cli.py imports}, with those of the
    cli.py helpers it calls (`check_world`, ...), followed call by call."""
    tree = parse(root / "pipeline" / "cli.py")
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

    return {command: reached(functions[name], {name}) for command, name in command_functions(root).items()}


def reads_sources(root: Path = ROOT) -> set[str]:
    """The commands whose function in cli.py takes the sources file (`--sources`, sources.yaml
    by default): the pins and row counts are as much their input as their code."""
    tree = parse(root / "pipeline" / "cli.py")
    takes = {
        node.name
        for node in tree.body
        if isinstance(node, ast.FunctionDef) and any(arg.arg == "sources_path" for arg in node.args.args)
    }
    return {name for name, function in command_functions(root).items() if function in takes}


def command_functions(root: Path = ROOT) -> dict[str, str]:
    """{command name: the name of its function in cli.py}."""
    tree = parse(root / "pipeline" / "cli.py")
    commands: dict[str, str] = {}
    for node in tree.body:
        if not isinstance(node, ast.FunctionDef):
            continue
        for decorator in node.decorator_list:
            if isinstance(decorator, ast.Call) and getattr(decorator.func, "attr", None) == "command":
                commands[decorator.args[0].value if decorator.args else node.name.replace("_", "-")] = node.name
    return commands


def command_files(command: str, root: Path = ROOT) -> list[str]:
    """The project files `python -m pipeline <command>` runs (and sources.yaml where it reads
    it), sorted."""
    return all_command_files(root)[command]


def all_command_files(root: Path = ROOT) -> dict[str, list[str]]:
    """{command: the files `command_files` gives it}, cli.py read once for all of them."""
    sources = reads_sources(root)
    found = {}
    for command, modules in cli_targets(root).items():
        code = {
            path.relative_to(root).as_posix()
            for path in closure(modules, root)
            if path.relative_to(root).as_posix() not in LEFT_OUT and not docstring_only(path)
        }
        found[command] = sorted(code | ({SOURCES} if command in sources else set()))
    return found


def docstring_only(path: Path) -> bool:
    """True for a package's `__init__.py` that holds a docstring and nothing else: it runs no
    code, so its edits rerun nothing."""
    body = parse(path).body
    return path.name == "__init__.py" and all(
        isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) for node in body
    )


def code_list(files: list[str], root: Path = ROOT) -> str:
    """`sha256sum`'s lines for `files`: the digest, two spaces, the path."""
    return "".join(f"{hashlib.sha256((root / name).read_bytes()).hexdigest()}  {name}\n" for name in files)


def code_lists(root: Path = ROOT) -> dict[str, str]:
    """{file name in deps/: its text}, one per command of cli.py."""
    return {f"{command}{SUFFIX}": code_list(files, root) for command, files in all_command_files(root).items()}


def is_code_list(path: Path) -> bool:
    """True for a file this tool wrote: every line the digest of a project file or
    sources.yaml (another `.sha256` file in the folder is not ours to remove)."""
    try:
        lines = path.read_text().splitlines()
    except (OSError, UnicodeDecodeError):
        return False
    return bool(lines) and all(
        len(line) > 66 and line[64:66] == "  " and (line[66:].startswith("pipeline/") or line[66:] == SOURCES)
        for line in lines
    )


def differing(out: Path, lists: dict[str, str]) -> list[str]:
    """The names in `out` whose text is not `lists`' (missing ones too), and the code lists
    there that no command has (a command renamed or gone)."""
    wrong = [name for name, text in lists.items() if not (out / name).is_file() or (out / name).read_text() != text]
    gone = [p.name for p in out.glob(f"*{SUFFIX}") if p.name not in lists and is_code_list(p)] if out.is_dir() else []
    return sorted(wrong + gone)


def write_lists(out: Path, lists: dict[str, str]) -> list[str]:
    """Bring `out` to `lists`: each differing list replaced whole (written beside it, then
    renamed), each code list no command has removed; the names changed."""
    changed = differing(out, lists)
    out.mkdir(parents=True, exist_ok=True)
    for name in changed:
        if name not in lists:
            (out / name).unlink()
            continue
        temporary = out / f".{name}.tmp"
        temporary.write_text(lists[name])
        os.replace(temporary, out / name)
    return changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="the folder of the lists (deps)")
    parser.add_argument("--check", action="store_true", help="compare only; exit 1 when a list differs")
    args = parser.parse_args(argv)
    try:
        lists = code_lists()
    except (CodeError, OSError) as error:
        print(f"Error: {error}: no code list written", file=sys.stderr)
        return 2
    if args.check:
        stale = differing(args.out, lists)
        if stale:
            print(
                f"{args.out}: {stale} differ from the code; run python tools/stage_deps.py --out {args.out}",
                file=sys.stderr,
            )
            return 1
        return 0
    try:
        changed = write_lists(args.out, lists)
    except OSError as error:
        print(f"Error: {args.out}: {error.strerror or error}: the code lists cannot be written", file=sys.stderr)
        return 2
    print(
        f"{args.out}: {len(changed)} code list(s) rewritten or removed {changed}"
        if changed
        else f"{args.out}: every code list as it was"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
