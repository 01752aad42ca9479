"""`cluster_features: pixels` means one thing on both roads: the embedded dataset and `hddm cluster` compute the
same principal components of the same area-averaged pixels."""

import numpy as np
import pytest

from hddm_flower.cluster import PixelFeatures, feature_model, pixel_components
from hddm_flower.embedded import PIXEL_COMPONENTS, cluster_features, pixel_vectors


def _images(n: int, side: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size=(n, side, side, 3), dtype=np.uint8)


def test_pixel_vectors_are_area_averages_up_to_16():
    small = _images(3, 16)
    np.testing.assert_array_equal(pixel_vectors(small), small.reshape(3, -1) / 255.0)  # 16×16: the pixels as they are
    big = _images(2, 32)
    blocks = big.astype(np.float64).reshape(2, 16, 2, 16, 2, 3).mean((2, 4)) / 255.0
    np.testing.assert_allclose(pixel_vectors(big), blocks.reshape(2, -1), rtol=0, atol=1e-12)
    odd = np.full((2, 24, 24, 3), 200, np.uint8)  # not a multiple of 16: PIL's box filter, still 16×16
    np.testing.assert_allclose(pixel_vectors(odd), np.full((2, 16 * 16 * 3), 200 / 255.0))


@pytest.mark.parametrize("side", [16, 32])
def test_both_roads_compute_the_same_components(tmp_path, side):
    images = _images(60, side, seed=side)
    embedded, described = cluster_features("pixels", images, [], [], encoder=None)
    model = feature_model("pixels", pixel_size=side)
    assert isinstance(model, PixelFeatures) and not model.normalize and model.dim == 16 * 16 * 3
    assert described in model.name
    raw = model(images, [])
    scaled = pixel_components(raw, tmp_path / "c.npy", seed=0, fit_samples=10**6)  # the fit sample is every row
    assert embedded.shape == scaled.shape == (60, PIXEL_COMPONENTS)
    np.testing.assert_allclose(scaled, embedded, rtol=0, atol=1e-5)  # float32 memmap on the scaled road
