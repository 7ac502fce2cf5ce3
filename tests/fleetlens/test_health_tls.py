"""`fleetlens health` where issue 33 found it blind: a collector serving TLS (item 8: the
plaintext probe restarted a healthy collector for ever), a heartbeat dated in the future and
an object store that never answers (item 10)."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import pytest

from fleetlens.collector.testing import running_collector
from tests.collector.certs import make_pki
from tests.fleetlens.test_health import fleetlens

pytestmark = pytest.mark.e2e


def _probe_config(path: Path, address: str, tls: dict[str, str]) -> Path:
    """The probe's fleetlens.toml: the collector's address and [collector.tls]."""
    lines = ["[collector]", f'grpc_address = "{address}"', "[collector.tls]"]
    lines += [f'{key} = "{value}"' for key, value in tls.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def _one_line_failure(out: object) -> str:
    assert out.returncode == 1, (out.stdout, out.stderr)  # type: ignore[attr-defined]
    err = out.stderr.strip()  # type: ignore[attr-defined]
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    return err


def test_the_collector_probe_speaks_the_collectors_tls(tmp_path: Path) -> None:
    pki = make_pki(tmp_path / "pki")
    tls = {"cert_file": str(pki["server_cert"]), "key_file": str(pki["server_key"]),
           "ca_file": str(pki["ca"])}
    with running_collector(tmp_path / "data", config={"tls": tls,
                                                      "auth_tokens": ["s3cret"]}) as col:
        config = _probe_config(tmp_path / "fleetlens.toml", col.grpc_address, tls)
        out = fleetlens("health", "collector", "--config", str(config))
        assert out.returncode == 0, out.stderr
        assert "SERVING" in out.stdout and "TLS" in out.stdout
        # The image's HEALTHCHECK: `fleetlens health`, the component and config from the env.
        out = fleetlens("health", env={"FLEETLENS_HEALTH": "collector",
                                       "FLEETLENS_CONFIG": str(config)})
        assert out.returncode == 0, out.stderr
        # A CA that did not sign the collector's certificate: one clear line, exit 1.
        wrong = _probe_config(tmp_path / "wrong.toml", col.grpc_address,
                              {**tls, "ca_file": str(pki["other_ca"])})
        err = _one_line_failure(fleetlens("health", "--timeout", "3", "collector",
                                          "--config", str(wrong)))
        assert "not signed by" in err and "other-ca" in err, err
        # --ca overrides the config's; a plaintext probe of a TLS collector fails too.
        err = _one_line_failure(fleetlens("health", "--timeout", "3", "collector", "--config",
                                          str(config), "--ca", str(pki["other_ca"])))
        assert "not signed by" in err, err
        err = _one_line_failure(fleetlens("health", "--timeout", "3", "collector",
                                          "--address", col.grpc_address))
        assert "UNAVAILABLE" in err or "DEADLINE_EXCEEDED" in err, err


def test_the_collector_probe_does_mutual_tls_with_the_collectors_own_certificate(
        tmp_path: Path) -> None:
    pki = make_pki(tmp_path / "pki")
    tls = {"cert_file": str(pki["server_cert"]), "key_file": str(pki["server_key"]),
           "client_ca_file": str(pki["ca"]), "ca_file": str(pki["ca"])}
    with running_collector(tmp_path / "data", config={"tls": tls}) as col:
        config = _probe_config(tmp_path / "fleetlens.toml", col.grpc_address, tls)
        out = fleetlens("health", "collector", "--config", str(config))
        assert out.returncode == 0, out.stderr
        out = fleetlens("health", "collector", "--config", str(config),
                        "--cert", str(pki["client_cert"]), "--key", str(pki["client_key"]))
        assert out.returncode == 0, out.stderr
        missing = _one_line_failure(fleetlens(
            "health", "collector", "--config", str(config), "--ca", str(tmp_path / "nope")))
        assert "cannot read the CA file" in missing


def test_a_heartbeat_from_the_future_is_not_healthy(tmp_path: Path) -> None:
    state = tmp_path / "data" / "state"
    state.mkdir(parents=True)
    beat = state / "pipeline-heartbeat.json"
    beat.write_text(json.dumps({"unix_s": time.time() + 3600}))
    err = _one_line_failure(fleetlens("health", "pipeline", "--data-dir", str(tmp_path / "data")))
    assert "in the future" in err
    beat.write_text(json.dumps({"unix_s": time.time() + 5}))  # ordinary skew passes
    out = fleetlens("health", "pipeline", "--data-dir", str(tmp_path / "data"))
    assert out.returncode == 0, out.stderr


def test_a_pipeline_probe_of_a_silent_object_store_gives_up_at_its_timeout(
        tmp_path: Path) -> None:
    pytest.importorskip("obstore")
    with socket.socket() as silent:  # accepts connections (the backlog), never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        env = {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{silent.getsockname()[1]}",
               "AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "x",
               "AWS_REGION": "us-east-1", "AWS_SHARED_CREDENTIALS_FILE": "/dev/null",
               "AWS_CONFIG_FILE": "/dev/null", "FLEETLENS_WAL_DIR": str(tmp_path / "wal")}
        started = time.monotonic()
        out = fleetlens("health", "--timeout", "2", "pipeline", "--data-dir", "s3://b/fleet",
                        env=env)
        took = time.monotonic() - started
    err = _one_line_failure(out)
    assert "more than 2 s" in err and took < 60, (err, took)


def test_every_collector_probe_in_deploy_is_fleetlens_health_collector() -> None:
    """The kubelet's grpc probe speaks plaintext only: with [collector.tls] on it fails and
    restarts a healthy collector for ever. Each collector probe runs the command instead."""
    import yaml

    deploy = Path(__file__).resolve().parents[2] / "deploy" / "k8s"
    probes = 0
    for path in sorted(deploy.rglob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            spec = (doc or {}).get("spec", {}).get("template", {}).get("spec", {})
            for container in spec.get("containers", []):
                if "collector" not in container.get("args", []):
                    continue
                for kind in ("readinessProbe", "livenessProbe"):
                    probe = container[kind]
                    assert "grpc" not in probe, (path.name, kind)
                    assert probe["exec"]["command"][:3] == ["fleetlens", "health", "collector"]
                    assert probe.get("timeoutSeconds", 1) >= 5, (path.name, kind)
                    probes += 1
    assert probes == 6  # central, scale-out and edge collectors
