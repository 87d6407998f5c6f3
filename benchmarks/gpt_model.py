"""A GPT-style decoder for step-time checks, built here with random weights (no download).

`GPT_124M` is the shape of GPT-2's smallest model: 12 layers of width 768 with 12 heads, a
context of 1,024 tokens, the vocabulary padded to 50,304, the output layer tied to the
token embedding: about 124M parameters. It trains in bfloat16 autocast with float32
weights, the way such a model is trained on a GPU. `GPT_DRY_RUN` is the same code at a size
a CPU runs in seconds, for a dry run of a check.

What must stay true: every process that builds a model from the same config and seed holds
the same weights and the same data, so two sides of a comparison train the same thing.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True, slots=True)
class GptConfig:
    vocab: int
    context: int
    layers: int
    heads: int
    width: int


GPT_124M = GptConfig(vocab=50304, context=1024, layers=12, heads=12, width=768)
GPT_DRY_RUN = GptConfig(vocab=512, context=64, layers=2, heads=2, width=64)


class Block(nn.Module):
    """Pre-norm attention (causal, PyTorch's fused kernel) and a 4x MLP, each residual."""

    def __init__(self, config: GptConfig) -> None:
        super().__init__()
        self.heads = config.heads
        self.norm1 = nn.LayerNorm(config.width)
        self.qkv = nn.Linear(config.width, 3 * config.width)
        self.out = nn.Linear(config.width, config.width)
        self.norm2 = nn.LayerNorm(config.width)
        self.mlp = nn.Sequential(
            nn.Linear(config.width, 4 * config.width),
            nn.GELU(approximate="tanh"),
            nn.Linear(4 * config.width, config.width),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, width = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(width, dim=2)
        shape = (batch, length, self.heads, width // self.heads)
        q, k, v = (t.view(shape).transpose(1, 2) for t in (q, k, v))
        attended = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.out(attended.transpose(1, 2).reshape(batch, length, width))
        return x + self.mlp(self.norm2(x))


class Gpt(nn.Module):
    def __init__(self, config: GptConfig) -> None:
        super().__init__()
        self.tokens = nn.Embedding(config.vocab, config.width)
        self.positions = nn.Embedding(config.context, config.width)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.layers))
        self.norm = nn.LayerNorm(config.width)
        self.head = nn.Linear(config.width, config.vocab, bias=False)
        self.head.weight = self.tokens.weight  # tied, as GPT-2's
        for module in self.modules():  # GPT-2's initial scale: logits near uniform
            if isinstance(module, nn.Linear | nn.Embedding):
                nn.init.normal_(module.weight, std=0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        place = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.tokens(tokens) + self.positions(place)
        for block in self.blocks:
            x = block(x)
        logits: torch.Tensor = self.head(self.norm(x))
        return logits


def building_gpt(config: GptConfig, samples: int, seed: int = 0) -> tuple[Gpt, torch.Tensor]:
    """The model (float32 weights) and `samples` random sequences of `context + 1` tokens."""
    torch.manual_seed(seed)
    model = Gpt(config)
    generator = torch.Generator().manual_seed(seed + 1)
    tokens = torch.randint(0, config.vocab, (samples, config.context + 1), generator=generator)
    return model, tokens


def gpt_loss(model: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    """Next-token cross entropy, the forward in bfloat16 autocast on the tokens' device."""
    with torch.autocast(tokens.device.type, dtype=torch.bfloat16):
        logits = model(tokens[:, :-1])
    return nn.functional.cross_entropy(
        logits.float().reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1)
    )
