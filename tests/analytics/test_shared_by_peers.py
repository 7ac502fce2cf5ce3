"""``shared_by_peers`` (analytics.attribution.rules_throttle): how far a host's slowdown is
one its peers share, with peers that decoded nothing in the incident."""

from __future__ import annotations

from types import SimpleNamespace

from fleetlens.analytics.attribution.rules_throttle import shared_by_peers


def _facts(**tpot: tuple[float, float]) -> SimpleNamespace:
    """Facts with each host's decode time per token (baseline, incident)."""
    hosts = {h: {"tpot": pair} for h, pair in tpot.items()}
    return SimpleNamespace(signals=SimpleNamespace(hosts=hosts))


def test_peers_that_decoded_nothing_say_nothing() -> None:
    # random fleets 41010 and 41013: every peer's incident TPOT read 0 (ZeroDivisionError)
    assert shared_by_peers(_facts(h01=(0.02, 0.06), h02=(0.02, 0.0), h03=(0.02, 0.0)),
                           "h01") == 0.0


def test_a_slowdown_every_host_shares_is_shared_and_one_host_alone_is_not() -> None:
    assert shared_by_peers(_facts(h01=(0.02, 0.04), h02=(0.02, 0.04), h03=(0.02, 0.04)),
                           "h01") == 1.0
    assert shared_by_peers(_facts(h01=(0.02, 0.06), h02=(0.02, 0.02), h03=(0.02, 0.02)),
                           "h01") == 0.0
    # a peer that decoded nothing is left out, the one that slowed as much still counts
    assert shared_by_peers(_facts(h01=(0.02, 0.04), h02=(0.02, 0.04), h03=(0.02, 0.0)),
                           "h01") == 1.0
