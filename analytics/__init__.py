"""Baselines, incident detection, root-cause attribution, KV-cache, energy and leaderboard."""
