"""Checkpoint import/export: Hugging Face safetensors directories and our own inference format."""

from dgemma.checkpoints.hf import load_hf, save_hf
from dgemma.checkpoints.native import load_model, save_model

__all__ = ["load_hf", "save_hf", "load_model", "save_model"]
