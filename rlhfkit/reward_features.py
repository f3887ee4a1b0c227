"""A frozen reward-model backbone, read once: the pooled hidden state of every response, cached.

With `trainable_layers=0` only the heads train. Their inputs (the hidden state at each response's
EOS, Detail 12, or its mean) never change during training, so one forward pass over the data
replaces one per step and epoch, and the cache file serves the next run on the same backbone and
data (other heads, ODIN, length balancing, another validation protocol). Entries are keyed by a
fingerprint of the backbone weights, the pooling, the precision and the token ids, so a changed
model or tokenisation can never read a stale vector.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm

from .data.collate import pack_pairs
from .data.examples import PairExample
from .devices import autocast, evaluation_mode, model_device
from .errors import ConfigError
from .reward_models import ScalarModel


@dataclass
class FeaturePair:
    """A pair as the heads see it: the pooled hidden state of each response and its length in tokens."""

    chosen: torch.Tensor
    rejected: torch.Tensor
    chosen_length: int
    rejected_length: int

    def width(self) -> int:
        return 1  # every row is one vector: nothing to pad


def backbone_fingerprint(model: ScalarModel) -> str:
    digest = hashlib.sha256(model.head_type.encode())
    for name, tensor in sorted(model.backbone.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().float().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def pair_key(prefix: str, example: PairExample) -> str:
    ids = [*example.query.ids, -1, *example.chosen, -2, *example.rejected]
    return hashlib.sha256(f"{prefix}|{ids}".encode()).hexdigest()


class FeatureCache:
    """Pooled features of pairs under one frozen backbone and precision, kept in `path` (a torch file
    of tensors only, read with weights_only=True) when a path is given."""

    def __init__(self, model: ScalarModel, precision: str, path: Path | None = None):
        self.path = path
        self.prefix = f"{backbone_fingerprint(model)}|{precision}"
        self.precision = precision
        self.entries: dict[str, torch.Tensor] = {}
        if path is not None and path.is_file():
            try:
                self.entries = torch.load(path, weights_only=True)
            except Exception as e:  # a truncated or foreign file: say which, do not guess
                raise ConfigError(
                    f"feature_cache={path} cannot be read ({type(e).__name__}: {e}); delete it to rebuild"
                ) from None

    def features(
        self, model: ScalarModel, pad_id: int, examples: list[PairExample], batch_size: int
    ) -> list[FeaturePair]:
        """Every example's features, computing (and saving) only the ones not cached yet."""
        keys = [pair_key(self.prefix, e) for e in examples]
        missing = [i for i, k in enumerate(keys) if k not in self.entries]
        if missing:
            self.compute(model, pad_id, [examples[i] for i in missing], [keys[i] for i in missing], batch_size)
        return [
            FeaturePair(self.entries[k][0], self.entries[k][1], *e.response_lengths())
            for k, e in zip(keys, examples, strict=True)
        ]

    @torch.no_grad()
    def compute(
        self, model: ScalarModel, pad_id: int, examples: list[PairExample], keys: list[str], batch_size: int
    ) -> None:
        device = model_device(model)
        order = sorted(range(len(examples)), key=lambda i: -examples[i].packed_width())
        with evaluation_mode(model), autocast(device, self.precision):
            for start in tqdm(range(0, len(order), batch_size), desc="backbone features (once)", unit="batch"):
                rows = order[start : start + batch_size]
                picked = [examples[i] for i in rows]
                batch = pack_pairs(
                    [e.query.ids for e in picked], [e.chosen for e in picked], [e.rejected for e in picked], pad_id
                )
                chosen, rejected = model.pair_features({k: v.to(device) for k, v in batch.items()})
                for i, c, r in zip(rows, chosen.float().cpu(), rejected.float().cpu(), strict=True):
                    self.entries[keys[i]] = torch.stack([c, r])
        self.save()

    def save(self) -> None:
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        partial = self.path.with_name(self.path.name + ".partial")
        torch.save(self.entries, partial)
        os.replace(partial, self.path)  # a run killed mid-write leaves the previous cache intact


def collate_features(examples: list[FeaturePair]) -> dict[str, torch.Tensor]:
    return {
        "chosen_features": torch.stack([e.chosen for e in examples]),
        "rejected_features": torch.stack([e.rejected for e in examples]),
        "chosen_lengths": torch.tensor([e.chosen_length for e in examples]),
        "rejected_lengths": torch.tensor([e.rejected_length for e in examples]),
        "loss_units": torch.ones(len(examples), dtype=torch.long),
    }
