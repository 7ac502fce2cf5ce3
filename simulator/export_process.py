"""The export process of :class:`simulator.telemetry.ProcessExporter`.

``python -m simulator.export_process ENDPOINT --insecure|--secure TIMEOUT_S`` reads pickled
export items on stdin (only ever from its parent) and prints its counts as JSON on stdout.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict

from fleetlens.simulator.telemetry import serve


def main(argv: list[str]) -> int:
    """Run the export loop; returns the exit status."""
    endpoint, mode, timeout_s = argv
    counts = serve(endpoint, mode == "--insecure", float(timeout_s), sys.stdin.buffer)
    sys.stdout.write(json.dumps(asdict(counts)))
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
