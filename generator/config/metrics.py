"""The `metrics` section: Prometheus on the head, exporters on every node, and the front door's
counts per key (stack/monitoring.py and stack/doorcounts.py render them)."""

from __future__ import annotations

from ipaddress import IPv4Address
from typing import Annotated

from pydantic import Field, field_validator

from generator.config.sections import Port, Strict, image


class Metrics(Strict):
    prometheus_image: str = image(
        "prom/prometheus:v3.5.0",
        "Prometheus image, run on the head; it scrapes every exporter over the private link and "
        "vLLM's /metrics (with the API key when there is no front door).",
    )
    node_exporter_image: str = image(
        "prom/node-exporter:v1.9.1",
        "Node exporter image, run on every node (host CPU, memory, disks, network).",
    )
    dcgm_exporter_image: str = image(
        "nvcr.io/nvidia/k8s/dcgm-exporter:4.2.3-4.1.3-ubuntu22.04",
        "NVIDIA's DCGM exporter image, run on every node with `accelerator: nvidia`.",
    )
    mtail_image: str = image(
        "ghcr.io/jaqx0r/mtail:3.4.9",
        "mtail image, run on the head with the front door: it counts requests and tokens per "
        "key and model from the door's log, for Prometheus.",
    )
    port: Port = Field(default=9090, description="Port of Prometheus on the head.")
    listen: Annotated[IPv4Address, Field(strict=False)] | None = Field(
        default=None,
        description="Address Prometheus listens on (default: the head's private IP; 0.0.0.0 "
        "opens it on every address). The exporters listen on each node's private IP only.",
    )
    node_exporter_port: Port = Field(default=9100, description="Port of each node's exporter.")
    ray_port: Port | None = Field(
        default=None,
        description="Ray's metrics export port on each Ray node (backend: ray; the image's Ray "
        "needs its dashboard extra). Off by default: Ray binds it to every address of the node.",
    )
    dcgm_port: Port = Field(default=9400, description="Port of each node's DCGM exporter.")
    scrape_interval: int = Field(
        default=15, ge=1, le=3600, description="Seconds between two scrapes of every target."
    )
    retention: str = Field(
        default="15d",
        pattern=r"^[0-9]+(ms|s|m|h|d|w|y)$",
        description="How long Prometheus keeps its samples (its volume on the head), e.g. 15d.",
    )

    @field_validator("retention")
    @classmethod
    def _retention_prometheus_can_read(cls, value: str) -> str:
        """Prometheus refuses 0 and a duration past its int64 of milliseconds (292 years)."""
        number, unit = int(value.rstrip("mshdwy")), value.lstrip("0123456789")
        seconds = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
        if number == 0 or number * seconds.get(unit, 31536000) > 100 * 31536000:
            raise ValueError(f"{value}: between 1 and 100 years' worth, e.g. 15d")
        return value

    @field_validator("listen", mode="before")
    @classmethod
    def _listen_is_written_as_an_address(cls, value: object) -> object:
        if value is not None and not isinstance(value, str):
            raise ValueError(f"expected an address like 192.168.200.12, got {value!r}")
        return value
