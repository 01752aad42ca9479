"""Train one expert in a child process of the ClientApp (``python -m clients.train_worker SPEC.json``).

In simulation every ClientApp of a Ray actor shares its process: a hard crash (the kernel's OOM killer, a
segfault in a kernel) would kill the actor and fail other nodes' experts with it. Trained here, the crash takes
down only this process; the ClientApp turns it into an error reply for this expert alone. Imports the core only
(no Flower), writes ``weights.safetensors`` and ``result.json`` (model config and metadata) into the spec's
``out`` directory.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def main(spec_path: str) -> None:
    import torch

    from hddm_flower.checkpoints import weights_bytes
    from hddm_flower.config import config_from_dict
    from hddm_flower.pipeline import train_one_expert

    spec = json.loads(Path(spec_path).read_text())
    torch.set_num_threads(int(spec["threads"]))
    cfg = config_from_dict(spec["experiment"], source="train message")
    state, model_config, meta = train_one_expert(cfg, Path(spec["dataset_dir"]), int(spec["expert_id"]),
                                                 spec["objective"], device=spec["device"],
                                                 checkpoint=Path(spec["checkpoint"]) if spec["checkpoint"] else None)
    out = Path(spec["out"])
    (out / "weights.safetensors").write_bytes(weights_bytes(state, cfg.expert.weights_dtype))
    tmp = out / "result.json.tmp"
    tmp.write_text(json.dumps({"model_config": model_config, "meta": meta}))
    os.replace(tmp, out / "result.json")


if __name__ == "__main__":
    main(sys.argv[1])
