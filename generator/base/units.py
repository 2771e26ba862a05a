"""Sizes as people read them."""


def size(n: float) -> str:
    """4123 -> '4.0 KiB'; 0 -> '0 B'."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024:
            return f"{n:.0f} B" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"
