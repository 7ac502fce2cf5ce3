"""Post-incident trace analysis (issue 35): find the requests worth opening and hand their
traces to other tools.

- :mod:`~analytics.traces.query`: what a search asks for (:class:`TraceQuery`) and the
  parsers of its command-line forms.
- :mod:`~analytics.traces.search`: the search over ``requests``, sorted and paged.
- :mod:`~analytics.traces.attr_sql`: span attribute filters as SQL over ``spans``.
- :mod:`~analytics.traces.sql`: quoted names, bound parameters, a view's columns.
- :mod:`~analytics.traces.lookup`: one trace's spans by trace or request id.
- :mod:`~analytics.traces.otlp_export`: spans as OTLP/JSON (Jaeger, Tempo, any collector).
- :mod:`~analytics.traces.heatmap`: a search's requests per (arrival, latency) cell.
- :mod:`~analytics.traces.compare`: what is different about a selection of them (the
  dimension comparison of attribution); :mod:`~analytics.traces.drill`: the search that
  opens a difference's requests, as a ``fleetlens traces`` command.
- :mod:`~analytics.traces.side_by_side`: two requests, or one and the median around it.
- :mod:`~analytics.traces.detail`: one trace in full (attributes, events, links, times to
  the ms), its requests' energy and their instance's signals (:mod:`.signals`) while they ran.
- :mod:`~analytics.traces.cli`: ``fleetlens traces`` and ``fleetlens traces export``;
  ``traces show`` in :mod:`.detail_cli`, ``traces compare`` and ``traces diff`` in
  :mod:`~analytics.traces.compare_cli` and :mod:`~analytics.traces.side_by_side_cli`
  (filter flags: :mod:`.cli_options`).

Everything here reads; nothing is stored. The dashboard's Traces page and trace explorer
(``dashboard/trace_search.py``, ``dashboard/trace_heatmap.py``, ``dashboard/views/``)
render what these return.
"""
