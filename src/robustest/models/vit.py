"""Vision Transformer ViT-Ti / DeiT-Tiny (Dosovitskiy et al. 2021; Touvron et al. 2021): ``vit_tiny``.

Patch embedding by a ``patch`` x ``patch`` stride-``patch`` convolution to 192 dimensions, a class token and
learned position embeddings, 12 pre-norm blocks (LayerNorm, 3-head self-attention through
``scaled_dot_product_attention``, LayerNorm, MLP 768 with GELU), a final LayerNorm and a linear head on the
class token. Plain torch; parameter names follow timm's ``VisionTransformer`` (``patch_embed.proj``,
``cls_token``, ``pos_embed``, ``blocks.0.attn.qkv``, ``blocks.0.mlp.fc1``, ``norm``, ``head``), so DeiT-Tiny
weights of the same patch size and resolution load with ``load_state_dict``.

The default patch is 4 below 128 pixels (8 x 8 patches for 32 x 32 images) and 16 from there (14 x 14 for
224 x 224); ``create("vit_tiny", patch=8)`` chooses another. The position embeddings fix the grid, so a
model takes exactly the input size it was built for.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from robustest.core.errors import ConfigError
from robustest.models.registry import register

__all__ = ["VisionTransformer", "vit_tiny"]


class _PatchEmbed(nn.Module):
    def __init__(self, in_channels: int, dim: int, patch: int) -> None:
        super().__init__()
        self.proj = nn.Conv2d(in_channels, dim, patch, stride=patch)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x).flatten(2).transpose(1, 2)  # N x tokens x dim


class _Attention(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, t, d = x.shape
        q, k, v = self.qkv(x).reshape(n, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        out = F.scaled_dot_product_attention(q, k, v)  # N x heads x tokens x head_dim
        return self.proj(out.transpose(1, 2).reshape(n, t, d))


class _Mlp(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class _Block(nn.Module):
    def __init__(self, dim: int, heads: int, hidden: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.attn = _Attention(dim, heads)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = _Mlp(dim, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class VisionTransformer(nn.Module):
    """ViT for ``input_size`` x ``input_size`` images: N x ``in_channels`` x S x S -> N x ``num_classes``."""

    def __init__(self, input_size: int = 224, patch: int = 16, num_classes: int = 1000, in_channels: int = 3,
                 dim: int = 192, depth: int = 12, heads: int = 3, mlp_dim: int = 768) -> None:
        super().__init__()
        if dim % heads:
            raise ConfigError(f"ViT dim {dim} must be a multiple of heads {heads}")
        _check_patch(patch, input_size)
        tokens = (input_size // patch) ** 2
        self.patch_embed = _PatchEmbed(in_channels, dim, patch)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embed = nn.Parameter(torch.zeros(1, tokens + 1, dim))
        self.blocks = nn.Sequential(*[_Block(dim, heads, mlp_dim) for _ in range(depth)])
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.head = nn.Linear(dim, num_classes)
        nn.init.trunc_normal_(self.pos_embed, std=0.02)
        nn.init.normal_(self.cls_token, std=1e-6)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.trunc_normal_(m.weight, std=0.02)
                nn.init.zeros_(m.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tok = self.patch_embed(x)
        tok = torch.cat([self.cls_token.expand(tok.shape[0], -1, -1), tok], 1) + self.pos_embed
        return self.head(self.norm(self.blocks(tok))[:, 0])


def _check_patch(patch: Any, input_size: int) -> None:
    if isinstance(patch, bool) or not isinstance(patch, int) or patch < 1:
        raise ConfigError(f"ViT patch size must be a positive integer, got {patch!r}")
    if input_size % patch:
        divisors = [d for d in range(2, min(input_size, 32) + 1) if input_size % d == 0]
        tip = f"patch= one of {', '.join(map(str, divisors))}" if divisors else "resize the images"
        raise ConfigError(f"vit_tiny with patch {patch} cannot take {input_size}x{input_size} inputs (the side "
                          f"must be a multiple of the patch): pass {tip}, or use resnet20/preact_resnet18")


def _resolve(options: dict[str, Any], input_size: int) -> dict[str, Any]:
    if options.get("patch") is None:
        options["patch"] = 16 if input_size >= 128 else 4
    _check_patch(options["patch"], input_size)
    return options


@register("vit_tiny", "ViT-Ti / DeiT-Tiny: dim 192, depth 12, 3 heads, MLP 768; patch 4 below 128 px, 16 above "
          "(patch option)", native=(3, 224, 1000), resolve=_resolve)
def vit_tiny(num_classes: int = 1000, in_channels: int = 3, input_size: int = 224, patch: int | None = None
             ) -> nn.Module:
    return VisionTransformer(input_size, _resolve({"patch": patch}, input_size)["patch"], num_classes, in_channels)
