"""Before the workers start: a taken port is one clear line; an open listener is warned about."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

from fleetlens.collector.config import CollectorConfig, TlsConfig
from fleetlens.collector.preflight import PortInUse, check_ports_free, warn_if_exposed
from fleetlens.collector.testing import free_port


def test_a_port_held_by_another_program_stops_the_collector_in_one_line(tmp_path) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        taken = holder.getsockname()[1]
        env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETLENS_")}
        out = subprocess.run(
            [sys.executable, "-m", "fleetlens", "collector", "--data-dir", str(tmp_path / "d"),
             "--grpc-address", f"127.0.0.1:{taken}",
             "--http-address", f"127.0.0.1:{free_port()}", "--workers", "2"],
            capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 1
    assert f"cannot listen on 127.0.0.1:{taken} (grpc_address)" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr and "restarting" not in out.stderr, out.stderr


def test_a_port_another_collector_serves_is_refused_too() -> None:
    """A listener with SO_REUSEPORT (another collector's workers) made the trial bind, which
    set it too, pass: the second collector started and the kernel split the clients between
    the two. Now it is refused like any taken port."""
    import pytest

    with socket.socket() as holder:
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        taken = holder.getsockname()[1]
        config = CollectorConfig(grpc_address=f"127.0.0.1:{taken}",
                                 http_address=f"127.0.0.1:{free_port()}")
        with pytest.raises(PortInUse, match=f"127.0.0.1:{taken} \\(grpc_address\\)"):
            check_ports_free(config)


def test_a_port_whose_server_closed_is_free_again() -> None:
    """A server that served connections and closed leaves them in TIME_WAIT: the port is
    free for a new collector (the trial bind sets SO_REUSEADDR, as the servers do)."""
    with socket.socket() as server:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        client = socket.create_connection(("127.0.0.1", port))
        accepted, _ = server.accept()
        accepted.close()  # the server side closes first: its end waits in TIME_WAIT
        client.close()
    check_ports_free(CollectorConfig(grpc_address=f"127.0.0.1:{port}",
                                     http_address=f"127.0.0.1:{free_port()}"))


def test_a_listener_beyond_loopback_without_tokens_or_tls_is_warned_about() -> None:
    exposed = CollectorConfig(grpc_address="0.0.0.0:4317")
    (warning,) = warn_if_exposed(exposed)
    assert warning.startswith("grpc_address 0.0.0.0:4317 is not loopback")
    assert warn_if_exposed(CollectorConfig()) == []  # the default: loopback only
    assert warn_if_exposed(CollectorConfig(grpc_address="0.0.0.0:4317",
                                           auth_tokens=("t",))) == []
    mutual_tls = CollectorConfig(http_address="[::]:4318", tls=TlsConfig(
        cert_file="c.pem", key_file="k.pem", client_ca_file="ca.pem"))
    assert warn_if_exposed(mutual_tls) == []
    assert len(warn_if_exposed(CollectorConfig(http_address="[::]:4318"))) == 1
