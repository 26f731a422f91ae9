"""The part floors reference: every shipped part profile's floors, as ``profiles.part_rules``
derives them from the part's datasheet figures in ``thresholds/devices.yaml``."""

from __future__ import annotations

import re

from docs.gen.md import GENERATED, cell, code, table

__all__ = ["render_part_floors"]


def _value(key: str, value: float, units: dict[str, str]) -> str:
    pattern = re.sub(r"\[\d+\]", "[]", key)
    unit = units.get(pattern) or units.get(pattern.rsplit(".", 1)[0], "")
    if unit == "B/s":
        return f"{value / 1e9:,.4g} GB/s"
    if unit == "FLOP/s":
        return f"{value / 1e12:,.4g} TFLOP/s"
    return f"{value:g}" + (f" {unit}" if unit else "")


def render_part_floors() -> str:
    from docs.gen.profile_page import walk
    from pytest_gpucluster.profiles import part_rules
    from pytest_gpucluster.profiles.devices import load_devices
    from pytest_gpucluster.profiles.loader import load_profile
    from pytest_gpucluster.profiles.schema import ProfileModel

    units = {k.key: k.unit for k in walk(ProfileModel)}
    out = [
        GENERATED,
        "# Part floors\n",
        "The floors of each shipped part profile (`thresholds/<part>.yaml`), as `profiles/part_rules.py` "
        "derives them from the part's datasheet figures in `thresholds/devices.yaml`; "
        "`tests/unit/test_part_profiles.py` holds every profile file to these numbers. Why each "
        "fraction sits where it does: [Thresholds from datasheets](../explanation/thresholds-from-datasheets.md).\n",
        table(
            ("rule", "fraction"),
            [
                ("`burnin.min_matmul`: of the dense bf16 peak", f"{part_rules.MATMUL_FRACTION:.0%}"),
                (
                    "`burnin.min_memory_bandwidth`: of the memory bandwidth",
                    f"{part_rules.MEMORY_FRACTION:.0%}",
                ),
                (
                    "`burnin.min_h2d_bandwidth`: of the PCIe link per direction",
                    f"{part_rules.H2D_FRACTION:.0%}",
                ),
                (
                    "intra-node all_reduce floor on an NVSwitch node: of NVLink per direction",
                    f"{part_rules.INTRA_NODE_FRACTION:.0%}",
                ),
                ("`nvlink.min_speedup` on an NVSwitch node", f"{part_rules.MIN_SPEEDUP:g}x"),
            ]
            + [
                (f"`numerics.min_flops.{dtype}`: of the dense {dtype} peak", f"{fraction:.0%}")
                for dtype, fraction in part_rules.NUMERICS_FRACTIONS.items()
            ],
        ),
    ]
    for device in load_devices():
        model = load_profile(device.key).model
        nvlink = model.nvlink is not None
        switched = nvlink and model.nvlink.topology is not None
        floors = part_rules.part_floors(device, nvlink=nvlink, switched=switched)
        out.append(f"## `{device.key}`: {device.part}\n")
        out.append(f"Datasheet: {cell(device.source)}.\n")
        out.append(
            table(
                ("key", "floor", "from"),
                ((code(f.key), _value(f.key, f.value, units), cell(f.derivation)) for f in floors),
            )
        )
    return "\n".join(out)
