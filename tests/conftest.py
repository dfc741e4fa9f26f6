"""Shared fixtures: real planted jobs, always killed in teardown."""

from __future__ import annotations

import pytest

from real_jobs import PlantedJob


@pytest.fixture
def planted(tmp_path):
    """Factory: ``planted("straggler", nproc=3)`` starts a real job and waits for its ranks."""
    jobs: list[PlantedJob] = []

    def start(scenario: str, nproc: int = 3, wait: bool = True, **kwargs) -> PlantedJob:
        job = PlantedJob(tmp_path / f"job{len(jobs)}", scenario, nproc=nproc, **kwargs).start()
        jobs.append(job)
        if wait:
            job.wait_for_ranks()
        return job

    yield start
    for job in jobs:
        job.stop()


def pytest_collection_modifyitems(config, items):
    """Every test under tests/jobs/ starts real processes: mark it ``job`` (``-m 'not job'`` skips them)."""
    for item in items:
        if "jobs" in item.path.parent.parts[-1:]:
            item.add_marker(pytest.mark.job)


@pytest.fixture(scope="session")
def slurm_cluster():
    """The real SLURM of tests/infra/slurm_up.sh (nodes tw1, tw2), started if needed.

    Skips where SLURM/munge are not installed; under CI=true that is a failure instead.
    """
    import slurm_cluster as cluster

    reason = cluster.unavailable_reason()
    if reason:
        if cluster.in_ci():
            pytest.fail(f"CI: {reason}")
        pytest.skip(reason)
    cluster.up()
    return cluster
