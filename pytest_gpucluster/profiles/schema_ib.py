"""The profile's ``fabric.ib:`` section: what ``gpucluster fabric scan`` holds the InfiniBand
fabric to (docs/how-to/ib-fabric.md)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from pytest_gpucluster.profiles.fields import Section

_SPEEDS = ("SDR", "DDR", "QDR", "FDR10", "FDR", "EDR", "HDR", "NDR", "XDR")


class IbFabricSettings(Section):
    """The InfiniBand fabric as cabled: the rated link and the layout ``gpucluster fabric scan`` checks."""

    link_width: int | None = Field(
        None,
        description="Lanes every cable should train at (4 for a 4X link). Default: the most common width "
        "among cables of the same kind (host cables, switch-to-switch cables).",
    )
    link_speed: str | None = Field(
        None,
        description="Lane speed every cable should run at, by IBTA name (EDR, HDR, NDR, XDR). Default: the "
        "most common among cables of the same kind.",
    )
    rails: int | None = Field(
        None,
        ge=1,
        description="HCAs each GPU node has on the fabric. Default: cluster.nics_per_node, else the most "
        "common count among the fabric's hosts.",
    )
    topology: Literal["rail-optimized", "fat-tree"] = Field(
        "fat-tree",
        description="'rail-optimized': every node's rail-r HCA must sit on a leaf of rail r (the leaf's "
        "majority rail); 'fat-tree': no rail check.",
    )

    @field_validator("link_speed")
    @classmethod
    def _speed(cls, value: str | None) -> str | None:
        if value is not None and value.upper() not in _SPEEDS:
            raise ValueError(f"{value!r} is not an IBTA lane speed; one of {', '.join(_SPEEDS)}")
        return None if value is None else value.upper()
