"""The apiserver's own request counters (apiserver_request_total on /metrics), read and compared.

Pure parsing and arithmetic; the scale benchmark fetches the text before and after a phase (and once a
second during the rollout storm) and reports the difference by verb and code.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

# (verb, resource, code) -> requests
Requests = Counter[tuple[str, str, str]]


def parse_requests(text: str) -> Requests:
    """apiserver_request_total summed over the labels the report does not use (group, version, scope...)."""
    out: Requests = Counter()
    for family in text_string_to_metric_families(text):
        if family.name != "apiserver_request":  # the parser strips the counter's _total
            continue
        for sample in family.samples:
            if not sample.name.endswith("_total"):
                continue
            labels = sample.labels
            key = (labels.get("verb", ""), labels.get("resource", ""), labels.get("code", ""))
            out[key] += int(sample.value)
    return out


def parse_rejections(text: str) -> int:
    """Requests API Priority and Fairness turned away (apiserver_flowcontrol_rejected_requests_total)."""
    total = 0
    for family in text_string_to_metric_families(text):
        if family.name == "apiserver_flowcontrol_rejected_requests":
            total += sum(int(s.value) for s in family.samples if s.name.endswith("_total"))
    return total


# (label value, upper bound in seconds) -> observations within it, cumulative as Prometheus keeps them
Buckets = dict[tuple[str, float], int]
REVIEW_HISTOGRAM = "tessera_controller_admission_duration_seconds"  # the controller's, by endpoint
# the controller's rebuilds of its device snapshot after slices changed (no labels)
SNAPSHOT_HISTOGRAM = "tessera_controller_snapshot_build_seconds"
# the apiserver's time calling each admission webhook, by webhook name, answer and transfer included
WEBHOOK_HISTOGRAM = "apiserver_admission_webhook_admission_duration_seconds"


def parse_review_buckets(text: str) -> Buckets:
    """The controller's own time to answer each AdmissionReview (from its /metrics), by endpoint."""
    return parse_buckets(text, REVIEW_HISTOGRAM, "endpoint")


def parse_buckets(text: str, histogram: str, label: str) -> Buckets:
    """A histogram's cumulative buckets from /metrics text, summed over every label but `label`."""
    out: Buckets = {}
    for family in text_string_to_metric_families(text):
        if family.name != histogram:
            continue
        for sample in family.samples:
            if sample.name.endswith("_bucket"):
                key = (sample.labels.get(label, ""), float(sample.labels["le"]))
                out[key] = out.get(key, 0) + int(sample.value)
    return out


def slower_than(before: Buckets, after: Buckets, seconds: float) -> dict[str, tuple[int, int]]:
    """Per label value, over what happened between two readings: (observations, those over `seconds`).
    `seconds` must be one of the histogram's bounds."""
    out: dict[str, tuple[int, int]] = {}
    for value in sorted({v for v, _ in after}):
        if (value, seconds) not in after:
            raise ValueError(f"{seconds} s is not a bound of the histogram")
        total = after.get((value, float("inf")), 0) - before.get((value, float("inf")), 0)
        if total:
            out[value] = (total, total - (after[(value, seconds)] - before.get((value, seconds), 0)))
    return out


def delta(before: Requests, after: Requests) -> Requests:
    """What happened between two readings (counters only grow; a missing key counts as zero)."""
    out: Requests = Counter()
    for key, value in after.items():
        diff = value - before.get(key, 0)
        if diff:
            out[key] = diff
    return out


@dataclass(frozen=True)
class VerbRow:
    verb: str
    total: int
    ok: int  # 2xx
    conflict: int  # 409
    throttled: int  # 429
    other: int  # anything else


def by_verb(requests: Requests, resource: str | None = None) -> list[VerbRow]:
    """Rows per verb (sorted by volume) for one resource, or for every resource when None."""
    rows: dict[str, Counter[str]] = {}
    for (verb, res, code), n in requests.items():
        if resource is not None and res != resource:
            continue
        row = rows.setdefault(verb, Counter())
        bucket = "ok" if code.startswith("2") else {"409": "conflict", "429": "throttled"}.get(code, "other")
        row[bucket] += n
        row["total"] += n
    return sorted((VerbRow(verb, c["total"], c["ok"], c["conflict"], c["throttled"], c["other"])
                   for verb, c in rows.items()), key=lambda r: (-r.total, r.verb))


def count_code(requests: Mapping[tuple[str, str, str], int], code: str, resource: str | None = None) -> int:
    return sum(n for (_, res, c), n in requests.items() if c == code and (resource is None or res == resource))


def last_increase(series: Iterable[tuple[float, int]]) -> float | None:
    """The time of the last sample at which a cumulative count (e.g. of 429s) went up; None if it never did."""
    last: float | None = None
    previous: int | None = None
    for t, value in series:
        if previous is not None and value > previous:
            last = t
        previous = value
    return last
