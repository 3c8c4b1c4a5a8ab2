"""Where a model comes from, and where it can be cut: its sources (timm, hf:, factories), the batch every rank
builds from the seed, the cached export, the candidate cut points."""
