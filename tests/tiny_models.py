"""Tiny random stand-ins for sd-vae-ft-mse, CLIP ViT-L/14 text and DINOv2, saved in the layout of the real ones
so that the real ``from_pretrained`` loading code reads them."""

from pathlib import Path

import torch


def save_tiny_vae(path: Path) -> Path:
    from diffusers import AutoencoderKL

    torch.manual_seed(0)
    AutoencoderKL(
        in_channels=3,
        out_channels=3,
        latent_channels=4,
        block_out_channels=(8, 16),
        down_block_types=("DownEncoderBlock2D",) * 2,
        up_block_types=("UpDecoderBlock2D",) * 2,
        norm_num_groups=8,
        sample_size=16,
        scaling_factor=0.18215,
    ).save_pretrained(path)
    return path


WORDS = ("a", "dog", "face", "red", "blue", "green", "square", "photo", "of")


def save_tiny_clip_text(path: Path, words=WORDS) -> Path:
    """A CLIP text model + tokenizer in the ViT-L/14 layout (tiny, random) whose vocabulary holds ``words``."""
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTokenizer

    vocab = {"<|startoftext|>": 0, "<|endoftext|>": 1}
    for ch in "abcdefghijklmnopqrstuvwxyz":
        vocab.setdefault(ch, len(vocab))
        vocab.setdefault(ch + "</w>", len(vocab))
    for w in words:
        vocab.setdefault(w + "</w>", len(vocab))
    CLIPTokenizer(vocab=vocab, merges=[]).save_pretrained(path)
    torch.manual_seed(0)
    CLIPTextModel(
        CLIPTextConfig(
            vocab_size=len(vocab),
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=2,
            max_position_embeddings=77,
            eos_token_id=1,
            bos_token_id=0,
            pad_token_id=1,
        )
    ).save_pretrained(path)
    return path


def save_tiny_dinov2(path: Path, image_size: int = 32) -> Path:
    from transformers import BitImageProcessor, Dinov2Config, Dinov2Model

    torch.manual_seed(0)
    Dinov2Model(
        Dinov2Config(
            hidden_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            intermediate_size=64,
            patch_size=8,
            image_size=image_size,
        )
    ).save_pretrained(path)
    BitImageProcessor(
        size={"shortest_edge": image_size},
        crop_size={"height": image_size, "width": image_size},
        image_mean=[0.485, 0.456, 0.406],
        image_std=[0.229, 0.224, 0.225],
    ).save_pretrained(path)
    return path
