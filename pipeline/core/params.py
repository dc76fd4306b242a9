"""Read params.yaml, the one place every knob lives (as in DVC's example-get-started), and
one section of it as the settings model of the stage that reads it: checked, with the
model's defaults filled in, so that a stage reads every setting, stated or not, from one object.

Each stage's model lives in its folder (`pipeline/stages/<stage>/settings.py`, the bench's in
`pipeline/bench/settings.py`); the `params` stage checks the whole file with all of them
first. pydantic is imported only when a section is checked, so reading params needs nothing
beyond PyYAML.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipeline.core.bounded import load_yaml, short
from pipeline.core.errors import InputError, is_slug


class ParamsError(InputError):
    """params.yaml lacks a key a command needs, or holds a value of the wrong kind."""


PARAMS_CAP = 1 << 20  # bytes: the file is a few KiB
SHOWN = 10  # problems quoted in one message: one readable line however many there are


def load_params(path: Path) -> dict[str, Any]:
    """params.yaml read strictly (pipeline.core.bounded.load_yaml): at most 1 MiB of UTF-8,
    no alias, no key given twice, each refused with one line naming the file."""
    data = load_yaml(Path(path), PARAMS_CAP, "params file", ParamsError)
    if not isinstance(data, dict):
        raise ParamsError(f"{path}: expected a mapping at the top level")
    return data


def section(params: dict[str, Any], *keys: str) -> Any:
    """params[k1][k2]..., with an error that names the missing dotted key."""
    node: Any = params
    for depth, key in enumerate(keys):
        if not isinstance(node, dict) or key not in node:
            raise ParamsError(f"params.yaml has no key {'.'.join(keys[: depth + 1])!r}")
        node = node[key]
    return node


def problems(path: Path, found: list[str], count: int) -> ParamsError:
    """One line listing the first problems found in the params file, and how many more."""
    more = f"; and {count - SHOWN:,} more" if count > SHOWN else ""
    return ParamsError(f"{path}: {count:,} problem(s): " + "; ".join(found[:SHOWN]) + more)


def validated(model: type, value: Any, key: str, path: Path) -> Any:
    """`value` (the params file's `key`, "" for the whole file) checked by `model` (a pydantic
    model, or a dataclass whose annotations carry its bounds); ParamsError listing every
    problem, each by its dotted key, if it does not fit."""
    from pydantic import TypeAdapter, ValidationError

    try:
        return TypeAdapter(model).validate_python(value)
    except ValidationError as err:
        found = []
        for error in err.errors()[:SHOWN]:
            where = ".".join(str(part) for part in ((key,) if key else ()) + tuple(error["loc"])) or "(top level)"
            kind = SAME_AS.get(error["type"], error["type"])
            message = (
                MESSAGES.get(kind, error["msg"]).removeprefix("Value error, ").replace("Tuple should", "List should")
            )
            got = "" if kind in ("missing", "value_error") else f" (got {short(error.get('input'))})"
            found.append(f"{where}: {message}{got}")
        raise problems(path, found, err.error_count()) from None


# A dataclass's errors said as a model's, so that a section reads the same whichever it is.
SAME_AS = {"missing_argument": "missing", "unexpected_keyword_argument": "extra_forbidden"}
# A dataclass's sequences are tuples; params.yaml writes them as lists.
MESSAGES = {
    "missing": "Field required",
    "extra_forbidden": "Extra inputs are not permitted",
    "tuple_type": "Input should be a valid list",
}


def read_section(path: Path, model: type, key: str) -> Any:
    """The params file's section `key` as an instance of its stage's settings `model`: checked,
    defaults filled in; ParamsError (every problem, by dotted key) where it does not fit."""
    return validated(model, section(load_params(path), key), key, path)


def dataset_names(names: Any) -> str | None:
    """What is wrong with params' `datasets` (folder names: distinct plain slugs), or None."""
    if not isinstance(names, list) or not names:
        return "a list of at least one data set name"
    bad = [name for name in names if not is_slug(name)]
    if bad:
        return f"data set names must be plain slugs (a-z, 0-9, '-', '_'): {bad[:3]}"
    if len(set(names)) != len(names):
        return "a data set is listed twice"
    return None


def read_datasets(path: Path) -> list[str]:
    """The params file's `datasets`, checked: the stages make a folder of each name."""
    names = section(load_params(path), "datasets")
    wrong = dataset_names(names)
    if wrong:
        raise problems(path, [f"datasets: {wrong}"], 1)
    return list(names)
