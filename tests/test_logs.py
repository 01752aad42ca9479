"""What a Flower log gets from a node: the training process's progress lines, no library progress bars."""

import subprocess
import sys

SCRIPT = """
import sys
from hddm_flower.config.io import load_config
from clients.expert_pool import train_in_child
from hddm_flower.data import Dataset
cfg = load_config(sys.argv[1], {"expert.steps": 3, "expert.log_every": 1})
train_in_child(cfg, Dataset.open(sys.argv[2]), 0, "fm", "cpu", None)
"""


def test_training_process_logs_its_progress_and_nothing_else(tiny_config_path, dataset_dir):
    """The training runs in a process forked from the ClientApp's fork server (no logging set up there): its
    step lines must still reach the node's stderr, in Flower's layout, with no progress bars."""
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tiny_config_path), str(dataset_dir)],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = [x for x in proc.stderr.splitlines() if "expert 0 [fm] step" in x]
    assert [x.split(" step ")[1].split()[0] for x in lines] == ["1/3", "2/3", "3/3"]
    assert all(x.startswith("INFO :") for x in lines)
    assert "it/s" not in proc.stderr and "Loading weights" not in proc.stderr and "Warning" not in proc.stderr
