"""What the control plane counts as it works, for ``GET /metrics`` (:mod:`cdui.plane.metrics`).

Most of what a scrape reports is read at scrape time from what the server already holds (the
queue, the connections, the database). A few figures exist only as things happen: events
stored, how long a run waited to be placed, how long it ran, enrollments refused, bytes
received. Those are counted here, one addition each, in the Prometheus client's own counter
and histogram types (held in this object's registry, never the library's global one: a test
process builds many servers), so nothing runs between scrapes.
"""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

# Seconds from a run's submission to its claim by a slot: most runs are placed at once, a backlog
# or a busy GPU makes it minutes or hours.
DISPATCH_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600, 14400)
# Seconds a run ran, from its claim to its end: a smoke test runs for a second, training for days.
DURATION_BUCKETS = (1, 5, 15, 30, 60, 300, 900, 1800, 3600, 3 * 3600, 6 * 3600, 12 * 3600, 24 * 3600,
                    3 * 86400, 7 * 86400)
# The codes an enrollment is refused with (cdui/plane/enroll.py, the enroll route): any other code
# counts as "other", so a new refusal never grows the label set by surprise.
ENROLL_REASONS = ("bad_request", "bad_name", "bad_token", "token_unknown", "token_revoked", "token_expired",
                  "token_used_up", "token_bound", "name_taken", "version_mismatch", "rate_limited", "too_large",
                  "disk_full")
STATUSES = ("succeeded", "failed", "cancelled", "interrupted")


class Counts:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        r = self.registry
        self.events = Counter("cdui_events_written", "Run events stored in the database", registry=r)
        self.dispatch = Histogram("cdui_dispatch_latency_seconds",
                                  "Seconds from a run's submission to its claim by a device slot (runs placed by "
                                  "this process)", buckets=DISPATCH_BUCKETS, registry=r)
        self.duration = Histogram("cdui_run_duration_seconds",
                                  "Seconds from a run's start to its end, by final status (runs started by this "
                                  "process)", ["status"], buckets=DURATION_BUCKETS, registry=r)
        self.enroll_refused = Counter("cdui_enrollment_refusals", "Enrollment requests refused, by reason",
                                      ["reason"], registry=r)
        self.transfer_bytes = Counter("cdui_transfer_received_bytes",
                                      "Bytes of run files workers uploaded to this server (the transfer backend)",
                                      registry=r)
        self.s3_bytes = Counter("cdui_s3_artifact_bytes",
                                "Bytes of run files workers reported stored in the S3 bucket", registry=r)
        # Every label value there is, at 0 from the start: a rate() over a series that appears only
        # with its first increment misses that increment.
        for status in STATUSES:
            self.duration.labels(status=status)
        for reason in (*ENROLL_REASONS, "other"):
            self.enroll_refused.labels(reason=reason)
        # When each run now running here was claimed (its duration's start), by run id; bounded by the
        # runs holding slots.
        self.started: dict[str, float] = {}

    def claimed(self, run_id: str, created_at: float, now: float) -> None:
        self.dispatch.observe(max(0.0, now - created_at))
        self.started[run_id] = now

    def ended(self, run_id: str, status: str, now: float) -> None:
        began = self.started.pop(run_id, None)
        if began is not None and status in STATUSES:
            self.duration.labels(status=status).observe(max(0.0, now - began))

    def refused(self, code: str) -> None:
        self.enroll_refused.labels(reason=code if code in ENROLL_REASONS else "other").inc()
