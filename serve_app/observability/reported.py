"""A counter whose running totals another part counts and this process reports."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector


@dataclass
class _Reported:
    values: dict[tuple[str, ...], float]
    key: tuple[str, ...]

    def set(self, total: float) -> None:
        self.values[self.key] = total


class ReportedCounter(Collector):
    """Running totals another process counts and this one reports (``labels(...).set(total)``),
    exposed as a counter (``<name>_total``): rate() and increase() apply, which a gauge would not allow."""

    def __init__(self, name: str, documentation: str, labelnames: list[str]) -> None:
        self.name, self.documentation, self.labelnames = name, documentation, labelnames
        self.values: dict[tuple[str, ...], float] = {}

    def labels(self, *values: str) -> _Reported:
        return _Reported(self.values, tuple(values))

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for key, total in sorted(self.values.items()):
            family.add_metric(list(key), total)
        yield family
