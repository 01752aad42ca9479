"""hddm_flower: the framework-free core of Heterogeneous Decentralized Diffusion Models on Flower.

Conventions: FM time t ∈ [0, 1] with t = 1 pure noise, ``x_t = (1 − t)·x0 + t·eps``, "velocity" ``v = eps − x0``.
The math lives in :mod:`hddm_flower.objectives`, the velocity interface over both objectives in
:mod:`hddm_flower.experts`, routing and sampling in :mod:`hddm_flower.ensemble`. This package never imports flwr.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("hddm-flower")
except PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0+unknown"
