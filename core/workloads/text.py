"""A small real text for language models, with nothing to download: the Python documentation's topics.

Every Python ships them in its standard library (``pydoc_data.topics``: what ``help("if")`` prints,
about 465 KB of English prose and code examples in Python 3.11), so a test or an example can train a
language model on real text offline. :func:`write_token_splits` writes it at byte level (a token is a
byte, vocabulary 256) as token files split as a run to a target reads them (docs/to-target.md):
``DATA/train.bin`` and ``DATA/val.bin``, nanoGPT's layout (uint16 ids).
"""

from __future__ import annotations

from pathlib import Path

from core.base.files import write_atomically
from core.data import HELD_OUT_SPLIT, TRAIN_SPLIT

#: byte-level tokens: every byte is its own id
BYTE_VOCABULARY = 256
#: the share of the text (its end) held out for evaluation
HELD_OUT_FRACTION = 0.1


def bundled_text() -> bytes:
    """The Python documentation's topics (``pydoc_data.topics``), in sorted topic order, as UTF-8:
    the same bytes for a given Python version. Its text changes between Python versions, and with it
    the figures a model reaches on it."""
    from pydoc_data.topics import topics

    return "\n\n".join(topics[name] for name in sorted(topics)).encode("utf-8")


def write_token_splits(
    root: str | Path, text_bytes: int | None = None, held_out_fraction: float = HELD_OUT_FRACTION
) -> Path:
    """Write :func:`bundled_text` as byte-level token files: ``root/train.bin`` (the text's first part)
    and ``root/val.bin`` (its last ``held_out_fraction``), each a flat file of uint16 ids.

    The held-out part is the text's end, not a random choice of sequences: sequences cut from one
    stretch of text would share their neighbours' contexts across the split (nanoGPT splits so too).
    Each file is written whole or not at all (a temporary file renamed).

    :param text_bytes: keep only the text's first bytes (a small data set for tests); None keeps all
    :returns: ``root``
    """
    import numpy as np

    if not 0 < held_out_fraction < 1:
        raise ValueError(f"held_out_fraction {held_out_fraction}: a fraction between 0 and 1")
    text = bundled_text()[:text_bytes]
    tokens = np.frombuffer(text, dtype=np.uint8).astype(np.uint16)
    cut = len(tokens) - int(len(tokens) * held_out_fraction)
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    for split, part in ((TRAIN_SPLIT, tokens[:cut]), (HELD_OUT_SPLIT, tokens[cut:])):
        write_atomically(root / f"{split}.bin", part.tobytes(), "a token file")
    return root
