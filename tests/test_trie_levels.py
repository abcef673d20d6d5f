"""The trie pass reads nothing back from the device inside a batch's levels: the operations that
make a host wait for a GPU (a value read, a boolean mask, `nonzero`, a copy to the host) are
counted per trie level on the tiny model, where they are the same operations as on a GPU; and the
widths learned from earlier batches keep every pruned result within its bound."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from probekit.core.answers import AnswerSet
from probekit.engines.base import DEFAULT_EPSILON, ScorerStats
from probekit.engines.hf.prefix_cache import PrefixCache
from probekit.engines.hf.prompt_pass import prompt_pass
from probekit.engines.hf.scorer import HFScorer

aten = torch.ops.aten
LEVEL = "level"  # the log's marker: a trie level's forward begins


class DeviceReads(TorchDispatchMode):
    """Logs each operation that needs a device's value on the host: a scalar read, `nonzero`,
    `masked_select`, indexing with a boolean mask, a copy to the host."""

    VALUE = {aten._local_scalar_dense.default, aten.nonzero.default, aten.masked_select.default}
    INDEXING = {aten.index.Tensor, aten.index_put.default, aten.index_put_.default}

    def __init__(self, log: list[str]) -> None:
        super().__init__()
        self.log = log
        self.quiet = False  # inside a host read `HostCopies` logs already

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.quiet:
            pass
        elif func in self.VALUE:
            self.log.append(str(func))
        elif func in self.INDEXING and any(
            i is not None and i.dtype == torch.bool for i in args[1]
        ):
            self.log.append(f"{func} with a boolean mask")
        elif func is aten._to_copy.default and _to_host(args[0], kwargs):
            self.log.append("copy to the host")
        return func(*args, **kwargs)


def _to_host(tensor: torch.Tensor, kwargs: dict) -> bool:
    return kwargs.get("device") == torch.device("cpu") and tensor.device.type != "cpu"


class HostCopies(TorchFunctionMode):
    """Logs the tensor methods that hand a tensor's data to the host (on a CPU some dispatch no
    operation, the data being there already; on a GPU each waits for the device)."""

    METHODS = {
        torch.Tensor.cpu,
        torch.Tensor.tolist,
        torch.Tensor.numpy,
        torch.Tensor.item,
        torch.Tensor.__int__,
        torch.Tensor.__float__,
        torch.Tensor.__bool__,
        torch.Tensor.__index__,
    }

    def __init__(self, reads: DeviceReads) -> None:
        super().__init__()
        self.reads = reads

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func not in self.METHODS:
            return func(*args, **(kwargs or {}))
        self.reads.log.append(func.__name__)
        self.reads.quiet = True
        try:
            return func(*args, **(kwargs or {}))
        finally:
            self.reads.quiet = False


def per_level(scorer: HFScorer, batch: list, epsilon: float) -> tuple[list[list[str]], int]:
    """One trie pass of `batch` after its prompt pass, as on an accelerator (the LM head runs
    on padding columns too, `TriePass.skip_padding`): the reads logged before each level's
    forward (from the previous level's forward on), then those after the last one, and the
    results' count."""
    model = scorer.model
    scorer.trie_pass.skip_padding = False
    state = prompt_pass(model, batch, PrefixCache(model), ScorerStats())
    log: list[str] = []

    def mark(rows, nodes, valid):
        log.append(LEVEL)
        return contextlib.nullcontext()

    reads = DeviceReads(log)
    with torch.inference_mode(), HostCopies(reads), reads:
        results = scorer.trie_pass.run(state, epsilon, scorer.stats, context=mark)
    segments: list[list[str]] = [[]]
    for entry in log:
        if entry == LEVEL:
            segments.append([])
        else:
            segments[-1].append(entry)
    return segments, len(results)


@pytest.mark.parametrize("spec", ["0-10", "0-100"])
def test_no_read_from_the_device_inside_the_trie_levels(tiny, spec):
    """Exact (epsilon 0): every level's width is the trie level's size, so from the prompt pass
    to the last level's forward nothing is read; after it, the batch's results come back in a
    fixed number of reads, whatever the depth. Pruned (the default epsilon): the first batch
    reads one width per level (it learns them), a later batch none."""
    answers = AnswerSet.parse(spec)
    scorer = HFScorer(tiny, answers, epsilon=0.0)
    depth = scorer.trie.max_depth
    texts = ["Q: How intense was it, from 0 to 100?\nA:", "Score the anger:", "Rate it:"]
    batch = [tiny.tokenizer.encode(t) for t in texts]
    segments, count = per_level(scorer, batch, 0.0)
    assert count == len(batch) and len(segments) == depth + 1
    assert all(s == [] for s in segments[:-1]), segments
    end = segments[-1]
    assert end == ["cpu", "numpy"] * 2  # the results and the counts: two copies

    pruned = HFScorer(tiny, answers)
    first, _ = per_level(pruned, batch, DEFAULT_EPSILON)
    levels = len(first) - 1
    assert 1 <= levels <= depth
    assert [len(s) for s in first[:-1]] == [1] * levels  # one width read before each level
    assert all(s == ["__int__"] for s in first[:-1])
    second, _ = per_level(pruned, batch[::-1], DEFAULT_EPSILON)
    assert len(second) > 1 and all(s == [] for s in second[:-1]), second
    assert second[-1] == end  # the same reads at the batch's end


def test_on_the_cpu_the_head_skips_the_padding_columns(tiny):
    """On the CPU (where the device is the host) the LM head reads only the fed columns; the
    results are those of the head over every column."""
    answers = AnswerSet.range(0, 100)
    texts = [f"Case {i}: how intense, from 0 to 100? Answer with a number." for i in range(6)]
    prompts = [tiny.tokenizer.encode(t) for t in texts]
    skipping = HFScorer(tiny, answers, batch_size=3)
    assert skipping.trie_pass.skip_padding
    every = HFScorer(tiny, answers, batch_size=3)
    every.trie_pass.skip_padding = False
    for a, b in zip(skipping.score(prompts), every.score(prompts), strict=True):
        assert np.abs(a.probs - b.probs).max() <= 1e-9 and a.greedy == b.greedy
        assert a.error_bound == pytest.approx(b.error_bound, rel=1e-9, abs=1e-15)
    assert skipping.stats.padding == every.stats.padding > 0


def test_learned_widths_keep_the_pruning_bound(tiny):
    """Batches of 2 prompts: every batch after the first feeds the widths the previous one
    wanted; rows that wanted more keep their most likely candidates and count the rest as
    dropped, and each result's true error stays within its bound (and the bound within epsilon,
    by the exact redo)."""
    answers = AnswerSet.range(0, 100)
    texts = [f"Case {i}: how intense, from 0 to 100? Answer with a number." for i in range(8)]
    prompts = [tiny.tokenizer.encode(t) for t in texts]
    exact = list(HFScorer(tiny, answers, epsilon=0.0).score(prompts))
    for epsilon in (1e-3, 1e-2):
        scorer = HFScorer(tiny, answers, epsilon=epsilon, batch_size=2)
        pruned = list(scorer.score(prompts))
        widths = scorer.trie_pass.widths[epsilon]
        assert len(widths) == scorer.trie.max_depth + 1 and widths[0] == 0
        levels = [len(scorer.trie.level(d)) for d in range(len(widths))]
        assert all(0 <= w <= size for w, size in zip(widths, levels, strict=True))
        assert any(0 < w < size for w, size in zip(widths, levels, strict=True))
        for e, p in zip(exact, pruned, strict=True):
            true_error = np.abs(e.probs * e.valid_mass - p.probs * p.valid_mass).sum()
            assert true_error / e.valid_mass <= p.error_bound + 1e-5
            assert p.error_bound <= epsilon
        assert scorer.stats.trie_positions < len(prompts) * (len(scorer.trie.nodes) - 1)
