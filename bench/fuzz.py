"""Coverage-guided fuzzing (atheris / libFuzzer) of the OTLP decoders and the HTTP path.

Targets (``tests/collector/fuzz_targets.py``): ``{spans,metrics,logs}_{pb,json}`` decode an
Export in process; ``http`` sends raw bytes to a real OTLP/HTTP server (h11, WAL) on
127.0.0.1. ``all`` picks the target by the input's first byte, so one process covers every
target. Each is seeded from ``tests/collector/fuzz_corpus/<target>/``; an input that breaks
the invariant (crash, hang past 10 s, counts that do not add up) is written there as
``crash-*``/``timeout-*`` and then replayed by ``make test`` for good.

    .venv/bin/python bench/fuzz.py --seconds 600 [--target all|spans_pb|...|http]
    .venv/bin/python bench/fuzz.py --write-seeds   # regenerate the seed inputs

Needs ``atheris`` (``pip install atheris==3.0.0``; wheels for CPython 3.11 on x86-64 Linux).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

NAMES = ("spans_pb", "spans_json", "metrics_pb", "metrics_json", "logs_pb", "logs_json",
         "http")


def fuzz(target: str, seconds: float, runs: int, work: Path) -> None:
    """Run libFuzzer on ``target`` in this process (never returns: libFuzzer exits)."""
    import atheris

    with atheris.instrument_imports(include=["fleetlens", "h11", "tests"]):
        from tests.collector import fuzz_targets as ft

    decoders = ft.Decoders()
    chosen = ft.targets(decoders)
    http = ft.HttpPath() if target in ("http", "all") else None
    if http is not None:
        chosen["http"] = http.send
    names = [n for n in NAMES if n in chosen]

    def one(data: bytes) -> None:
        if target != "all":
            chosen[target](data)
        elif data:
            chosen[names[data[0] % len(names)]](data[1:])

    folders = [ft.CORPUS / n for n in (names if target == "all" else [target])]
    crash_dir = folders[0] if target != "all" else ft.CORPUS / "all"
    crash_dir.mkdir(exist_ok=True)
    args = [sys.argv[0], str(work), *(str(f) for f in folders), "-timeout=10",
            f"-artifact_prefix={crash_dir}/", "-print_final_stats=1", "-max_len=65536"]
    if target == "all":  # the folders' inputs lack the selector byte: prefix them here
        args = [sys.argv[0], str(work), "-timeout=10", f"-artifact_prefix={crash_dir}/",
                "-print_final_stats=1", "-max_len=65536"]
        for i, name in enumerate(names):
            for file_name, data in ft.corpus(name):
                (work / f"{name}-{file_name}").write_bytes(bytes([i]) + data)
    args.append(f"-max_total_time={max(1, int(seconds))}" if seconds else f"-runs={runs}")
    atheris.Setup(args, one)
    atheris.Fuzz()


def write_seeds() -> None:
    """Write the seed inputs of every target (valid requests of each kind, and edge cases)."""
    from tests.collector.fuzz_seeds import seeds
    from tests.collector.fuzz_targets import CORPUS

    for name, inputs in seeds().items():
        folder = CORPUS / name
        folder.mkdir(parents=True, exist_ok=True)
        for file_name, data in inputs.items():
            (folder / f"seed-{file_name}").write_bytes(data)
        print(f"{name}: {len(inputs)} seeds in {folder.relative_to(REPO)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="all", choices=("all", *NAMES))
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--runs", type=int, default=0, help="inputs to run instead of seconds")
    parser.add_argument("--write-seeds", action="store_true")
    parser.add_argument("--in-process", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.write_seeds:
        write_seeds()
        return
    if args.in_process:
        with tempfile.TemporaryDirectory(prefix="fleetlens-fuzz-work-") as work:
            fuzz(args.target, 0 if args.runs else args.seconds, args.runs, Path(work))
        return
    # libFuzzer ends its process with exit(): run it in a child and report the outcome.
    command = [sys.executable, __file__, "--in-process", "--target", args.target,
               "--seconds", str(args.seconds), "--runs", str(args.runs)]
    done = subprocess.run(command, cwd=REPO, check=False)
    print(f"fuzz {args.target}: {'no finding' if done.returncode == 0 else 'FINDING'} "
          f"(exit {done.returncode}); findings are kept in tests/collector/fuzz_corpus/")
    sys.exit(done.returncode)


if __name__ == "__main__":
    main()
