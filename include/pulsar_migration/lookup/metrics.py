"""Prometheus text exposition for the lookup service, without a client library: a few counters, two gauges
and two histograms are all it needs."""

from __future__ import annotations

import bisect
from collections import Counter
from dataclasses import dataclass, field

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 25.0)


@dataclass
class Histogram:
    buckets: tuple[float, ...] = LATENCY_BUCKETS
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    n: int = 0

    def __post_init__(self) -> None:
        self.counts = [0] * len(self.buckets)

    def observe(self, value: float) -> None:
        index = bisect.bisect_left(self.buckets, value)
        if index < len(self.counts):
            self.counts[index] += 1
        self.total += value
        self.n += 1

    def lines(self, name: str, labels: str = "") -> list[str]:
        out, running = [], 0
        sep = "," if labels else ""
        for bound, count in zip(self.buckets, self.counts, strict=True):
            running += count
            out.append(f'{name}_bucket{{{labels}{sep}le="{bound}"}} {running}')
        out.append(f'{name}_bucket{{{labels}{sep}le="+Inf"}} {self.n}')
        suffix = f"{{{labels}}}" if labels else ""
        out += [f"{name}_sum{suffix} {self.total:.6f}", f"{name}_count{suffix} {self.n}"]
        return out


@dataclass
class Metrics:
    requests: Counter[tuple[str, str, int]] = field(default_factory=Counter)  # (kind, cluster, status)
    latency: dict[str, Histogram] = field(default_factory=dict)  # per kind, parking included
    park_seconds: Histogram = field(default_factory=Histogram)
    parked: int = 0
    parked_total: int = 0
    hold_timeouts_total: int = 0
    forward_errors_total: int = 0
    transient_retries_total: int = 0
    rerouted_total: int = 0
    unauthorized_total: int = 0

    def count(self, kind: str, cluster: str, status: int, seconds: float) -> None:
        self.requests[(kind, cluster, status)] += 1
        self.latency.setdefault(kind, Histogram()).observe(seconds)

    def render(self, *, held_tenants: int) -> str:
        lines = ["# HELP pulsar_lookup_requests_total Client requests forwarded, by kind, cluster and status.",
                 "# TYPE pulsar_lookup_requests_total counter"]
        for (kind, cluster, status), n in sorted(self.requests.items()):
            lines.append(f'pulsar_lookup_requests_total{{kind="{kind}",cluster="{cluster}",status="{status}"}} {n}')
        lines += ["# HELP pulsar_lookup_request_seconds Time to answer a client request (parking included).",
                  "# TYPE pulsar_lookup_request_seconds histogram"]
        for kind, histogram in sorted(self.latency.items()):
            lines += histogram.lines("pulsar_lookup_request_seconds", f'kind="{kind}"')
        lines += ["# HELP pulsar_lookup_park_seconds Time requests of held tenants waited.",
                  "# TYPE pulsar_lookup_park_seconds histogram", *self.park_seconds.lines("pulsar_lookup_park_seconds")]
        for name, kind, value, text in (
                ("pulsar_lookup_parked_requests", "gauge", self.parked, "Requests parked now."),
                ("pulsar_lookup_held_tenants", "gauge", held_tenants, "Tenants held now."),
                ("pulsar_lookup_parked_total", "counter", self.parked_total, "Requests ever parked."),
                ("pulsar_lookup_hold_timeouts_total", "counter", self.hold_timeouts_total,
                 "Parked requests answered 503 because the hold outlasted hold_timeout_s."),
                ("pulsar_lookup_forward_errors_total", "counter", self.forward_errors_total,
                 "Requests whose cluster did not answer."),
                ("pulsar_lookup_transient_retries_total", "counter", self.transient_retries_total,
                 "Lookups retried by the service after a transient 5xx of the broker (an unload, a bundle move)."),
                ("pulsar_lookup_rerouted_total", "counter", self.rerouted_total,
                 "Answers dropped because a hold or a route change of their tenant came while they were forwarded."),
                ("pulsar_lookup_unauthorized_total", "counter", self.unauthorized_total,
                 "Admin API calls refused (401).")):
            lines += [f"# HELP {name} {text}", f"# TYPE {name} {kind}", f"{name} {value}"]
        return "\n".join(lines) + "\n"
