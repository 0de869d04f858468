"""Local randomizers: each knows its parameters, privacy cost, secure per-record randomization,
fast numpy simulation, fixed-length encoding, its wire knowledge for the aggregator (bulk
decoding, accepted range, integer statistic rows and exact sums) and its channel. A device's one
answer goes through ``randomize_payload``, pure Python: numpy loads at the first bulk use
(``lazy_numpy``).

May import numpy and the standard library only: never ``client.device``, ``aggregator`` or scipy.
"""

from client.mechanisms.additive import DEFAULT_GRANULARITY_BITS, GaussianNoise, LaplaceNoise
from client.mechanisms.base import Mechanism, PrivacyCost, ReportRangeError
from client.mechanisms.flip_components import FlipComponents
from client.mechanisms.hadamard import HadamardResponse
from client.mechanisms.local_hashing import LocalHashing
from client.mechanisms.public_coin import PublicCoinBit, as_public_coin
from client.mechanisms.randomized_response import RandomizedResponse
from client.mechanisms.subset import SubsetSelection
from client.mechanisms.support import ExchangeableSupport, SupportMechanism, as_exchangeable
from client.mechanisms.unary import OptimizedUnaryEncoding

__all__ = [
    "DEFAULT_GRANULARITY_BITS",
    "ExchangeableSupport",
    "FlipComponents",
    "GaussianNoise",
    "HadamardResponse",
    "LaplaceNoise",
    "LocalHashing",
    "Mechanism",
    "OptimizedUnaryEncoding",
    "PrivacyCost",
    "PublicCoinBit",
    "RandomizedResponse",
    "ReportRangeError",
    "SubsetSelection",
    "SupportMechanism",
    "as_exchangeable",
    "as_public_coin",
]
