"""Stored records: the one way every JSON record of a run folder is written and read (its
layout version, its file, one reading rule), so that a record misread a week later is refused,
never judged."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from pydantic import BaseModel, Field, ValidationError

from infra.errors import QuantgateError

Record = TypeVar("Record", bound=BaseModel)


class StoredRecordError(QuantgateError):
    """A stored record (stage.json, manifest.json, a stage's results) is missing, damaged or of
    another layout."""


class Stored(BaseModel):
    """A record kept as `<folder>/FILE`, in layout LAYOUT (bump it when a change would make an
    older quantgate misread the file; a file written before the field existed is layout 1)."""

    FILE: ClassVar[str]
    LAYOUT: ClassVar[int] = 1
    # Fields with a default that the verdict reads: a stored record must carry them (as null
    # where nothing was measured), else one taken out would be judged by its default.
    VERDICT_FIELDS: ClassVar[tuple[str, ...]] = ()

    schema_version: int = Field(default=1, description="Layout of the file (LAYOUT when written).")

    def save(self, folder: Path) -> Path:
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / self.FILE
        path.write_text(json.dumps(self.stored_data(), indent=1), encoding="utf-8")
        return path

    def stored_data(self) -> dict[str, Any]:
        """What the file holds: every field, in the layout this quantgate writes."""
        return self.model_dump(mode="json") | {"schema_version": self.LAYOUT}

    @classmethod
    def read(cls, folder: Path):  # noqa: ANN206 - the subclass itself
        return read_record(folder / cls.FILE, cls)


def stored_object(path: Path, layout: int) -> tuple[dict[str, Any], int]:
    """The JSON object a record file holds and its layout, refused with the file, the version
    found and what to do when it is not one this quantgate can read."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError as err:
        raise StoredRecordError(f"{path}: missing; the results folder is incomplete: re-run "
                                "the acceptance") from err
    except (OSError, UnicodeDecodeError) as err:
        raise StoredRecordError(f"{path}: cannot be read ({err}); the results folder is "
                                "damaged: re-run the acceptance") from err
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as err:
        raise StoredRecordError(f"{path}: not valid JSON ({str(err)[:200]}); the results folder "
                                "is damaged: re-run the acceptance") from err
    if not isinstance(data, dict):
        raise StoredRecordError(f"{path}: expected a JSON object, got {type(data).__name__}; the "
                                "results folder is damaged: re-run the acceptance")
    version = data.get("schema_version", 1)  # written before the field existed: layout 1
    if type(version) is not int or version < 1:
        raise StoredRecordError(f"{path}: unknown schema version {version!r} (this quantgate "
                                f"reads {layout}); the record is damaged: re-run the "
                                "acceptance")
    if version > layout:
        raise StoredRecordError(f"{path}: written by a newer quantgate (schema {version}, this "
                                f"one reads {layout}): upgrade quantgate to gate it")
    return data, version


def validated(path: Path, data: dict[str, Any], version: int, model: type[Record],
              verdict_fields: tuple[str, ...] | None = None) -> Record:
    """`data` as a `model`, refused in one line when it is not one, or when a field the verdict
    reads was taken out (quantgate writes every field, null or not)."""
    if "schema_version" in model.model_fields:  # as found, not the default of the layout written now
        data = data | {"schema_version": version}
    try:
        record = model.model_validate(data)
    except ValidationError as err:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or '(top level)'}: {e['msg']}"
                             for e in err.errors()[:3])
        raise StoredRecordError(f"{path}: schema {version} but not a valid {model.__name__} "
                                f"({problems}); damaged or older layout: re-run, or re-gate with "
                                "the quantgate that wrote it") from err
    fields = getattr(model, "VERDICT_FIELDS", ()) if verdict_fields is None else verdict_fields
    absent = [name for name in fields if name not in data]
    if absent:
        raise StoredRecordError(f"{path}: schema {version} record without "
                                f"{', '.join(map(repr, absent))}, which every {model.__name__} of "
                                "this layout carries (null where nothing was measured) and the "
                                "verdict reads; the record was edited or damaged: re-run the "
                                "acceptance")
    return record


def read_record(path: Path, model: type[Record]) -> Record:
    """A stored record, by the one reading rule: an object, a layout this quantgate reads, a
    valid `model`, every field the verdict reads present."""
    data, version = stored_object(path, getattr(model, "LAYOUT", 1))
    return validated(path, data, version, model)
