"""MIG-capable GPU models and the GPU instance profiles each supports, as data.

Source: NVIDIA Multi-Instance GPU User Guide, "Supported MIG Profiles"
(https://docs.nvidia.com/datacenter/tesla/mig-user-guide/supported-mig-profiles.html):
the profile tables and placement diagrams for A100-SXM4-40GB, A100-SXM4-80GB, H100 80GB
and H200 141GB; the start positions are those `nvidia-smi mig -lgipp` lists, i.e. NVML's
`nvmlGpuInstancePlacement_t` (start = first memory slice, size = memory slices occupied;
8 memory slices per GPU, 7 compute slices).

Each profile: (name, compute slices, memory slices occupied, memory MiB, legal starts).
Memory is the profile's nominal size (the GB in its name, x 1024); the driver reports a
little less (for example 4864 MiB for 1g.5gb), so a memory request is mapped with the
nominal size, as users read the names. The "+me" profiles (media extensions, at most one
per GPU) are left out: GPUPool does not schedule media engines.
"""

from __future__ import annotations

COMPUTE_SLICES = 7  # a full GPU: 7g
MEMORY_SLICES = 8  # the placement grid NVML reports starts and sizes on

SOURCE = "NVIDIA Multi-Instance GPU User Guide, Supported MIG Profiles"

Row = tuple[str, int, int, int, tuple[int, ...]]

_80GB: tuple[Row, ...] = (
    ("1g.10gb", 1, 1, 10 * 1024, (0, 1, 2, 3, 4, 5, 6)),
    ("1g.20gb", 1, 2, 20 * 1024, (0, 2, 4, 6)),
    ("2g.20gb", 2, 2, 20 * 1024, (0, 2, 4)),
    ("3g.40gb", 3, 4, 40 * 1024, (0, 4)),
    ("4g.40gb", 4, 4, 40 * 1024, (0,)),
    ("7g.80gb", 7, 8, 80 * 1024, (0,)),
)

# model -> rows. The layouts of the four models are the same; the memory per slice differs.
PROFILES: dict[str, tuple[Row, ...]] = {
    "A100-40GB": (
        ("1g.5gb", 1, 1, 5 * 1024, (0, 1, 2, 3, 4, 5, 6)),
        ("1g.10gb", 1, 2, 10 * 1024, (0, 2, 4, 6)),
        ("2g.10gb", 2, 2, 10 * 1024, (0, 2, 4)),
        ("3g.20gb", 3, 4, 20 * 1024, (0, 4)),
        ("4g.20gb", 4, 4, 20 * 1024, (0,)),
        ("7g.40gb", 7, 8, 40 * 1024, (0,)),
    ),
    "A100-80GB": _80GB,
    "H100-80GB": _80GB,  # the same names, slices and placements as A100 80GB
    "H200-141GB": (
        ("1g.18gb", 1, 1, 18 * 1024, (0, 1, 2, 3, 4, 5, 6)),
        ("1g.35gb", 1, 2, 35 * 1024, (0, 2, 4, 6)),
        ("2g.35gb", 2, 2, 35 * 1024, (0, 2, 4)),
        ("3g.71gb", 3, 4, 71 * 1024, (0, 4)),
        ("4g.71gb", 4, 4, 71 * 1024, (0,)),
        ("7g.141gb", 7, 8, 141 * 1024, (0,)),
    ),
}

# How a device's reported name and memory map to a row above: family, then the memory
# class nearest the device's memory (NVML names vary: "NVIDIA A100-SXM4-80GB",
# "NVIDIA H100 80GB HBM3", "NVIDIA H200").
FAMILIES: dict[str, tuple[tuple[int, str], ...]] = {
    "A100": ((40, "A100-40GB"), (80, "A100-80GB")),
    "H100": ((80, "H100-80GB"),),
    "H200": ((141, "H200-141GB"),),
}
