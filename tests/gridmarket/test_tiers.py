"""GPU tiers, VRAM classes and regions (gridmarket.tiers)."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gridmarket.tiers import (
    CPU_ONLY,
    REGIONS,
    TIERS,
    VRAM_CLASSES_GIB,
    Segment,
    UnknownRegionError,
    classify_gpu,
    normalize_gpu_name,
    region_multiplier,
    tier_by_key,
    vram_class,
    vram_class_floor_mib,
    vram_class_label,
)


def test_seed_multipliers_are_kept_exactly() -> None:
    assert TIERS["rtx-4090"].price_multiplier == 3.0
    assert TIERS["rtx-3090"].price_multiplier == 2.2
    assert TIERS["rtx-4070"].price_multiplier == 1.8
    assert TIERS["rtx-3060"].price_multiplier == 1.2
    assert CPU_ONLY.price_multiplier == 0.8
    assert tier_by_key("cpu") is CPU_ONLY


def test_table_is_consistent() -> None:
    for key, tier in TIERS.items():
        assert tier.key == key
        assert not tier.guessed and tier.basis == "table"
        if tier.segment is Segment.CPU:
            continue
        assert tier.speed > CPU_ONLY.speed
        assert tier.price_multiplier > CPU_ONLY.price_multiplier
        assert tier.vram_mib >= 4 * 1024
        # the nominal size of every card lands in its own standard class
        assert VRAM_CLASSES_GIB[vram_class(tier.vram_mib)] * 1024 <= tier.vram_mib


def test_faster_cards_of_a_generation_cost_more() -> None:
    ada = ["rtx-4060", "rtx-4060-ti", "rtx-4070", "rtx-4070-super", "rtx-4070-ti", "rtx-4080"]
    for slower, faster in itertools.pairwise(ada):
        assert TIERS[slower].speed < TIERS[faster].speed
        assert TIERS[slower].price_multiplier < TIERS[faster].price_multiplier
    assert TIERS["h200"].speed > TIERS["h100-sxm"].speed > TIERS["h100-pcie"].speed
    assert TIERS["h100-pcie"].speed > TIERS["a100-80gb"].speed > TIERS["rtx-4090"].speed


@pytest.mark.parametrize(
    ("name", "vram_mib", "key"),
    [
        # names as NVML / nvidia-smi print them
        ("NVIDIA GeForce RTX 4090", 24564, "rtx-4090"),
        ("NVIDIA GeForce RTX 4080 SUPER", 16376, "rtx-4080-super"),
        ("NVIDIA GeForce RTX 4070 Ti SUPER", 16376, "rtx-4070-ti-super"),
        ("NVIDIA GeForce RTX 4070 Ti", 12282, "rtx-4070-ti"),
        ("NVIDIA GeForce RTX 4070 SUPER", 12282, "rtx-4070-super"),
        ("NVIDIA GeForce RTX 4070", 12282, "rtx-4070"),
        ("NVIDIA GeForce RTX 4060 Ti", 8188, "rtx-4060-ti"),
        ("NVIDIA GeForce RTX 4060", 8188, "rtx-4060"),
        ("NVIDIA GeForce RTX 3090", 24576, "rtx-3090"),
        ("NVIDIA GeForce RTX 3080", 10240, "rtx-3080"),
        ("NVIDIA GeForce RTX 3070", 8192, "rtx-3070"),
        ("NVIDIA GeForce RTX 3060", 12288, "rtx-3060"),
        ("NVIDIA GeForce RTX 3060 Ti", 8192, "rtx-3060-ti"),
        ("NVIDIA GeForce GTX 1080 Ti", 11264, "gtx-1080-ti"),
        ("NVIDIA GeForce GTX 1660 SUPER", 6144, "gtx-1660"),
        ("NVIDIA GeForce RTX 2080 Ti", 11264, "rtx-2080-ti"),
        ("NVIDIA H200", 143771, "h200"),
        ("NVIDIA H100 80GB HBM3", 81559, "h100-sxm"),
        ("NVIDIA H100 PCIe", 81559, "h100-pcie"),
        ("NVIDIA H100 NVL", 95830, "h100-nvl"),
        ("NVIDIA A100-SXM4-40GB", 40960, "a100-40gb"),
        ("NVIDIA A100-SXM4-80GB", 81920, "a100-80gb"),
        ("NVIDIA A100 80GB PCIe", 81920, "a100-80gb"),
        ("NVIDIA A100-PCIE-40GB", 40960, "a100-40gb"),
        ("NVIDIA L40S", 46068, "l40s"),
        ("NVIDIA L40", 46068, "l40"),
        ("NVIDIA L4", 23034, "l4"),
        ("NVIDIA A10", 23028, "a10"),
        ("NVIDIA A10G", 23028, "a10"),
        ("NVIDIA A40", 46068, "a40"),
        ("Tesla V100-SXM2-16GB", 16384, "v100"),
        ("Tesla V100-PCIE-32GB", 32768, "v100"),
        ("Tesla T4", 15360, "t4"),
        ("NVIDIA RTX A6000", 49140, "rtx-a6000"),
        ("NVIDIA RTX 6000 Ada Generation", 49140, "rtx-6000-ada"),
        ("Quadro RTX 6000", 24576, "quadro-rtx-6000"),
        ("AMD Instinct MI300X", 196608, "mi300x"),
    ],
)
def test_classify_real_names(name: str, vram_mib: int, key: str) -> None:
    tier = classify_gpu(name, vram_mib)
    assert tier.key == key
    assert not tier.guessed and not tier.mobile


@pytest.mark.parametrize(
    "name",
    [
        "nvidia geforce rtx 4090",
        "NVIDIA  GeForce   RTX  4090 ",
        "GeForce RTX 4090",
        "RTX4090",
        "rtx-4090",
        "NVIDIA GeForce RTX 4090 D",
        "NVIDIA(R) GeForce(TM) RTX 4090",
    ],
)
def test_classify_ignores_case_spacing_and_vendor_words(name: str) -> None:
    assert classify_gpu(name).key == "rtx-4090"


def test_classify_keeps_ti_and_super_apart() -> None:
    assert classify_gpu("RTX 4070Ti").key == "rtx-4070-ti"
    assert classify_gpu("RTX 4070 TI SUPER").key == "rtx-4070-ti-super"
    assert classify_gpu("GTX 1080").key == "gtx-1080"
    assert normalize_gpu_name("NVIDIA A100-SXM4-80GB") == "a100"


@pytest.mark.parametrize(
    ("name", "desktop"),
    [
        ("NVIDIA GeForce RTX 4090 Laptop GPU", "rtx-4090"),
        ("NVIDIA GeForce RTX 3060 Laptop GPU", "rtx-3060"),
        ("NVIDIA GeForce RTX 2080 with Max-Q Design", "rtx-2080"),
        ("NVIDIA GeForce RTX 4070 Mobile", "rtx-4070"),
    ],
)
def test_laptop_parts_are_derated_copies(name: str, desktop: str) -> None:
    tier = classify_gpu(name)
    base = TIERS[desktop]
    assert tier.mobile and not tier.guessed
    assert tier.key == f"{desktop}-laptop"
    assert tier.speed < base.speed
    assert CPU_ONLY.price_multiplier < tier.price_multiplier <= base.price_multiplier
    assert "laptop variant" in tier.basis


def test_a100_size_comes_from_vram_when_the_name_lacks_it() -> None:
    assert classify_gpu("NVIDIA A100", 81920).key == "a100-80gb"
    assert classify_gpu("NVIDIA A100", 40960).key == "a100-40gb"
    unsized = classify_gpu("NVIDIA A100")
    assert unsized.key == "a100-40gb" and "assumed" in unsized.basis


def test_unknown_model_is_guessed_from_vram_and_says_so() -> None:
    tier = classify_gpu("NVIDIA Frobnicator X1", 24 * 1024)
    assert tier.guessed
    assert tier.key == "unknown-24gb"
    assert tier.name == "NVIDIA Frobnicator X1"
    assert tier.vram_mib == 24 * 1024
    known_24 = [
        t for t in TIERS.values() if not t.guessed and vram_class(t.vram_mib) == vram_class(24576)
    ]
    slowest = min(known_24, key=lambda t: t.speed)
    assert (tier.speed, tier.price_multiplier) == (slowest.speed, slowest.price_multiplier)
    assert slowest.name in tier.basis and "unknown model" in tier.basis


def test_unknown_model_between_classes_takes_the_class_below() -> None:
    tier = classify_gpu("Mystery 28GB", 28 * 1024)  # no known 28 GB card: the 24 GiB class
    assert tier.guessed and tier.key == "unknown-24gb"


def test_unknown_model_without_vram_gets_the_slowest_card() -> None:
    tier = classify_gpu("something new")
    slowest = min(
        (t for t in TIERS.values() if t.segment is not Segment.CPU), key=lambda t: t.speed
    )
    assert tier.guessed and tier.key == "unknown"
    assert tier.speed == slowest.speed


@given(st.text(max_size=60), st.one_of(st.none(), st.integers(0, 300_000)))
def test_classify_never_raises_and_never_guesses_silently(name: str, vram: int | None) -> None:
    tier = classify_gpu(name, vram)
    assert tier.speed > 0
    assert tier.guessed == (tier.basis.startswith("unknown model"))
    if not tier.guessed:
        assert tier.key.removesuffix("-laptop") in TIERS


@pytest.mark.parametrize(
    ("vram_mib", "gib"),
    [
        (0, 0),
        (4096, 4),
        (6144, 6),
        (8188, 8),
        (10240, 10),
        (11264, 11),
        (12282, 12),
        (15360, 16),  # T4 with ECC
        (16376, 16),
        (23028, 24),  # A10 with ECC
        (24564, 24),
        (32768, 32),
        (40960, 40),
        (46068, 48),  # L40S with ECC
        (81559, 80),
        (95830, 94),
        (143771, 141),
        (196608, 192),
    ],
)
def test_vram_class_of_reported_sizes(vram_mib: int, gib: int) -> None:
    index = vram_class(vram_mib)
    assert VRAM_CLASSES_GIB[index] == gib
    assert vram_class_label(index) == f"{gib} GiB"
    assert vram_class_floor_mib(index) <= vram_mib


@given(st.integers(0, 400_000), st.integers(0, 400_000))
def test_vram_class_is_monotonic(a: int, b: int) -> None:
    if a <= b:
        assert vram_class(a) <= vram_class(b)


def test_regions() -> None:
    assert region_multiplier("us") == 1.0
    for region in REGIONS.values():
        assert 0.5 < region.multiplier <= 1.0
        assert region.multiplier == round(0.5 + 0.5 * region.price_level, 2)
    assert region_multiplier("in") < region_multiplier("eu-east") < region_multiplier("eu-west")
    with pytest.raises(UnknownRegionError):
        region_multiplier("atlantis")
    with pytest.raises(KeyError):  # UnknownRegionError is a KeyError too
        region_multiplier("")


def test_tier_to_dict_is_json_ready() -> None:
    data = classify_gpu("Tesla T4", 15360).to_dict()
    assert data["key"] == "t4" and data["segment"] == "datacenter" and data["guessed"] is False
