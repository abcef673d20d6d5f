"""Running a study: the resumable run loop (`loop`, one for one process and Ray: `scoring`,
`ray`), the run folder's parts, shards, numerics and the time a run takes (`pace`); reporting
finished runs again (`report`); and a study under the mechanism commands (`patch`, `capture`,
`steer`: `probekit.run.patch`, `.capture`, `.steer`, their shared options in `.mechanism`)."""
