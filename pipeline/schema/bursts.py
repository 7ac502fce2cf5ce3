"""One burst definition, for the analytics and for the simulator's natural-surge labeller.

A *burst* is a rise of arrivals to at least :data:`BURST_RATIO` x the usual: the baseline
period's rate where the analytics judge an incident, the look-back's median minute where the
labeller (``simulator/natural.py``) marks the spikes a replayed trace brings by itself. The
two read the same constant, so a rise the analytics are allowed to call a traffic surge is
one the scorer can recognise as natural (before this the labeller wanted x1.5 and the
analytics counted from x1.3: a natural x1.4 named ``traffic_surge`` scored as false).
"""

from __future__ import annotations

#: Arrivals at least this multiple of the usual are a burst. x1.3: a replayed production
#: trace drifts x1.2-1.3 by itself (random fleet 27011), a burst of new conversations rises
#: x1.4 and more (28009's clean control).
BURST_RATIO = 1.3
