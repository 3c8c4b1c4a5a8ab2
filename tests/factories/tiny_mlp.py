"""A user's own model for --model-factory tests: a small MLP stack and its example batch."""

import torch
from torch import nn


def build(width: int = 16, depth: int = 4):
    layers = nn.Sequential(*[nn.Sequential(nn.Linear(width, width), nn.ReLU()) for _ in range(depth)])
    return nn.Sequential(layers, nn.Linear(width, 3)), torch.randn(8, width)


def not_a_pair():
    return nn.Linear(2, 2)


def uneven():
    return nn.Linear(2, 2), (torch.randn(4, 2), torch.randn(3, 2))


class Masked(nn.Module):
    """Token ids and a padding mask, as a language model takes them: the mask is used past every cut."""

    def __init__(self, vocab: int, width: int, depth: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(width, width), nn.ReLU()) for _ in range(depth))
        self.head = nn.Linear(width, 3)

    def forward(self, ids, mask):
        keep = mask.unsqueeze(-1).to(torch.float32)
        h = self.embed(ids) * keep
        for block in self.blocks:
            h = block(h) * keep
        return self.head(h.sum(1))


def masked(vocab: int = 50, width: int = 16, depth: int = 4):
    return Masked(vocab, width, depth), (torch.randint(0, vocab, (8, 6)), torch.ones(8, 6, dtype=torch.bool))


def wide(width: int = 1024, depth: int = 4, batch: int = 256):
    """Wide enough that what a training step keeps (gradients, saved activations) stands well above the
    allocator's noise in a process's resident size, small enough to step in a fraction of a second."""
    layers = nn.Sequential(*[nn.Sequential(nn.Linear(width, width), nn.ReLU()) for _ in range(depth)])
    return nn.Sequential(layers, nn.Linear(width, 8)), torch.randn(batch, width)
