"""Load a YAML file into a pydantic model, with errors that name the file and the field."""

from __future__ import annotations

from pathlib import Path
from typing import TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from infra.errors import SpecError

Model = TypeVar("Model", bound=BaseModel)


def describe_validation_error(source: str, err: ValidationError) -> str:
    """'file: field 'a.b': message' for the first problem, with a count of the rest."""
    problems = err.errors()
    first = problems[0]
    where = ".".join(str(part) for part in first["loc"]) or "(top level)"
    more = f" (and {len(problems) - 1} more problem(s))" if len(problems) > 1 else ""
    return f"{source}: field '{where}': {first['msg']}{more}"


def read_yaml(path: Path) -> object:
    if not path.is_file():
        raise SpecError(f"{path}: file not found")
    try:
        return yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise SpecError(f"{path}: not valid YAML: {err}".replace("\n", " ")) from err


def load_model(path: Path, model: type[Model], context: dict | None = None) -> Model:
    data = read_yaml(path)
    if not isinstance(data, dict):
        raise SpecError(f"{path}: expected a mapping at the top level, got {type(data).__name__}")
    try:
        return model.model_validate(data, context=context)
    except ValidationError as err:
        raise SpecError(describe_validation_error(str(path), err)) from err
