"""Running a study: the resumable run loop, the run folder, shards, numerics, Ray; and a study
under the mechanism commands (`patch`, `capture`, `steer`: `probekit.run.patch`, `.capture`,
`.steer`, their shared options in `.mechanism`)."""
