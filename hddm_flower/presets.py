"""Size presets of the expert (PixArt-α AdaLN-Single) and the router (a DiT classifier): plain data, torch-free,
so the configuration names them without importing the models (:mod:`hddm_flower.models` builds them)."""

# hidden width = heads × head_dim. The DiT sizes (S, B, XL; patch 2) follow Peebles & Xie; at the paper's input
# shapes (4×32×32 latents, CLIP ViT-L/14 text states of width 768) XL/2 has 607M parameters (paper: 605M).
EXPERT_PRESETS: dict[str, dict] = {
    "test": dict(num_layers=1, num_attention_heads=2, attention_head_dim=16, patch_size=2),
    # femto and pico: one block of width 8 and 16, the narrow end of the GMM capacity map (docs/results.md)
    "femto": dict(num_layers=1, num_attention_heads=1, attention_head_dim=8, patch_size=2),
    "pico": dict(num_layers=1, num_attention_heads=2, attention_head_dim=8, patch_size=2),
    "nano": dict(num_layers=2, num_attention_heads=2, attention_head_dim=16, patch_size=2),  # the GMM capacity rung
    "mini": dict(num_layers=2, num_attention_heads=2, attention_head_dim=32, patch_size=2),  # 8×8 toy data
    "tiny": dict(num_layers=4, num_attention_heads=4, attention_head_dim=32, patch_size=2),
    "S/2": dict(num_layers=12, num_attention_heads=6, attention_head_dim=64, patch_size=2),
    "B/2": dict(num_layers=12, num_attention_heads=12, attention_head_dim=64, patch_size=2),
    "XL/2": dict(num_layers=28, num_attention_heads=16, attention_head_dim=72, patch_size=2),
}
# the router is a DiT classifier: B/2 on 4×32×32 latents has 128.5M parameters (paper: ≈129M)
ROUTER_PRESETS: dict[str, dict] = {
    "test": dict(depth=1, hidden_size=32, num_heads=2, patch_size=4),
    "tiny": dict(depth=3, hidden_size=96, num_heads=4, patch_size=4),
    "S/2": dict(depth=12, hidden_size=384, num_heads=6, patch_size=2),
    "B/2": dict(depth=12, hidden_size=768, num_heads=12, patch_size=2),
}
