"""Shared fixtures: a tiny experiment config and the embedded dataset prepared once per test session."""

import os

import pytest
import yaml

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
os.environ.setdefault("FLWR_DISABLE_UPDATE_CHECK", "1")
os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")


def pytest_collection_modifyitems(config, items):
    """For README's command, which runs the suite on two pytest-xdist workers (``-n 2 --dist loadgroup``): the
    loopback deployment first, since it is the longest test and spends most of its time waiting on its SuperLink,
    so the other worker runs the rest meanwhile; and the Ray simulations in one group, one after another on one
    worker, so that two Ray clusters never start at once. Without xdist only the order changes."""
    for item in items:
        if item.get_closest_marker("simulation"):
            item.add_marker(pytest.mark.xdist_group("ray"))
    items.sort(key=lambda item: item.get_closest_marker("deploy") is None)  # stable: the rest keep their order


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
