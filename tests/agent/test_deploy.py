"""deploy/ stays true to the code: every fleetlens command in the compose file and the
Kubernetes manifests parses with the real CLI, the configs load, and vLLM and the agent agree
on the instance identity and the collector address."""

from __future__ import annotations

import tomllib
from pathlib import Path

import click
import pytest
import yaml

from fleetlens.cli import cli
from fleetlens.collector.agent.cli import load_agent_config, parse_vllm_option
from fleetlens.config import load_config
from fleetlens.pipeline.schema import attributes as a
from tests.conftest import REPO

DEPLOY = REPO / "deploy"
VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
IMAGE, AGENT_IMAGE = f"fleetlens:{VERSION}", f"fleetlens-agent:{VERSION}"
OURS = (IMAGE, AGENT_IMAGE)


def parse_command(args: list[str]) -> click.Context:
    """Parse ``fleetlens ARGS`` with the real click command (no execution)."""
    name, *rest = args
    command = cli.get_command(click.Context(cli), name)
    assert command is not None, f"unknown fleetlens subcommand {name!r}"
    return command.make_context(name, list(rest))


def resource_attributes(value: str) -> dict[str, str]:
    return dict(item.split("=", 1) for item in value.split(","))


def option(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load((DEPLOY / "compose.yaml").read_text())


@pytest.fixture(scope="module")
def k8s() -> dict[tuple[str, str], dict]:
    docs = {}
    for path in sorted((DEPLOY / "k8s").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            docs[(doc["kind"], doc["metadata"]["name"])] = doc
    return docs


def test_compose_commands_parse_and_config_loads(compose: dict) -> None:
    services = compose["services"]
    assert {"collector", "pipeline", "dashboard", "agent", "vllm"} <= set(services)
    ours = {n: s for n, s in services.items() if s.get("image") in OURS}
    assert set(ours) == {"collector", "pipeline", "compact", "dashboard", "agent"}
    for name, service in ours.items():
        ctx = parse_command(service["command"])
        assert ctx.info_name == service["command"][0] == name
    assert "--follow" in services["pipeline"]["command"]
    assert "--every" in services["compact"]["command"]  # retention runs
    assert services["agent"]["user"] == "root" and "SYS_PTRACE" in services["agent"]["cap_add"]
    config = load_config(DEPLOY / "fleetlens.toml", environ={
        "FLEETLENS_COLLECTOR__AUTH_TOKENS": '["t"]', "FLEETLENS_AGENT__AUTH_TOKEN": "t"})
    assert config.collector.auth_tokens == ("t",) and config.agent.auth_token == "t"
    assert config.dashboard.auth == "password"
    assert config.pipeline.window_s == config.analytics.window_s  # detection is tuned on it
    # published ports bind loopback only
    for service in services.values():
        assert all(str(p).startswith("127.0.0.1:") for p in service.get("ports", []))


def test_compose_vllm_and_agent_agree(compose: dict) -> None:
    services = compose["services"]
    vllm, agent = services["vllm"], services["agent"]
    attrs = resource_attributes(vllm["environment"]["OTEL_RESOURCE_ATTRIBUTES"])
    config = load_agent_config(str(DEPLOY / "fleetlens.toml"), environ={})
    (target,) = config.vllm
    assert attrs[a.SERVICE_INSTANCE_ID] == target.instance_id
    assert attrs[a.HOST_NAME] == option(agent["command"], "--host-name")
    assert any(key in attrs for key in a.RESOURCE_MODEL_KEYS)
    assert vllm["environment"]["OTEL_SERVICE_NAME"]
    endpoint = option(vllm["command"], "--otlp-traces-endpoint")
    assert endpoint == option(agent["command"], "--collector")
    assert endpoint.endswith(":4317") and "127.0.0.1:4317:4317" in services["collector"]["ports"]
    assert target.url.endswith(":" + option(vllm["command"], "--port"))
    assert agent["pid"] == "host" and agent["network_mode"] == "host"
    assert agent["environment"]["NVIDIA_DRIVER_CAPABILITIES"] == "utility"


def test_k8s_manifests(k8s: dict, tmp_path: Path) -> None:
    assert {("Deployment", "fleetlens-collector"), ("Service", "fleetlens-collector"),
            ("Deployment", "fleetlens-pipeline"), ("Deployment", "fleetlens-dashboard"),
            ("DaemonSet", "fleetlens-agent"), ("Deployment", "vllm-llama-8b")} <= set(k8s)
    ours = []
    for (kind, _), doc in k8s.items():
        if kind not in ("Deployment", "DaemonSet", "CronJob"):
            continue
        spec = doc["spec"]["jobTemplate"]["spec"] if kind == "CronJob" else doc["spec"]
        for container in spec["template"]["spec"]["containers"]:
            if container["image"] in OURS:
                parse_command(container["args"])
                ours.append(container["args"][0])
    # An image tag out of step would parse nothing; compact is the retention CronJob.
    assert sorted(ours) == ["agent", "collector", "compact", "dashboard", "pipeline"], ours
    config = k8s[("ConfigMap", "fleetlens-config")]["data"]["fleetlens.toml"]
    path = tmp_path / "fleetlens.toml"
    path.write_text(config)
    loaded = load_config(path, environ={})
    assert loaded.collector.grpc_address == "0.0.0.0:4317"
    assert loaded.pipeline.window_s == loaded.analytics.window_s  # detection is tuned on it


def test_k8s_agent_has_nvml_access_and_matches_vllm(k8s: dict) -> None:
    ds = k8s[("DaemonSet", "fleetlens-agent")]["spec"]["template"]["spec"]
    assert ds["hostPID"] is True and ds["hostNetwork"] is True
    (agent,) = ds["containers"]
    env = {e["name"]: e.get("value") for e in agent["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all" and env["NVIDIA_DRIVER_CAPABILITIES"]
    args = agent["args"]
    service = k8s[("Service", "fleetlens-collector")]
    collector = option(args, "--collector")
    assert collector == f"{service['metadata']['name']}.fleetlens.svc:4317"
    # the environment overrides the DaemonSet sets give a valid agent config
    static = {k: v for k, v in env.items() if k.startswith("FLEETLENS_AGENT__") and v}
    target = parse_vllm_option(option(args, "--vllm"))
    loaded = load_agent_config(None, {"collector": collector, "host_name": "node-1"},
                               environ=static)
    assert loaded.allow_plaintext and loaded.resource_attributes == {"region": "eu-west-1"}

    vllm = k8s[("Deployment", "vllm-llama-8b")]["spec"]["template"]["spec"]
    (server,) = vllm["containers"]
    venv = {e["name"]: e.get("value") for e in server["env"]}
    attrs = resource_attributes(venv["OTEL_RESOURCE_ATTRIBUTES"])
    assert attrs[a.SERVICE_INSTANCE_ID] == target.instance_id  # both "$(NODE_NAME)/vllm-0"
    assert attrs[a.HOST_NAME] == option(args, "--host-name")
    assert option(server["args"], "--otlp-traces-endpoint") == collector
    assert target.url == f"http://127.0.0.1:{option(server['args'], '--port')}"
    assert vllm["hostNetwork"] is True


def test_telemetry_doc_lists_every_emitted_and_scraped_name() -> None:
    from fleetlens.collector.agent.instruments import ENGINE_METRICS, GPU_METRICS

    doc = (REPO / "docs" / "telemetry.md").read_text()
    names = [*GPU_METRICS, *ENGINE_METRICS, a.ENGINE_INSTANCE_GPUS, a.HW_ID, a.HW_NAME,
             a.HW_TYPE, a.GPU_INDEX, a.ENGINE_INSTANCE, a.ENGINE_MODEL_NAME,
             *(n for names in a.VLLM_PROMETHEUS_NAMES.values() for n in names),
             *a.PROMOTED_SPAN_ATTRIBUTES, a.GEN_AI_N, a.GEN_AI_TEMPERATURE, a.GEN_AI_TOP_P]
    missing = [n for n in names if f"`{n}`" not in doc]
    assert missing == []


def test_images_are_multi_stage_with_a_slim_agent_and_a_healthcheck(compose: dict,
                                                                    k8s: dict) -> None:
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    stages = {line.split()[-1] for line in dockerfile.splitlines() if line.startswith("FROM ")}
    assert {"build", "agent", "full"} <= stages
    agent_stage = dockerfile.split("AS agent")[1].split("FROM ")[0]
    assert "[agent]" in agent_stage and "[all]" not in agent_stage
    assert 'HEALTHCHECK' in dockerfile.split("AS full")[1]
    services = compose["services"]
    assert services["agent"]["image"] == AGENT_IMAGE
    assert services["agent"]["build"]["target"] == "agent"
    ds = k8s[("DaemonSet", "fleetlens-agent")]["spec"]["template"]["spec"]["containers"][0]
    assert ds["image"] == AGENT_IMAGE
    # every long-running service of the full image says what its HEALTHCHECK checks
    health = parse_command(["health"]).command
    for name, service in services.items():
        if service.get("image") != IMAGE:
            continue
        if service.get("healthcheck", {}).get("disable"):
            continue
        named = service["environment"]["FLEETLENS_HEALTH"]
        assert named == name and health.get_command(click.Context(health), named), name


def test_k8s_probes_for_the_dashboard_and_the_pipeline(k8s: dict) -> None:
    def container(name: str) -> dict:
        return k8s[("Deployment", name)]["spec"]["template"]["spec"]["containers"][0]

    dash = container("fleetlens-dashboard")
    for probe in ("readinessProbe", "livenessProbe"):
        assert dash[probe]["httpGet"]["path"] == "/_stcore/health"
    command = container("fleetlens-pipeline")["livenessProbe"]["exec"]["command"]
    assert command[0] == "fleetlens"
    ctx = parse_command(command[1:])
    sub = ctx.command.get_command(ctx, command[2])
    sub.make_context(command[2], command[3:])  # the probe's arguments parse


def _scale_docs() -> dict[tuple[str, str], dict]:
    docs = {}
    for path in sorted((DEPLOY / "k8s" / "scale").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            docs[(doc["kind"], doc["metadata"]["name"])] = doc
    return docs


def test_scale_out_layout_collectors_keep_a_wal_each_and_publish_to_the_bucket() -> None:
    docs = _scale_docs()
    secret = docs[("Secret", "fleetlens-s3")]["stringData"]
    assert secret["FLEETLENS_DATA"].startswith("s3://")
    sts = docs[("StatefulSet", "fleetlens-collector")]["spec"]
    pod = sts["template"]["spec"]["containers"][0]
    ctx = parse_command(pod["args"])
    assert ctx.params["data_dir"] == "$(FLEETLENS_DATA)"  # the bucket URL from the Secret
    env = {e["name"]: e.get("value") for e in pod["env"]}
    mounts = {m["name"]: m["mountPath"] for m in pod["volumeMounts"]}
    assert env["FLEETLENS_WAL_DIR"] == mounts["wal"]  # the WAL stays on the replica's volume
    assert [t["metadata"]["name"] for t in sts["volumeClaimTemplates"]] == ["wal"]
    hpa = docs[("HorizontalPodAutoscaler", "fleetlens-collector")]["spec"]
    assert hpa["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "StatefulSet",
                                     "name": "fleetlens-collector"}
    assert hpa["minReplicas"] >= 2


def test_scale_out_layout_runs_pipeline_and_analyze_on_ray() -> None:
    docs = _scale_docs()
    assert ("RayCluster", "fleetlens-ray") in docs
    submitted = []
    for name in ("fleetlens-pipeline-ray", "fleetlens-analyze-ray"):
        pod = docs[("CronJob", name)]["spec"]["jobTemplate"]["spec"]["template"]["spec"]
        container = pod["containers"][0]
        assert container["command"][:3] == ["ray", "job", "submit"]
        args = container["args"]
        assert args[0] == "fleetlens"
        ctx = parse_command(args[1:])
        assert ctx.params["runner"] == "ray"
        submitted.append(args[1])
    assert submitted == ["pipeline", "analyze"]
    dash = docs[("Deployment", "fleetlens-dashboard")]["spec"]["template"]["spec"]
    parse_command(dash["containers"][0]["args"])
