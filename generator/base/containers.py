"""A container as Docker describes it, read one way everywhere: the Compose service it runs and
its state in words."""

from __future__ import annotations

from python_on_whales import Container
from python_on_whales.components.container.models import ContainerState

SERVICE = "com.docker.compose.service"  # the label naming a container's service


def service_of(container: Container) -> str:
    """Its Compose service (its name, for a container Compose did not start)."""
    return (container.config.labels or {}).get(SERVICE, container.name)


def health_of(state: ContainerState) -> str | None:
    """Its healthcheck's status ("starting", "healthy", "unhealthy"); None without a check."""
    return state.health.status if state.health else None


def described(state: ContainerState) -> str:
    """`running, healthy`, `running`, or `exited (exit 1)`: what status and top show."""
    if not state.running:
        return f"{state.status} (exit {state.exit_code})"
    health = health_of(state)
    return f"running, {health}" if health else "running"
