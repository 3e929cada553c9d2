"""Sampling: block-diffusion generation as one jitted program, an autoregressive baseline with the same
backbone, and step-by-step display (tasks that use them: dgemma/tasks).

    from dgemma.sampling import SamplerConfig, generate
    out = generate(params, config, prompt_BxP, prompt_valid_BxP, jax.random.key(0), SamplerConfig())
"""

from dgemma.sampling.autoregressive import ARConfig, AROutput, compile_autoregressive, generate_autoregressive
from dgemma.sampling.generate import (GenerateOutput, SamplerConfig, compile_generate, generate, sampler_config,
                                      self_conditioning_for)

__all__ = ["SamplerConfig", "GenerateOutput", "generate", "compile_generate", "self_conditioning_for", "sampler_config",
           "ARConfig", "AROutput", "generate_autoregressive", "compile_autoregressive"]
