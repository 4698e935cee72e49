"""Named random streams derived from one root seed.

Every subsystem draws from its own child stream so that adding, say, a fault injector does not
shift the workload's draws. A stream's seed depends only on the root seed and the stream's
*name* (never on the order in which streams are asked for), so the mapping is stable:

``seed(name) = SeedSequence(root, spawn_key=(blake2b-64(name),))``.
"""

from __future__ import annotations

import hashlib

import numpy as np


def _name_key(name: str) -> int:
    # Stable 64-bit key from the name; Python's hash() is salted per process, so never used.
    return int.from_bytes(hashlib.blake2b(name.encode("utf-8"), digest_size=8).digest(), "little")


class RngStreams:
    """A factory of seeded ``numpy.random.Generator`` objects, one per name.

    ``streams.get("workload")`` returns the same generator object on every call within one
    ``RngStreams``; two ``RngStreams`` with the same root seed give identical sequences per name.
    """

    def __init__(self, root_seed: int) -> None:
        if root_seed < 0:
            raise ValueError(f"root seed must be >= 0, got {root_seed}")
        self.root_seed = int(root_seed)
        self._gens: dict[str, np.random.Generator] = {}

    def seed_sequence(self, name: str) -> np.random.SeedSequence:
        """The ``SeedSequence`` of stream ``name`` (a pure function of root seed and name)."""
        return np.random.SeedSequence(self.root_seed, spawn_key=(_name_key(name),))

    def get(self, name: str) -> np.random.Generator:
        """The generator of stream ``name``, created on first use."""
        gen = self._gens.get(name)
        if gen is None:
            gen = self._gens[name] = np.random.Generator(np.random.PCG64(self.seed_sequence(name)))
        return gen
