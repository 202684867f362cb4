from __future__ import annotations

import pytest

from infra.cpu_support import check_cpu_servable, cpu_flags, fast_dtype
from infra.errors import SpecError

AVX2 = {"sse4_2", "avx", "avx2", "fma"}
AVX512 = AVX2 | {"avx512f", "avx512bw", "avx512_vnni"}


def test_flags_are_read_from_cpuinfo(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu avx2 avx512f\n")
    assert cpu_flags(info) == {"fpu", "avx2", "avx512f"}
    assert cpu_flags(tmp_path / "absent") == set()


@pytest.mark.parametrize("flags", [AVX2, AVX512])
def test_bf16_and_w8a8_serve_everywhere(flags):
    check_cpu_servable("s", "none", "none", "auto", False, flags)
    check_cpu_servable("s", "int8/channel", "int8/token/dynamic", "auto", False, flags)


def test_fp8_kv_cache_needs_avx512():
    check_cpu_servable("kv", "none", "none", "fp8_e4m3", False, AVX512)
    needle = "stage 'kv': .*AVX-512 or AMX for an fp8 KV cache; this CPU has AVX2"
    with pytest.raises(SpecError, match=needle):
        check_cpu_servable("kv", "none", "none", "fp8_e4m3", False, AVX2)


def test_weight_only_kernels_and_the_dequantized_way_out():
    with pytest.raises(SpecError, match="no INT8 weight-only kernel.*dequantized copy"):
        check_cpu_servable("w", "int8/channel", "none", "auto", False, AVX512)
    check_cpu_servable("w", "int4/group64", "none", "auto", False, AVX512)
    with pytest.raises(SpecError, match="INT4 weight-only kernel needs AVX-512"):
        check_cpu_servable("w", "int4/group64", "none", "auto", False, AVX2)
    check_cpu_servable("w", "int4/group64", "none", "auto", True, AVX2)
    check_cpu_servable("w", "int8/channel", "none", "auto", True, AVX2)


def test_the_fast_dtype_is_float32_without_avx512():
    assert fast_dtype({"avx2", "fma"}) == "float32"
    assert fast_dtype({"avx2", "avx512f"}) == "auto"
