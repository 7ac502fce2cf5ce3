"""``fleetlens agent``: the host agent (NVML sampler or dcgm-exporter + vLLM /metrics scraper
-> OTLP)."""

from __future__ import annotations

import dataclasses
import logging
import signal
import sys
from collections.abc import Mapping

import click

from fleetlens.collector.agent.config import AgentConfig, VllmTarget
from fleetlens.collector.agent.gpu import GpuBackend, NoGpu, open_nvml
from fleetlens.collector.agent.runner import Agent
from fleetlens.pipeline.schema.logsetup import configure_logging
from fleetlens.pipeline.schema.settings import ConfigError, load_section

SECTION = "agent"


def parse_vllm_option(value: str) -> VllmTarget:
    """``URL`` or ``INSTANCE_ID=URL`` (the instance id must match the vLLM's spans)."""
    instance, sep, url = value.partition("=")
    if sep and not instance.startswith(("http://", "https://")):
        return VllmTarget(url=url, instance_id=instance)
    return VllmTarget(url=value)


def open_backend(config: AgentConfig, echo=click.echo) -> GpuBackend | None:
    """Fake GPUs when asked, else NVML; without NVML say so in one line and return ``None``.
    ``None`` too with ``dcgm``: dcgm-exporter is then the GPU source, NVML is not opened."""
    if config.dcgm:
        return None
    if config.fake_gpus:
        from fleetlens.collector.agent.fake_gpu import FakeGpuBackend

        return FakeGpuBackend(config.fake_gpus, host_seed=config.resolved_host_name())
    try:
        return open_nvml()
    except NoGpu as exc:
        echo(f"no NVIDIA GPU/driver: {exc}; GPU sampling off (NVML is tried again every "
             "minute)", err=True)
        return None


@click.command("agent")
@click.option("--config", "config_file", type=click.Path(dir_okay=False),
              help="fleetlens.toml (default: $FLEETLENS_CONFIG, else ./fleetlens.toml).")
@click.option("--collector", help="Collector OTLP/gRPC HOST:PORT [agent.collector].")
@click.option("--fake-gpus", type=click.IntRange(0, 64),
              help="Simulate N GPUs instead of NVML (demos) [agent.fake_gpus].")
@click.option("--vllm", "vllm", multiple=True, metavar="[INSTANCE_ID=]URL",
              help="A local vLLM to scrape (repeatable); replaces [[agent.vllm]].")
@click.option("--dcgm", metavar="URL",
              help="Read GPUs from NVIDIA dcgm-exporter at URL instead of NVML [agent.dcgm].")
@click.option("--host-name", help="Resource host.name [agent.host_name].")
@click.option("--gpu-interval", type=float, help="Seconds between GPU samples (default 0.1).")
@click.option("--scrape-interval", type=float, help="Seconds between scrapes (default 1).")
@click.option("-v", "--verbose", is_flag=True, help="Log mapping changes and exports.")
def agent(config_file: str | None, collector: str | None, fake_gpus: int | None,
          vllm: tuple[str, ...], dcgm: str | None, host_name: str | None,
          gpu_interval: float | None,
          scrape_interval: float | None, verbose: bool) -> None:
    """Sample GPUs (NVML) and local vLLM /metrics; export them as OTLP metrics.

    Without a GPU or driver it says so once and keeps scraping vLLM.
    """
    configure_logging(logging.INFO if verbose else logging.WARNING)
    given = dict(collector=collector, fake_gpus=fake_gpus, host_name=host_name, dcgm=dcgm,
                 gpu_interval_s=gpu_interval, scrape_interval_s=scrape_interval)
    overrides: dict[str, object] = {k: v for k, v in given.items() if v is not None}
    if vllm:
        overrides["vllm"] = [
            {k: v for k, v in dataclasses.asdict(parse_vllm_option(item)).items() if v}
            for item in vllm
        ]
    try:
        config = load_agent_config(config_file, overrides)
    except ConfigError as exc:
        raise click.UsageError(str(exc)) from None
    backend = open_backend(config)
    # Without NVML now, keep trying: the driver may load after the agent (boot, upgrade).
    runner = Agent(config, backend, reopen_gpus=None if config.fake_gpus else open_nvml)
    gpus = (f"GPUs from dcgm-exporter {config.dcgm_metrics_url}" if config.dcgm else
            f"{backend.device_count() if backend is not None else 0} GPU(s)")
    click.echo(f"fleetlens agent: {gpus}, {len(config.vllm)} vLLM target(s) -> "
               f"{config.collector}", err=True)

    def on_signal(signum: int, frame: object) -> None:
        runner.stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    # Exit 1 when collections were discarded at shutdown, so the loss is not silent.
    sys.exit(1 if runner.run() else 0)


def load_agent_config(path: str | None, overrides: Mapping[str, object] | None = None,
                      environ: Mapping[str, str] | None = None) -> AgentConfig:
    """The ``[agent]`` table of the config file, then ``FLEETLENS_AGENT__*``, then ``overrides``.

    Raises:
        ConfigError: naming the bad field (``agent.<field>``).
    """
    return load_section(AgentConfig, SECTION, path, environ=environ, overrides=overrides)
