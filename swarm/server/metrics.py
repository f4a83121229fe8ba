"""/metrics: the swarm in Prometheus' text format, through prometheus_client.

Three sources, each read where it is exact:
- gauges (running and waiting turns, slots, KV blocks) are read from the
  scheduler at scrape time;
- counters and the wait histogram follow the event stream (every turn, HTTP or
  in-process);
- time to first token and inter-token latency are measured where the HTTP
  caller sees them: from the request's arrival to each piece handed to the
  response. The label `class` is foreground (priority >= FOREGROUND) or background.

Each server has its own registry, so several can live in one process.
"""

from __future__ import annotations

from collections.abc import Iterator

import anyio
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from runtime.events.kinds import Admitted, Ended, Event, Inherited, Preempted
from runtime.scheduling.priority import FOREGROUND
from swarm.api import Swarm

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# Seconds: a step on a CPU is tens of ms, a wait behind background work seconds.
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class Metrics:
    def __init__(self, swarm: Swarm) -> None:
        self.swarm = swarm
        self.registry = CollectorRegistry()
        r = self.registry
        self.preemptions = Counter("slotswarm_preemptions", "Turns paused at a token boundary to give their slot away", registry=r)
        self.inheritances = Counter("slotswarm_priority_inheritances", "Times an agent started running at a waiter's priority", registry=r)
        self.turns = Counter("slotswarm_turns", "Turns ended, by terminal event", ["outcome"], registry=r)
        self.responses = Counter("slotswarm_http_responses", "HTTP responses, by path and status", ["path", "status"], registry=r)
        self.tokens = Counter("slotswarm_http_completion_tokens", "Tokens sent to HTTP callers", ["class"], registry=r)
        self.wait = Histogram("slotswarm_wait_seconds", "Request to first slot, every turn", ["class"], buckets=LATENCY_BUCKETS, registry=r)
        self.ttft = Histogram(
            "slotswarm_time_to_first_token_seconds",
            "HTTP request arrival to its first text",
            ["class"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.itl = Histogram(
            "slotswarm_inter_token_latency_seconds",
            "Between successive texts of one HTTP response",
            ["class"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        for klass in ("foreground", "background"):  # so both series exist from the start
            for family in (self.tokens, self.wait, self.ttft, self.itl):
                family.labels(klass)
        r.register(_SchedulerGauges(swarm))

    def observe(self, event: Event) -> None:
        match event:
            case Preempted():
                self.preemptions.inc()
            case Inherited():
                self.inheritances.inc()
            case Admitted(priority=priority, waited_s=waited_s):
                self.wait.labels(_klass(priority)).observe(waited_s or 0.0)
            case Ended():
                self.turns.labels(event.event.removeprefix("turn.")).inc()

    async def follow(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Count the swarm's events until the bus closes (run it in a task group)."""
        subscription = self.swarm.bus.subscribe(max_buffer=100_000)
        task_status.started()
        try:
            async for item in subscription:
                if isinstance(item, Event):
                    self.observe(item)
        finally:
            subscription.close()

    def render(self) -> bytes:
        return generate_latest(self.registry)


def _klass(priority: int | None) -> str:
    return "foreground" if (priority or 0) >= FOREGROUND else "background"


class _SchedulerGauges(Collector):
    """Read at scrape time: the owner's scheduler is only ever touched on the
    event loop, as this is, so the numbers are one consistent boundary."""

    def __init__(self, swarm: Swarm) -> None:
        self.swarm = swarm

    def collect(self) -> Iterator[GaugeMetricFamily]:
        scheduler = self.swarm.owner.scheduler
        pool = scheduler.pool
        yield _gauge("slotswarm_running_turns", "Turns holding a slot", len(scheduler.running))
        yield _gauge("slotswarm_waiting_turns", "Turns queued or paused, waiting for a slot", len(scheduler.waiting))
        yield _gauge("slotswarm_slots_in_use", "Slots holding a turn", len(scheduler.running))
        yield _gauge("slotswarm_slots", "Slots in all", scheduler.config.slots)
        yield _gauge("slotswarm_kv_blocks_used", "KV cache blocks held by turns", pool.num_blocks - pool.num_free)
        yield _gauge("slotswarm_kv_blocks_free", "KV cache blocks free (counting the prefix cache's unheld blocks)", pool.num_free)
        yield _gauge("slotswarm_kv_blocks_cached", "KV cache blocks kept for prefix reuse, held by no turn", pool.num_cached)

    def describe(self) -> Iterator[GaugeMetricFamily]:
        return iter(())


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=value)
