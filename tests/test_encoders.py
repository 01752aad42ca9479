"""Encoders from local directories, tested with tiny random models saved to disk and loaded by the same code
that loads sd-vae-ft-mse and CLIP ViT-L/14."""

import pytest
import torch

from hddm_flower.encoders import LatentCodec
from hddm_flower.text import TextEncoder


@pytest.fixture(scope="module")
def tiny_vae(tmp_path_factory):
    from diffusers import AutoencoderKL

    torch.manual_seed(0)
    vae = AutoencoderKL(
        in_channels=3,
        out_channels=3,
        latent_channels=4,
        block_out_channels=(8, 16),
        down_block_types=("DownEncoderBlock2D",) * 2,
        up_block_types=("UpDecoderBlock2D",) * 2,
        norm_num_groups=8,
        sample_size=16,
        scaling_factor=0.18215,
    )
    path = tmp_path_factory.mktemp("vae")
    vae.save_pretrained(path)
    return path, vae.eval()


def test_latent_codec_round_trip_shapes_and_scaling(tiny_vae):
    path, vae = tiny_vae
    codec = LatentCodec(path)
    assert codec.scaling_factor == 0.18215 and codec.downsample == 2
    x = torch.rand(2, 3, 16, 16) * 2 - 1
    z = codec.encode(x, sample=False)
    assert z.shape == (2, 4, 8, 8)
    with torch.no_grad():
        torch.testing.assert_close(z, vae.encode(x).latent_dist.mode() * 0.18215)
        torch.testing.assert_close(codec.decode(z), vae.decode(z / 0.18215).sample.clamp(-1, 1))
    g1, g2 = torch.Generator().manual_seed(0), torch.Generator().manual_seed(0)
    torch.testing.assert_close(codec.encode(x, generator=g1), codec.encode(x, generator=g2))
    with pytest.raises(FileNotFoundError, match="does not hold a diffusers AutoencoderKL"):
        LatentCodec(path / "nope")


def test_clip_text_encoder_from_a_local_directory(tmp_path):
    """A CLIP text model + tokenizer in the ViT-L/14 layout (here tiny and random) loads through TextEncoder."""
    from .tiny_models import save_tiny_clip_text

    save_tiny_clip_text(tmp_path, ["a", "dog", "face", "japan", "flag", "red", "apple"])
    enc = TextEncoder(tmp_path, max_length=77)
    cond, pooled = enc.encode(["a dog face", "japan flag", ""])
    assert enc.dim == 32 and enc.name.startswith("clip_text_model")
    assert cond.states.shape == (3, 77, 32) and pooled.shape == (3, 32)
    assert cond.mask[2].sum() == 2 and cond.mask[0].sum() > cond.mask[2].sum()  # "" is [BOS][EOS]
    assert not torch.allclose(cond.states[0], cond.states[1])


def test_full_clip_folder_loads_its_text_tower(tmp_path):
    """openai/clip-vit-large-patch14 is a full CLIPModel folder: TextEncoder takes its text model only."""
    from transformers import CLIPConfig, CLIPModel, CLIPTextModel

    from .tiny_models import save_tiny_clip_text

    save_tiny_clip_text(tmp_path / "text")
    text_config = CLIPTextModel.from_pretrained(tmp_path / "text").config.to_dict()
    torch.manual_seed(0)
    full = CLIPModel(
        CLIPConfig(
            text_config=text_config,
            vision_config={
                "hidden_size": 32,
                "intermediate_size": 64,
                "num_hidden_layers": 1,
                "num_attention_heads": 2,
                "image_size": 32,
                "patch_size": 16,
            },
            projection_dim=16,
        )
    )
    full.save_pretrained(tmp_path / "full")
    for f in (tmp_path / "text").glob("*"):
        if "token" in f.name or f.name in ("vocab.json", "merges.txt"):
            (tmp_path / "full" / f.name).write_bytes(f.read_bytes())
    enc = TextEncoder(tmp_path / "full", max_length=77)
    assert type(enc.model).__name__ == "CLIPTextModel" and enc.dim == 32
    cond, _ = enc.encode(["a red dog"])
    tok = enc.tokenizer(["a red dog"], padding="max_length", max_length=77, return_tensors="pt")
    with torch.no_grad():
        ref = full.text_model(**tok).last_hidden_state
    n = int(tok["attention_mask"].sum())
    torch.testing.assert_close(cond.states[0, :n], ref[0, :n])


def test_dinov2_features_from_a_local_directory(tmp_path):
    """A DINOv2 folder (model + image processor, the facebook/dinov2-large layout) gives its CLS features."""
    import numpy as np
    from transformers import AutoImageProcessor, Dinov2Model

    from hddm_flower.cluster import Dinov2Features, feature_model

    from .tiny_models import save_tiny_dinov2

    save_tiny_dinov2(tmp_path / "dino", image_size=32)
    f = feature_model("dinov2", dinov2=str(tmp_path / "dino"))
    assert isinstance(f, Dinov2Features) and f.dim == 32 and f.name.startswith("dinov2:dino")
    images = np.random.default_rng(0).integers(0, 256, (3, 24, 24, 3), dtype=np.uint8)
    out = f(images, [])
    model = Dinov2Model.from_pretrained(tmp_path / "dino").eval()
    inputs = AutoImageProcessor.from_pretrained(tmp_path / "dino")(images=list(images), return_tensors="pt")
    assert inputs["pixel_values"].shape == (3, 3, 32, 32)  # resized + centre-cropped by the processor
    with torch.no_grad():
        ref = model(**inputs).pooler_output  # the CLS token after the final layer norm
        torch.testing.assert_close(ref, model(**inputs).last_hidden_state[:, 0])
    np.testing.assert_allclose(out, ref.numpy(), atol=1e-5)
    with pytest.raises(FileNotFoundError, match="does not hold a transformers model"):
        feature_model("dinov2", dinov2=str(tmp_path / "nope"))
    with pytest.raises(ValueError, match="need data.dinov2"):
        feature_model("dinov2")
