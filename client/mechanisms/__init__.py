"""Local randomizers: each knows its parameters, privacy cost, secure per-record randomization,
fast numpy simulation, fixed-length encoding, and its channel for the aggregator."""

from client.mechanisms.additive import GaussianNoise, LaplaceNoise
from client.mechanisms.base import Mechanism, PrivacyCost
from client.mechanisms.flip_components import FlipComponents
from client.mechanisms.randomized_response import RandomizedResponse

__all__ = [
    "FlipComponents",
    "GaussianNoise",
    "LaplaceNoise",
    "Mechanism",
    "PrivacyCost",
    "RandomizedResponse",
]
