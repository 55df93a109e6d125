"""GPU tiers, VRAM classes and regional price levels, shared by the agent and the scheduler.

Pure data and pure functions, no I/O. A :class:`Tier` says how fast a card is relative to the
others (``speed``, for ranking) and how it is priced (``price_multiplier``, for quotes).

* :func:`classify_gpu` maps the name NVML or ``nvidia-smi`` reports ("NVIDIA GeForce RTX 4090",
  "NVIDIA H100 80GB HBM3", "Tesla T4", "NVIDIA GeForce RTX 4070 Laptop GPU") to a tier. A model
  that is not in the table gets a tier derived from its VRAM with ``guessed=True`` and a
  ``basis`` that says what the numbers were copied from: it never guesses silently.
* :func:`vram_class` puts a reported VRAM size in a standard size class (24 GiB, 80 GiB, ...);
  reported sizes sit a little below the nominal ones (a 24 GB RTX 4090 reports 24564 MiB, an
  L40S 46068 MiB), so a class starts at 93% of its nominal size.
* :data:`REGIONS` holds the regional price levels used by quotes.

The published multipliers of the projects GridMarket grew from are kept exactly: RTX 4090 3.0x,
RTX 3090 2.2x, RTX 4070 1.8x, RTX 3060 1.2x, CPU-only 0.8x; the rest of the table extends them.
``speed`` is a rough relative deep-learning throughput (mixed precision, RTX 4090 = 100); it
orders candidates, it is not a benchmark.
"""

from __future__ import annotations

import bisect
import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType

__all__ = [
    "CPU_ONLY",
    "REGIONS",
    "TIERS",
    "VRAM_CLASSES_GIB",
    "Region",
    "Segment",
    "Tier",
    "UnknownRegionError",
    "classify_gpu",
    "normalize_gpu_name",
    "region_multiplier",
    "tier_by_key",
    "vram_class",
    "vram_class_floor_mib",
    "vram_class_label",
]


class Segment(StrEnum):
    """Market segment of a tier."""

    CONSUMER = "consumer"
    WORKSTATION = "workstation"
    DATACENTER = "datacenter"
    CPU = "cpu"


@dataclass(frozen=True, slots=True)
class Tier:
    """One GPU model (or CPU-only) with the numbers matching and pricing use.

    ``vram_mib`` is the nominal size of the table entry (for a guessed tier: the reported size);
    matching always uses the VRAM a node actually reports. ``guessed`` is true when the model
    was not recognised and the numbers were copied from a known card of the same VRAM class;
    ``basis`` says where the numbers come from in words.
    """

    key: str
    name: str
    vendor: str
    segment: Segment
    vram_mib: int
    speed: float
    price_multiplier: float
    guessed: bool = False
    mobile: bool = False
    basis: str = "table"

    def to_dict(self) -> dict[str, object]:
        """A JSON-ready dict."""
        data = dataclasses.asdict(self)
        data["segment"] = self.segment.value
        return data


def _gb(n: float) -> int:
    return int(n * 1024)


_C, _W, _D = Segment.CONSUMER, Segment.WORKSTATION, Segment.DATACENTER

# key, display name, vendor, segment, nominal VRAM GB, speed (RTX 4090 = 100), price multiplier,
# and the extra normalised names (see normalize_gpu_name) that mean the same card.
_TABLE: tuple[tuple[str, str, str, Segment, float, float, float, tuple[str, ...]], ...] = (
    # NVIDIA GeForce, Blackwell / Ada / Ampere / Turing / Pascal
    ("rtx-5090", "NVIDIA GeForce RTX 5090", "nvidia", _C, 32, 130, 3.6, ("rtx 5090 d",)),
    ("rtx-5080", "NVIDIA GeForce RTX 5080", "nvidia", _C, 16, 85, 2.6, ()),
    ("rtx-5070-ti", "NVIDIA GeForce RTX 5070 Ti", "nvidia", _C, 16, 70, 2.3, ()),
    ("rtx-5070", "NVIDIA GeForce RTX 5070", "nvidia", _C, 12, 55, 2.0, ()),
    ("rtx-4090", "NVIDIA GeForce RTX 4090", "nvidia", _C, 24, 100, 3.0, ("rtx 4090 d",)),
    ("rtx-4080-super", "NVIDIA GeForce RTX 4080 SUPER", "nvidia", _C, 16, 80, 2.6, ()),
    ("rtx-4080", "NVIDIA GeForce RTX 4080", "nvidia", _C, 16, 76, 2.5, ()),
    ("rtx-4070-ti-super", "NVIDIA GeForce RTX 4070 Ti SUPER", "nvidia", _C, 16, 63, 2.2, ()),
    ("rtx-4070-ti", "NVIDIA GeForce RTX 4070 Ti", "nvidia", _C, 12, 58, 2.0, ()),
    ("rtx-4070-super", "NVIDIA GeForce RTX 4070 SUPER", "nvidia", _C, 12, 52, 1.9, ()),
    ("rtx-4070", "NVIDIA GeForce RTX 4070", "nvidia", _C, 12, 45, 1.8, ()),
    ("rtx-4060-ti", "NVIDIA GeForce RTX 4060 Ti", "nvidia", _C, 8, 32, 1.4, ()),
    ("rtx-4060", "NVIDIA GeForce RTX 4060", "nvidia", _C, 8, 25, 1.3, ()),
    ("rtx-3090-ti", "NVIDIA GeForce RTX 3090 Ti", "nvidia", _C, 24, 62, 2.4, ()),
    ("rtx-3090", "NVIDIA GeForce RTX 3090", "nvidia", _C, 24, 57, 2.2, ()),
    ("rtx-3080-ti", "NVIDIA GeForce RTX 3080 Ti", "nvidia", _C, 12, 53, 2.0, ()),
    ("rtx-3080", "NVIDIA GeForce RTX 3080", "nvidia", _C, 10, 48, 1.9, ()),
    ("rtx-3070-ti", "NVIDIA GeForce RTX 3070 Ti", "nvidia", _C, 8, 37, 1.6, ()),
    ("rtx-3070", "NVIDIA GeForce RTX 3070", "nvidia", _C, 8, 34, 1.5, ()),
    ("rtx-3060-ti", "NVIDIA GeForce RTX 3060 Ti", "nvidia", _C, 8, 28, 1.3, ()),
    ("rtx-3060", "NVIDIA GeForce RTX 3060", "nvidia", _C, 12, 22, 1.2, ()),
    ("rtx-3050", "NVIDIA GeForce RTX 3050", "nvidia", _C, 8, 13, 1.0, ()),
    ("rtx-2080-ti", "NVIDIA GeForce RTX 2080 Ti", "nvidia", _C, 11, 30, 1.4, ()),
    ("rtx-2080", "NVIDIA GeForce RTX 2080", "nvidia", _C, 8, 22, 1.2, ("rtx 2080 super",)),
    ("rtx-2070", "NVIDIA GeForce RTX 2070", "nvidia", _C, 8, 18, 1.1, ("rtx 2070 super",)),
    ("rtx-2060", "NVIDIA GeForce RTX 2060", "nvidia", _C, 6, 14, 1.0, ("rtx 2060 super",)),
    ("gtx-1080-ti", "NVIDIA GeForce GTX 1080 Ti", "nvidia", _C, 11, 14, 1.0, ()),
    ("gtx-1080", "NVIDIA GeForce GTX 1080", "nvidia", _C, 8, 11, 0.9, ()),
    ("gtx-1070", "NVIDIA GeForce GTX 1070", "nvidia", _C, 8, 9, 0.9, ("gtx 1070 ti",)),
    (
        "gtx-1660",
        "NVIDIA GeForce GTX 1660",
        "nvidia",
        _C,
        6,
        7,
        0.85,
        ("gtx 1660 super", "gtx 1660 ti"),
    ),
    ("gtx-1650", "NVIDIA GeForce GTX 1650", "nvidia", _C, 4, 5, 0.85, ("gtx 1650 super",)),
    # NVIDIA workstation
    ("rtx-6000-ada", "NVIDIA RTX 6000 Ada Generation", "nvidia", _W, 48, 105, 3.4, ()),
    ("rtx-a6000", "NVIDIA RTX A6000", "nvidia", _W, 48, 60, 2.6, ()),
    ("rtx-a5000", "NVIDIA RTX A5000", "nvidia", _W, 24, 45, 2.0, ()),
    ("rtx-a4000", "NVIDIA RTX A4000", "nvidia", _W, 16, 30, 1.5, ()),
    ("quadro-rtx-8000", "Quadro RTX 8000", "nvidia", _W, 48, 34, 1.7, ("rtx 8000",)),
    ("quadro-rtx-6000", "Quadro RTX 6000", "nvidia", _W, 24, 33, 1.6, ("rtx 6000",)),
    # NVIDIA and AMD datacenter
    ("h200", "NVIDIA H200", "nvidia", _D, 141, 260, 9.0, ()),
    ("h100-sxm", "NVIDIA H100 SXM", "nvidia", _D, 80, 240, 8.0, ()),
    ("h100-nvl", "NVIDIA H100 NVL", "nvidia", _D, 94, 220, 7.5, ()),
    ("h100-pcie", "NVIDIA H100 PCIe", "nvidia", _D, 80, 190, 6.5, ()),
    ("a100-80gb", "NVIDIA A100 80GB", "nvidia", _D, 80, 130, 5.0, ()),
    ("a100-40gb", "NVIDIA A100 40GB", "nvidia", _D, 40, 120, 4.2, ()),
    ("l40s", "NVIDIA L40S", "nvidia", _D, 48, 120, 4.0, ()),
    ("l40", "NVIDIA L40", "nvidia", _D, 48, 95, 3.4, ()),
    ("a40", "NVIDIA A40", "nvidia", _D, 48, 55, 2.6, ()),
    ("a30", "NVIDIA A30", "nvidia", _D, 24, 60, 2.2, ()),
    ("a10", "NVIDIA A10", "nvidia", _D, 24, 42, 2.0, ("a10g",)),
    ("l4", "NVIDIA L4", "nvidia", _D, 24, 33, 1.7, ()),
    ("v100", "NVIDIA V100", "nvidia", _D, 16, 45, 1.8, ()),
    ("t4", "NVIDIA T4", "nvidia", _D, 16, 18, 1.1, ()),
    ("p100", "NVIDIA P100", "nvidia", _D, 16, 15, 0.95, ()),
    ("p40", "NVIDIA P40", "nvidia", _D, 24, 12, 0.95, ()),
    ("mi300x", "AMD Instinct MI300X", "amd", _D, 192, 250, 8.0, ()),
)

CPU_ONLY = Tier(
    key="cpu",
    name="CPU only",
    vendor="none",
    segment=Segment.CPU,
    vram_mib=0,
    speed=1.0,
    price_multiplier=0.8,
)

TIERS: Mapping[str, Tier] = MappingProxyType(
    {
        CPU_ONLY.key: CPU_ONLY,
        **{
            key: Tier(key, name, vendor, segment, _gb(gb), speed, mult)
            for key, name, vendor, segment, gb, speed, mult, _aliases in _TABLE
        },
    }
)
"""Every known tier by key, CPU-only included."""


def tier_by_key(key: str) -> Tier:
    """The table tier for ``key`` (``KeyError`` if there is none)."""
    return TIERS[key]


# --------------------------------------------------------------------------- VRAM classes
VRAM_CLASSES_GIB: tuple[int, ...] = (
    0, 2, 3, 4, 6, 8, 10, 11, 12, 16, 20, 24, 32, 40, 48, 64, 80, 94, 141, 192, 256
)  # fmt: skip
"""Standard VRAM sizes, GiB. Class ``i`` holds sizes from 93% of ``VRAM_CLASSES_GIB[i]``."""

_CLASS_FRACTION = 0.93
_CLASS_FLOORS_MIB: tuple[int, ...] = tuple(
    int(g * 1024 * _CLASS_FRACTION) for g in VRAM_CLASSES_GIB
)


def vram_class(vram_mib: int) -> int:
    """Index in :data:`VRAM_CLASSES_GIB` of the class holding ``vram_mib`` (0 for no GPU)."""
    if vram_mib <= 0:
        return 0
    return bisect.bisect_right(_CLASS_FLOORS_MIB, vram_mib) - 1


def vram_class_floor_mib(index: int) -> int:
    """Smallest reported size, MiB, that falls in class ``index``."""
    return _CLASS_FLOORS_MIB[index]


def vram_class_label(index: int) -> str:
    """``"24 GiB"`` for the 24 GiB class."""
    return f"{VRAM_CLASSES_GIB[index]} GiB"


# --------------------------------------------------------------------------- name matching
_VENDOR_WORDS = frozenset(
    {"nvidia", "geforce", "tesla", "quadro", "amd", "ati", "instinct", "radeon", "graphics", "gpu"}
)
_MOBILE_WORDS = frozenset({"laptop", "mobile", "maxq", "maxp", "notebook"})
_NOISE_WORDS = frozenset({"generation", "with", "design", "r", "tm", "corporation"})
_FORM_WORDS = frozenset(
    {"pcie", "sxm", "sxm2", "sxm3", "sxm4", "sxm5", "nvl", "hbm2", "hbm2e", "hbm3", "hbm3e"}
)
_MEMORY_WORD = re.compile(r"^(\d+)gb$")

_ALIASES: dict[str, str] = {}
for _key, _name, _vendor, _segment, _gb_size, _speed, _mult, _more in _TABLE:
    for _alias in (_key.replace("-", " "), *_more):
        _ALIASES[_alias] = _key


@dataclass(frozen=True, slots=True)
class _ParsedName:
    base: str
    mobile: bool
    form: frozenset[str]
    memory_gb: int | None


def normalize_gpu_name(name: str) -> str:
    """Lower-case words of a GPU name without vendor, brand, form-factor or memory words.

    ``"NVIDIA GeForce RTX 4070 Ti SUPER"`` -> ``"rtx 4070 ti super"``,
    ``"NVIDIA A100-SXM4-80GB"`` -> ``"a100"``, ``"NVIDIA GeForce RTX4090 Laptop GPU"`` ->
    ``"rtx 4090"``.
    """
    return _parse(name).base


def _parse(name: str) -> _ParsedName:
    text = name.lower().replace("(r)", " ").replace("(tm)", " ")
    text = re.sub(r"max[\s-]*([qp])\b", r"max\1", text)
    text = re.sub(r"[^a-z0-9]+", " ", text)
    text = re.sub(r"\b(rtx|gtx|gt)(\d)", r"\1 \2", text)  # "rtx4090" -> "rtx 4090"
    text = re.sub(r"(\d)(ti|super|d)\b", r"\1 \2", text)  # "4070ti" -> "4070 ti"
    text = re.sub(r"\b(\d+) gb\b", r"\1gb", text)  # "80 gb" -> "80gb"
    words: list[str] = []
    mobile = False
    form: set[str] = set()
    memory_gb: int | None = None
    for word in text.split():
        memory = _MEMORY_WORD.match(word)
        if memory:
            memory_gb = int(memory.group(1))
        elif word in _MOBILE_WORDS:
            mobile = True
        elif word in _FORM_WORDS:
            form.add(word)
        elif word not in _VENDOR_WORDS and word not in _NOISE_WORDS:
            words.append(word)
    return _ParsedName(" ".join(words), mobile, frozenset(form), memory_gb)


def _datacenter_key(parsed: _ParsedName, vram_mib: int | None) -> tuple[str, str] | None:
    """Tier key and basis for the models whose name needs its form factor or memory size."""
    base, form = parsed.base, parsed.form
    if base == "h100":
        if "nvl" in form:
            return "h100-nvl", "table"
        if "pcie" in form:
            return "h100-pcie", "table"
        return "h100-sxm", "table"  # "H100 80GB HBM3" and "H100 SXM5 80GB" are SXM parts
    if base == "a100":
        if parsed.memory_gb is not None:
            return ("a100-80gb" if parsed.memory_gb >= 60 else "a100-40gb"), "table"
        if vram_mib:
            return ("a100-80gb" if vram_mib >= 60 * 1024 else "a100-40gb"), "table (size by VRAM)"
        return "a100-40gb", "table (size not reported: the smaller A100 assumed)"
    return None


_LAPTOP_SPEED = 0.7
_LAPTOP_PRICE = 0.75


def _laptop(tier: Tier) -> Tier:
    """The laptop part of a desktop model: the same name, a slower chip at lower power."""
    return dataclasses.replace(
        tier,
        key=f"{tier.key}-laptop",
        name=f"{tier.name} Laptop GPU",
        speed=round(tier.speed * _LAPTOP_SPEED, 1),
        price_multiplier=max(0.85, round(tier.price_multiplier * _LAPTOP_PRICE, 2)),
        mobile=True,
        basis=f"laptop variant of {tier.name}: speed x{_LAPTOP_SPEED}, price x{_LAPTOP_PRICE}",
    )


def _guess_from_vram(name: str, vram_mib: int | None) -> Tier:
    """A tier for an unknown model: the numbers of the slowest known card of its VRAM class.

    Copying from the slowest card of the largest known class that the reported VRAM reaches
    keeps a guess from out-ranking or out-pricing the cards that really have that much memory.
    """
    cards = [t for t in TIERS.values() if t.segment is not Segment.CPU]
    if vram_mib:
        reported_class = vram_class(vram_mib)
        reachable = [t for t in cards if vram_class(t.vram_mib) <= reported_class]
    else:
        reachable = []
    if reachable:
        top = max(vram_class(t.vram_mib) for t in reachable)
        pool = [t for t in reachable if vram_class(t.vram_mib) == top]
        label = f"slowest known {vram_class_label(top)} card"
    else:
        pool, label = cards, "slowest known card"
    like = min(pool, key=lambda t: (t.speed, t.price_multiplier, t.key))
    size = f"{vram_mib} MiB" if vram_mib else "unknown VRAM"
    vendor = "amd" if re.search(r"\b(amd|radeon|instinct)\b", name.lower()) else "nvidia"
    return Tier(
        key=f"unknown-{VRAM_CLASSES_GIB[vram_class(vram_mib)]}gb" if vram_mib else "unknown",
        name=name.strip() or "unknown GPU",
        vendor=vendor,
        segment=like.segment,
        vram_mib=vram_mib or 0,
        speed=like.speed,
        price_multiplier=like.price_multiplier,
        guessed=True,
        basis=f"unknown model ({size}): numbers of the {label}, {like.name}",
    )


def classify_gpu(name: str, vram_mib: int | None = None) -> Tier:
    """The tier of a GPU from the name its driver reports (and, optionally, its VRAM in MiB).

    Case, spacing, hyphens, vendor and brand words ("NVIDIA", "GeForce", "Tesla", "AMD
    Instinct"), form factor and memory words ("SXM4", "PCIe", "80GB HBM3") do not matter.
    Laptop parts ("... Laptop GPU", "Max-Q") get a derated copy of the desktop tier
    (``mobile=True``). An unknown model gets :func:`_guess_from_vram`'s tier with
    ``guessed=True``.
    """
    parsed = _parse(name)
    found = _datacenter_key(parsed, vram_mib)
    if found is None and parsed.base in _ALIASES:
        found = _ALIASES[parsed.base], "table"
    if found is None:
        return _guess_from_vram(name, vram_mib)
    key, basis = found
    tier = TIERS[key]
    if basis != "table":
        tier = dataclasses.replace(tier, basis=basis)
    return _laptop(tier) if parsed.mobile else tier


# --------------------------------------------------------------------------- regions
class UnknownRegionError(KeyError):
    """A region code that is not in :data:`REGIONS`."""


@dataclass(frozen=True, slots=True)
class Region:
    """A pricing region.

    ``price_level`` is the region's price level relative to the United States (purchasing power
    parity over exchange rate, World Bank ICP figures, rounded). Only part of a GPU-hour's cost
    follows local prices (power, rent, labour); the hardware is bought at world prices. So the
    quote multiplier moves half as much: ``0.5 + 0.5 * price_level``.
    """

    code: str
    name: str
    price_level: float

    @property
    def multiplier(self) -> float:
        """Quote multiplier for this region (1.0 for the United States)."""
        return round(0.5 + 0.5 * self.price_level, 2)


REGIONS: Mapping[str, Region] = MappingProxyType(
    {
        r.code: r
        for r in (
            Region("us", "United States", 1.00),
            Region("ca", "Canada", 0.88),
            Region("eu-west", "Western Europe", 0.88),
            Region("eu-north", "Nordics", 1.00),
            Region("eu-east", "Central and Eastern Europe", 0.50),
            Region("uk", "United Kingdom", 0.90),
            Region("jp", "Japan", 0.60),
            Region("kr", "South Korea", 0.66),
            Region("sg", "Singapore", 0.80),
            Region("au", "Australia", 0.90),
            Region("br", "Brazil", 0.45),
            Region("in", "India", 0.25),
        )
    }
)
"""Pricing regions by code."""


def region_multiplier(code: str) -> float:
    """Quote multiplier of region ``code`` (:class:`UnknownRegionError` if it is not known)."""
    try:
        return REGIONS[code].multiplier
    except KeyError:
        raise UnknownRegionError(code) from None
