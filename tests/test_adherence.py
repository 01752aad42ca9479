"""Prompt adherence: each prompt's cluster from the dataset's captions, and the fraction of its samples a real
feature classifier puts there."""

import pytest
import torch

from hddm_flower.data import Dataset
from hddm_flower.data.layout import PROMPT_CLUSTERS
from hddm_flower.evaluation.adherence import prompt_adherence, prompt_clusters
from hddm_flower.evaluation.metrics import FeatureClassifier


def test_prompt_clusters_come_from_the_dataset_captions(dataset_dir):
    both = [Dataset.open(dataset_dir).split(None, split) for split in ("train", "val")]
    truth: dict[str, set[int]] = {}
    for split in both:
        for caption, k in zip(split.captions, split.labels.tolist()):
            truth.setdefault(caption, set()).add(k)
    picked = [both[0].captions[0], both[1].captions[-1], both[0].captions[len(both[0].captions) // 2]]
    got = prompt_clusters(Dataset.open(dataset_dir), [*picked, "no emoji is called this"], cache=False)
    assert got == [sorted(truth[c]) for c in picked] + [[]]


def test_prompt_clusters_are_read_once_per_dataset_and_prompts(dataset_dir, monkeypatch):
    """The first call reads the captions and caches the answer beside the dataset; the next reads no caption."""

    prompts = [Dataset.open(dataset_dir).split(None, "val").captions[0], "a prompt only this test asks for"]
    first = prompt_clusters(Dataset.open(dataset_dir), prompts)
    assert list((dataset_dir / PROMPT_CLUSTERS).glob("*.json"))

    def no_reading(*a, **k):
        raise AssertionError("the captions were read again")

    monkeypatch.setattr(Dataset, "captions", no_reading)
    assert prompt_clusters(Dataset.open(dataset_dir), prompts) == first and first[0] and first[1] == []
    with pytest.raises(AssertionError, match="read again"):  # other prompts: another answer, read once
        prompt_clusters(Dataset.open(dataset_dir), [*prompts, "one more"])


def test_prompt_clusters_pass_every_sample_once(dataset_dir, monkeypatch):
    """One pass over both splits: every sample's json goes through webdataset's member filter exactly once."""
    from hddm_flower.data import read_meta, shards

    seen, real = [], shards.open_shards

    def counted(urls, *, select_files, **kw):
        return real(
            urls, select_files=lambda name: (name.endswith(".json") and seen.append(name)) or select_files(name), **kw
        )

    monkeypatch.setattr(shards, "open_shards", counted)
    prompt_clusters(Dataset.open(dataset_dir), ["a prompt of the one-pass test"], cache=False)
    assert len(seen) == len(set(seen)) == read_meta(dataset_dir)["num_images"]


def test_adherence_is_the_fraction_of_a_prompts_samples_in_its_cluster():
    net = FeatureClassifier(in_channels=3, num_classes=4, text_dim=8, feature_dim=8, widths=(8,)).eval()
    with torch.no_grad():  # a classifier that puts every image in cluster 2 (its logits: the head's bias only)
        net.cls_head.weight.zero_()
        net.cls_head.bias.copy_(torch.tensor([0.0, 0.0, 5.0, 0.0]))
    images = torch.rand(4 * 3, 3, 8, 8) * 2 - 1
    a = prompt_adherence(net, images, [[2], [1], [], [1, 2]], samples_per_prompt=3)
    assert a["per_prompt"] == [1.0, 0.0, None, 1.0]
    assert a["mean"] == pytest.approx(2 / 3)
    assert a["predicted"] == [[2, 2, 2]] * 4
    with pytest.raises(ValueError, match="12 images for 3 prompts"):
        prompt_adherence(net, images, [[2], [1], []], samples_per_prompt=3)
