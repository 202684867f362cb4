"""What a run was asked, kept in its results folder: the resolved spec, the sized load profile and
every eval set's prompts by item id (`inputs/`; the policy is `policy.json`, the measurements the
stage folders). `quantgate gate RUN_DIR` reads these and nothing else: a week later, with the spec
moved or deleted and the eval data changed, it gives the same verdict and report. A run written
before inputs were kept has none (`kept` gives None: the gate then reads the spec where it was)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar

from pydantic import Field

from infra.stored import Stored
from load.profile import LoadProfile

FOLDER = "inputs"
RUN_FILE = "run.json"


class RunInputs(Stored):
    """The run's questions as it asked them (spec paths already resolved)."""

    FILE: ClassVar[str] = RUN_FILE
    schema_version: int = Field(default=1, description="Layout of inputs/run.json.")
    spec: dict[str, Any] = Field(description="The validated spec (paths absolute).")
    load_profile: LoadProfile = Field(description="The profile as the load ran it, sized to the "
                                      "prompts it sent (what the capacity what-if models).")
    load_profile_name: str = Field(description="What the spec named (a profile or a path).")

    def keep(self, results_dir: Path, prompts: dict[str, dict[str, str]]) -> Path:
        """`inputs/run.json` and each set's prompts by id beside it."""
        folder = results_dir / FOLDER
        (folder / "prompts").mkdir(parents=True, exist_ok=True)
        for name, by_id in prompts.items():
            (folder / "prompts" / f"{name}.jsonl").write_text(
                "".join(json.dumps({"id": item, "prompt": text}) + "\n"
                        for item, text in by_id.items()), encoding="utf-8")
        return self.save(folder)

    @classmethod
    def kept(cls, results_dir: Path) -> RunInputs | None:
        """The run's inputs, None for a run from before they were kept; refused in one line when
        damaged or of a newer layout (the one reading rule of stored records)."""
        folder = results_dir / FOLDER
        return cls.read(folder) if (folder / RUN_FILE).is_file() else None


def stored_prompts(results_dir: Path, set_name: str) -> dict[str, str]:
    """One set's prompts by item id as the run asked them ({} when not kept)."""
    path = results_dir / FOLDER / "prompts" / f"{set_name}.jsonl"
    try:
        rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]
    except (OSError, ValueError):
        return {}
    return {str(row["id"]): str(row["prompt"]) for row in rows
            if isinstance(row, dict) and "id" in row and "prompt" in row}
