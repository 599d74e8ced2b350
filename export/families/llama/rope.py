"""The rotary embedding's cos/sin tables, baked into the graph as transformers computes them at run time."""

import math

import numpy as np
from edgelm.runtime.package.format import Architecture

ROPE_TYPES = ("default", "llama3")  # rope_scaling types baked at export; others change with the sequence length


def inverse_frequencies(arch: Architecture):
    """The rotary inverse frequencies [D / 2] as transformers computes them (float32, torch), with Llama 3's
    scaling where rope_scaling asks for it: wavelengths longer than the original context are divided by
    `factor`, short ones kept, the band between blended smoothly."""
    import torch

    D = arch.head_size
    inv_freq = 1.0 / (arch.rope_theta ** (torch.arange(0, D, 2, dtype=torch.int64).to(dtype=torch.float) / D))
    scaling = arch.rope_scaling or {}
    if scaling.get("rope_type", scaling.get("type", "default")) != "llama3":
        return inv_freq
    factor, low, high = (float(scaling[k]) for k in ("factor", "low_freq_factor", "high_freq_factor"))
    old_context = scaling["original_max_position_embeddings"]
    low_wavelength, high_wavelength = old_context / low, old_context / high
    wavelength = 2 * math.pi / inv_freq
    scaled = torch.where(wavelength > low_wavelength, inv_freq / factor, inv_freq)
    smooth = (old_context / wavelength - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelength < high_wavelength) * ~(wavelength > low_wavelength)
    return torch.where(medium, smoothed, scaled)


def rope_tables(arch: Architecture) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin of position x inverse frequency, float32 [n_positions, D / 2], computed as transformers does
    at run time (a float32 product, then float32 cos and sin), so the baked tables match it bit for bit."""
    import torch

    angles = torch.arange(arch.n_positions, dtype=torch.float32)[:, None] * inverse_frequencies(arch)[None, :]
    return angles.cos().numpy(), angles.sin().numpy()
