"""The transformers engine: a Hugging Face model behind the `Engine` protocol.

- `model`: loading (`load_model`: default, hub id, directory, GGUF) and `LoadedModel`, the engine
  (encode, scorer, decode, hookable, describe; TransformerLens and nnsight views); the parts
  below take it as the `HookableModel` of `probekit.engines.base`, so they import no `model`
- `scorer`: `HFScorer`, the exact scorer's facade (score, score_batch, generate, stats), and its
  batches: length-sorted batches that share prefixes; half the batch on CUDA out-of-memory
- `prompt_pass`: the prompts' forward, left-padded after a cached shared prefix (the KV caches
  of recent shared prompt prefixes, computed once at batch size 1); the decoding of greedy or
  sampled continuations with the study's stop rule
- `trie_pass`: the answer trie read from the prompt cache, one forward per depth, pruned, with
  nothing read back from the device inside a batch's levels
- `head`: the LM head on the positions read, in its tier's arithmetic; float64-accurate
  vocabulary sums
- `forward`: the transformer body's forward, the device-synchronised clock and the event
  stopwatch
- `cache`: the KV-cache operations (truncate, select rows, repeat rows, copy)
- `attention`: boolean masks as additive masks; grouped-query SDPA on the CPU
- `precision`: the precision tiers (what each computes in, putting a model in one), the tier a
  run scores in (chosen by its measured error, or kept from the run it resumes; float16's
  fallback), the float32 head under 16-bit weights, and the noise figure
- `differentiable`: the same answer distribution in one pass with autograd (attribution), and
  the final norm and LM head on any layer's residual stream (the logit lens)
- `gguf`, `bridge`: the GGUF files and their converted copies; the TransformerLens bridge,
  installed only while it is used
"""
