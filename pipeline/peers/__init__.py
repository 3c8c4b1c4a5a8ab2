"""The training frameworks' own split rules (torchtitan, Megatron-Core, DeepSpeed) and the split in their formats."""
