"""The mechanism: activation capture, patching, attribution, mediation and directions.

- `sites`: the one table of sites (TransformerLens hook names, short forms, the nnsight accessor)
  and of hook libraries; layers counted from the end.
- `interventions`: read and write activations at sites during a scored prompt pass or a plain
  forward, with TransformerLens hooks or nnsight.
- `pairs`: counterfactual pairs (from two strings with `make_pair`), their choice and the
  right-to-left alignment of their spans.
- `components`: a patch (layer, site, span[, head]), the grid of them, and the patching table.
- `patching`, `attribution`, `mediation`, `directions`: the four analyses.
- `capture`: activations at spans, in memory or as resumable safetensors shards.
- `steering`: α·v added while scoring, with its checks; `vectors`: steering vectors from a file
  or a contrast.
- `defaults`: what a study tells the mechanism (`MechanismDefaults`).
- `pipeline`: the whole patch and capture analyses that `probekit patch/capture` run.
- `api`: `patch`, `capture`, `make_pair` for scripts.

The study-aware commands (`patch_study`, `capture_study`, `steer_study`) are in `probekit.run`.
"""
