"""The layout's promises, checked from the code itself:

- every DVC stage but the two gates (the params check, the code stage: a second each, rerun by
  any edit) depends on deps/<command>.sha256, the list of the project code its command runs
  (the stage module that `cli.py` calls and everything it imports, walked with `ast` by
  tools/stage_deps.py), so an edit reruns the stages that run it;
- an edit of each module of pipeline/ reruns the stages OWNERS names for it and no other:
  an edit of one stage's code or settings model reruns that stage and what follows, nothing
  upstream;
- imports flow one way, core <- shards <- bench <- stages <- the entry points, and nothing
  outside a module uses its private names;
- the shard library imports no stage and loads neither polars, pyarrow, dvc nor pydantic.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "pipeline"
sys.path.insert(0, str(ROOT / "tools"))

from stage_deps import closure, code_list, command_files, differing, imported, module_file, write_lists  # noqa: E402

LAYERS = {"core": 0, "shards": 1, "budget": 1, "bench": 2, "stages": 3}  # the rest of pipeline/: 4
GATES = {"params", "code"}  # the params check and the code lists: every other stage waits for both


def layer(path: Path) -> int:
    parts = path.relative_to(PACKAGE).parts
    return LAYERS.get(parts[0], 4) if len(parts) > 1 else 4


def stage_definitions() -> dict[str, dict]:
    """{stage name in dvc.yaml: its definition (a foreach/matrix stage's `do` or body)}."""
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    return {name: stage.get("do", stage) for name, stage in stages.items()}


def stage_command(stage: dict) -> str:
    """The `python -m pipeline <command>` a stage runs."""
    return stage["cmd"].split("-m pipeline ", 1)[1].split()[0]


def code_deps(stage: dict) -> list[str]:
    """A stage's project-file deps: its code list, and any file of the code it names itself."""
    return sorted(str(dep) for dep in stage.get("deps", []) if str(dep).startswith(("pipeline", "deps/", "sources")))


@pytest.mark.parametrize("name", sorted(set(stage_definitions()) - GATES))
def test_every_stage_depends_on_its_commands_code_list_alone(name):
    """The list, and nothing the list holds: a file named beside it would rerun the stage on
    edits the list already follows, or on ones it leaves out on purpose (cli.py)."""
    stage = stage_definitions()[name]
    assert code_deps(stage) == [f"deps/{stage_command(stage)}.sha256"]


def test_the_gates_depend_on_the_whole_package_and_the_check_comes_first():
    """The params check and the code stage depend on all of pipeline/ (the check reads every
    settings model; the lists are of every command), the code stage on the check's file, so
    every other stage, through its list, waits for both."""
    stages = stage_definitions()
    assert set(stages["params"]["deps"]) == {"pipeline/", "sources.yaml"}
    assert set(stages["code"]["deps"]) == {"data/params.ok", "pipeline/", "sources.yaml", "tools/stage_deps.py"}
    assert stages["code"]["cmd"] == "python tools/stage_deps.py --out deps"
    assert [next(iter(out)) for out in stages["code"]["outs"]] == ["deps"]


def test_the_code_stage_writes_every_list_and_removes_a_stale_one_of_its_own(tmp_path):
    digest = "0" * 64
    lists = {"a.sha256": f"{digest}  pipeline/x.py\n", "b.sha256": f"{digest}  sources.yaml\n"}
    (tmp_path / "b.sha256").write_text("old\n")
    (tmp_path / "gone.sha256").write_text(f"{digest}  pipeline/z.py\n")  # a command renamed
    (tmp_path / "ubuntu.sha256").write_text(f"{digest}  ubuntu.iso\n")  # not a code list
    (tmp_path / "kept.txt").write_text("not a list\n")
    assert differing(tmp_path, lists) == ["a.sha256", "b.sha256", "gone.sha256"]
    assert write_lists(tmp_path, lists) == ["a.sha256", "b.sha256", "gone.sha256"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.sha256", "b.sha256", "kept.txt", "ubuntu.sha256"]
    assert (tmp_path / "b.sha256").read_text() == f"{digest}  sources.yaml\n"
    assert differing(tmp_path, lists) == [] and write_lists(tmp_path, lists) == []


@pytest.mark.skipif(shutil.which("sha256sum") is None, reason="no sha256sum (GNU coreutils) here")
def test_a_code_list_is_what_sha256sum_checks(tmp_path):
    """`sha256sum -c` reads a list as it is: the format is the tool's, not ours."""
    (tmp_path / "pipeline").mkdir()
    (tmp_path / "pipeline" / "a.py").write_text("x = 1\n")
    (tmp_path / "sources.yaml").write_text("{}\n")
    (tmp_path / "a.sha256").write_text(code_list(["pipeline/a.py", "sources.yaml"], tmp_path))
    done = subprocess.run(
        ["sha256sum", "--check", "--strict", "a.sha256"], cwd=tmp_path, capture_output=True, text=True
    )
    assert done.returncode == 0 and done.stdout == "pipeline/a.py: OK\nsources.yaml: OK\n", done.stdout + done.stderr
    (tmp_path / "pipeline" / "a.py").write_text("x = 2\n")
    assert subprocess.run(["sha256sum", "--check", "a.sha256"], cwd=tmp_path, capture_output=True).returncode == 1


def test_the_package_holds_only_python_files():
    """The lists name the modules a command imports: a data file inside pipeline/ (a template,
    a table) would be read by a stage without being in its list."""
    others = [
        p.relative_to(ROOT).as_posix()
        for p in PACKAGE.rglob("*")
        if p.is_file() and p.suffix != ".py" and "__pycache__" not in p.parts
    ]
    assert others == []


# Which stages an edit of each module of pipeline/ reruns: those whose command's code list
# names it (an entry ending in / stands for every module beneath it). First match wins; a module
# no entry names fails the test below until it is placed here. The two gates, the params check
# and the code stage, rerun on any edit (a second each) and are not in the table.
EVERY = {"fetch", "csv", "convert", "codecs", "shard", "machine", "bench", "train", "summary", "report"}
READ_PARAMS = {"fetch", "convert", "codecs", "shard", "bench", "train", "summary", "report"}
SAMPLES = {"fetch", "csv", "convert", "shard", "bench", "train"}  # the sample schema (stages/mnist.py)
OWNERS: list[tuple[str, set[str]]] = [
    # Entry points and docstring-only packages, no stage's code: cli.py parses options (every
    # path a stage uses is in its cmd) and imports each stage's code inside its command.
    ("pipeline/__init__.py", set()),
    ("pipeline/__main__.py", set()),
    ("pipeline/cli.py", set()),
    ("pipeline/standalone.py", set()),
    *[  # a docstring each: they run no code
        (f"pipeline/{package}/__init__.py", set())
        for package in (
            "core",
            "stages",
            "bench",
            "stages/convert",
            "stages/fetch",
            "stages/report",
            "stages/shard",
            "stages/train",
        )
    ],
    # core: what many stages share, nothing one stage alone uses.
    ("pipeline/core/atomic.py", EVERY),
    ("pipeline/core/errors.py", EVERY),
    ("pipeline/core/bounded.py", EVERY - {"machine"}),
    ("pipeline/core/params.py", READ_PARAMS),
    ("pipeline/core/bounds.py", READ_PARAMS | {"machine"}),  # every section's bounds, the fingerprint's
    ("pipeline/core/codec.py", {"convert", "codecs", "summary"}),
    ("pipeline/core/dataset.py", {"fetch", "csv", "convert", "codecs", "shard", "bench", "train", "summary"}),
    ("pipeline/core/parquet.py", {"convert", "codecs", "shard", "bench"}),
    ("pipeline/core/sources.py", {"fetch", "csv", "convert", "shard"}),  # the data sets there are
    ("pipeline/core/location.py", {"shard", "bench", "train"}),  # a path or a URL: the stages that read either
    # stages: each stage's folder or module.
    ("pipeline/stages/params.py", set()),  # the check's own, which reruns on any edit
    ("pipeline/stages/fetch/settings.py", {"fetch"}),
    ("pipeline/stages/fetch/", {"fetch"}),
    ("pipeline/stages/mnist.py", {"fetch", "csv", "convert", "shard"}),
    ("pipeline/stages/csvdata.py", {"csv", "convert"}),
    ("pipeline/stages/convert/settings.py", {"convert", "codecs", "summary"}),
    ("pipeline/stages/convert/", {"convert"}),
    ("pipeline/stages/codecs.py", {"codecs"}),
    ("pipeline/stages/shard/settings.py", {"shard"}),
    ("pipeline/stages/shard/", {"shard"}),
    ("pipeline/stages/train/settings.py", {"train"}),
    ("pipeline/stages/train/", {"train"}),
    ("pipeline/stages/machine.py", {"machine"}),
    ("pipeline/stages/summary.py", {"summary"}),
    ("pipeline/stages/report/", {"report"}),
    # The Ray engine of the data stages (engine: ray): its setting is read by every reader of
    # their settings models; the cluster is both stages'.
    ("pipeline/stages/engine_settings.py", {"convert", "codecs", "summary", "shard"}),
    ("pipeline/stages/ray_cluster.py", {"convert", "shard"}),
    # The shard library: the sample schema for every stage that writes or checks samples,
    # the writer for the shard stage, all of it for the stages that read shards.
    ("pipeline/shards/__init__.py", SAMPLES),
    ("pipeline/shards/format.py", SAMPLES),
    ("pipeline/shards/writer.py", {"shard"}),
    ("pipeline/shards/", {"bench", "train"}),
    # The bench: its stage, settings and document; its model is also what train trains, its
    # rung names and document what the summary and the report read.
    ("pipeline/bench/model.py", {"bench", "train"}),
    ("pipeline/bench/settings.py", {"bench", "summary", "report"}),  # its Recipe is the document's
    ("pipeline/bench/document.py", {"bench", "summary", "report"}),
    ("pipeline/bench/variants.py", {"bench", "summary", "report"}),
    ("pipeline/bench/", {"bench"}),
    # The time budget: the ladder profiles every rung with it; the machine's name is also the
    # machine stage's; the loop finder is `profile`'s, no stage's.
    ("pipeline/budget/findloop.py", set()),
    ("pipeline/budget/machine.py", {"bench", "machine", "summary", "report"}),  # its Fingerprint is the document's
    ("pipeline/budget/__init__.py", {"bench", "machine", "summary", "report"}),
    ("pipeline/budget/", {"bench"}),
]


def code_listing() -> dict[str, set[str]]:
    """{stage: the files its command's code list names}, the two gates aside."""
    return {name: set(command_files(stage_command(s))) for name, s in stage_definitions().items() if name not in GATES}


def rerun_by(path: str, listing: dict[str, set[str]]) -> set[str]:
    """The stages whose code list names `path`."""
    return {name for name, files in listing.items() if path in files}


def owners(path: str) -> set[str] | None:
    """The stages whose code `path` is, from OWNERS; None where no entry names it."""
    return next(
        (stages for prefix, stages in OWNERS if path == prefix or (prefix.endswith("/") and path.startswith(prefix))),
        None,
    )


def test_every_module_is_listed_by_exactly_the_stages_whose_code_it_is():
    """Which stages' code lists name a file is which stages an edit of it reruns (the
    end-to-end form: tests/test_dvc_pipeline.py), so this walks every module."""
    listing = code_listing()
    assert set(listing) == EVERY
    wrong = {}
    for file in sorted(PACKAGE.rglob("*.py")):
        path = file.relative_to(ROOT).as_posix()
        listed = rerun_by(path, listing)
        if owners(path) is None:
            wrong[path] = f"not in OWNERS (listed by {sorted(listed)})"
        elif listed != owners(path):
            wrong[path] = f"listed by {sorted(listed)}, the code of {sorted(owners(path))}"
    assert not wrong, wrong


def test_the_cli_imports_no_project_module_at_its_top():
    """Each command imports its stage's code inside its function: a top-level import would
    run in every stage without being in any stage's deps."""
    tree = ast.parse((PACKAGE / "cli.py").read_text())
    top = [
        ast.unparse(node)
        for node in tree.body
        if isinstance(node, (ast.Import, ast.ImportFrom))
        and any(
            name.startswith("pipeline")
            for name in ([node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names])
        )
    ]
    assert not top, top


def test_editing_a_module_of_one_stage_reruns_that_stage_alone():
    """Spot checks of the table above, for a reader: the ladder's rung names, two settings
    models and one engine rerun no stage upstream of their own."""
    listing = code_listing()
    assert rerun_by("pipeline/bench/variants.py", listing) == {"bench", "summary", "report"}
    assert rerun_by("pipeline/stages/convert/settings.py", listing) == {"convert", "codecs", "summary"}
    assert rerun_by("pipeline/stages/shard/settings.py", listing) == {"shard"}
    assert rerun_by("pipeline/stages/shard/ray.py", listing) == {"shard"}


def test_the_walk_follows_lazy_imports_and_the_cli_helpers_a_command_calls():
    """Checked against files named here, not against the walk's own output: `train` calls
    cli.check_world, which imports core/dataset.py; the shard stage imports its writer lazily."""
    train = set(command_files("train"))
    assert {"pipeline/core/dataset.py", "pipeline/shards/format.py", "pipeline/stages/train/stage.py"} <= train
    shard = set(command_files("shard"))
    assert {
        "pipeline/stages/shard/stage.py",
        "pipeline/shards/writer.py",
        "pipeline/stages/mnist.py",
        "pipeline/core/parquet.py",
        "pipeline/stages/shard/settings.py",
    } <= shard
    assert "pipeline/stages/convert/stage.py" not in shard and "pipeline/bench/ladder.py" not in shard
    assert not shard & {"pipeline/bench/settings.py", "pipeline/bench/variants.py", "pipeline/core/codec.py"}


def test_imports_flow_one_way():
    wrong = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for name in imported(path):
            target = module_file(name)
            if target != PACKAGE / "__init__.py" and layer(target) > layer(path):
                wrong.append(f"{path.relative_to(ROOT)} imports {name}")
    assert not wrong, wrong


def import_cycles() -> list[list[str]]:
    """Every circle of imports between files of pipeline/ (lazy imports inside functions
    count: they run too), each as the files around it; a package's __init__ that a module
    of it passes on the way is an edge only where the __init__ imports something itself
    (its `if TYPE_CHECKING:` names are loaded on first use, not while it is imported)."""
    graph: dict[Path, set[Path]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        found = imported(path)
        graph[path] = {target for name in found if (target := module_file(name)) and target != path}
    index: dict[Path, int] = {}
    low: dict[Path, int] = {}
    stack: list[Path] = []
    cycles: list[list[str]] = []

    def visit(node: Path) -> None:  # Tarjan's strongly connected components
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member.relative_to(ROOT).as_posix())
                if member == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in graph:
        if node not in index:
            visit(node)
    return cycles


def test_no_file_imports_a_file_that_imports_it_back():
    """Folders flowing one way is not enough: two files of one folder can import each other
    (a stage and its second engine did, the engine lazily). Every file's imports, lazy ones
    included, form no circle."""
    assert import_cycles() == []


def private_uses(path: Path) -> list[str]:
    """Private names reached from outside the module that defines them: `import a._b`,
    `from a._b import c`, `from a import _c` (any library) and `obj._x` (a name starting with
    one underscore; dunders are public)."""

    def private(name: str) -> bool:
        return any(part.startswith("_") and not part.startswith("__") for part in name.split("."))

    tree = ast.parse(path.read_text())
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):  # `import torch._dynamo`: another library's private module
            found += [alias.name for alias in node.names if private(alias.name)]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            found += [f"{node.module}.{a.name}" for a in node.names if private(f"{node.module}.{a.name}")]
        elif isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            base = node.value
            if not (isinstance(base, ast.Name) and base.id in ("self", "cls")):
                found.append(f"{ast.unparse(base)}.{node.attr}")
    return found


def test_no_module_reaches_into_another_modules_private_names():
    """Benchmarks, examples, tools and the package use public names only; a module's own
    `self._x` is its business. (`os._exit` and the like are the standard library's public API.)"""
    allowed = {"os._exit", "sys._getframe"}
    wrong = {}
    for folder in ("pipeline", "benchmarks", "examples", "tools"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            uses = sorted(set(u for u in private_uses(path) if u not in allowed))
            if uses:
                wrong[str(path.relative_to(ROOT))] = uses
    assert not wrong, wrong


def test_the_shard_library_imports_no_stage():
    library = closure({f"pipeline.shards.{p.stem}" for p in (PACKAGE / "shards").glob("*.py")})
    outside = sorted(
        str(p.relative_to(ROOT)) for p in library if "shards" not in p.parts and p.parent != PACKAGE / "core"
    )
    assert not outside, f"the shard library imports {outside}"
    assert PACKAGE / "core" / "params.py" not in library


def test_importing_the_shard_library_loads_no_heavy_dependency():
    code = (
        "import sys, pipeline.shards as s; s.read_split, s.DeviceBatches, s.ShardDataset, s.ShardWriter, s.merge_parts, s.ShardSampler; "
        "print(sorted(m for m in ('polars', 'pyarrow', 'dvc', 'pydantic', 'pandas') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]"


def test_plot_titles_embed_safely_in_dvc_plots_page():
    """DVC writes each plot's title into the page's JavaScript unescaped: a quote, backslash
    or angle bracket there leaves that chart blank in a browser."""
    plots = yaml.safe_load((ROOT / "dvc.yaml").read_text())["plots"]
    titles = [next(iter(plot)) for plot in plots]
    assert len(titles) == 6
    assert not [title for title in titles if set(title) & set("'\"\\<>`\n")], titles


def test_the_budgets_names_are_what_its_modules_define():
    """`pipeline.budget` exports each name from the module its table names; the rest of the
    package (the bench, the stages) uses no other name of the library: its public API, as
    any user's."""
    import pipeline.budget as budget

    assert set(budget.__all__) == set(budget._WHERE)
    for name in budget.__all__:
        assert getattr(budget, name) is getattr(
            __import__(f"pipeline.budget.{budget._WHERE[name]}", fromlist=["x"]), name
        )
    reached = [
        f"{path.relative_to(ROOT)}: {node.module}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if not path.is_relative_to(PACKAGE / "budget")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("pipeline.budget.")
    ]
    assert not reached, reached


@pytest.mark.parametrize(
    "edit, said",
    [
        (b"def broken(:\n", "pipeline/stages/fetch/stage.py:1: "),  # an edit half typed
        (b"x = '\xff'\n", "pipeline/stages/fetch/stage.py: 'utf-8' codec can't decode"),
        (b"x = 1\0\n", "pipeline/stages/fetch/stage.py"),  # a NUL byte
        (None, "imports pipeline.stages.fetch.stage, which is no file of the project"),  # removed
    ],
)
def test_a_file_the_walk_cannot_read_stops_the_code_stage_in_one_line(tmp_path, edit, said):
    """One line naming the file, exit 2, no list written, never a traceback."""
    root = tmp_path / "repo"
    shutil.copytree(PACKAGE, root / "pipeline", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "tools", root / "tools", ignore=shutil.ignore_patterns("__pycache__"))
    (root / "sources.yaml").write_text("{}\n")
    target = root / "pipeline/stages/fetch/stage.py"
    target.write_bytes(edit) if edit is not None else target.unlink()
    done = subprocess.run(
        [sys.executable, "tools/stage_deps.py", "--out", "deps"], cwd=root, capture_output=True, text=True
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.count("\n") == 1 and said in done.stderr and "None" not in done.stderr, done.stderr
    assert not (root / "deps").exists()
