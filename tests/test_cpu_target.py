"""The CPU description: what it derives from LLVM's names and features, and what records store.
(numba is imported where used, after modelc, which sets numba's configuration before numba loads.)"""
import pytest

from modelc import target
from modelc.target import Target

AVX2 = "+avx,+avx2,+fma,+sse4.1,+sse4.2,-avx512f"
AVX512 = "+avx,+avx2,+fma,+avx512f,+avx512bw,+avx512vl,+avx512vnni,-amx-tile"


def test_avx2_is_8_lanes_16_registers():
    t = Target.from_features("znver3", AVX2, threads=2)
    assert (t.vector_bits, t.lanes(), t.lanes(8), t.vector_registers) == (256, 8, 4, 16)
    assert t.max_tile_vectors == 12
    assert t.isa == ("avx", "avx2", "fma", "sse4.1", "sse4.2")


def test_avx512_is_16_lanes_32_registers():
    t = Target.from_features("sapphirerapids", AVX512, threads=2)
    assert (t.vector_bits, t.lanes(), t.vector_registers, t.max_tile_vectors) == (512, 16, 32, 28)
    assert "avx512vnni" in t.isa and "amx-tile" not in t.isa      # a "-" feature is off


def test_prefer_256_bit_halves_the_vectors_not_the_registers():
    t = Target.from_features("skylake-avx512", AVX512 + ",+prefer-256-bit")
    assert (t.lanes(), t.vector_registers) == (8, 32)


def test_fma_pipes_by_microarchitecture():
    assert Target.from_features("znver4", AVX512).accumulators_in_flight == 8
    assert Target.from_features("haswell", AVX2).fma_latency == 5
    assert Target.from_features("some-future-cpu", AVX2).accumulators_in_flight == 8


def test_a_server_core_llvm_names_after_a_client_core_reads_the_server_rows():
    """AMX marks Intel's server cores: a KVM Xeon LLVM calls "rocketlake" (the hypervisor's model
    number) streams beyond its L2 over a mesh, as a Sapphire Rapids does; numba still compiles for the
    name LLVM gives, and a real Rocket Lake (no AMX) keeps the client's row."""
    amx = AVX512.replace("-amx-tile", "+amx-tile")
    misnamed, spr = Target.from_features("rocketlake", amx), Target.from_features("sapphirerapids", amx)
    assert misnamed.beyond_l2_bytes_per_cycle == spr.beyond_l2_bytes_per_cycle == 8
    assert misnamed.llvm_cpu == "rocketlake" and misnamed.flops_per_cycle == 64
    assert Target.from_features("rocketlake", AVX512).beyond_l2_bytes_per_cycle == 16
    assert Target.from_features("graniterapids", amx).beyond_l2_bytes_per_cycle == 8


def test_fma_width_sets_the_peak_and_the_vectors_per_broadcast():
    """Zen 4 runs 512-bit FMAs on 256-bit pipes: half the FLOPs a cycle of Intel's AVX-512 cores,
    whose two full-width FMAs a cycle want two vectors per broadcast, as AVX2's broadcasts do."""
    zen4, spr = Target.from_features("znver4", AVX512), Target.from_features("sapphirerapids", AVX512)
    zen3 = Target.from_features("znver3", AVX2)
    assert (zen4.flops_per_cycle, spr.flops_per_cycle, zen3.flops_per_cycle) == (32, 64, 32)
    assert (zen4.vectors_per_broadcast, spr.vectors_per_broadcast, zen3.vectors_per_broadcast) == (1, 2, 2)
    # compiled for AVX2 on a Zen 4 host: 256-bit vectors on 256-bit pipes
    avx2_on_zen4 = Target.from_features("znver4", AVX2)
    assert (avx2_on_zen4.fma_bits, avx2_on_zen4.flops_per_cycle) == (256, 32)


def test_host_matches_what_llvm_says_and_records_store():
    import llvmlite.binding as llvm
    import numba
    t = Target.host()
    feats = numba.config.CPU_FEATURES or llvm.get_host_cpu_features().flatten()
    assert ("avx512f" in t.isa) == ("+avx512f" in feats.split(","))
    assert t.threads == numba.get_num_threads()
    assert t.l1d_bytes >= 4096 and t.l2_bytes >= t.l1d_bytes
    rec = t.record()
    assert set(rec) == {"cpu", "llvm_cpu", "isa", "threads"} and rec["isa"] == list(t.isa)
    from modelc.tune.records import current_target, same_target
    assert same_target(current_target(), rec)
    assert not same_target(Target.host(threads=t.threads + 1).record(), rec)


def test_use_sets_the_target_for_this_thread_only():
    import threading
    avx2 = Target.from_features("znver3", AVX2, threads=2)
    seen = {}
    with target.use(avx2):
        assert target.current() is avx2
        th = threading.Thread(target=lambda: seen.setdefault("other", target.current()))
        th.start()
        th.join()
    assert seen["other"].llvm_cpu == Target.host().llvm_cpu
    assert target.current() == Target.host()


@pytest.mark.parametrize("text,expected", [("32K", 32 << 10), ("1024K", 1 << 20), ("32M", 32 << 20), ("512", 512)])
def test_sysfs_sizes(text, expected):
    assert target._bytes(text) == expected


def test_cost_model_features_follow_the_target():
    """The vector-register and cache features read the target's lanes and L1."""
    from types import SimpleNamespace

    from modelc.kernels.space import ConfigSpace
    from modelc.tune import features

    sp = ConfigSpace()
    sp.define_knob("tile_n", [24])
    wl = SimpleNamespace(outputs=[SimpleNamespace(shape=(64, 24), layout=None)])
    small = Target.from_features("znver3", AVX2, threads=2, caches=(32 << 10, 512 << 10, 16 << 20))
    big = Target.from_features("znver4", AVX512, threads=2, caches=(32 << 10, 1 << 20, 32 << 20))
    derived = {}
    for t in (small, big):
        with target.use(t):
            derived[t.llvm_cpu] = dict(zip(features.DERIVED, features._derived(sp, wl, {"tile_n": 24}, 3e4)))
    # 24 floats are 3 AVX2 vectors but 2 AVX-512 ones
    assert derived["znver3"]["log_vec_regs"] > derived["znver4"]["log_vec_regs"]


def test_info_names_the_target_kernels_are_shaped_for(tmp_path, capsys):
    import onnx
    from onnx import TensorProto, helper

    from modelc.cli import main
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])
    m = helper.make_model(helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y]),
                          opset_imports=[helper.make_opsetid("", 18)])
    onnx.save(m, str(tmp_path / "m.onnx"))
    assert main(["info", str(tmp_path / "m.onnx")]) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("target"))
    t = Target.host()
    assert t.llvm_cpu in line and f"{t.vector_bits}-bit vectors x {t.vector_registers} registers" in line


def test_a_config_is_checked_against_the_space_of_the_current_target():
    """Candidates follow the vectors (dense's tile_n: multiples of one vector), so a config
    checked once under one target is not taken as checked under another."""
    from modelc.errors import ModelcError
    from modelc.extract import workload_key
    from modelc.validate import check_config
    from test_kernels_target import dense

    wl = dense(8, 64, 64).json
    key = workload_key(wl)
    big = Target.from_features("znver4", AVX512, threads=2)
    small = Target.from_features("znver3", AVX2, threads=2)
    with target.use(big):
        cfg = check_config("dense", wl, None, "t", key)          # the default, tile_n a multiple of 16
        assert cfg["tile_n"] % 16 == 0 and check_config("dense", wl, cfg.values, "t", key).values == cfg.values
    with target.use(small):
        assert check_config("dense", wl, None, "t", key)["tile_n"] % 8 == 0
        big_only = {**cfg.values, "tile_n": 64}
        with pytest.raises(ModelcError, match="tile_n"):
            check_config("dense", wl, big_only, "t", key)


def test_fma_slots_count_narrow_vectors_and_wide_ones_on_narrow_pipes():
    """A loop of 24 float32 is three 256-bit FMAs on AVX-512 (LLVM's widest width dividing it); a
    512-bit FMA takes two slots on Zen 4's 256-bit pipes, one on Sapphire Rapids'."""
    spr = Target.from_features("sapphirerapids", AVX512)
    zen4 = Target.from_features("znver4", AVX512)
    zen3 = Target.from_features("znver3", AVX2)
    assert [spr.fma_slots(n) for n in (8, 16, 24, 32, 48)] == [1, 1, 3, 2, 3]
    assert [zen4.fma_slots(n) for n in (8, 16, 24, 32, 48)] == [1, 2, 3, 4, 6]
    assert [zen3.fma_slots(n) for n in (8, 16, 24)] == [1, 2, 3]
