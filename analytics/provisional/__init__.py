"""Provisional live incidents: a queue on the engines' gauges is posted before its slow
requests end, then confirmed by (and updated to) the span-based incident, or withdrawn.

Live only (issue 30 item 6: a latency incident posted within 2 windows of its first
anomalous window): :func:`.live.queues` reads `engine_samples` in each live run
(:func:`analytics.runner.run` with ``notify``), :mod:`.lifecycle` keeps their state beside
the webhook deliveries, and :mod:`analytics.webhook` posts them. The `incidents` table and
batch analysis are unchanged.

The package imports nothing at its top: :mod:`analytics.config` holds its settings
(:mod:`.config`).
"""
