"""The transformers engine: a Hugging Face model behind the `Engine` protocol.

- `model`: loading (`load_model`: default, hub id, directory, GGUF) and `LoadedModel`, the engine
  (encode, scorer, decode, hookable, describe; TransformerLens and nnsight views)
- `protocol`: `HFModel`, what the parts below read of a loaded model (so they import no `model`)
- `scorer`: `Scorer`, the exact scorer's facade (score, score_batch, generate, stats)
- `batching`: length-sorted batches that share prefixes; half the batch on CUDA out-of-memory
- `prefix_cache`: KV caches of recent shared prompt prefixes, computed once at batch size 1
- `prompt_pass`: the prompts' forward, left-padded after a cached shared prefix
- `trie_pass`: the answer trie read from the prompt cache, one forward per depth, pruned, with
  nothing read back from the device inside a batch's levels
- `decoding`: greedy or sampled continuations with the study's stop rule
- `head`: the LM head on the positions read, in its tier's arithmetic; float64-accurate
  vocabulary sums
- `hook_libraries`: the packages of the hook libraries (TransformerLens, nnsight); one line where
  one is missing
- `forward`: the transformer body's forward, the device-synchronised clock and the event
  stopwatch
- `cache`: the KV-cache operations (truncate, select rows, repeat rows, copy)
- `attention`: boolean masks as additive masks; grouped-query SDPA on the CPU
- `precision`: the float32 answer head under reduced-precision weights; the noise figure
- `arithmetic`: what each precision tier computes in (TF32, 16-bit heads), putting a model in one
- `tiers`: the tier a run scores in, chosen by its measured error; float16's fallback
- `differentiable`: the same answer distribution in one pass with autograd (attribution)
- `reference`: slow references (brute force, shared-prefix peer, loglik, transformers generate)
- `synthetic`: random-weight models for speed measurements
"""
