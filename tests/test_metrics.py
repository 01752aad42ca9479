"""Metrics against closed forms (float64), and the loading code of every feature network on tiny random weights."""

from unittest import mock

import pytest
import torch

from hddm_flower.evaluation import metrics as M

F64 = torch.float64


def _with_moments(z: torch.Tensor, mu: torch.Tensor, cov: torch.Tensor) -> torch.Tensor:
    """Points whose sample mean is exactly ``mu`` and unbiased sample covariance exactly ``cov``."""
    z = z - z.mean(0)
    emp = z.T @ z / (len(z) - 1)
    white = z @ torch.linalg.inv(torch.linalg.cholesky(emp)).T  # sample covariance = I
    return mu + white @ torch.linalg.cholesky(cov).T


def _sqrtm(a: torch.Tensor) -> torch.Tensor:
    vals, vecs = torch.linalg.eigh(a)
    return vecs @ torch.diag(vals.clamp(min=0).sqrt()) @ vecs.T


def test_frechet_distance_of_gaussians_with_known_moments():
    g = torch.Generator().manual_seed(0)
    # 1-d: (μ1 − μ2)² + (σ1 − σ2)²
    a = _with_moments(
        torch.randn(500, 1, generator=g, dtype=F64), torch.tensor([1.0], dtype=F64), torch.tensor([[4.0]], dtype=F64)
    )
    b = _with_moments(
        torch.randn(700, 1, generator=g, dtype=F64), torch.tensor([-2.0], dtype=F64), torch.tensor([[9.0]], dtype=F64)
    )
    assert M.frechet_distance(a, b) == pytest.approx(9.0 + 1.0, abs=1e-9)
    # d = 4, non-commuting covariances: ‖μ1 − μ2‖² + Tr(Σ1 + Σ2 − 2 (Σ1^½ Σ2 Σ1^½)^½)
    A, B = torch.randn(4, 4, generator=g, dtype=F64), torch.randn(4, 4, generator=g, dtype=F64)
    s1, s2 = A @ A.T + 0.5 * torch.eye(4, dtype=F64), B @ B.T + 0.1 * torch.eye(4, dtype=F64)
    m1, m2 = torch.randn(4, generator=g, dtype=F64), torch.randn(4, generator=g, dtype=F64)
    r1 = _sqrtm(s1)
    expected = (m1 - m2).square().sum() + torch.trace(s1 + s2 - 2 * _sqrtm(r1 @ s2 @ r1))
    x = _with_moments(torch.randn(300, 4, generator=g, dtype=F64), m1, s1)
    y = _with_moments(torch.randn(400, 4, generator=g, dtype=F64), m2, s2)
    assert M.frechet_distance(x, y) == pytest.approx(expected.item(), rel=1e-9)
    assert M.frechet_distance(x, x) == pytest.approx(0.0, abs=1e-8)


def test_kernel_distance_of_identical_sets_is_zero_up_to_its_closed_form_bias():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(300, 8, generator=g, dtype=F64)
    # unbiased MMD² of a set against itself (subset = the whole set), polynomial kernel (x·y/d + 1)³:
    # 2·S_off/(m(m−1)) − 2·(S_off + S_diag)/m² = 2·(mean off-diagonal − mean diagonal)/m → 0 as 1/m
    k = (x @ x.T / 8 + 1) ** 3
    m, s_diag = len(x), k.diagonal().sum()
    s_off = k.sum() - s_diag
    expected = (2 * s_off / (m * (m - 1)) - 2 * (s_off + s_diag) / m**2).item()
    mean, std, size = M.kernel_distance(x, x, subset_size=m, subsets=3)
    assert size == m and mean == pytest.approx(expected, rel=1e-9) and std == pytest.approx(0, abs=1e-12)
    # two independent samples of one distribution: ≈ 0; a shift of one standard deviation: far from 0
    a, b = torch.randn(2, 1000, 8, generator=g, dtype=F64)
    same = M.kernel_distance(a, b, subset_size=500, subsets=20)[0]
    far = M.kernel_distance(a, b + 1.0, subset_size=500, subsets=20)[0]
    assert abs(same) < 0.02 * far and far > 0.5
    assert M.kernel_distance(a, b, subset_size=100, subsets=5, seed=3) == M.kernel_distance(
        a, b, subset_size=100, subsets=5, seed=3
    )  # seeded subsets
    assert M.kernel_distance(a, b, subset_size=5000)[2] == 1000  # subset size capped by the sets
    with pytest.raises(ValueError, match="same d"):
        M.kernel_distance(a, b[:, :4])


def _classifier():
    torch.manual_seed(0)
    return M.FeatureClassifier(num_classes=3, text_dim=6, feature_dim=16, widths=(8, 8))


def test_classifier_features_and_fallback_diversity(tmp_path):
    net = _classifier().eval()
    x = torch.rand(6, 3, 16, 16) * 2 - 1
    fx = M.classifier_features(net, "test")
    assert fx(x).shape == (6, 16) and fx(x).dtype == F64 and "hddm feature classifier" in fx.name
    d = M.classifier_distance(net, "test")
    assert "FALLBACK" in d.name and "not LPIPS" in d.name
    same = x[:2].unsqueeze(1).expand(2, 4, 3, 16, 16)  # 2 prompts × 4 identical samples
    div = M.intra_prompt_diversity(same, d)
    assert div["mean"] == pytest.approx(0.0, abs=1e-10) and div["pairs_per_prompt"] == 6
    assert M.intra_prompt_diversity(x[:4].reshape(1, 4, 3, 16, 16), d)["mean"] > 0
    # saved with the run and loaded back (diffusers ModelMixin, safetensors)
    net.save_pretrained(tmp_path / "fc")
    back = M.FeatureClassifier.from_pretrained(tmp_path / "fc").eval()
    torch.testing.assert_close(M.classifier_features(back, "x")(x), fx(x))


def test_no_alexnet_means_the_named_fallback_or_an_error(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    assert "FALLBACK" in M.lpips_distance(None, fallback=_classifier(), fallback_description="t").name
    with pytest.raises(FileNotFoundError, match="no AlexNet weights"):
        M.lpips_distance(None)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        M.lpips_distance(tmp_path / "missing.pth")


def test_lpips_alexnet_loads_a_local_weights_file(tmp_path, monkeypatch):
    """The real LPIPS path on a random AlexNet saved where torchvision caches it: identical samples give 0."""
    import torchvision

    torch.manual_seed(0)
    (tmp_path / "hub" / "checkpoints").mkdir(parents=True)
    alex = torchvision.models.alexnet()
    torch.save(alex.state_dict(), tmp_path / "hub" / "checkpoints" / M.ALEXNET_FILE)
    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    d = M.lpips_distance(None)
    assert d.name.startswith("LPIPS v0.1 AlexNet")
    x = torch.rand(3, 3, 16, 16) * 2 - 1
    assert torch.all(d(x, x) == 0)
    assert torch.all(d(x, x.flip(0)[[0, 2, 1]]) >= 0)
    div = M.intra_prompt_diversity(x[:1].unsqueeze(1).expand(1, 3, 3, 16, 16), d)
    assert div["mean"] == 0.0
    assert M.intra_prompt_diversity(x.unsqueeze(0), d)["mean"] > 0
    # the random file's weights really are the ones used
    from lpips import LPIPS

    ref = LPIPS(net="alex", pnet_rand=True, verbose=False)
    assert not torch.equal(ref.net.slice1[0].weight, alex.features[0].weight)


def test_inception_features_from_a_local_file(tmp_path):
    """Standard-FID loading code on a random Inception-v3 state dict written to a file."""
    from torchmetrics.image.fid import NoTrainInceptionV3

    empty = tmp_path / "empty.pth"
    torch.save({}, empty)
    with mock.patch.object(NoTrainInceptionV3, "load_state_dict", lambda self, sd: None):
        net = NoTrainInceptionV3(
            name="inception-v3-compat", features_list=["2048"], feature_extractor_weights_path=str(empty)
        )
    torch.save(net.state_dict(), tmp_path / "inception.pth")
    fx = M.inception_features(tmp_path / "inception.pth")
    f = fx(torch.rand(2, 3, 16, 16) * 2 - 1)
    assert f.shape == (2, 2048) and torch.isfinite(f).all() and "inception-v3" in fx.name
    with pytest.raises(FileNotFoundError):
        M.inception_features(tmp_path / "nope.pth")


def test_feature_classifier_learns_separable_clusters():
    g = torch.Generator().manual_seed(0)
    labels = torch.arange(2).repeat(40)
    images = torch.randn(80, 3, 16, 16, generator=g) * 0.1 + (labels[:, None, None, None] * 2 - 1) * 0.5
    emb = torch.nn.functional.normalize(torch.randn(80, 6, generator=g), dim=-1)
    g = torch.Generator().manual_seed(1)

    def batches():
        while True:
            idx = torch.randint(0, len(images), (16,), generator=g)
            yield images[idx], labels[idx], emb[idx]

    net, _ = M.train_feature_classifier_stream(batches(), 2, in_channels=3, text_dim=6, steps=30)
    with torch.no_grad():
        assert (net(images)[0].argmax(-1) == labels).all() and net.config.num_classes == 2


def _tiny_clip(folder):
    """A random CLIP (text + vision towers of width 32) with a byte-level tokenizer, saved like a hub folder."""
    import json

    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel, CLIPProcessor, CLIPTokenizer

    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), 256))
    chars = [chr(b) for b in bs] + [chr(256 + i) for i in range(256 - len(bs))]  # GPT-2's byte → unicode map
    vocab = {c: i for i, c in enumerate(chars + [c + "</w>" for c in chars] + ["<|startoftext|>", "<|endoftext|>"])}
    folder.mkdir()
    (folder / "vocab.json").write_text(json.dumps(vocab))
    (folder / "merges.txt").write_text("#version: 0.2\n")
    tok = CLIPTokenizer(str(folder / "vocab.json"), str(folder / "merges.txt"))
    images = CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
    small = dict(hidden_size=32, intermediate_size=37, num_hidden_layers=1, num_attention_heads=2)
    cfg = CLIPConfig(
        text_config=dict(
            small,
            vocab_size=len(vocab),
            max_position_embeddings=77,
            bos_token_id=vocab["<|startoftext|>"],
            eos_token_id=vocab["<|endoftext|>"],
        ),
        vision_config=dict(small, image_size=32, patch_size=8),
        projection_dim=16,
    )
    torch.manual_seed(0)
    CLIPModel(cfg).save_pretrained(folder)
    CLIPProcessor(image_processor=images, tokenizer=tok).save_pretrained(folder)


def test_clip_score_from_a_local_folder(tmp_path):
    _tiny_clip(tmp_path / "clip")
    x = torch.rand(3, 3, 16, 16) * 2 - 1
    r = M.clip_score(x, ["dog face", "japan flag", "red apple"], tmp_path / "clip")
    assert r["num_images"] == 3 and 0 <= r["value"] <= 100 and r["model"].endswith("clip")
    with pytest.raises(FileNotFoundError):
        M.clip_score(x, ["a"] * 3, tmp_path / "nope")
