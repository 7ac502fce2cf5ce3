"""Failures and changes, found from liveness, progress, absence and errors (issue 30).

Latency detection asks "is this slower than usual?"; these detectors ask "did something
stop, fail or change?", which needs no baseline and so works from a fleet's first minutes:

* :mod:`.engines`: engines down (failed scrapes), hung (no progress while requests run) and
  restarted (a new process start time), from `engine_samples`;
* :mod:`.hosts`: hosts whose agent went silent, split into lost hosts and telemetry gaps by
  whether their request spans still arrive;
* :mod:`.errors`: windows of failing requests not explained by the above;
* :mod:`.gpus`: GPU faults (Xid, ECC, row remap, a lost GPU) from `gpu_health`;
* :mod:`.throttles`: a GPU throttling by heat, a ``warning`` even when no latency moved;
  :mod:`.absorb` folds it into a latency incident that already ranks its throttle.

Each finding is one incident with its cause (:mod:`.findings`). A latency incident that
follows a failure on the same host or service (an engine died and its peers took its load,
a restarted engine's cold cache) names the failure first (:func:`.detect.link_cascades`), so
`explain`, the dashboard and the webhook tell one story.

The package imports nothing at its top: :mod:`analytics.config` holds its settings
(:mod:`.config`). The passes are in :mod:`.detect`.
"""
