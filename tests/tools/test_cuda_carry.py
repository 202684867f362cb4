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
