"""tools/cuda_carry: which requirements of a wheel go along to the GPU machine (Python 3.12,
Linux x86_64), extras included where asked for."""

from __future__ import annotations

import zipfile

from tools.cuda_carry import requires


def wheel(tmp_path, lines: list[str]):
    path = tmp_path / "pkg-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("pkg-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: pkg\n"
                         + "".join(f"Requires-Dist: {line}\n" for line in lines))
    return path


def test_requirements_follow_the_machines_python_platform_and_the_extras_asked_for(tmp_path):
    path = wheel(tmp_path, [
        "numpy", "six>=1.16.0; python_version > '3.11'", "tomli; python_version < '3.11'",
        "llguidance<1.8; platform_machine == 'x86_64'", "pywin32; sys_platform == 'win32'",
        "nvidia-cuda-nvcc; extra == 'cu13'", "nvidia-cuda-nvcc-cu12; extra == 'cu12'"])
    names = [str(r.name) for r in requires(path, set())]
    assert names == ["numpy", "six", "llguidance"]
    assert [str(r.name) for r in requires(path, {"cu13"})] == names + ["nvidia-cuda-nvcc"]


def test_a_part_fits_one_call_beside_the_tracked_tree():
    """Every call carries the tracked tree too: session 38's 56 MiB parts beside its 9 MiB tree
    would have been refused (64 MiB a call)."""
    from pathlib import Path

    from tools.cuda_carry import CALL, SPARE, part_size

    repo = Path(__file__).resolve().parents[2]
    part = part_size(repo)
    beside = CALL - SPARE - part  # the tracked tree, rounded up to a whole MiB
    assert part % 2**20 == 0 and 2**20 < beside < 64 * 2**20


def test_the_unpack_script_refuses_parts_appended_wrong(tmp_path):
    import hashlib
    import subprocess

    from tools.cuda_carry import unpack_script

    bundle = b"part0" + b"part1"
    check = unpack_script(hashlib.sha256(bundle).hexdigest(), 2).splitlines()[1]
    check = check.replace("/tmp/carry.tar", str(tmp_path / "carry.tar"))
    (tmp_path / "carry.tar").write_bytes(bundle)
    assert subprocess.run(["sh", "-c", check], capture_output=True).returncode == 0
    (tmp_path / "carry.tar").write_bytes(bundle + b"part1")  # the last part carried twice
    refused = subprocess.run(["sh", "-c", check], capture_output=True, text=True)
    assert refused.returncode == 2
    assert "append .gpu/part00 to part01, in order" in refused.stdout
