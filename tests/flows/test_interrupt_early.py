"""A signal while `quantgate run` is still loading the flow (Prefect, MLflow, lm-eval: seconds of
imports on a loaded box) ends the run as a later one does: exit 130 and the one line.

The child is the real console entry point (`flows.cli.main`) with one change: importing
`flows.acceptance` announces itself and then blocks, so the signal lands exactly there.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from tests.flows.test_bad_inputs import base_spec
from tests.flows.test_interrupt import _env, _interrupt_when

ROOT = Path(__file__).parents[2]

SCRIPT = """
import sys, time
sys.path.insert(0, {root!r})


class BlockedImport:
    # The flow's import, held up: the moment a signal can come before any check has run.
    def find_spec(self, name, path=None, target=None):
        if name == "flows.acceptance":
            print("importing the flow", flush=True)
            time.sleep(600)
        return None


sys.meta_path.insert(0, BlockedImport())
sys.argv = ["quantgate", "run", {spec!r}]
from flows.cli import main
main()
"""


@pytest.mark.parametrize("sig, name", [(signal.SIGINT, "Ctrl-C"), (signal.SIGTERM, "SIGTERM")],
                         ids=["ctrl-c", "sigterm"])
def test_a_signal_while_the_flow_loads_exits_130_with_the_line(tmp_path, sig, name):
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(base_spec(tmp_path)))
    script = tmp_path / "run.py"
    script.write_text(textwrap.dedent(SCRIPT.format(root=str(ROOT), spec=str(spec))))
    process = subprocess.Popen([sys.executable, str(script)], cwd=tmp_path, env=_env(tmp_path),
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               start_new_session=True, text=True)
    assert process.stdout.readline() == "importing the flow\n", process.stdout.read()
    code, _, _ = _interrupt_when(process, lambda: True, sig)
    rest = process.stdout.read()
    lines = [line for line in rest.splitlines() if line.strip()]
    assert code == 130, rest
    assert lines == [f"interrupted by {name}: `quantgate run {spec}` stopped while its spec was "
                     "checked, before any engine started; nothing was measured; run the same "
                     "command again to start"], rest
