"""Decoding in batch-size buckets on a KV cache laid out once, each bucket's decoding step captured as a
CUDA graph and replayed for every later token.

Why: an eager decoding step launches every kernel of every layer from Python, one at a time. At the
sizes RLHF samples at (135M-1B parameters, a few dozen rows) the GPU finishes each kernel before
Python launches the next, so a step cost about 45 ms on an H100 whatever the batch. A CUDA graph
launches the whole step at once. A graph replays fixed addresses, so everything a step reads lives in
buffers allocated once (`BucketDecoder`): the token, the position, the visibility mask and the KV
cache, shared by every bucket (a bucket's rows are the first rows of each buffer).

Rows that have emitted EOS are not decoded: when the rows still running fit a smaller bucket (powers of
two), they are gathered to the front of the buffers and the smaller bucket's graph runs. Sampling stays
outside the graphs, on the full batch's logits and each row's own RNG, so the random streams, and so
resumption, are the eager path's.

Graphs are captured on a bucket's first step (after one eager step on a side stream, which is that
step's real work) and checked on its second: the replay's logits must equal an eager step's on the
same inputs, or the call starts again with eager steps (the rows' RNGs fresh, so it samples what an
eager call would), as do the model's later calls, with the reason logged once.
Buffers and graphs are kept for the model's later calls (`decoders`), rebuilt when a call needs more
rows or positions, a different autocast, or the weights moved.
"""

from __future__ import annotations

import contextlib
import logging
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from transformers.cache_utils import Cache, StaticLayer

from ..attention_masks import mask_as_attention_takes_it, mask_obstacle
from .eager import cache_keyword

log = logging.getLogger(__name__)

POSITION_MULTIPLE = 64  # cache lengths are rounded up so that calls with other query widths reuse the graphs

decoders: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> BucketDecoder
graphs_refused: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> why its capture failed
fallbacks_logged: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> the reason last logged


class GraphMismatch(RuntimeError):
    """A graph's first replay disagreed with an eager step: what it wrote to the cache cannot be trusted,
    so the call starts again with eager steps (`generation.generate`)."""


def bucket_for(rows: int) -> int:
    """The smallest power of two that holds `rows` rows."""
    return 1 << max(0, rows - 1).bit_length()


def decoding_buffers(rows: int, length: int) -> tuple[int, int]:
    """The rows and positions of the buffers that decode `rows` rows of `length` positions."""
    return bucket_for(rows), -(-length // POSITION_MULTIPLE) * POSITION_MULTIPLE


def bucket_obstacle(model: torch.nn.Module, plain_cache: bool) -> str | None:
    """Why the model cannot decode from the shared buffers, or None."""
    if not plain_cache:
        return "its KV cache is not one plain layer per attention layer (sliding-window, hybrid or quantised)"
    return mask_obstacle(model)


def graph_obstacle(model: torch.nn.Module, device: torch.device) -> str | None:
    """Why the model's decoding step cannot be captured as a CUDA graph, or None."""
    from torch.distributed.fsdp import FSDPModule

    from ..devices import is_deepspeed_engine

    if device.type != "cuda":
        return f"CUDA graphs need a CUDA device; the model is on {device.type}"
    if any(isinstance(m, FSDPModule) for m in model.modules()) or is_deepspeed_engine(model):
        return "the model is sharded (FSDP or ZeRO-3): a graph would replay the addresses of one gathering"
    return graphs_refused.get(model)


def fall_back(model: torch.nn.Module, reason: str) -> None:
    """Log, once per model and reason, why it decodes with eager steps."""
    if fallbacks_logged.get(model) != reason:
        fallbacks_logged[model] = reason
        log.warning("rlhfkit: decoding with eager steps: %s", reason)


class SharedSlotLayer(StaticLayer):
    """One attention layer's cache as views of buffers shared by every bucket, written at `filled`, a
    (1,) device tensor shared by the buckets too: the write position lives on the device, where a
    replayed graph reads it, not in a Python int a graph would freeze."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, filled: torch.Tensor):
        super().__init__(max_cache_len=keys.size(2))
        self.keys, self.values, self.filled = keys, values, filled
        self.dtype, self.device = keys.dtype, keys.device
        self.is_initialized = True

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
    ) -> tuple[torch.Tensor, torch.Tensor]:
        # one token per step; autocast gives fp32 keys (rotary) and bf16 values, the buffers take one dtype
        self.keys.index_copy_(2, self.filled, key_states.to(self.keys.dtype))
        self.values.index_copy_(2, self.filled, value_states.to(self.values.dtype))
        self.filled.add_(1)
        return self.keys, self.values


def capture_graph(step: Callable[[], torch.Tensor]) -> Callable[[], torch.Tensor]:
    """`step` recorded as a CUDA graph; the returned function replays it and returns its output buffer.
    Autocast's weight cache is off while recording: a cached cast made outside the graph would be read
    at its old address after the weights changed, where a recorded cast reads the weights themselves."""
    graph = torch.cuda.CUDAGraph()
    with autocast_without_weight_cache("cuda"), torch.cuda.graph(graph):
        output = step()

    def replay() -> torch.Tensor:
        graph.replay()
        return output

    return replay


@contextlib.contextmanager
def on_side_stream(device: torch.device):
    """A CUDA side stream for the eager step before a capture (the warm-up PyTorch asks for); nothing
    elsewhere."""
    if device.type != "cuda":
        yield
        return
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        yield
    torch.cuda.current_stream(device).wait_stream(side)


@contextlib.contextmanager
def autocast_without_weight_cache(device_type: str):
    if not torch.is_autocast_enabled(device_type):
        yield
        return
    with torch.autocast(device_type, dtype=torch.get_autocast_dtype(device_type), cache_enabled=False):
        yield


def logits_agree(replayed: torch.Tensor, eager: torch.Tensor) -> bool:
    """The same greedy token in every row and values within a few units of the dtype's precision."""
    scale = float(eager.float().abs().max()) + 1.0
    close = float((replayed.float() - eager.float()).abs().max()) <= 8 * torch.finfo(eager.dtype).eps * scale
    return close and torch.equal(replayed.argmax(-1), eager.argmax(-1))


def context_key(model: torch.nn.Module, device: torch.device) -> tuple:
    """What a captured graph depends on besides its buffers: autocast, inference mode and where every
    weight lives (an optimizer step writes in place; moving or reloading the model does not)."""
    autocast = torch.get_autocast_dtype(device.type) if torch.is_autocast_enabled(device.type) else None
    return autocast, torch.is_inference_mode_enabled(), tuple(p.data_ptr() for p in model.parameters())


@dataclass
class BucketDecoder:
    """Buffers for `rows` x `length` cache positions, one graph (or eager step) per bucket."""

    model: weakref.ReferenceType
    key: tuple
    keys: list[torch.Tensor]  # per layer (rows, kv heads, length, head dim)
    values: list[torch.Tensor]
    filled: list[torch.Tensor]  # per layer (1,): the next position to write
    capture: bool
    ids: torch.Tensor = field(init=False)
    positions: torch.Tensor = field(init=False)
    visible: torch.Tensor = field(init=False)  # (rows, length) bool: the positions each row attends to
    steps: dict[int, Callable[[], torch.Tensor]] = field(default_factory=dict)
    checked: set[int] = field(default_factory=set)

    def __post_init__(self):
        rows, length = self.keys[0].size(0), self.keys[0].size(2)
        device = self.keys[0].device
        self.ids = torch.zeros(rows, 1, dtype=torch.long, device=device)
        self.positions = torch.zeros(rows, 1, dtype=torch.long, device=device)
        self.visible = torch.zeros(rows, length, dtype=torch.bool, device=device)

    @property
    def rows(self) -> int:
        return self.keys[0].size(0)

    @property
    def length(self) -> int:
        return self.keys[0].size(2)

    def fits(self, rows: int, length: int, key: tuple) -> bool:
        return rows <= self.rows and length <= self.length and key == self.key

    def step_function(self, bucket: int) -> Callable[[], torch.Tensor]:
        """One decoding step of the first `bucket` rows, reading only this decoder's buffers."""
        cache = Cache(
            layers=[
                SharedSlotLayer(k[:bucket], v[:bucket], f)
                for k, v, f in zip(self.keys, self.values, self.filled, strict=True)
            ]
        )
        ids, positions, visible, model = self.ids[:bucket], self.positions[:bucket], self.visible[:bucket], self.model
        keyword = cache_keyword(model())

        def step() -> torch.Tensor:
            policy = model()
            mask = prepared_mask(policy, visible)
            return policy(
                input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True, **{keyword: cache}
            ).logits[:, -1]

        return step

    def run(self, bucket: int) -> torch.Tensor:
        """The next-token logits of the first `bucket` rows, through the bucket's graph where it has one."""
        step = self.steps.get(bucket)
        if step is None:
            return self.first_step(bucket)
        if bucket in self.checked:
            return step()
        self.checked.add(bucket)
        return self.checked_replay(bucket, step)

    def first_step(self, bucket: int) -> torch.Tensor:
        eager = self.step_function(bucket)
        if not self.capture:
            self.steps[bucket] = eager
            return eager()
        with on_side_stream(self.ids.device):  # the step's real work, and the warm-up a capture needs
            logits = eager()
        try:
            self.steps[bucket] = capture_graph(eager)
        except Exception as error:  # noqa: BLE001 - any refusal to record means: decode eagerly
            self.refuse(f"capturing the {bucket}-row step failed: {type(error).__name__}: {error}")
            self.steps[bucket] = eager
        return logits

    def checked_replay(self, bucket: int, replay: Callable[[], torch.Tensor]) -> torch.Tensor:
        """The graph's first replay against an eager step on the same inputs (the cache position rewound
        between the two, so both write the same place): inputs that changed since the capture show
        whether the graph reads them or froze them."""
        rewound = [filled.clone() for filled in self.filled]
        replayed = replay().clone()
        for filled, position in zip(self.filled, rewound, strict=True):
            filled.copy_(position)
        eager = self.step_function(bucket)
        logits = eager()
        if not logits_agree(replayed, logits):
            self.refuse(f"the {bucket}-row graph's logits differ from an eager step's on the same inputs")
            self.steps = {size: self.step_function(size) for size in self.steps}
            raise GraphMismatch(bucket)
        return logits

    def refuse(self, reason: str) -> None:
        self.capture = False
        graphs_refused[self.model()] = reason
        fall_back(self.model(), reason)


def prepared_mask(model: torch.nn.Module, visible: torch.Tensor) -> torch.Tensor:
    """The (B, 1, 1, L) mask of the keys each row sees, as the attention takes it (`mask_as_attention_takes_it`)."""
    return mask_as_attention_takes_it(model, visible[:, None, None, :])


def decoder_for(
    model: torch.nn.Module, prefill: Cache, rows: int, length: int, dtype: torch.dtype, capture: bool
) -> BucketDecoder:
    """The model's decoder, kept from an earlier call when it fits, else built (and kept)."""
    device = prefill.layers[0].keys.device
    key = context_key(model, device)
    kept = decoders.get(model)
    if kept is not None and kept.fits(rows, length, key) and kept.keys[0].dtype == dtype and kept.capture == capture:
        return kept
    decoders.pop(model, None)  # its buffers and graphs go before the new ones are allocated
    rows, length = decoding_buffers(rows, length)
    rows = max(rows, kept.rows if kept is not None and kept.key == key else 0)
    keys, values = [], []
    for layer in prefill.layers:
        keys.append(torch.zeros(rows, layer.keys.size(1), length, layer.keys.size(3), dtype=dtype, device=device))
        values.append(torch.zeros(rows, layer.values.size(1), length, layer.values.size(3), dtype=dtype, device=device))
    filled = [torch.zeros(1, dtype=torch.long, device=device) for _ in prefill.layers]
    decoder = BucketDecoder(weakref.ref(model), key, keys, values, filled, capture)
    if capture:
        size = sum(t.numel() * t.element_size() for t in keys + values)
        log.info(
            "CUDA-graph decoding: a KV cache of %d rows x %d positions (%.2f GB) kept for later calls",
            rows,
            length,
            size / 1e9,
        )
    decoders[model] = decoder
    return decoder


class BucketSteps:
    """The decoding steps of one `generate` call on a `BucketDecoder`: row `slots[i]` of the batch sits in
    slot i of the buffers; finished rows leave when the rest fit a smaller bucket."""

    def __init__(
        self, decoder: BucketDecoder, prefill: Cache, query_mask: torch.Tensor, repeats: int, logits: torch.Tensor
    ):
        self.decoder, self.logits = decoder, logits
        batch, width = query_mask.shape
        self.width, self.bucket = width, bucket_for(batch)
        self.slots = torch.arange(batch, device=query_mask.device)
        for source, keys, values, filled in zip(
            prefill.layers, decoder.keys, decoder.values, decoder.filled, strict=True
        ):
            keys[:batch, :, :width] = source.keys.repeat_interleave(repeats, dim=0)
            values[:batch, :, :width] = source.values.repeat_interleave(repeats, dim=0)
            filled.fill_(width)
        decoder.visible.zero_()
        decoder.visible[:batch, :width] = query_mask.bool()
        decoder.visible[batch:, 0] = True  # spare slots attend somewhere: an empty softmax would give NaN
        decoder.positions[:batch, 0] = query_mask.sum(-1)

    @property
    def name(self) -> str:
        return "cuda-graphs" if self.decoder.capture else "buckets"

    def step(self, tokens: torch.Tensor, finished: torch.Tensor, step: int) -> torch.Tensor:
        """The batch's next-token logits after `tokens`; finished rows keep their last logits."""
        running = ~finished[self.slots]
        count = int(running.sum())
        if bucket_for(count) < self.bucket:
            self.gather(running.nonzero().squeeze(1))
            self.bucket = bucket_for(count)
        decoder, used = self.decoder, self.slots.numel()
        decoder.ids[:used, 0] = tokens[self.slots]
        decoder.visible[:, self.width + step] = True
        logits = decoder.run(self.bucket)
        decoder.positions.add_(1)
        self.logits[self.slots] = logits[:used]
        return self.logits

    def gather(self, keep: torch.Tensor) -> None:
        """Move the slots `keep` to the front of every buffer, in order."""
        decoder, count = self.decoder, keep.numel()
        for buffer in [*decoder.keys, *decoder.values, decoder.positions, decoder.visible]:
            buffer[:count] = buffer.index_select(0, keep)
        self.slots = self.slots[keep]
