"""Benchmark: an expert's forward passes at a sampling batch with glibc's default malloc and with
:func:`hddm_flower.devices.keep_freed_memory` (which ``hddm reproduce`` calls in itself and in every worker).

Each measurement runs in a process of its own, forked from this one (the malloc setting stays in the child):
``--forwards`` forward passes of the config's expert preset (fresh weights from seed 0) on one batch of
``--batch`` noisy samples with captions, after two untimed ones, with one torch thread. Per measurement: wall time
per forward, user and kernel CPU time, minor page faults, peak resident memory, and the sha256 of the outputs
(hashed after the clock stops; the setting must not change a bit of them). The two settings alternate over
``--reps`` repetitions; the figure is the median ratio kept / default of the wall time, measured within the same
repetition.

    python -m benchmarks.freed_memory                      # reproduce-gmm-subspace.yaml's expert, batch 704

Writes ``benchmarks/results/freed_memory.{json,md}``.
"""

from __future__ import annotations

import argparse
import hashlib
import resource
import statistics
import time

import torch

from benchmarks.common import RESULTS, ROOT, commit, forked, load_at_start, machine, write_result
from hddm_flower.config.io import load_config
from hddm_flower.devices import keep_freed_memory
from hddm_flower.stages.expert import build_expert

TEXT_LENGTH, TEXT_DIM = 12, 384  # the gmm datasets' caption embeddings


def measure(config: str, batch: int, forwards: int, keep: bool) -> dict:
    kept = keep_freed_memory() if keep else False
    torch.set_num_threads(1)
    cfg = load_config(config)
    meta = {"image_size": 8, "channels": 3, "text_dim": TEXT_DIM}
    torch.manual_seed(0)
    net = build_expert(cfg, meta, "fm")[0].net.transformer.eval()
    g = torch.Generator().manual_seed(1)
    x = torch.randn(batch, 3, 8, 8, generator=g)
    t = torch.full((batch,), 500.0)
    text = torch.randn(batch, TEXT_LENGTH, TEXT_DIM, generator=g)
    mask = torch.ones(batch, TEXT_LENGTH)
    outputs = []
    with torch.no_grad():
        for _ in range(2):
            net(x, encoder_hidden_states=text, timestep=t, encoder_attention_mask=mask, return_dict=False)
        r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        for _ in range(forwards):  # the outputs kept as they are; hashed after the clock stops
            outputs.append(
                net(x, encoder_hidden_states=text, timestep=t, encoder_attention_mask=mask, return_dict=False)[0]
            )
        wall = time.perf_counter() - t0
        r1 = resource.getrusage(resource.RUSAGE_SELF)
    digest = hashlib.sha256()
    for out in outputs:
        digest.update(out.numpy().tobytes())
    return {
        "keep_freed_memory": kept,
        "peak_rss_mib": r1.ru_maxrss / 1024,
        "ms_per_forward": 1000 * wall / forwards,
        "user_s": r1.ru_utime - r0.ru_utime,
        "sys_s": r1.ru_stime - r0.ru_stime,
        "minor_faults": r1.ru_minflt - r0.ru_minflt,
        "outputs_sha256": digest.hexdigest(),
    }


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default=str(ROOT / "configs" / "reproduce-gmm-subspace.yaml"))
    ap.add_argument("--batch", type=int, default=704)
    ap.add_argument("--forwards", type=int, default=15)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args(argv)
    record = {"machine": machine(), "commit": commit(), "load": load_at_start(), "args": vars(args), "reps": []}
    for rep in range(args.reps):
        order = (False, True) if rep % 2 == 0 else (True, False)
        pair = {keep: forked(measure, args.config, args.batch, args.forwards, keep) for keep in order}
        record["reps"].append({"default": pair[False], "kept": pair[True]})
        print(rep, {k: round(v["ms_per_forward"], 1) for k, v in record["reps"][-1].items()}, flush=True)
    reps = record["reps"]
    record["ratio_kept_over_default"] = statistics.median(
        r["kept"]["ms_per_forward"] / r["default"]["ms_per_forward"] for r in reps
    )
    record["applied"] = all(r["kept"]["keep_freed_memory"] for r in reps)
    record["outputs_identical"] = len({r[k]["outputs_sha256"] for r in reps for k in r}) == 1
    write_result(RESULTS / "freed_memory.json", record)

    def median(key, side):
        return statistics.median(r[side][key] for r in reps)

    rows = [
        f"| {side} | {median('ms_per_forward', side):.1f} | {median('user_s', side):.2f} | "
        f"{median('sys_s', side):.2f} | {median('minor_faults', side):,.0f} | {median('peak_rss_mib', side):,.0f} |"
        for side in ("default", "kept")
    ]
    (RESULTS / "freed_memory.md").write_text(
        "\n".join(
            [
                "# An expert's forward passes with glibc's default malloc and with keep_freed_memory",
                "",
                f"`python -m benchmarks.freed_memory` · {record['machine']} · commit {record['commit']} · "
                f"{record['load']} · {time.strftime('%Y-%m-%d')}",
                "",
                f"Expert preset of `{args.config.split('/')[-1]}`, batch {args.batch}, {args.forwards} forwards, "
                f"1 thread; medians over {args.reps} repetitions (each setting in its own process).",
                "",
                "| malloc | ms / forward | user s | kernel s | minor page faults | peak RSS MiB |",
                "|---|---|---|---|---|---|",
                *rows,
                "",
                f"kept / default wall time (median of the repetitions' ratios): "
                f"{record['ratio_kept_over_default']:.2f}; outputs bit-identical: {record['outputs_identical']}; "
                f"keep_freed_memory applied in every kept process: {record['applied']}.",
                "",
            ]
        )
    )
    print(f"ratio {record['ratio_kept_over_default']:.2f}, identical {record['outputs_identical']}")
    return record


if __name__ == "__main__":
    main()
