"""Uniform-state discrete diffusion: noise schedules, corruption and training losses."""
