"""Load a YAML file into a pydantic model, with errors that name the file and the field."""

from __future__ import annotations

import re
import typing
from pathlib import Path
from typing import TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from infra.errors import SpecError, did_you_mean

Model = TypeVar("Model", bound=BaseModel)


def describe_validation_error(source: str, err: ValidationError, model: type[BaseModel]) -> str:
    """'file: field 'a.b': problem (got value)' for every problem, with a hint for misspelt fields."""
    lines = []
    for problem in err.errors():
        loc = [str(part) for part in problem["loc"]]
        field = ".".join(loc) or "(top level)"
        message = problem["msg"].removeprefix("Value error, ")
        if problem["type"] == "extra_forbidden":
            owner = _model_at(model, problem["loc"][:-1])
            hint = did_you_mean(loc[-1], tuple(owner.model_fields)) if owner else ""
            lines.append(f"unknown field {field!r}; {hint}".rstrip("; "))
        elif problem["type"] == "missing":
            lines.append(f"field {field!r}: {message}")
        elif problem["type"] in ("literal_error", "union_tag_invalid"):  # an enum's typo
            lines.append(_misspelt_choice(field, problem))
        elif problem["type"] == "finite_number":
            lines.append(f"field {field!r}: {message} (got {problem.get('input')!r}); give a "
                         "finite value: .inf and .nan cannot be meant (nothing is switched off "
                         "by an infinite value; a rule by its own setting)")
        elif not loc:  # a rule across the file's fields: its message names them
            lines.append(message)
        elif problem["type"] == "value_error" and isinstance(problem.get("input"), dict):
            # A rule across fields: the input is the whole mapping, not worth echoing.
            lines.append(f"{field}: {message}")
        else:
            lines.append(f"field {field!r}: {message} (got {problem.get('input')!r})")
    return f"{source}: " + "; ".join(lines)


def _misspelt_choice(field: str, problem: dict) -> str:
    """'field 'a.b': 'hihg' is not one of its choices; did you mean 'high'? (valid: ...)'."""
    ctx = problem.get("ctx") or {}
    if problem["type"] == "union_tag_invalid":
        key = str(ctx.get("discriminator", "")).strip("'")
        if key.isidentifier():  # a field's name; a callable one ('_engine_kind()') is not the user's
            field = f"{field}.{key}".rstrip(".")
        given, expected = ctx.get("tag"), ctx.get("expected_tags", "")
    else:
        given, expected = problem.get("input"), ctx.get("expected", "")
    choices = re.findall(r"'([^']*)'", str(expected))
    if not choices:
        return f"field {field!r}: {problem['msg']} (got {given!r})"
    return f"field {field!r}: {given!r} is not one of its choices; {did_you_mean(str(given), choices)}"


def _model_at(model: type[BaseModel], loc: tuple) -> type[BaseModel] | None:
    """The pydantic model that owns the field at `loc` (list indices and union tags followed)."""
    candidates = [model]
    for part in loc:
        if isinstance(part, int):
            continue
        fields = [c.model_fields[part] for c in candidates if part in c.model_fields]
        if fields:
            candidates = _models_in(fields[0].annotation)
        else:  # a discriminated union's tag: the member whose Literal field holds it
            candidates = [c for c in candidates if _has_tag(c, part)] or candidates
    return candidates[0] if len(candidates) == 1 else None


def _models_in(annotation: object) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _models_in(arg)]


def _has_tag(model: type[BaseModel], tag: str) -> bool:
    return any(typing.get_origin(f.annotation) is typing.Literal and tag in typing.get_args(f.annotation)
               for f in model.model_fields.values())


class DuplicateKeyError(yaml.constructor.ConstructorError):
    """A mapping repeats a key: YAML would silently keep the last one."""


class AliasBombError(yaml.composer.ComposerError):
    """Aliases that expand the document far beyond what it holds ("billion laughs")."""


class StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses a repeated key instead of letting the second one win (a second
    `stages:` would otherwise drop the first list without a word), and a document whose aliases
    expand it beyond reason (pydantic would copy every expanded node: a MemoryError)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: dict[object, int] = {}
        # Checked before merge keys (`<<:`) are flattened in: a literal key may override a merged one.
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            try:
                first = seen.get(key)
            except TypeError:  # an unhashable key: the base constructor reports it
                continue
            if first is not None:
                raise DuplicateKeyError(
                    None, None, f"duplicate key {key!r} at line {line} (first at line {first})",
                    key_node.start_mark)
            seen[key] = line
        return super().construct_mapping(node, deep=deep)

    def compose_document(self) -> yaml.Node:
        root = super().compose_document()
        _check_expansion(root)
        return root


# Nodes that aliases may add to a document beyond the ones it writes out: anchors that reuse a
# block a few times add tens; nested aliases multiply (9 levels of 9 copies: 387 million).
MAX_ALIAS_EXPANSION = 100_000


def _check_expansion(root: yaml.Node | None) -> None:
    """Refuse a document whose aliases expand it by more than MAX_ALIAS_EXPANSION nodes, or that
    refers to itself (an endless structure), before anything is constructed from it."""
    if root is None:
        return
    sizes: dict[int, int] = {}  # id(node) -> expanded size, once its children are summed
    distinct: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    open_nodes: set[int] = set()
    while stack:
        node, children_done = stack.pop()
        key = id(node)
        if children_done:
            children = _children(node)
            sizes[key] = 1 + sum(sizes[id(child)] for child in children)
            open_nodes.discard(key)
            if sizes[key] - len(distinct) > MAX_ALIAS_EXPANSION:
                raise AliasBombError(
                    None, None, f"the aliases under line {node.start_mark.line + 1} expand the "
                    f"document by more than {MAX_ALIAS_EXPANSION:,} nodes (a 'billion laughs'); "
                    "write the values out or use fewer nested aliases", node.start_mark)
            continue
        if key in sizes:
            continue
        if key in open_nodes:
            raise AliasBombError(None, None, f"the node at line {node.start_mark.line + 1} holds an "
                                 "alias of itself (an endless structure); remove that alias",
                                 node.start_mark)
        distinct.add(key)
        open_nodes.add(key)
        stack.append((node, True))
        stack.extend((child, False) for child in _children(node) if id(child) not in sizes)


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    return []


def parse_yaml(text: str, source: str = "<string>") -> object:
    """YAML text to Python objects, refusing repeated keys, alias bombs and endless nesting;
    errors name `source` and the line."""
    try:
        return yaml.load(text, Loader=StrictLoader)  # noqa: S506 - StrictLoader is a SafeLoader
    except (DuplicateKeyError, AliasBombError) as err:
        raise SpecError(f"{source}: {err.problem}") from err
    except RecursionError as err:
        raise SpecError(f"{source}: nested too deeply to read; flatten the document") from err
    except yaml.YAMLError as err:
        raise SpecError(f"{source}: not valid YAML: {err}".replace("\n", " ")) from err


def read_text(path: Path) -> str:
    """A user's text file as UTF-8, or one line naming the file."""
    if not path.is_file():
        raise SpecError(f"{path}: file not found")
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise SpecError(f"{path}: not UTF-8 text (byte {err.object[err.start]:#04x} at offset "
                        f"{err.start}); save it as UTF-8") from err
    except OSError as err:
        raise SpecError(f"{path}: cannot be read: {err.strerror or err}") from err


def read_yaml(path: Path) -> object:
    """The one reader of YAML files: duplicate keys, bad encodings and bad syntax are SpecErrors."""
    return parse_yaml(read_text(path), str(path))


def read_mapping(path: Path) -> dict:
    """A YAML file whose top level must be a mapping (a spec, a policy, a profile)."""
    data = read_yaml(path)
    if not isinstance(data, dict):
        raise SpecError(f"{path}: expected a mapping at the top level, got {type(data).__name__}")
    return data


def validate_model(data: dict, model: type[Model], source: str, context: dict | None = None
                   ) -> Model:
    """`data` as `model`; what is wrong is one SpecError naming `source`."""
    try:
        return model.model_validate(data, context=context)
    except ValidationError as err:
        raise SpecError(describe_validation_error(source, err, model)) from err


def load_model(path: Path, model: type[Model], context: dict | None = None) -> Model:
    return validate_model(read_mapping(path), model, str(path), context)
