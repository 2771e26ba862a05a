"""Comparing two listings of a model folder (relative path -> size): the one place that says
which files are missing, extra, or of another size. Used by preflight (a node against the head)
and the lock (a node against the manifest it recorded)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Differences:
    missing: list[str]  # in `want`, not in `have`
    extra: list[str]  # in `have`, not in `want`
    size: list[str]  # in both, of another size

    def __bool__(self) -> bool:
        return bool(self.missing or self.extra or self.size)

    def labelled(self, missing: str, extra: str, size: str) -> list[tuple[str, list[str]]]:
        """(label, names) for each kind of difference there is, under the caller's labels."""
        found = ((missing, self.missing), (extra, self.extra), (size, self.size))
        return [(label, names) for label, names in found if names]


def differences(want: dict[str, int], have: dict[str, int]) -> Differences:
    return Differences(
        missing=sorted(set(want) - set(have)),
        extra=sorted(set(have) - set(want)),
        size=sorted(n for n in set(want) & set(have) if want[n] != have[n]),
    )
