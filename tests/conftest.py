"""Shared fixtures: a tiny experiment config and the embedded dataset prepared once per test session."""

import fcntl
import os

import pytest
import yaml

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
os.environ.setdefault("FLWR_DISABLE_UPDATE_CHECK", "1")
os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")


def pytest_collection_modifyitems(config, items):
    """For README's command, which runs the suite on two pytest-xdist workers (``-n 2 --dist loadgroup``): the
    loopback deployment first, since it is the longest test and spends most of its time waiting on its SuperLink,
    so the other worker runs the rest meanwhile. Without xdist only the order changes."""
    items.sort(key=lambda item: item.get_closest_marker("deploy") is None)  # stable: the rest keep their order


@pytest.fixture(autouse=True)
def _one_ray_simulation_at_a_time(request, tmp_path_factory):
    """A test marked ``simulation`` starts a Ray cluster that asks for both cores: one at a time across the
    workers, through a lock file in the folder the workers' temporary folders share (xdist's own grouping marks are
    not honoured by every pytest release)."""
    if request.node.get_closest_marker("simulation") is None:
        yield
        return
    with open(tmp_path_factory.getbasetemp().parent / "ray-simulation.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


TINY = {
    "num_experts": 4,
    "data": {"limit": 240, "max_caption_tokens": 8},
    "objectives": {"ddpm": 2, "fm": 2, "ddpm_clusters": [1, 2]},
    "ddpm": {"schedule": "linear"},
    "expert": {"preset": "test", "steps": 3, "batch_size": 4, "optim": {"warmup_steps": 1}, "log_every": 1},
    "router": {"preset": "test", "steps": 3, "batch_size": 8},
    "sampling": {"num_steps": 2, "samples_per_prompt": 2, "prompts": ["dog face", "japan flag"]},
    "evaluation": {
        "num_prompts": 3,
        "samples_per_prompt": 2,
        "per_expert_samples": 3,
        "grid_prompts": 2,
        "feature_steps": 3,
        "kid_subset_size": 4,
        "kid_subsets": 3,
        "seeds": 1,
    },
    "federation": {"min_nodes": 4, "min_experts": 2, "node_wait_timeout": 5, "train_timeout": 60},
}


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(scope="session")
def tiny_config_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("cfg") / "tiny.yaml"
    path.write_text(yaml.safe_dump(TINY))
    return path


@pytest.fixture(scope="session")
def tiny_config(tiny_config_path):
    from hddm_flower.config.io import load_config

    return load_config(tiny_config_path)


@pytest.fixture(scope="session")
def dataset_dir(tiny_config, cache_dir):
    from hddm_flower.stages.prepare import prepare_data

    return prepare_data(tiny_config, cache_dir).root
