"""Benchmark: exact activation patching, beside TransformerLens and nnsight, and against
attribution patching.

`--against peers` (the default). On the README's persona pair ("You are a Muslim." / "You are a
Jew.", the identity span), the default model, the expected value of the answers 0-10 and one
thread, one run times the same sweep (every layer x one site, at the identity span) four ways,
interleaved site by site so that the machine's load falls on all of them alike:

  probekit         `probekit.mechanism.patching.sweep`: clean and corrupt runs, the run's
                   numeric noise, then the patched runs, `--batch-size` per forward, each read
                   by the exact scorer (prompt pass, then the answer trie from its KV cache);
  transformer_lens TransformerLens's own `patching.generic_activation_patch` on the model's
                   TransformerBridge, with its `layer_pos_patch_setter` (heads:
                   `layer_pos_head_vector_patch_setter`); its input is every surface form of
                   every answer as its own continuation of the prompt (22 rows: `0`..`10` and
                   ` 0`..` 10`), the one input from whose logits the exact expected value can be
                   read (as `probekit.testing.reference.brute_force` defines it);
  nnsight          a plain nnsight loop: one `trace` of the same rows per component, writing the
                   clean value into the module's input or output;
  nnsight_cached   the strongest peer (`probekit.testing.reference.shared_prefix`'s way): per
                   component, one nnsight `trace` of the patched prompt alone, then every
                   continuation batched against its KV cache.

It prints each method's seconds, probekit's time over each peer's (target: <= 0.5 against
TransformerLens and nnsight on every site), the largest difference of the patched expected
values, and where probekit's time went (`Scorer.stats`: the prompt passes, the answer rows of
the trie passes, the readout (the LM head and vocabulary sums at every answer position), the
rest); `--json` writes them for docs/performance.md (`benchmarks/report.py`).

Then, on the peers' layers, what a patched run costs by the positions it patches: probekit's
sweep with the `identity` span (prompt positions only), with `from_identity` without the answer
positions (`through_answer=False`) and through them, against the same rows scored unpatched (the
floor: a prompt pass and a trie pass, no hook): CPU seconds per scored row and the ratio.

`--against attribution`. On N intergroup pairs, the full exact sweep over layers x heads and
over layers x {resid_pre, attn_out, mlp_out} against attribution patching of every component
plus exact patching of the top k: the speed-up and how well the estimate ranked the components
(Spearman rho of |mean effect|, recall of the exact top 10).

This is a benchmark, not a test: it exits 0 whatever the numbers are and says PASS/FAIL against
the targets. Timings on a shared machine are distorted by other processes; the load average is
printed (and recorded) at start and end and before each timed call.

    python benchmarks/patching.py --json benchmarks/results/patching.json   # every layer
    python benchmarks/patching.py --layers 0,10,20 --sites resid_pre         # a quick run
    python benchmarks/patching.py --against attribution --layers 0,10,20,29 --spans from_experiencer
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from common import load_line, shared_options, timed, write_results

from probekit.core.answers import AnswerSet
from probekit.core.kinds import comma_list, int_list
from probekit.engines.base import ScorerStats
from probekit.engines.hf.head import vocabulary_size
from probekit.engines.hf.model import LoadedModel, load_model
from probekit.engines.hf.scorer import HFScorer
from probekit.engines.trie import AnswerTrie, answer_variants, extension_masks
from probekit.mechanism import attribution
from probekit.mechanism.components import grid
from probekit.mechanism.pairs import aligned_positions, difference_sets, draw_sets, make_pair
from probekit.mechanism.patching import sweep
from probekit.mechanism.pipeline import measure
from probekit.mechanism.readouts import parse_readout
from probekit.mechanism.sites import HEAD_SITE, n_heads, site
from probekit.run import runner
from probekit.studies.base import Context, get_study

# ---------------------------------------------------------------------- peers
EVENT = {"role": "user", "content": "My bike was stolen. How angry am I, from 0 to 10?"}
CLEAN = [{"role": "system", "content": "You are a Muslim."}, EVENT]
CORRUPT = [{"role": "system", "content": "You are a Jew."}, EVENT]
ANSWERS = "0-10"
PEER_SITES = ["hook_resid_pre", "hook_attn_out", "hook_mlp_out", HEAD_SITE]
METHODS = ["probekit", "transformer_lens", "nnsight", "nnsight_cached"]
TARGET = 0.5  # probekit's time over each peer's, at most
TARGET_PEERS = ["transformer_lens", "nnsight"]


class Continuations:
    """Every surface form of every answer as its own continuation of a prompt, and the exact
    expected value read from their logits: P(answer) sums, over its surface forms, the product of
    the tokens' probabilities and the probability of stopping after them (a token that does not
    extend the answer), normalised over the answers (`probekit.testing.reference.brute_force`)."""

    def __init__(self, model: LoadedModel, answers: AnswerSet) -> None:
        tok = model.tokenizer
        rules = AnswerTrie.build(answers, tok).rules
        self.forms = [
            (a, list(v)) for a in range(len(answers)) for v in answer_variants(answers, a, tok)
        ]
        self.width = max(len(tokens) for _, tokens in self.forms)
        self.pad = tok.pad_token_id
        stops = ~extension_masks(tok, vocabulary_size(model))  # [rules, vocab]
        self.stop = torch.stack([stops[rules[a]] for a, _ in self.forms])  # [forms, vocab]
        self.tokens = torch.full((len(self.forms), self.width), self.pad, dtype=torch.long)
        for row, (_, tokens) in enumerate(self.forms):
            self.tokens[row, : len(tokens)] = torch.tensor(tokens)
        self.lengths = torch.tensor([len(tokens) for _, tokens in self.forms])
        self.answer = torch.tensor([a for a, _ in self.forms])
        self.values = torch.tensor(answers.values, dtype=torch.float64)
        for name in ("stop", "tokens", "lengths", "answer", "values"):  # beside the logits
            setattr(self, name, getattr(self, name).to(model.device))

    def rows(self, prompt: Sequence[int]) -> torch.Tensor:
        """[forms, len(prompt) + width] token ids: the prompt, then each form, right-padded."""
        head = torch.tensor(list(prompt), device=self.tokens.device).expand(len(self.forms), -1)
        return torch.cat([head, self.tokens], dim=1)

    def expected(self, logits: torch.Tensor) -> float:
        """The expected value from [forms, width + 1, vocab] logits: position j predicts the
        form's token j (the last one, after the form, its stop)."""
        logp = logits.double().log_softmax(-1)
        vocab = logp.shape[-1]
        at = torch.arange(self.width, device=logp.device)
        steps = logp[:, :-1].gather(-1, self.tokens[:, :, None].clamp(max=vocab - 1))[..., 0]
        steps = torch.where(at[None] < self.lengths[:, None], steps, 0.0).sum(-1)
        after = logp[torch.arange(len(self.forms), device=logp.device), self.lengths]
        stop = after.masked_fill(~self.stop[:, :vocab], -torch.inf).logsumexp(-1)
        probs = torch.zeros(len(self.values), dtype=torch.float64, device=logp.device)
        probs.index_add_(0, self.answer, (steps + stop).exp())
        return float(probs @ self.values / probs.sum())

    def from_rows(self, logits: torch.Tensor, n: int) -> float:
        """The expected value from the logits of `rows(prompt)` (`n` prompt tokens)."""
        return self.expected(logits[:, n - 1 : n + self.width])


def site_value(lm: Any, name: str, layer: int) -> Any:
    """The value of `site` at `layer` inside an nnsight trace of the Hugging Face Llama modules:
    [batch, positions, d_model] (`attn.hook_z`: the output projection's input, heads
    concatenated)."""
    block = lm.model.layers[layer]
    return {
        "hook_resid_pre": lambda: block.input,
        "hook_attn_out": lambda: block.self_attn.output[0],
        "hook_mlp_out": lambda: block.mlp.output,
        HEAD_SITE: lambda: block.self_attn.o_proj.input,
    }[name]()


@dataclass
class Sweep:
    """One method's sweep: the clean and corrupt readouts, each component's patched one, and
    the forward passes it ran (a peer's forwards all have one shape)."""

    clean: float
    corrupt: float
    patched: np.ndarray
    forwards: int = 0

    def scale(self, components: int) -> float:
        """A peer's time for `components` over its time for its own: its forwards all have one
        shape (a clean and a corrupt run, then one per component), so time scales with them."""
        return (components + 2) / (len(self.patched) + 2)


@dataclass
class Peer:
    """What every method is given: the model, the pair (probekit's, and its token ids), the
    positions patched, the rows, and probekit's exact scorer and readout."""

    model: LoadedModel
    pair: Any
    positions: list[int]
    forms: Continuations
    scorer: HFScorer
    readout: Any

    @classmethod
    def of(cls, model: LoadedModel) -> Peer:
        """The README's persona pair on `model` (any model on the default tokenizer), the
        expected value of `ANSWERS`."""
        answers = AnswerSet.parse(ANSWERS)
        pair = make_pair(model, CLEAN, CORRUPT, span="Muslim")
        clean_pos, corrupt_pos = aligned_positions(pair, "identity")
        if clean_pos != corrupt_pos or len(pair[0].input_ids) != len(pair[1].input_ids):
            raise SystemExit("the peers patch one position list in both prompts: equal shapes only")
        forms = Continuations(model, answers)
        scorer = HFScorer(model, answers, epsilon=0.0)
        return cls(model, pair, corrupt_pos, forms, scorer, parse_readout("expected", answers))

    @property
    def clean_ids(self) -> list[int]:
        return self.pair[0].input_ids

    @property
    def corrupt_ids(self) -> list[int]:
        return self.pair[1].input_ids

    def components(self, name: str, layers: Sequence[int]) -> list[tuple[int, int | None]]:
        heads = range(n_heads(self.model)) if name == HEAD_SITE else [None]
        return [(layer, head) for layer in layers for head in heads]


def run_transformer_lens(peer: Peer, name: str, layers: Sequence[int]) -> Sweep:
    """TransformerLens's `generic_activation_patch` over every component of the sweep, after
    one `run_with_cache` of the clean rows; `baseline=True` adds the unpatched corrupt run."""
    from transformer_lens import patching as tl

    tl.tqdm = lambda rows, **kw: rows  # its progress bar, one per call, is noise here
    short = site(name).short
    n = len(peer.clean_ids)
    clean_rows, corrupt_rows = peer.forms.rows(peer.clean_ids), peer.forms.rows(peer.corrupt_ids)
    names = [site(name).hook(layer) for layer in layers]
    pos = peer.positions
    rows = [(layer, pos, head) for layer, head in peer.components(name, layers)]
    if name == HEAD_SITE:
        index = pd.DataFrame(rows, columns=["layer", "pos", "head_index"])
        setter = tl.layer_pos_head_vector_patch_setter
    else:
        index = pd.DataFrame([r[:2] for r in rows], columns=["layer", "pos"])
        setter = tl.layer_pos_patch_setter
    with torch.no_grad(), peer.model.bridged() as bridge:
        logits, cache = bridge.run_with_cache(clean_rows, names_filter=names)
        result = tl.generic_activation_patch(
            bridge,
            corrupt_rows,
            cache,
            lambda out: torch.tensor(peer.forms.from_rows(out, n)),
            setter,
            short,
            index_df=index,
            baseline=True,
        )
    clean = peer.forms.from_rows(logits, n)
    patched = result.values.double().cpu().numpy()
    return Sweep(clean, float(result.baseline), patched, len(rows) + 2)


def run_nnsight(peer: Peer, name: str, layers: Sequence[int], cached: bool = False) -> Sweep:
    """A plain nnsight loop: one trace of the clean rows reads every value patched, one of the
    corrupt rows gives its readout, then one trace per component writes the clean value into
    the corrupt rows. `cached`: each trace runs the prompt alone, and its continuations are
    batched against the trace's KV cache (one more forward, of the continuations only)."""
    import nnsight

    lm, hf, forms, pos = peer.model.nnsight, peer.model.hf, peer.forms, peer.positions
    n, count = len(peer.clean_ids), len(forms.forms)
    width = n_heads(peer.model)

    device = peer.model.device

    def inputs(prompt: list[int]) -> dict[str, torch.Tensor]:
        ids = torch.tensor([prompt], device=device) if cached else forms.rows(prompt)
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}

    def expected(out: Any) -> float:
        if not cached:
            return forms.from_rows(out.logits, n)
        cache = out.past_key_values
        cache.batch_repeat_interleave(count)
        more = hf(
            input_ids=forms.tokens,
            attention_mask=torch.ones((count, n + forms.width), dtype=torch.long, device=device),
            position_ids=torch.arange(n, n + forms.width, device=device).expand(count, -1),
            past_key_values=cache,
        ).logits
        root = out.logits[:, -1:].expand(count, -1, -1)
        return forms.expected(torch.cat([root, more], dim=1))

    with torch.no_grad(), peer.model.bridged(False):
        with lm.trace(inputs(peer.clean_ids), use_cache=cached):
            values = [site_value(lm, name, layer)[:1, pos].clone() for layer in layers]
            values = nnsight.save(values)
            clean = lm.output.save()

        def patched(layer: int | None = None, head: int | None = None) -> float:
            with lm.trace(inputs(peer.corrupt_ids), use_cache=cached):
                if layer is not None:
                    value = site_value(lm, name, layer)
                    new = values[layers.index(layer)]
                    if head is None:
                        value[:, pos] = new
                    else:
                        d = value.shape[-1] // width
                        cut = slice(head * d, (head + 1) * d)
                        value[:, pos, cut] = new[..., cut]
                out = lm.output.save()
            return expected(out)

        done = [patched(layer, head) for layer, head in peer.components(name, layers)]
        readouts = expected(clean), patched()
    forwards = (len(done) + 2) * (2 if cached else 1)
    return Sweep(*readouts, np.array(done), forwards)


def run_probekit(
    peer: Peer, name: str, layers: Sequence[int], size: int | None, hooks: str = "transformer_lens"
) -> Sweep:
    """`probekit.mechanism.patching.sweep` of `name` over `layers` at the identity span."""
    heads = range(n_heads(peer.model)) if name == HEAD_SITE else ()
    patches = grid(layers, [name], ["identity"], heads)
    readout = peer.readout
    df = sweep(
        peer.scorer, [peer.pair], patches, readout, hooks=hooks, batch_size=size, progress=False
    )
    m = readout.column
    return Sweep(
        float(df[f"{m}_clean"][0]), float(df[f"{m}_corrupt"][0]), df[f"{m}_patched"].to_numpy()
    )


SPAN_RUNS = {
    "unpatched": "the same rows scored unpatched on the bridge (the floor: prompt and trie pass)",
    "identity": "`identity`: the span's prompt positions only",
    "from_identity, prompt only": "`from_identity`, `through_answer=False`: the span to the "
    "prompt's end, no answer position",
    "from_identity": "`from_identity` through the answer: the span to the prompt's end and every "
    "answer position",
}


def span_costs(
    scorer: HFScorer, pair: Any, readout: Any, name: str, layers: Sequence[int], size: int | None
) -> dict[str, Callable[[], int]]:
    """probekit's sweep of `name` over `layers` with a prompt-only span, a span to the prompt's
    end without and with the answer positions, and the same rows scored unpatched (clean and
    corrupt, then each patched run and the two prompts scored again for the noise, in the
    sweep's batches): each a function that runs it and returns the rows it scored."""
    heads = range(n_heads(scorer.model)) if name == HEAD_SITE else ()
    batch = size or scorer.batch_size
    runs = len(grid(layers, [name], ["identity"], heads))

    def swept(span: str, through: bool | None = None) -> Callable[[], int]:
        patches = grid(layers, [name], [span], heads)
        return lambda: (
            len(
                sweep(
                    scorer,
                    [pair],
                    patches,
                    readout,
                    batch_size=size,
                    through_answer=through,
                    progress=False,
                )
            )
            + 4
        )

    def unpatched() -> int:
        clean, corrupt = pair[0].input_ids, pair[1].input_ids
        rows = [corrupt] * runs + [clean, corrupt]
        with scorer.model.bridged():
            scorer.score_batch([clean, corrupt], reuse_prefix=False)
            for start in range(0, len(rows), batch):
                scorer.score_batch(rows[start : start + batch], reuse_prefix=False)
        return len(rows) + 2

    return {
        "unpatched": unpatched,
        "identity": swept("identity"),
        "from_identity, prompt only": swept("from_identity", False),
        "from_identity": swept("from_identity", True),
    }


def split(stats: ScorerStats, before: ScorerStats, seconds: float) -> dict[str, float]:
    """Where probekit's `seconds` went, from the scorer's counters over the call."""
    prompt = stats.prompt_seconds - before.prompt_seconds
    trie = stats.trie_seconds - before.trie_seconds
    head = stats.head_seconds - before.head_seconds
    return {
        "prompt_pass_s": prompt,
        "answer_rows_s": trie - head,
        "readout_s": head,
        "other_s": seconds - prompt - trie,
        "prompt_tokens": stats.prompt_tokens - before.prompt_tokens,
        "answer_positions": stats.trie_positions - before.trie_positions,
    }


def compare_peers(
    peer: Peer,
    names: Sequence[str],
    layers: Sequence[int],
    sampled: Sequence[int],
    repeats: int = 1,
    size: int | None = None,
    methods: Sequence[str] = METHODS,
    hooks: str = "transformer_lens",
) -> dict[str, dict[str, Any]]:
    """Per site of `names`, each of `methods` timed on the same sweep, interleaved site by site
    (best of `repeats`): probekit on `layers` through `hooks`, the peers on `sampled` with their
    time scaled to `layers`. The seconds are the process's CPU time on a CPU (other processes'
    load adds little to it) and wall time on a GPU (whose work the CPU time does not count).
    Per site: `seconds`, `wall`, `load` and `sweeps` by method, and `split`, where probekit's
    time went."""
    model, scorer = peer.model, peer.scorer
    runs: dict[str, Callable[[str], Sweep]] = {
        "probekit": lambda s: run_probekit(peer, s, layers, size, hooks),
        "transformer_lens": lambda s: run_transformer_lens(peer, s, sampled),
        "nnsight": lambda s: run_nnsight(peer, s, sampled),
        "nnsight_cached": lambda s: run_nnsight(peer, s, sampled, cached=True),
    }
    run_probekit(peer, names[0], layers[:1], None, hooks)  # warm-up: one-off costs
    results: dict[str, dict[str, Any]] = {}
    for repeat in range(repeats):
        for name in names:
            entry = results.setdefault(name, {"seconds": {}, "wall": {}, "load": {}, "sweeps": {}})
            full = len(peer.components(name, layers))
            for method in methods:
                load = os.getloadavg()[0]
                before = ScorerStats(**vars(scorer.stats))
                got, wall, cpu = timed(model.device, lambda m=method, s=name: runs[m](s))
                seconds = wall if model.device.type == "cuda" else cpu
                if method != "probekit":  # on --peer-layers: scaled to every layer
                    seconds, wall = seconds * got.scale(full), wall * got.scale(full)
                print(
                    f"  [{repeat + 1}] {name:<15} {method:<17} {seconds:7.1f} s, {wall:7.1f} s"
                    f" wall, load {load:.1f}"
                )
                if seconds < entry["seconds"].get(method, np.inf):
                    entry["seconds"][method], entry["wall"][method] = seconds, wall
                    entry["sweeps"][method], entry["load"][method] = got, load
                    if method == "probekit":
                        entry["split"] = split(scorer.stats, before, wall)
    return results


def peers(options: argparse.Namespace) -> None:
    torch.set_num_threads(options.threads)
    start = load_line("at start")
    model = load_model("default")
    peer = Peer.of(model)
    layers = options.layers or list(range(model.n_layers))
    sampled = options.peer_layers or layers
    if not set(sampled) <= set(layers):
        raise SystemExit("--peer-layers must be some of --layers")
    names = [site(s).name for s in options.sites]
    print(
        f"{len(layers)} layers x {', '.join(names)} at the identity span (position "
        f"{peer.positions}); {len(peer.forms.forms)} continuation rows for the peers, which run "
        f"layers {sampled}; {torch.get_num_threads()} thread(s)"
    )
    results = compare_peers(peer, names, layers, sampled, options.repeats, options.batch_size)
    spans = measure_spans(options, peer.scorer, peer.pair, peer.readout, names, sampled)
    end = load_line("at end")
    figures, details = report_peers(results, peer, layers, sampled)
    details["spans"] = spans
    details["pair"] = {"clean": CLEAN, "corrupt": CORRUPT, "span": "Muslim"}
    if options.json:
        write_results(
            "patching",
            figures,
            device=model.device,
            threads=options.threads,
            load_start=start,
            load_end=end,
            path=Path(options.json),
            details=details,
        )


def measure_spans(
    options: argparse.Namespace,
    scorer: HFScorer,
    pair: Any,
    readout: Any,
    names: list[str],
    layers: list[int],
) -> dict[str, Any]:
    """Per site, each `SPAN_RUNS` sweep on `layers`: CPU seconds per scored row (best of the
    repeats, interleaved) and where its time went; printed, and returned for the JSON."""
    out: dict[str, Any] = {"layers": layers, "runs": SPAN_RUNS, "sites": {}}
    print(f"\nprobekit per scored row, by span (layers {layers}):")
    for _ in range(options.repeats):
        for name in names:
            entry = out["sites"].setdefault(name, {})
            for label, run in span_costs(
                scorer, pair, readout, name, layers, options.batch_size
            ).items():
                before = ScorerStats(**vars(scorer.stats))
                rows, wall, seconds = timed(scorer.model.device, run)
                record = {"seconds": seconds, "rows": rows, "per_row_s": seconds / rows}
                record["split"] = split(scorer.stats, before, wall)
                if seconds / rows < entry.get(label, {}).get("per_row_s", np.inf):
                    entry[label] = record
    for name, entry in out["sites"].items():
        floor = entry["unpatched"]["per_row_s"]
        for label, record in entry.items():
            record["over_unpatched"] = record["per_row_s"] / floor
            s = record["split"]
            print(
                f"  {name:<15} {label:<27} {record['per_row_s']:.3f} s/row "
                f"({record['over_unpatched']:.2f}x unpatched; {record['rows']} rows: prompt "
                f"{s['prompt_pass_s']:.1f} s, answer rows {s['answer_rows_s']:.1f} s, readout "
                f"{s['readout_s']:.1f} s, rest {s['other_s']:.1f} s, {s['answer_positions']} "
                "answer positions)"
            )
    return out


def report_peers(
    results: dict[str, dict[str, Any]], peer: Peer, layers: list[int], sampled: list[int]
) -> tuple[list, dict]:
    """Print the comparison and return the figures and details for `write_results`."""
    figures: list[dict[str, Any]] = []
    details: dict[str, Any] = {"layers": layers, "peer_layers": sampled, "sites": {}}
    scaled = "" if sampled == layers else f" (peers: timed on layers {sampled}, scaled)"
    print(
        f"\nseconds (CPU time on a CPU, wall on a GPU), best of repeats, {len(layers)} "
        f"layers{scaled}; ratio = probekit's time / the peer's"
    )
    for name, entry in results.items():
        seconds, sweeps = entry["seconds"], entry["sweeps"]
        ours = sweeps["probekit"]
        every = peer.components(name, layers)
        kept = np.array([c in set(peer.components(name, sampled)) for c in every])
        record = {"components": len(every), "seconds": seconds, "wall_seconds": entry["wall"]}
        record["load"] = entry["load"]
        record["split"] = entry["split"]
        print(f"{name} ({len(every)} components):")
        for method in [m for m in METHODS[1:] if m in sweeps]:
            ratio = seconds["probekit"] / seconds[method]
            other = sweeps[method]
            diff = max(
                float(np.max(np.abs(ours.patched[kept] - other.patched))),
                abs(ours.clean - other.clean),
                abs(ours.corrupt - other.corrupt),
            )
            verdict = ("PASS" if ratio <= TARGET else "FAIL") if method in TARGET_PEERS else ""
            record[method] = {"ratio": ratio, "max_abs_diff": diff, "forwards": other.forwards}
            print(
                f"  vs {method:<17} {seconds['probekit']:7.1f} s / {seconds[method]:7.1f} s "
                f"= {ratio:5.2f}x  {verdict:<4}  largest |difference| {diff:.2g}"
            )
            figures.append(
                {
                    "figure": f"{name}: probekit time / {method} time",
                    "value": round(ratio, 3),
                    "unit": "ratio",
                    "verdict": f"{verdict} (<= {TARGET})" if verdict else "",
                }
            )
            figures.append(
                {
                    "figure": f"{name}: largest |probekit - {method}| expected value",
                    "value": float(f"{diff:.3g}"),
                    "unit": "on 0-10",
                }
            )
        s = entry["split"]
        print(
            f"  probekit's time: prompt passes {s['prompt_pass_s']:.1f} s, answer rows "
            f"{s['answer_rows_s']:.1f} s, readout {s['readout_s']:.1f} s, rest {s['other_s']:.1f} s"
            f" ({s['prompt_tokens']} prompt tokens, {s['answer_positions']} answer positions)"
        )
        details["sites"][name] = record
    details["verdict"] = verdict_line(details["sites"])
    print(details["verdict"])
    return figures, details


def verdict_line(sites: dict[str, dict[str, Any]]) -> str:
    """One line: whether probekit met the target against each target peer on every site, with
    the largest ratio, and its ratios against the cached nnsight loop (which has no target)."""
    parts = []
    for method in [m for m in METHODS[1:] if all(m in record for record in sites.values())]:
        ratios = {name: record[method]["ratio"] for name, record in sites.items()}
        worst = max(ratios, key=ratios.get)
        if method in TARGET_PEERS:
            failed = [name for name, r in ratios.items() if r > TARGET]
            met = f"FAIL on {', '.join(failed)}" if failed else "PASS on every site"
            parts.append(f"against {method} {met} (largest ratio {ratios[worst]:.2f}, {worst})")
        else:
            low = min(ratios.values())
            parts.append(
                f"against {method} (no target) ratios {low:.2f} to {ratios[worst]:.2f} ({worst})"
            )
    return f"target <= {TARGET}: " + "; ".join(parts)


# ---------------------------------------------------------------------- attribution
SITES = ["hook_resid_pre", "hook_attn_out", "hook_mlp_out"]
GRIDS = {"head": "layer x head x span", "site": "layer x site x span"}  # the head grid has a target
MIN_HEAD_SPEEDUP = 10.0
MIN_RECALL = 0.8


def select_pairs(study: Any, probe: Any, encoded: Sequence[Any], per_unit: int) -> list:
    """The study's pairs of `encoded`, `per_unit` of each unit drawn at random (seed 0), never
    by the size of their gap."""
    sets = draw_sets(difference_sets(study.pairs(probe, encoded)), per_unit, seed=0)
    return [pair for found in sets for pair in found.pairs]


def against_attribution(options: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    print(f"load average at start: {os.getloadavg()}; torch threads {torch.get_num_threads()}")
    study = get_study("intergroup")
    probe, items = _study_items(study, options.pairs, options.data)
    readout = parse_readout("expected", probe.answers)
    model = load_model("default")
    spans = options.spans or list(study.mechanism_defaults().spans)
    layers = options.layers or list(range(model.n_layers))
    encoded = [model.encode(item) for item in items]
    scorer = HFScorer(model, probe.answers, epsilon=0.0, batch_size=options.batch_size)
    pairs = select_pairs(study, probe, encoded, 2)[: options.pairs]
    print(f"{len(pairs)} pairs, layers {layers[0]}..{layers[-1]} ({len(layers)}), spans {spans}")
    heads = range(n_heads(model))
    unknown = sorted(set(options.grids) - set(GRIDS))
    if unknown:
        parser.error(f"unknown grid {unknown[0]}; choose from {', '.join(GRIDS)}")
    sites = {"head": ([HEAD_SITE], heads), "site": (SITES, ())}
    grids = {
        GRIDS[g]: grid(layers, sites[g][0], spans, sites[g][1]) for g in GRIDS if g in options.grids
    }
    size = options.batch_size
    for name, patches in grids.items():
        exact, t_exact, _ = timed(
            model.device,
            # prompt positions only: what attribution estimates and verify re-measures
            lambda p=patches: measure(
                scorer, pairs, p, readout, batch_size=size, through_answer=False
            ),
        )
        estimated, t_attr, _ = timed(
            model.device,
            lambda p=patches: measure(
                scorer, pairs, p, readout, method="attribution", batch_size=size
            ),
        )
        top = min(options.top_k, len(patches))
        verified, t_verify, _ = timed(
            model.device,
            lambda e=estimated, k=top: attribution.verify(
                scorer, pairs, e, k, readout, batch_size=size
            ),
        )
        per = attribution.effects(
            estimated.assign(
                expected_patched=exact["expected_patched"], ran=exact["ran"], method="exact"
            )
        )
        fit = attribution.agreement(per, k=10)
        speedup = t_exact / (t_attr + t_verify)
        print(f"\n{name}: {len(patches)} components x {len(pairs)} pairs")
        print(f"  full exact sweep             {t_exact:9.1f} s")
        print(f"  attribution (all components) {t_attr:9.1f} s")
        print(f"  exact verification of top {top:<3}{t_verify:9.1f} s")
        print(f"  speed-up                     {speedup:9.1f}x")
        print(f"  Spearman rho of |effect|     {fit['spearman']:+9.3f}")
        print(f"  top-10 recall                {fit['recall@10']:9.2f}")
        if name == GRIDS["head"]:
            verdict = speedup >= MIN_HEAD_SPEEDUP and fit["recall@10"] >= MIN_RECALL
            print(
                f"  target >= {MIN_HEAD_SPEEDUP:.0f}x and recall >= {MIN_RECALL}: "
                f"{'PASS' if verdict else 'FAIL'}"
            )
        del verified
    print(f"\nload average at end: {os.getloadavg()}")


def _study_items(study: Any, pairs: int, data: str | None) -> tuple[Any, list[Any]]:
    """The intergroup study's patch probe and items, enough events to give `pairs` pairs (its
    default religion: 25 named perceiver x experiencer prompts an event)."""
    keywords = {"limit": 25 * max(1, (pairs + 1) // 2), "data": data}
    options = runner("patch").build(keywords, "benchmarks/patching.py", study)
    quiet = Context("patch", options.own.seed, say=lambda *a, **k: None, limit=options.own.limit)
    return study.mechanism_items(options.study, quiet)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--against", choices=["peers", "attribution"], default="peers", help="(default peers)"
    )
    parser.add_argument("--layers", type=int_list, help="layers (default: every layer)")
    shared_options(parser, "batch_size")
    parser.add_argument(
        "--sites", type=comma_list, default=PEER_SITES, help="peers: sites (default all four)"
    )
    parser.add_argument(
        "--peer-layers",
        type=int_list,
        help="peers: the layers TransformerLens and nnsight run, their time scaled to --layers "
        "(default: --layers)",
    )
    parser.add_argument("--repeats", type=int, default=1, help="peers: best of N (default 1)")
    parser.add_argument("--threads", type=int, default=1, help="peers: torch threads (default 1)")
    parser.add_argument("--json", help="peers: also write the figures here")
    parser.add_argument("--pairs", type=int, default=8, help="attribution: pairs (2 per event)")
    parser.add_argument("--spans", type=comma_list, help="attribution: spans (default the study's)")
    parser.add_argument("--top-k", type=int, default=20, help="attribution: verified exactly")
    parser.add_argument("--data", help="attribution: crowd-enVent root (default $PROBEKIT_DATA)")
    parser.add_argument(
        "--grids", type=comma_list, default=list(GRIDS), help="attribution: head, site or both"
    )
    options = parser.parse_args(argv)
    if options.against == "peers":
        peers(options)
    else:
        against_attribution(options, parser)


if __name__ == "__main__":
    main(sys.argv[1:])
