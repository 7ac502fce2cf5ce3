"""Coverage-guided differential fuzzing of the C span kernel against the Python decoder.

Target ``spans_kernel`` (``tests/collector/fuzz_targets.py``): the input is handed to the
kernel's request walk as raw bytes (never a crash), then, when the real schema parses it,
decoded by ``decode_spans`` with the kernel and with Python alone; the outcomes (columns,
counts, messages, truncation, unknown-field flag, name budgets) or refusals must be equal.
Seeds: ``tests/collector/fuzz_corpus/spans_pb`` and ``spans_kernel`` (findings are written to
the latter, which ``tests/collector/test_span_kernel.py`` replays), plus vLLM requests.

atheris sees the Python side's coverage only (gcc has no libFuzzer instrumentation). The
corpus it grows is kept in ``bench/out/fuzz_span_kernel/``; ``--asan`` then replays that corpus
and 2,000 generated hostile requests (``tests/collector/test_span_kernel.py``) through a copy
of the kernel built with AddressSanitizer and UBSan, without libFuzzer (whose coverage the
ASan runtime would break): an out-of-bounds read or write in the C walk aborts the run even
where the outputs agree. ::

    .venv/bin/python bench/fuzz_span_kernel.py --seconds 300   # coverage-guided
    .venv/bin/python bench/fuzz_span_kernel.py --asan          # its corpus, sanitized
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
SOURCES = ("collector/_spankernel.c", "collector/_spankernel_span.c",
           "collector/_spankernel_scope.c")
MODULE = "fleetlens.collector._spankernel"
#: The corpus libFuzzer grows (kept between runs; bench/out/ is not committed).
GROWN = REPO / "bench" / "out" / "fuzz_span_kernel"


def build_sanitized(out_dir: Path) -> Path:
    """The kernel built with ASan + UBSan into ``out_dir`` (needs the ASan runtime preloaded)."""
    target = out_dir / f"_spankernel{sysconfig.get_config_var('EXT_SUFFIX')}"
    subprocess.run(["gcc", "-shared", "-fPIC", "-O1", "-g", "-fno-omit-frame-pointer",
                    "-fsanitize=address,undefined", "-fno-sanitize-recover=undefined",
                    f"-I{sysconfig.get_paths()['include']}", *(str(REPO / s) for s in SOURCES),
                    "-o", str(target)], check=True)
    return target


def replay_sanitized(sanitized: str) -> None:
    """The grown corpus and generated hostile requests through the sanitized kernel."""
    import random

    spec = importlib.util.spec_from_file_location(MODULE, sanitized)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules[MODULE] = module  # under the kernel's own name, before anyone imports it
    from fleetlens.collector import span_kernel
    from tests.collector import fuzz_targets as ft
    from tests.collector.test_span_kernel import _request

    assert span_kernel.KERNEL is module, "the sanitized kernel did not load"
    target = ft.targets(ft.Decoders())["spans_kernel"]
    inputs = [p.read_bytes() for p in sorted(GROWN.glob("*"))] if GROWN.is_dir() else []
    rng = random.Random(34)
    inputs += [_request(rng) for _ in range(2000)]
    for data in inputs:
        target(data)
    print(f"{len(inputs)} inputs through the sanitized kernel: no finding")


def fuzz(seconds: float, runs: int, work: Path) -> None:
    """Run libFuzzer on the differential target in this process (libFuzzer exits)."""
    import atheris

    with atheris.instrument_imports(include=["fleetlens", "tests"]):
        from tests.collector import fuzz_targets as ft
    from fleetlens.collector import span_kernel
    from fleetlens.collector.testing import vllm_trace_request

    if span_kernel.KERNEL is None:
        sys.exit("the span kernel is not built (pip install -e .) or FLEETLENS_SPAN_KERNEL=0")
    target = ft.targets(ft.Decoders())["spans_kernel"]
    findings = ft.CORPUS / "spans_kernel"
    findings.mkdir(exist_ok=True)
    for name in ("spans_pb", "spans_kernel"):
        for file_name, data in ft.corpus(name):
            (work / f"{name}-{file_name}").write_bytes(data)
    for seed in range(4):
        request = vllm_trace_request(3, seed=seed, start_ns=ft.SEED_NS)
        (work / f"vllm-{seed}").write_bytes(request.SerializeToString())
    GROWN.mkdir(parents=True, exist_ok=True)
    args = [sys.argv[0], str(GROWN), str(work), "-timeout=10", f"-artifact_prefix={findings}/",
            "-print_final_stats=1", "-max_len=65536",
            f"-max_total_time={max(1, int(seconds))}" if seconds else f"-runs={runs}"]
    atheris.Setup(args, target)
    atheris.Fuzz()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--runs", type=int, default=0, help="inputs to run instead of seconds")
    parser.add_argument("--asan", action="store_true", help="fuzz a sanitized kernel build")
    parser.add_argument("--in-process", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--sanitized", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.sanitized:
        replay_sanitized(args.sanitized)
        return
    if args.in_process:
        with tempfile.TemporaryDirectory(prefix="fleetlens-fuzz-kernel-") as work:
            fuzz(0 if args.runs else args.seconds, args.runs, Path(work))
        return
    env = dict(os.environ)
    with tempfile.TemporaryDirectory(prefix="fleetlens-kernel-asan-") as build:
        command = [sys.executable, __file__, "--in-process", "--seconds", str(args.seconds),
                   "--runs", str(args.runs)]
        if args.asan:
            command = [sys.executable, __file__, "--sanitized",
                       str(build_sanitized(Path(build)))]
            runtime = subprocess.run(["gcc", "-print-file-name=libasan.so"], text=True,
                                     capture_output=True, check=True).stdout.strip()
            env.update(LD_PRELOAD=runtime, ASAN_OPTIONS="detect_leaks=0:abort_on_error=1")
        # libFuzzer ends its process with exit(), ASan aborts: a child, and its outcome.
        done = subprocess.run(command, cwd=REPO, env=env, check=False)
    print(f"fuzz spans_kernel{' (ASan)' if args.asan else ''}: "
          f"{'no finding' if done.returncode == 0 else 'FINDING'} (exit {done.returncode}); "
          "findings are kept in tests/collector/fuzz_corpus/spans_kernel/")
    sys.exit(done.returncode)


if __name__ == "__main__":
    main()
