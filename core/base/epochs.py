"""What one epoch is, for the epoch time and energy estimates (``RunConfig.epoch_definition``).

The papers define an epoch differently: the dataset's training split (GH200: CIFAR-100's 50,000),
a fixed sample count (CARAML: "1 Epoch = 1281167 Samples", or "10^6 images"), or a multiple of
the batch (CARAML's IPU GPT: "1 Epoch = 4*Batch size"). A run names its definition as text so that
a sweep file, a CLI flag and a stored result all spell it the same way:

- ``dataset``: the training split of the dataset the run reads or the workload stands for
  (what core did before definitions existed, so the default);
- ``samples:N``: N samples, e.g. ``samples:1281167``;
- ``global-batches:N``: N global batches of ``samples_per_update`` samples each;
- ``host-calls:N``: N host calls of ``samples_per_host_call`` samples each (the global batch times
  ``device_iterations``; Graphcore's tools count an epoch this way).

Nothing here runs anything: an epoch's time and energy are extrapolated from the timed window.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

EpochKind = Literal["dataset", "samples", "global-batches", "host-calls"]
EPOCH_KINDS: tuple[EpochKind, ...] = ("dataset", "samples", "global-batches", "host-calls")
_KINDS: dict[str, EpochKind] = {kind: kind for kind in EPOCH_KINDS}
DEFAULT_EPOCH_DEFINITION = "dataset"
# Beyond this a count is a typing mistake, and samples stay exact in a float (2^53 is about 9e15).
MAX_EPOCH_COUNT = 10**12

# Spaces around the text and the colon are allowed (``samples: 1000``): every spelling of one
# definition parses to the same one, written back as ``samples:1000`` (see EpochDefinition.__str__).
_PATTERN = re.compile(r"\s*(?P<kind>[a-z-]+)(?:\s*:\s*(?P<count>[0-9][0-9_]*))?\s*")

ALLOWED_EPOCH_DEFINITIONS = (
    "'dataset' (the dataset's training split), 'samples:N' (N samples, e.g. samples:1281167), "
    "'global-batches:N' (N x samples_per_update, e.g. global-batches:4) or 'host-calls:N' "
    f"(N x samples_per_host_call), with N a whole number from 1 to {MAX_EPOCH_COUNT:_}"
)


@dataclass(frozen=True)
class EpochDefinition:
    kind: EpochKind
    count: int | None = None  # None for "dataset"

    @classmethod
    def parse(cls, text: str) -> EpochDefinition:
        """The definition ``text`` spells; ValueError saying what is allowed otherwise.

        Spellings of one definition parse equal (``samples:1_000``, ``samples: 1000`` and
        ``samples:01000`` are ``samples:1000``), so ``str()`` of the result is the one spelling
        to store and to compare (a sweep's cells are told apart by it)."""
        match = _PATTERN.fullmatch(text)
        kind = _KINDS.get(match.group("kind")) if match else None
        raw_count = match.group("count") if match else None
        if kind is None or (kind == "dataset") != (raw_count is None):
            raise ValueError(f"one of {ALLOWED_EPOCH_DEFINITIONS}")
        if raw_count is None:
            return cls("dataset")
        count = int(raw_count.replace("_", ""))  # underscores as in TOML: samples:1_281_167
        if not 1 <= count <= MAX_EPOCH_COUNT:
            raise ValueError(f"a count of {count} is out of range; one of {ALLOWED_EPOCH_DEFINITIONS}")
        return cls(kind, count)

    def __str__(self) -> str:
        return self.kind if self.count is None else f"{self.kind}:{self.count}"

    def samples(self, dataset_samples: int | None, samples_per_update: int, samples_per_host_call: int) -> int | None:
        """Samples in one epoch; None for ``dataset`` when the dataset's size is unknown."""
        if self.kind == "dataset" or self.count is None:
            return dataset_samples or None
        per_unit = {"samples": 1, "global-batches": samples_per_update, "host-calls": samples_per_host_call}
        return self.count * per_unit[self.kind]

    def describe(self) -> str:
        """In words, for the CLI text and the report: 'samples:1281167 (1,281,167 samples)'."""
        if self.count is None:
            return "dataset (its training split)"
        unit = {"samples": "samples", "global-batches": "global batches", "host-calls": "host calls"}[self.kind]
        return f"{self} ({self.count:,} {unit})"
