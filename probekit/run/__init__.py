"""Running a study: the resumable run loop, the run folder, shards, numerics, Ray."""
