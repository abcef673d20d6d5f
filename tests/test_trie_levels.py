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
from probekit.core.options import default_of
from probekit.engines.base import ScorerStats
from probekit.engines.hf.prompt_pass import PrefixCache, prompt_pass
from probekit.engines.hf.scorer import HFScorer
from probekit.engines.options import EpsilonOption

aten = torch.ops.aten
EPSILON = default_of(EpsilonOption, "epsilon")  # the pruning bound a scorer starts from
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
    on padding columns too and learned widths are fed, `TriePass.on_host`): the reads logged
    before each level's forward (from the previous level's forward on), then those after the
    last one, and the results' count."""
    model = scorer.model
    scorer.trie_pass.on_host = False
    state = prompt_pass(model, batch, PrefixCache(model), ScorerStats())
    log: list[str] = []

    def mark(rows, nodes, valid):
        log.append(LEVEL)
        return contextlib.nullcontext()

    reads = DeviceReads(log)
    with torch.inference_mode(), HostCopies(reads), reads:
        results, cut = scorer.trie_pass.run(state, epsilon, scorer.stats, context=mark)
    assert cut == []  # no row keeps more than the widths learned from these prompts
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
    first, _ = per_level(pruned, batch, EPSILON)
    levels = len(first) - 1
    assert 1 <= levels <= depth
    assert [len(s) for s in first[:-1]] == [1] * levels  # one width read before each level
    assert all(s == ["__int__"] for s in first[:-1])
    second, _ = per_level(pruned, batch[::-1], EPSILON)
    assert len(second) > 1 and all(s == [] for s in second[:-1]), second
    assert second[-1] == end  # the same reads at the batch's end


def test_on_the_cpu_the_head_skips_the_padding_columns(tiny):
    """On the CPU (where the device is the host) the LM head reads only the fed columns and each
    depth feeds the width its batch keeps; the results are those of the head over every column
    and the learned widths, from no more columns."""
    answers = AnswerSet.range(0, 100)
    texts = [f"Case {i}: how intense, from 0 to 100? Answer with a number." for i in range(6)]
    prompts = [tiny.tokenizer.encode(t) for t in texts]
    skipping = HFScorer(tiny, answers, batch_size=3)
    assert skipping.trie_pass.on_host
    every = HFScorer(tiny, answers, batch_size=3)
    every.trie_pass.on_host = False
    for a, b in zip(skipping.score(prompts), every.score(prompts), strict=True):
        assert np.abs(a.probs - b.probs).max() <= 1e-7 and a.greedy == b.greedy  # float32 sums
        assert a.error_bound == pytest.approx(b.error_bound, rel=1e-6, abs=1e-15)  # other widths
    slots = [x.stats.trie_positions + x.stats.padding for x in (skipping, every)]
    assert slots[0] <= slots[1] and every.stats.padding > 0  # no cut rows run again here


def cut_rows(scorer: HFScorer) -> list[int]:
    """The rows the scorer's trie pass reports cut from here on (a list it keeps extending)."""
    cut: list[int] = []
    run = scorer.trie_pass.run

    def counting(*args, **kwargs):
        results, rows = run(*args, **kwargs)
        cut.extend(rows)
        return results, rows

    scorer.trie_pass.run = counting
    return cut


def test_learned_widths_leave_each_row_as_it_is_alone(tiny):
    """Batches of 2 prompts: every batch after the first feeds the widths the previous one
    kept; a row that keeps more is cut and runs again with its own widths, so that every result
    is the one its prompt gets alone (batch 1, widths read), within its bound of the exact one."""
    answers = AnswerSet.range(0, 100)
    texts = [f"Case {i}: how intense, from 0 to 100? Answer with a number." for i in range(8)]
    texts += ["Q: How intense was it, from 0 to 100?\nA:", "Rate it:", "Score the anger:"]
    prompts = [tiny.tokenizer.encode(t) for t in texts]
    exact = list(HFScorer(tiny, answers, epsilon=0.0).score(prompts))
    for epsilon in (1e-3, 1e-2):
        alone = [HFScorer(tiny, answers, epsilon, 1).score_batch([p])[0] for p in prompts]
        scorer = HFScorer(tiny, answers, epsilon=epsilon, batch_size=2)
        scorer.trie_pass.on_host = False  # learned widths, as on an accelerator
        cut = cut_rows(scorer)
        pruned = list(scorer.score(prompts))
        assert cut, "no row kept more than the previous batch's widths"
        widths = scorer.trie_pass.widths[epsilon]
        levels = [len(scorer.trie.level(d)) for d in range(len(widths))]
        assert widths[0] == 0 and any(0 < w < size for w, size in zip(widths, levels, strict=True))
        for e, p, a in zip(exact, pruned, alone, strict=True):
            assert np.abs(p.probs - a.probs).max() <= 1e-6
            assert p.error_bound == pytest.approx(a.error_bound, rel=1e-4, abs=1e-12)
            true_error = np.abs(e.probs * e.valid_mass - p.probs * p.valid_mass).sum()
            assert true_error / e.valid_mass <= p.error_bound + 1e-5
            assert p.error_bound <= epsilon
        assert scorer.stats.trie_positions < len(prompts) * (len(scorer.trie.nodes) - 1)
