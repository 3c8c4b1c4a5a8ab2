"""A user's own model for --model-factory tests: a small MLP stack and its example batch."""

import torch
from torch import nn


def build(width: int = 16, depth: int = 4):
    layers = nn.Sequential(*[nn.Sequential(nn.Linear(width, width), nn.ReLU()) for _ in range(depth)])
    return nn.Sequential(layers, nn.Linear(width, 3)), torch.randn(8, width)


def not_a_pair():
    return nn.Linear(2, 2)


def two_inputs():
    return nn.Linear(2, 2), (torch.randn(4, 2), torch.randn(4, 2))
