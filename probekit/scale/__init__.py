"""Scale-out beyond one process: `probekit.scale.ray` runs a study's prompts on a Ray cluster."""
