"""Per-service SLOs and their burn-rate alerts (the ``[analytics.slos]`` table).

::

    [analytics.slos]
    period_days = 30                       # the compliance period of every SLO

    [[analytics.slos.services]]
    service = "llama-70b"
    availability = 0.999                   # 99.9% of requests succeed (is_error false)
    latency = [{metric = "ttft", threshold_s = 1.0, objective = 0.99}]

A service with no entry has no SLO: fleetlens invents no objective. ``alerts`` defaults to the
SRE workbook's multiwindow, multi-burn-rate rules (page at 14.4x over 1 h and 5 min, page at
6x over 6 h and 30 min, ticket at 1x over 3 days and 6 h).
"""

from __future__ import annotations

from dataclasses import dataclass

from fleetlens.pipeline.schema.settings import ConfigError, require

#: Latency metrics a latency SLO may judge (``requests`` columns ``<metric>_s``).
LATENCY_METRICS = ("ttft", "e2e", "tpot", "queue")
SEVERITIES = ("page", "ticket")
AVAILABILITY = "availability"
LATENCY = "latency"


@dataclass(frozen=True)
class LatencySlo:
    """A share of requests whose latency is at most a threshold: TTFT <= 1 s for 99%."""

    #: ttft, e2e, tpot or queue.
    metric: str = "ttft"
    #: A good request's metric is at most this, s (Prometheus' ``le`` buckets count the same).
    threshold_s: float = 1.0
    #: The share of requests that must be good, in (0, 1).
    objective: float = 0.99
    #: The SLO's name in tables, labels and alerts (default ``<metric>_<threshold>s``).
    name: str = ""

    def slo_name(self) -> str:
        """``name``, else e.g. ``ttft_1s``."""
        return self.name or f"{self.metric}_{self.threshold_s:g}s"

    def validate(self) -> None:
        """Refuse an unmeasured metric, a threshold <= 0, an objective out of (0, 1)."""
        require(self.metric in LATENCY_METRICS, "metric",
                f"{self.metric!r} is not one of {', '.join(LATENCY_METRICS)}")
        require(self.threshold_s > 0, "threshold_s", "must be positive")
        require(0 < self.objective < 1, "objective", "must be in (0, 1), e.g. 0.99")


@dataclass(frozen=True)
class ServiceSlos:
    """The SLOs of one service (``service_name`` as the telemetry spells it)."""

    service: str = ""
    #: Share of requests that must succeed (``is_error`` false); unset: no availability SLO.
    availability: float | None = None
    latency: tuple[LatencySlo, ...] = ()

    def validate(self) -> None:
        """Refuse an unnamed service, an objective out of (0, 1), two SLOs of one name."""
        require(bool(self.service), "service", "must name the service (its service_name)")
        require(self.availability is None or 0 < self.availability < 1, "availability",
                "must be in (0, 1), e.g. 0.999")
        require(self.availability is not None or bool(self.latency), "availability",
                f"service {self.service!r} has neither an availability nor a latency SLO")
        names = [AVAILABILITY] if self.availability is not None else []
        for i, slo in enumerate(self.latency):
            try:
                slo.validate()
            except ConfigError as exc:
                raise ConfigError(f"latency[{i}].{exc}") from None
            require(slo.slo_name() not in names, f"latency[{i}].name",
                    f"{slo.slo_name()!r} names two SLOs of service {self.service!r}")
            names.append(slo.slo_name())


@dataclass(frozen=True)
class BurnRateAlert:
    """Alert when the burn rate is at least ``factor`` over both windows (ending now).

    The long window says the budget is really burning; the short one that it still is, so
    the alert resolves soon after the burning stops.
    """

    severity: str = "page"
    factor: float = 14.4
    long_window_s: int = 3600
    short_window_s: int = 300

    def name(self) -> str:
        """A stable name, e.g. ``page_1h_5m`` (window labels as Prometheus writes them)."""
        return f"{self.severity}_{window_label(self.long_window_s)}_" \
               f"{window_label(self.short_window_s)}"

    def validate(self) -> None:
        """Refuse an unknown severity, a factor <= 0, a short window not under the long one."""
        require(self.severity in SEVERITIES, "severity",
                f"{self.severity!r} is not one of {', '.join(SEVERITIES)}")
        require(self.factor > 0, "factor", "must be positive")
        require(self.short_window_s > 0, "short_window_s", "must be positive")
        require(self.short_window_s < self.long_window_s, "short_window_s",
                "must be shorter than long_window_s")


def _workbook_alerts() -> tuple[BurnRateAlert, ...]:
    # The SRE workbook, "Alerting on SLOs", table 5-8 (30-day period): 2% of the budget in
    # 1 h and 5% in 6 h page; 10% in 3 days files a ticket.
    return (BurnRateAlert("page", 14.4, 3600, 300),
            BurnRateAlert("page", 6.0, 6 * 3600, 1800),
            BurnRateAlert("ticket", 1.0, 3 * 86400, 6 * 3600))


@dataclass(frozen=True)
class SloConfig:
    """Every service's SLOs, their compliance period and the burn-rate alert rules."""

    services: tuple[ServiceSlos, ...] = ()
    #: The compliance period the error budget is counted over, days.
    period_days: int = 30
    alerts: tuple[BurnRateAlert, ...] = _workbook_alerts()

    @property
    def period_s(self) -> int:
        return self.period_days * 86400

    def windows_s(self) -> tuple[int, ...]:
        """Every alert window, shortest first (the burn rates reported)."""
        return tuple(sorted({w for a in self.alerts for w in (a.short_window_s,
                                                              a.long_window_s)}))

    def validate(self) -> None:
        """Check every service and alert; errors name the item (``services[0].latency[1]``)."""
        require(self.period_days >= 1, "period_days", "must be at least 1")
        seen: set[str] = set()
        for i, service in enumerate(self.services):
            try:
                service.validate()
            except ConfigError as exc:
                raise ConfigError(f"services[{i}].{exc}") from None
            require(service.service not in seen, f"services[{i}].service",
                    f"{service.service!r} is configured twice")
            seen.add(service.service)
        names: set[str] = set()
        for i, alert in enumerate(self.alerts):
            try:
                alert.validate()
            except ConfigError as exc:
                raise ConfigError(f"alerts[{i}].{exc}") from None
            require(alert.long_window_s <= self.period_s, f"alerts[{i}].long_window_s",
                    "must not exceed the compliance period")
            require(alert.name() not in names, f"alerts[{i}]", f"{alert.name()} is twice")
            names.add(alert.name())


def window_label(seconds: int) -> str:
    """A window as Prometheus writes a range: 300 -> ``5m``, 3600 -> ``1h``, 259200 -> ``3d``."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


__all__ = ["AVAILABILITY", "LATENCY", "LATENCY_METRICS", "SEVERITIES", "BurnRateAlert",
           "LatencySlo", "ServiceSlos", "SloConfig", "window_label"]
