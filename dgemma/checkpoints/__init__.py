"""Checkpoint import/export: Hugging Face safetensors directories, GGUF files and our own inference format."""

from dgemma.checkpoints.gguf import load_gguf
from dgemma.checkpoints.hf import load_hf, save_hf
from dgemma.checkpoints.native import load_native, save_model

__all__ = ["load_gguf", "load_hf", "save_hf", "load_native", "save_model"]
