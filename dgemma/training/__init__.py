"""Training: LoRA, the optimizer, the diffusion train step, checkpointing and metrics."""
