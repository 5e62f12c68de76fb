"""Reading a process's Prometheus metrics, to see what happened inside it."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(url: str) -> Samples:
    """Every sample `url` serves, by name and labels."""
    text = httpx.get(url, timeout=10).text
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    """One sample's value; 0 for a series not (yet) exported."""
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


class Delta:
    """How much each series grew between a scrape taken now and a later one."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.before = scrape(url)
        self.after = self.before

    def rescrape(self) -> Delta:
        self.after = scrape(self.url)
        return self

    def __call__(self, name: str, **labels: str) -> float:
        return value(self.after, name, **labels) - value(self.before, name, **labels)

    def total(self, name: str) -> float:
        """The growth of `name` summed over all its labels."""
        return sum(v for (n, _), v in self.after.items() if n == name) - sum(
            v for (n, _), v in self.before.items() if n == name
        )


def engine_settled(worker: Delta) -> bool:
    """Every job that entered the GPU worker's engine since `worker` began has left it,
    by the worker's own count: it finished, failed or was aborted there."""
    worker.rescrape()
    return worker.total("inferq_jobs_finished_total") >= worker("inferq_jobs_admitted_total")


def worker_idle(url: str) -> bool:
    """The GPU worker holds no job and its engine runs nothing: what an earlier test left
    it (a cancel it had yet to hear of while frozen, say) is done with."""
    samples = scrape(url)
    return (
        value(samples, "inferq_jobs_held") == 0
        and value(samples, "inferq_sequences_in_flight") == 0
    )
