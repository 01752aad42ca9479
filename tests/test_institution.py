"""Institution-owned data (``data.partition: institution``): declarations, their checks, the data-free
coordinator, and the ServerApp end to end over 4 nodes whose own data is their cluster."""

import json
import math

import pytest
from flwr.app import Context, RecordDict

from clients.client_app import app as client_app
from hddm_flower.config.io import load_config, parse_overrides
from hddm_flower.config.rules import ConfigError
from hddm_flower.data import Dataset
from hddm_flower.federation.declarations import (
    CLAIM,
    DECLARATION,
    DECLARATION_JSON,
    cluster_details,
    declaration,
    disagreements,
    institution_objectives,
    parse_declaration,
)
from hddm_flower.wire import WireError
from strategies.inprocess_grid import FakeGrid

INSTITUTION = "data.partition=institution router.training=federated evaluation.reference=federated"
SAMPLE_SUFFIXES = (".tar", ".png", ".npy", ".jpg", ".jpeg", ".webp")


def institution_run_config(config, run_dir, coordinator_cache, overrides: str) -> dict:
    """The ServerApp's run config for institution-owned data (:data:`INSTITUTION` plus ``overrides``)."""
    return {
        "config": str(config),
        "overrides": f"{INSTITUTION} {overrides}",
        "run-dir": str(run_dir),
        "cache-dir": str(coordinator_cache),
    }


def sample_files(root):
    """Files under ``root`` that hold samples of a cluster: shards, images, latents."""
    return [p for p in root.rglob("*") if p.is_file() and p.name.endswith(SAMPLE_SUFFIXES)]


def test_a_declaration_is_statistics_of_the_nodes_own_cluster(dataset_dir):
    d = declaration(Dataset.open(dataset_dir / "cluster-2"))
    meta = json.loads((dataset_dir / "meta.json").read_text())
    c = meta["clusters"][2]
    assert d["num_train"] + d["num_val"] == c["size"] and d["num_val"] == c["val"] and d["detail"] == c["detail"]
    assert (d["image_size"], d["channels"], d["latent"]) == (16, 3, "pixels")
    assert parse_declaration(json.dumps(d), 7) == {k: v for k, v in d.items() if k != "version"}


@pytest.mark.parametrize(
    "change, message",
    [
        ({"image_size": -1}, "image_size"),
        ({"detail": -1.0}, "detail"),
        ({"text_encoder": "x" * 1000}, "text_encoder"),
        ({"extra": 1}, "unknown fields"),
        ({"version": 99}, "version"),
    ],
)
def test_a_malformed_declaration_is_refused_naming_the_node_and_field(dataset_dir, change, message):
    d = declaration(Dataset.open(dataset_dir / "cluster-0")) | change
    with pytest.raises(WireError, match=f"node 5 declaration.*{message}"):
        parse_declaration(json.dumps(d), 5)


def test_declarations_that_disagree_name_the_node_and_the_field(dataset_dir):
    """The run's data is the largest group that agrees on every shared field among the nodes that match what the
    coordinator holds; everyone else is left out with the first field that differs."""
    d = parse_declaration(json.dumps(declaration(Dataset.open(dataset_dir / "cluster-0"))), 1)
    enc = d["text_encoder"]
    assert disagreements({1: d, 2: d | {"detail": 0.9}, 3: d}) == {}  # statistics may differ
    out = disagreements({1: d, 2: d, 3: d | {"text_encoder": "clip:other"}})
    assert list(out) == [3] and out[3].startswith(f"declares text_encoder 'clip:other', the run's is {enc!r}")
    out = disagreements({1: d | {"channels": 1}, 2: d, 3: d})  # the majority decides, not the lowest node
    assert list(out) == [1] and out[1].startswith("declares channels 1")
    assert list(disagreements({5: d, 2: d | {"image_size": 8}})) == [5]  # a tie: the group of the lowest node
    # the coordinator's own text encoder outranks a lower node id and a majority
    other = d | {"text_encoder": "clip:other"}
    out = disagreements({1: other, 2: d}, {"text_encoder": enc})
    assert list(out) == [1] and out[1].startswith(f"declares text_encoder 'clip:other', the coordinator's is {enc!r}")
    assert list(disagreements({1: other, 2: other, 3: d}, {"text_encoder": enc})) == [1, 2]
    # groups agree on every field at once: {2, 3} and {4, 5} tie at two, 2 is the lowest node; 1 agrees with 4, 5 on
    # the encoder and with 2, 3 on the size, with neither group on both
    a, b = d, d | {"text_encoder": "clip:b"}
    nodes = {1: a | {"image_size": 8}, 2: b | {"image_size": 8}, 3: b | {"image_size": 8}, 4: a, 5: a}
    assert sorted(disagreements(nodes)) == [1, 4, 5]
    assert sorted(disagreements(nodes, claims={1: 1, 2: 7, 3: 7, 4: 4, 5: 5})) == [1, 2, 3]  # 2, 3 share a vote


class DeclaringGrid:
    """A Grid whose nodes answer the declare query with the given (claimed expert, declaration) and nothing else."""

    def __init__(self, answers: dict[int, tuple[int, dict]]):
        from flwr.supercore.task_identity import TaskIdentity  # Message() needs it outside a runtime, as FakeGrid's

        TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1
        self.answers = answers

    def get_node_ids(self):
        return sorted(self.answers)

    def send_and_receive(self, messages, *, timeout=None):
        from flwr.app import ConfigRecord, Message

        for msg in messages:
            node = msg.metadata.dst_node_id
            expert, decl = self.answers[node]
            record = ConfigRecord({CLAIM: expert, DECLARATION_JSON: json.dumps(decl)})
            reply = Message(RecordDict({DECLARATION: record}), reply_to=msg)
            reply.metadata.__dict__["_src_node_id"] = node
            yield reply


def test_a_node_whose_data_disagrees_costs_only_its_expert_and_cannot_hold_anothers(
    tiny_config_path, dataset_dir, tmp_path
):
    """One node declares another text encoder and claims expert 0 before (a lower node id than) the node whose
    data fits: it is left out with its reason, the run goes on with the others, and expert 0 goes to the node that
    fits; a run in which every node is left out stops with one line."""
    from strategies.gather_declarations import gather_declarations

    cfg = load_config(tiny_config_path, parse_overrides(f"{INSTITUTION} federation.min_nodes=1"))
    d = declaration(Dataset.open(dataset_dir / "cluster-0"))
    answers = {1: (1, d), 2: (0, d | {"text_encoder": "clip:other"}), 3: (0, d), 4: (2, d)}
    inst = gather_declarations(DeclaringGrid(answers), cfg, tmp_path / "run", timeout=5)
    assert inst.nodes == {0: 3, 1: 1, 2: 4} and list(inst.refused) == [2]
    assert inst.refused[2].startswith("declares text_encoder 'clip:other', the coordinator's is")
    assert inst.record()["refused"] == {"2": inst.refused[2]}
    # two nodes, a tie: the one whose text encoder is the coordinator's stays, whatever the node ids
    two = {1: (0, d | {"text_encoder": "clip:other"}), 2: (1, d)}
    assert gather_declarations(DeclaringGrid(two), cfg, tmp_path / "run-2", timeout=5).nodes == {1: 2}
    # a late joiner joins the run as its descriptor has it: another image size is refused even when it is alone
    late = {7: (3, d | {"image_size": 2 * d["image_size"]})}
    # extra claimants of one expert id share its vote: three nodes claiming expert 2 do not outvote two others
    small = d | {"image_size": d["image_size"] // 2}
    crowd = {2: (0, d), 4: (1, d), 9: (2, small), 10: (2, small), 11: (2, small)}
    assert gather_declarations(DeclaringGrid(crowd), cfg, tmp_path / "run-4", timeout=5).nodes == {0: 2, 1: 4}
    # nodes the coordinator rules out do not split a vote: two of them claiming the honest nodes' ids would turn
    # 2 votes against 1 into a tie that the lower node id (the attacker's) wins
    bogus = d | {"text_encoder": "clip:bogus"}
    split = {2: (0, d), 3: (1, d), 1: (2, small), 7: (0, bogus), 8: (1, bogus)}
    assert gather_declarations(DeclaringGrid(split), cfg, tmp_path / "run-6", timeout=5).nodes == {0: 2, 1: 3}
    # more caption tokens than the coordinator's text encoder takes (MiniLM: 512): refused, not a run that fails to
    # encode; the limit itself is taken
    long = {1: (0, d | {"max_caption_tokens": 513}), 2: (1, d | {"max_caption_tokens": 512})}
    inst_long = gather_declarations(DeclaringGrid(long), cfg, tmp_path / "run-5", timeout=5)
    assert inst_long.nodes == {1: 2} and "max_caption_tokens 513, which the coordinator" in inst_long.refused[1]
    assert "(RuntimeError: " in inst_long.refused[1]  # what the encoder raised, in the reason
    earlier = Dataset.open(inst.descriptor)
    with pytest.raises(RuntimeError, match="no node declared usable data"):
        gather_declarations(DeclaringGrid(late), cfg, tmp_path / "run", timeout=5, earlier=earlier)
    assert gather_declarations(DeclaringGrid(late), cfg, tmp_path / "run-3", timeout=5).nodes == {3: 7}  # no run yet
    # the ServerApp binds a re-run to the earlier descriptor only when the earlier run left experts
    from strategies.server_app import earlier_descriptor

    assert earlier_descriptor(tmp_path / "run", present=[0]).meta == earlier.meta
    assert earlier_descriptor(tmp_path / "run", present=[]) is None  # its nodes may have prepared their data again
    assert earlier_descriptor(tmp_path / "no-run", present=[0]) is None
    bad = {n: (k, x | {"version": 99}) for n, (k, x) in answers.items()}
    with pytest.raises(RuntimeError, match="no node declared usable data"):
        gather_declarations(DeclaringGrid(bad), cfg, tmp_path / "run-bad", timeout=5)


def test_pinned_expert_ids_decide_the_institutions_claims(tiny_config_path, dataset_dir, tmp_path):
    """federation.expert_nodes gives expert 0 to node 3 and expert 2 to node 1: node 1's claim of expert 0 (a lower
    node id than node 3's) is refused, node 3 gets it; node 4 claims expert 1, which nobody is pinned to."""
    from hddm_flower.federation.declarations import claim_refusal
    from strategies.gather_declarations import gather_declarations

    assert claim_refusal([], 7, 0) is None and claim_refusal([3, 0], 9, 1) is None
    assert claim_refusal([3, 0], 9, 0) == "claims expert 0, which federation.expert_nodes gives to node 3"
    assert (
        claim_refusal([3, 0], 3, 1) == "claims expert 1, but federation.expert_nodes gives this node experts [0] only"
    )
    pins = "federation.expert_nodes=[3,0,1,0] federation.min_nodes=1"
    cfg = load_config(tiny_config_path, parse_overrides(f"{INSTITUTION} {pins}"))
    d = declaration(Dataset.open(dataset_dir / "cluster-0"))
    inst = gather_declarations(DeclaringGrid({1: (0, d), 3: (0, d), 4: (1, d)}), cfg, tmp_path / "run", timeout=5)
    assert inst.nodes == {0: 3, 1: 4} and inst.refused == {1: claim_refusal([3, 0, 1, 0], 1, 0)}
    # a node the pins refuse does not vote: node 1 (another image size, a lower id) would otherwise tie with node 3
    other = d | {"image_size": d["image_size"] // 2}
    inst = gather_declarations(DeclaringGrid({1: (0, other), 3: (0, d)}), cfg, tmp_path / "run-b", timeout=5)
    assert inst.nodes == {0: 3} and list(inst.refused) == [1] and "gives to node 3" in inst.refused[1]
    with pytest.raises(ConfigError, match="federation.expert_nodes: has 2 entries for 4 experts"):
        load_config(tiny_config_path, parse_overrides("federation.expert_nodes=[3,0]"))


def test_auto_objectives_rank_the_declared_detail_scores(tiny_config_path):
    cfg = load_config(tiny_config_path, parse_overrides("objectives.ddpm_clusters=auto"))
    details = cluster_details(cfg, {0: {"detail": 0.3}, 1: {"detail": 0.1}, 3: {"detail": 0.5}})
    assert details[2] == -math.inf
    assert cfg.objective_of(details) == ["ddpm", "fm", "fm", "ddpm"]
    declared = {0: {"detail": 0.3}, 1: {"detail": 0.1}, 2: {"detail": 0.9}, 3: {"detail": 0.5}}
    assert institution_objectives(cfg, declared, {}) == ["fm", "fm", "ddpm", "ddpm"]
    # experts already trained keep their objective; a late one takes a DDPM place left free if its detail ranks
    assert institution_objectives(cfg, declared, {0: "ddpm", 1: "fm", 3: "fm"}) == ["ddpm", "fm", "ddpm", "fm"]
    assert institution_objectives(cfg, declared, {0: "ddpm", 2: "ddpm", 3: "fm"}) == ["ddpm", "fm", "ddpm", "fm"]


@pytest.mark.parametrize(
    "overrides, key",
    [
        ("data.partition=institution evaluation.reference=federated", "router.training"),
        ("data.partition=institution router.training=federated", "evaluation.reference"),
        ("data.partition=somewhere", "data.partition"),
    ],
)
def test_institution_partition_needs_the_federated_roads(tiny_config_path, overrides, key):
    with pytest.raises(ConfigError, match=key):
        load_config(tiny_config_path, parse_overrides(overrides))


def assert_coordinator_holds_no_sample(coordinator_cache, run_dir):
    """The coordinator's cache is empty of samples, and its run directory holds no shard or latent and, as its
    only data folder, the descriptor (metadata and the empty caption's text states)."""
    assert sample_files(coordinator_cache) == []
    assert [p for p in sample_files(run_dir) if not p.name.endswith(".png")] == []
    assert sorted(p.name for p in (run_dir / "institutions").iterdir()) == ["meta.json", "uncond.safetensors"]
    assert not any(p.name.startswith("cluster-") for p in run_dir.rglob("*"))


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_server_app_with_institution_owned_data(tiny_config_path, dataset_dir, cache_dir, tmp_path):
    """4 nodes whose own data is their cluster (in-process Grid), the coordinator with an empty cache: declarations,
    objectives from declared detail scores, experts, federated feature classifier, router and reference; one node
    joins late and a targeted re-run brings its expert into the router rounds."""
    from strategies.server_app import main as server_main

    coordinator_cache = tmp_path / "coordinator-cache"
    coordinator_cache.mkdir()
    run_dir = tmp_path / "run"
    run_config = institution_run_config(
        tiny_config_path,
        run_dir,
        coordinator_cache,
        "objectives.ddpm_clusters=auto router.rounds=2 evaluation.feature_steps=2 "
        "evaluation.routing_modes=[top2,oracle] federation.min_nodes=3 federation.min_experts=3",
    )
    nodes = {n: {"partition-id": n - 1, "cache-dir": str(cache_dir)} for n in range(1, 4)}  # simulated institutions
    grid = FakeGrid(client_app, nodes)
    server_main(grid, Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=run_config))
    report = json.loads((run_dir / "report.json").read_text())
    assert [e["expert_id"] for e in report["experts"]] == [0, 1, 2]
    inst = report["institutions"]
    assert sorted(inst["declared"]) == ["0", "1", "2"] and inst["refused"] == {}
    meta = json.loads((dataset_dir / "meta.json").read_text())
    details = [c["detail"] for c in meta["clusters"][:3]]
    assert [inst["declared"][str(k)]["detail"] for k in range(3)] == details
    ddpm = sorted(sorted(range(3), key=lambda k: -details[k])[:2])
    assert sorted(e["expert_id"] for e in report["experts"] if e["objective"] == "ddpm") == ddpm
    assert report["feature_net"]["training"] == "federated" and report["feature_net"]["rounds"] == 2
    assert "federatedly" in report["metrics"]["feature_network"]
    ev = report["metrics"]["evaluation"]
    assert list(ev["modes"]) == ["top2"] and "oracle" in ev["skipped_modes"] and "per_expert_skipped" in ev
    assert ev["prompts"] == ["dog face", "japan flag"] and "sampling.prompts" in ev["protocol"]["prompt_source"]
    assert report["metrics"]["ensemble_velocity_mse"] == [None] * 5 and report["metrics"]["skipped"]
    assert report["metrics"]["router_top1_accuracy"] == report["router"]["heldout"]["top1"]
    assert sorted(report["router"]["nodes"].values()) == [[0], [1], [2]]
    assert_coordinator_holds_no_sample(coordinator_cache, run_dir)

    # a fourth institution joins: a targeted re-run trains its expert, then every router round includes it
    grid = FakeGrid(client_app, nodes | {4: {"expert-id": 3, "shard-set": str(dataset_dir / "cluster-3")}})
    run_config["experts"] = "3"
    server_main(grid, Context(run_id=2, node_id=0, node_config={}, state=RecordDict(), run_config=run_config))
    report = json.loads((run_dir / "report.json").read_text())
    assert [e["expert_id"] for e in report["experts"]] == [0, 1, 2, 3] and report["missing"] == []
    assert sorted(report["router"]["nodes"].values()) == [[0], [1], [2], [3]]
    assert report["reference_statistics"]["clusters"] == [0, 1, 2, 3]
    assert sorted(report["feature_net"]["nodes"].values()) == [[0], [1], [2], [3]]
    assert_coordinator_holds_no_sample(coordinator_cache, run_dir)


def test_a_node_left_out_by_the_declarations_trains_no_expert(tiny_config_path, dataset_dir, tmp_path, monkeypatch):
    """End to end (ServerApp over the in-process Grid, real ClientApp): node 2 declares another text encoder and
    claims expert 0 before node 3 (a lower node id), whose data fits and which claims it too. Node 2 is left out and
    is sent no train message; node 3 trains expert 0 and the run completes with it."""
    import clients.declare
    from strategies.server_app import main as server_main

    real = clients.declare.declaration

    def declaration_of(dataset):  # node 2's shard set is cluster 1's: its declaration names another encoder
        d = real(dataset)
        return d | {"text_encoder": "clip:other"} if dataset.own_cluster == 1 else d

    monkeypatch.setattr(clients.declare, "declaration", declaration_of)
    run_dir = tmp_path / "run"
    run_config = institution_run_config(
        tiny_config_path,
        run_dir,
        tmp_path / "coordinator-cache",
        "router.rounds=1 evaluation.feature_steps=2 evaluation.routing_modes=[top2] federation.min_nodes=2 "
        "federation.min_experts=1",
    )
    nodes = {
        2: {"expert-id": 0, "shard-set": str(dataset_dir / "cluster-1")},
        3: {"expert-id": 0, "shard-set": str(dataset_dir / "cluster-0")},
    }
    grid = FakeGrid(client_app, nodes)
    server_main(grid, Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=run_config))
    report = json.loads((run_dir / "report.json").read_text())
    assert list(report["institutions"]["refused"]) == ["2"]
    assert "text_encoder 'clip:other'" in report["institutions"]["refused"]["2"]
    assert [(e["expert_id"], e["node_id"]) for e in report["experts"]] == [(0, 3)]
    assert not [m for m in grid.sent if m.metadata.dst_node_id == 2 and m.metadata.message_type == "train"]


@pytest.mark.simulation
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_ray_simulation_with_institution_owned_data(tiny_config_path, dataset_dir, cache_dir, tmp_path, monkeypatch):
    """A real Flower simulation (Ray, 4 SuperNodes): each simulated institution holds one cluster in its own cache,
    the coordinator's cache stays empty; federated feature classifier, router and reference statistics; the run
    completes with all 4 experts and the coordinator never holds a sample."""
    from flwr.serverapp import Grid, ServerApp
    from flwr.simulation import run_simulation

    from strategies.server_app import main as server_main

    monkeypatch.setenv("HDDM_CACHE", str(cache_dir))  # the nodes' own caches (Ray's workers inherit it)
    coordinator_cache = tmp_path / "coordinator-cache"
    coordinator_cache.mkdir()
    run_dir = tmp_path / "run"
    run_config = {
        "config": str(tiny_config_path),
        "overrides": f"{INSTITUTION} router.rounds=1 evaluation.feature_steps=1 evaluation.routing_modes=[top2] "
        "federation.train_timeout=600",  # the first message waits for Ray to start the actors
        "run-dir": str(run_dir),
        "cache-dir": str(coordinator_cache),
    }
    server = ServerApp()

    @server.main()
    def _main(grid: Grid, context: Context) -> None:  # run_simulation passes an empty run config
        context.run_config.update(run_config)
        server_main(grid, context)

    run_simulation(
        server_app=server,
        client_app=client_app,
        num_supernodes=4,
        backend_config={
            "client_resources": {"num_cpus": 1, "num_gpus": 0.0},
            "init_args": {"num_cpus": 2, "logging_level": "ERROR", "log_to_driver": False},
        },
    )
    report = json.loads((run_dir / "report.json").read_text())
    assert [e["expert_id"] for e in report["experts"]] == [0, 1, 2, 3] and report["missing"] == []
    assert sorted(report["institutions"]["declared"]) == ["0", "1", "2", "3"]
    assert report["router"]["training"] == "federated" and sorted(report["router"]["nodes"].values()) == [
        [0],
        [1],
        [2],
        [3],
    ]
    assert report["reference_statistics"]["clusters"] == [0, 1, 2, 3]
    assert report["feature_net"]["training"] == "federated"
    assert_coordinator_holds_no_sample(coordinator_cache, run_dir)


def test_hddm_prepare_makes_one_institutions_data_answer_to_any_expert_id(tiny_config_path, cache_dir):
    """`hddm prepare` with data.partition: institution: one cluster, no clustering into num_experts, marked as
    one institution's data, so the expert id the federation assigns reads it (labels = that id)."""
    from hddm_flower.data import Dataset, read_meta
    from hddm_flower.stages.prepare import prepare_institution

    cfg = load_config(tiny_config_path, parse_overrides(f"{INSTITUTION} data.limit=40"))
    d = prepare_institution(cfg, cache_dir).root
    meta = read_meta(d)
    assert meta["institution"] and meta["num_clusters"] == 1 and meta["num_images"] == 40
    split = Dataset.open(d).split([3], "train")
    assert set(split.labels.tolist()) == {3} and len(split) == declaration(Dataset.open(d))["num_train"]
