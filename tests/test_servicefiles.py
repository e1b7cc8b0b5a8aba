"""The systemd units, the launchd plist, and `memctl service install|uninstall|status`.

No test here talks to a real service manager: commands go to a recording runner, and HOME /
XDG_CONFIG_HOME point into tmp_path (tests/test_activation.py starts memd with a socket
passed the way systemd passes it).
"""

from __future__ import annotations

import functools
import json
import os
import plistlib
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from memd.ctl import servicefiles
from memd.ctl.memctl import cli
from memd.ctl.servicefiles import (
    ServiceError,
    launchd_plist,
    memd_executable,
    systemd_socket,
    systemd_unit,
)

from .daemon_fixture import running_daemon

REPO = Path(__file__).resolve().parents[1]
SHIPPED_LOG = Path("/Users/USERNAME/Library/Logs/memd.log")
SHIPPED_SOCKET = Path("/Users/USERNAME/Library/Application Support/memd/run/memd.sock")
EXE = Path("/opt/memd venv/bin/memd")
SOCK = Path("/Users/me/Library/Application Support/memd/run/memd.sock")
START = ["systemctl", "--user", "enable", "--now", "memd.socket", "memd.service"]

Reply = tuple[int, str, str]


class Recorder:
    """A stand-in for subprocess.run that records commands and answers from ``reply``."""

    def __init__(
        self, reply: Callable[[list[str]], Reply] | None = None, *, missing: bool = False
    ) -> None:
        self.calls: list[list[str]] = []
        self.reply = reply or (lambda cmd: (0, "", ""))
        self.missing = missing

    def __call__(self, cmd: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        self.calls.append(list(cmd))
        if self.missing:
            raise FileNotFoundError(2, "No such file or directory", cmd[0])
        rc, out, err = self.reply(cmd)
        return subprocess.CompletedProcess(cmd, rc, out, err)


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    user_home = tmp_path / "user"
    user_home.mkdir()
    monkeypatch.setenv("HOME", str(user_home))
    for var in ("XDG_CONFIG_HOME", "MEMD_HOME", "MEMD_SOCKET", "MEMD_CONFIG"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "run"))
    return user_home


def unit_path(home: Path) -> Path:
    return home / ".config" / "systemd" / "user" / "memd.service"


def socket_unit(home: Path) -> Path:
    return home / ".config" / "systemd" / "user" / "memd.socket"


def plist_path(home: Path) -> Path:
    return home / "Library" / "LaunchAgents" / "dev.memd.memd.plist"


# --- the shipped files cannot drift from the generator -------------------------------------------


def test_shipped_unit_is_the_rendering_for_the_pipx_path() -> None:
    shipped = (REPO / "systemd" / "memd.service").read_text()
    assert shipped == systemd_unit(Path("%h/.local/bin/memd"))


def test_shipped_socket_is_the_rendering_for_the_runtime_directory() -> None:
    shipped = (REPO / "systemd" / "memd.socket").read_text()
    assert shipped == systemd_socket()
    assert "ListenStream=%t/memd/memd.sock" in shipped.splitlines()


def test_shipped_plist_is_the_rendering_for_usr_local() -> None:
    shipped = (REPO / "launchd" / "dev.memd.memd.plist").read_bytes()
    rendered = launchd_plist(
        Path("/usr/local/bin/memd"), log_path=SHIPPED_LOG, socket=SHIPPED_SOCKET
    )
    assert shipped == rendered


# --- rendering -----------------------------------------------------------------------------------


def test_unit_runs_the_executable_as_a_notify_service() -> None:
    text = systemd_unit(Path("/home/u/.venv/bin/memd"))
    lines = text.splitlines()
    assert "ExecStart=/home/u/.venv/bin/memd run" in lines
    for expected in (
        "Type=notify",
        "NotifyAccess=main",
        "Restart=on-failure",
        "RestartSec=2s",
        "StartLimitIntervalSec=60",
        "StartLimitBurst=5",
        "WatchdogSec=60",
        "TimeoutStopSec=30",
        "MemoryMax=2G",
        "NoNewPrivileges=yes",
        "UMask=0077",
        "Environment=PYTHONUNBUFFERED=1",
        "WantedBy=default.target",
        # socket activation: systemd listens, memd takes the socket; enabling one enables both
        "Requires=memd.socket",
        "After=memd.socket",
        "Also=memd.socket",
    ):
        assert expected in lines
    # The runtime directory belongs to the socket unit: a RuntimeDirectory= of the service
    # would be removed (with the socket systemd listens on) whenever memd stops.
    assert not any(line.startswith("RuntimeDirectory") for line in lines)
    # Options that need user namespaces stay out of the base unit (it must start without them).
    for option in ("ProtectSystem=", "ProtectHome=", "PrivateTmp=", "PrivateUsers="):
        assert not any(line.startswith(option) for line in lines)


def test_unit_quotes_and_escapes_paths_and_environment() -> None:
    text = systemd_unit(EXE, environment={"MEMD_HOME": "/data/100% mine"})
    assert 'ExecStart="/opt/memd venv/bin/memd" run' in text.splitlines()
    assert 'Environment="MEMD_HOME=/data/100%% mine"' in text.splitlines()
    assert "ExecStart=/x/50%%/memd run" in systemd_unit(Path("/x/50%/memd"))
    assert "ExecStart=/x/$$HOME/memd run" in systemd_unit(Path("/x/$HOME/memd"))


@pytest.mark.parametrize(
    ("exe", "env"),
    [(Path("/x/me\nmd"), None), (Path("/x/memd"), {"BAD NAME": "1"}), (EXE, {"A": "b\nc"})],
)
def test_unit_refuses_what_a_unit_cannot_hold(exe: Path, env: dict[str, str] | None) -> None:
    with pytest.raises(ServiceError):
        systemd_unit(exe, environment=env)


def test_socket_unit_listens_privately_where_memd_looks() -> None:
    lines = systemd_socket().splitlines()
    for expected in (
        "ListenStream=%t/memd/memd.sock",
        "SocketMode=0600",
        "DirectoryMode=0700",
        "RemoveOnStop=yes",
        "WantedBy=sockets.target",
    ):
        assert expected in lines
    assert "ListenStream=/srv/100%%/memd.sock" in systemd_socket("/srv/100%/memd.sock")
    for bad in ("relative/memd.sock", "/a b/memd.sock", "/a\nb"):
        with pytest.raises(ServiceError):
            systemd_socket(bad.replace("\\n", "\n"))


def _verify(unit_dir: Path, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed")
    runtime = tmp_path / "runtime"
    runtime.mkdir(mode=0o700, exist_ok=True)
    env = {**os.environ, "XDG_RUNTIME_DIR": str(runtime)}
    result = subprocess.run(
        [analyze, "--user", "verify", str(unit_dir / "memd.service")],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    if "Failed to initialize manager" in result.stderr:
        pytest.skip(f"systemd-analyze cannot run here: {result.stderr.strip()}")
    return result


def test_unit_passes_systemd_analyze_verify(tmp_path: Path) -> None:
    unit_dir = tmp_path / "units"
    unit_dir.mkdir()
    # verify checks that ExecStart exists and is executable, so point it at the real memd.
    (unit_dir / "memd.service").write_text(
        systemd_unit(memd_executable(), environment={"MEMD_HOME": "/tmp/a b"})
    )
    (unit_dir / "memd.socket").write_text(systemd_socket())
    result = _verify(unit_dir, tmp_path)
    assert result.returncode == 0, result.stderr
    assert "ignoring" not in result.stderr and "Unknown" not in result.stderr, result.stderr


def test_hardening_dropin_passes_systemd_analyze_verify(tmp_path: Path) -> None:
    unit_dir = tmp_path / "units"
    (unit_dir / "memd.service.d").mkdir(parents=True)
    (unit_dir / "memd.service").write_text(systemd_unit(memd_executable()))
    (unit_dir / "memd.socket").write_text(systemd_socket())
    shutil.copy(REPO / "systemd" / "hardening.conf", unit_dir / "memd.service.d")
    result = _verify(unit_dir, tmp_path)
    assert result.returncode == 0, result.stderr
    assert "ignoring" not in result.stderr and "Unknown" not in result.stderr, result.stderr


def test_plist_has_launchd_keys_and_absolute_paths() -> None:
    log = Path("/Users/me/Library/Logs/memd.log")
    plist = plistlib.loads(
        launchd_plist(EXE, log_path=log, socket=SOCK, environment={"MEMD_HOME": "/m"})
    )
    assert plist["Label"] == "dev.memd.memd"
    # launchd listens on memd's socket and starts memd on a connection (socket activation)
    assert plist["Sockets"] == {
        "Listeners": {
            "SockPathName": str(SOCK),
            "SockPathMode": 0o600,
            "SockType": "stream",
            "SockFamily": "Unix",
        }
    }
    assert plist["ProgramArguments"] == [str(EXE), "run"]
    assert plist["RunAtLoad"] is True
    assert plist["KeepAlive"] == {"SuccessfulExit": False}
    assert plist["ProcessType"] == "Background"
    assert plist["ThrottleInterval"] == 10
    assert plist["StandardOutPath"] == plist["StandardErrorPath"] == str(log)
    env = plist["EnvironmentVariables"]
    assert env["PATH"].split(":")[0] == str(EXE.parent)
    assert env["MEMD_HOME"] == "/m"


def test_plist_refuses_relative_paths() -> None:
    with pytest.raises(ServiceError, match="absolute"):
        launchd_plist(EXE, log_path=Path("~/Library/Logs/memd.log"), socket=SOCK)
    with pytest.raises(ServiceError, match="absolute"):
        launchd_plist(EXE, log_path=Path("/l/memd.log"), socket=Path("run/memd.sock"))


def test_memd_executable_in_this_venv_is_the_script_beside_python() -> None:
    exe = memd_executable()
    assert exe == Path(sys.executable).absolute().parent / "memd"
    assert exe.is_file() and os.access(exe, os.X_OK)


def test_memd_executable_falls_back_to_path_then_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "memd"
    script.write_text("#!/bin/sh\n")
    script.chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_dir))
    assert memd_executable() == script
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(ServiceError, match="cannot find the memd executable"):
        memd_executable()


# --- install / uninstall / status on Linux --------------------------------------------------------


def test_linux_install_writes_the_unit_and_starts_it(home: Path) -> None:
    rec = Recorder()
    lines = servicefiles.install("linux", executable=EXE, runner=rec)
    path = unit_path(home)
    assert path.read_text() == systemd_unit(EXE)
    assert socket_unit(home).read_text() == systemd_socket()
    assert path.stat().st_mode & 0o777 == socket_unit(home).stat().st_mode & 0o777 == 0o644
    assert rec.calls == [["systemctl", "--user", "daemon-reload"], START]
    assert any(str(path) in line for line in lines)
    assert any(str(socket_unit(home)) in line for line in lines)
    # Again: nothing to change, nothing stopped.
    rec.calls.clear()
    lines = servicefiles.install("linux", executable=EXE, runner=rec)
    assert f"{path} is up to date" in lines and f"{socket_unit(home)} is up to date" in lines
    assert ["systemctl", "--user", "stop", "memd.service"] not in rec.calls


def test_linux_install_respects_xdg_config_home_and_memd_home(
    home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "xdg-config"
    monkeypatch.setenv("XDG_CONFIG_HOME", str(config))
    monkeypatch.setenv("MEMD_HOME", "/srv/memd")
    monkeypatch.setenv("MEMD_EMBEDDING_API_KEY", "sk-secret")
    servicefiles.install("linux", executable=EXE, runner=Recorder())
    text = (config / "systemd" / "user" / "memd.service").read_text()
    assert "Environment=MEMD_HOME=/srv/memd" in text.splitlines()
    assert "sk-secret" not in text
    assert not unit_path(home).exists()
    # systemd listens where memd and its clients look with this MEMD_HOME
    sock = (config / "systemd" / "user" / "memd.socket").read_text().splitlines()
    assert "ListenStream=/srv/memd/run/memd.sock" in sock
    monkeypatch.setenv("MEMD_SOCKET", str(tmp_path / "run" / "elsewhere" / "m.sock"))
    servicefiles.install("linux", executable=EXE, force=True, runner=Recorder())
    sock = (config / "systemd" / "user" / "memd.socket").read_text().splitlines()
    assert "ListenStream=%t/elsewhere/m.sock" in sock
    assert not (tmp_path / "run").exists()  # named in the unit; systemd creates it


def test_linux_install_refuses_a_foreign_unit_without_force(home: Path) -> None:
    path = unit_path(home)
    path.parent.mkdir(parents=True)
    path.write_text("[Service]\nExecStart=/somewhere/else run\n")
    rec = Recorder()
    with pytest.raises(ServiceError, match="--force") as info:
        servicefiles.install("linux", executable=EXE, runner=rec)
    assert "-ExecStart=/somewhere/else run" in str(info.value)  # a diff
    assert path.read_text() == "[Service]\nExecStart=/somewhere/else run\n"
    assert rec.calls == []
    servicefiles.install("linux", executable=EXE, force=True, runner=rec)
    assert path.read_text() == systemd_unit(EXE)
    # the memd of the old unit is stopped, so the next one takes the socket systemd listens on
    assert rec.calls[-2:] == [["systemctl", "--user", "stop", "memd.service"], START]


@pytest.mark.parametrize("platform", ["linux", "darwin"])
def test_dry_run_writes_and_runs_nothing(home: Path, platform: str) -> None:
    rec = Recorder()
    lines = servicefiles.install(platform, executable=EXE, dry_run=True, runner=rec)
    assert lines and all(line.startswith(("would ", "    ")) for line in lines)
    # The file it would write is shown, line by line.
    shown = [line[4:] for line in lines if line.startswith("    ")]
    expected = (
        systemd_unit(EXE) + systemd_socket()
        if platform == "linux"
        else launchd_plist(
            EXE,
            log_path=servicefiles.launchd_log_path(),
            socket=Path(os.environ["XDG_RUNTIME_DIR"]) / "memd" / "memd.sock",
        ).decode()
    )
    assert shown == expected.splitlines()
    assert rec.calls == []
    assert list(home.iterdir()) == []
    assert servicefiles.uninstall(platform, dry_run=True, runner=rec)
    assert rec.calls == []


def test_linux_install_without_systemctl_says_so(home: Path) -> None:
    with pytest.raises(ServiceError) as info:
        servicefiles.install("linux", executable=EXE, runner=Recorder(missing=True))
    message = str(info.value)
    assert "systemd user manager not available" in message
    assert str(unit_path(home)) in message and "memd run" in message
    assert unit_path(home).exists() and socket_unit(home).exists()
    assert info.value.lines == [
        f"wrote {unit_path(home)} (ExecStart={EXE} run)",
        f"wrote {socket_unit(home)} (socket activation)",
    ]


def test_linux_install_without_a_user_manager_says_so(home: Path) -> None:
    rec = Recorder(lambda cmd: (1, "", "Failed to connect to bus: No medium found\n"))
    with pytest.raises(ServiceError, match="user manager not available.*No medium found"):
        servicefiles.install("linux", executable=EXE, runner=rec)
    assert len(rec.calls) == 1


def test_linux_install_reports_a_failed_start(home: Path) -> None:
    def reply(cmd: list[str]) -> Reply:
        return (1, "", "Job for memd.service failed.\n") if "enable" in cmd else (0, "", "")

    with pytest.raises(ServiceError, match="journalctl --user -u memd") as info:
        servicefiles.install("linux", executable=EXE, runner=Recorder(reply))
    assert "Job for memd.service failed." in str(info.value)


def test_linux_uninstall_stops_and_removes(home: Path) -> None:
    servicefiles.install("linux", executable=EXE, runner=Recorder())
    rec = Recorder()
    lines = servicefiles.uninstall("linux", runner=rec)
    assert rec.calls == [
        ["systemctl", "--user", "disable", "--now", "memd.service", "memd.socket"],
        ["systemctl", "--user", "daemon-reload"],
    ]
    assert not unit_path(home).exists() and not socket_unit(home).exists()
    assert f"removed {unit_path(home)}" in lines and f"removed {socket_unit(home)}" in lines


def test_linux_uninstall_without_systemctl_still_removes(home: Path) -> None:
    servicefiles.install("linux", executable=EXE, runner=Recorder())
    lines = servicefiles.uninstall("linux", runner=Recorder(missing=True))
    assert not unit_path(home).exists()
    assert any("systemd user manager not available" in line for line in lines)


def test_linux_status(home: Path) -> None:
    def reply(cmd: list[str]) -> Reply:
        return (0, "active\n" if "is-active" in cmd else "enabled\n", "")

    servicefiles.install("linux", executable=EXE, runner=Recorder())
    info = servicefiles.status("linux", executable=EXE, runner=Recorder(reply))
    assert info["available"] and info["running"] and info["installed"] and info["up_to_date"]
    assert (info["active"], info["enabled"]) == ("active", "enabled")
    assert info["path"] == str(unit_path(home))
    assert info["socket_unit"]["installed"] and info["socket_unit"]["active"] == "active"
    other = servicefiles.status("linux", executable=Path("/elsewhere/memd"), runner=Recorder(reply))
    assert other["up_to_date"] is False
    # A unit installed before memd.socket existed is out of date: install again.
    socket_unit(home).unlink()
    assert (
        servicefiles.status("linux", executable=EXE, runner=Recorder(reply))["up_to_date"] is False
    )


def test_linux_status_without_systemctl(home: Path) -> None:
    info = servicefiles.status("linux", executable=EXE, runner=Recorder(missing=True))
    assert not info["available"] and not info["running"] and not info["installed"]
    assert "systemd user manager not available" in info["reason"]
    json.dumps(info)


# --- install / uninstall / status on macOS -------------------------------------------------------


def test_darwin_install_writes_the_plist_and_bootstraps_it(home: Path) -> None:
    rec = Recorder(
        lambda cmd: (113, "", "Could not find service") if "print" in cmd else (0, "", "")
    )
    servicefiles.install("darwin", executable=EXE, runner=rec)
    path = plist_path(home)
    plist = plistlib.loads(path.read_bytes())
    log = home / "Library" / "Logs" / "memd.log"
    assert plist["StandardOutPath"] == plist["StandardErrorPath"] == str(log)
    assert log.parent.is_dir()
    service = f"gui/{os.getuid()}/dev.memd.memd"
    assert rec.calls == [
        ["launchctl", "print", service],
        ["launchctl", "enable", service],
        ["launchctl", "bootstrap", f"gui/{os.getuid()}", str(path)],
    ]


def test_darwin_install_boots_out_a_loaded_agent_first(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(time, "sleep", lambda s: None)
    bootstraps = iter([(5, "", "Bootstrap failed: 5: Input/output error"), (0, "", "")])

    def reply(cmd: list[str]) -> Reply:
        return next(bootstraps) if "bootstrap" in cmd else (0, "", "")

    rec = Recorder(reply)
    servicefiles.install("darwin", executable=EXE, runner=rec)
    verbs = [cmd[1] for cmd in rec.calls]
    assert verbs == ["print", "bootout", "enable", "bootstrap", "bootstrap"]


def test_darwin_install_without_launchctl_says_so(home: Path) -> None:
    with pytest.raises(ServiceError, match="launchctl not available"):
        servicefiles.install("darwin", executable=EXE, runner=Recorder(missing=True))
    assert plist_path(home).exists()


def test_darwin_uninstall_and_status(home: Path) -> None:
    servicefiles.install("darwin", executable=EXE, runner=Recorder())
    printed = (
        f"gui/{os.getuid()}/dev.memd.memd = {{\n\tactive count = 1\n"
        "\tstate = running\n\tpid = 4242\n\tlast exit code = (never exited)\n"
        "\tendpoints = {\n\t\tstate = nested\n\t}\n}\n"
    )
    info = servicefiles.status(
        "darwin", executable=EXE, runner=Recorder(lambda c: (0, printed, ""))
    )
    assert info["loaded"] and info["running"] and info["pid"] == 4242
    assert info["up_to_date"] is True and info["state"] == "running"
    rec = Recorder()
    lines = servicefiles.uninstall("darwin", runner=rec)
    assert rec.calls == [["launchctl", "bootout", f"gui/{os.getuid()}/dev.memd.memd"]]
    assert not plist_path(home).exists()
    assert f"removed {plist_path(home)}" in lines


def test_unsupported_platform() -> None:
    with pytest.raises(ServiceError, match="memd run"):
        servicefiles.install("win32", executable=EXE, runner=Recorder())


# --- memctl service ------------------------------------------------------------------------------


def _patch(monkeypatch: pytest.MonkeyPatch, rec: Recorder) -> None:
    for name in ("install", "uninstall", "status"):
        real = getattr(servicefiles, name)
        monkeypatch.setattr(servicefiles, name, functools.partial(real, "linux", runner=rec))


def test_memctl_service_install_uninstall(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rec = Recorder()
    _patch(monkeypatch, rec)
    result = CliRunner().invoke(cli, ["service", "install", "--dry-run"])
    assert result.exit_code == 0, result.output
    assert "would write" in result.output and rec.calls == []
    result = CliRunner().invoke(cli, ["service", "install"])
    assert result.exit_code == 0, result.output
    assert "ran: systemctl --user enable --now memd.socket memd.service" in result.output
    assert unit_path(home).exists()
    result = CliRunner().invoke(cli, ["service", "uninstall"])
    assert result.exit_code == 0, result.output
    assert "removed" in result.output and not unit_path(home).exists()


def test_memctl_service_install_failures_exit_1(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _patch(monkeypatch, Recorder(missing=True))
    result = CliRunner().invoke(cli, ["service", "install"])
    assert result.exit_code == 1
    assert "systemd user manager not available" in result.stderr
    assert "wrote" in result.stdout
    unit_path(home).write_text("# mine\n")
    result = CliRunner().invoke(cli, ["service", "install"])
    assert result.exit_code == 1 and "--force" in result.stderr
    assert unit_path(home).read_text() == "# mine\n"


def test_memctl_service_status(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _patch(monkeypatch, Recorder(lambda cmd: (3, "inactive\n", "")))
    result = CliRunner().invoke(cli, ["service", "status", "--json"])
    assert result.exit_code == 0, result.output
    info = json.loads(result.stdout)
    assert info["manager"] == "systemd" and info["active"] == "inactive"
    assert info["running"] is False and info["installed"] is False
    result = CliRunner().invoke(cli, ["service", "status"])
    assert "not installed" in result.output and "not running" in result.output


def test_memctl_service_status_without_a_manager_exits_1(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _patch(monkeypatch, Recorder(missing=True))
    result = CliRunner().invoke(cli, ["service", "status"])
    assert result.exit_code == 1
    assert "systemd user manager not available" in result.stderr


def test_install_carries_the_shells_settings_but_never_a_key(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A model or provider chosen in the shell is what the service must run with; a key set
    there is named, with what to do, and stays out of the unit."""
    monkeypatch.setenv("MEMD_LOCAL_MODEL", "/models/multilingual-e5-small.gguf")
    monkeypatch.setenv("MEMD_WATCH_DEBOUNCE_MS", "900")
    monkeypatch.setenv("MEMD_TEST_MODEL", "/not/a/setting.gguf")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-live-secret")
    lines = servicefiles.install("linux", executable=EXE, runner=Recorder())
    unit = unit_path(home).read_text().splitlines()
    assert "Environment=MEMD_LOCAL_MODEL=/models/multilingual-e5-small.gguf" in unit
    assert "Environment=MEMD_WATCH_DEBOUNCE_MS=900" in unit
    assert not any("MEMD_TEST_MODEL" in line or "sk-live" in line for line in unit)
    (note,) = [line for line in lines if "OPENAI_API_KEY" in line]
    assert "not given to the service" in note and "api_key_file" in note
    assert "sk-live" not in "".join(lines)


def test_service_status_sees_a_memd_started_by_hand(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _patch(monkeypatch, Recorder(lambda cmd: (3, "inactive\n", "")))
    with running_daemon() as daemon:
        monkeypatch.setenv("MEMD_SOCKET", str(daemon.socket_path))
        result = CliRunner().invoke(cli, ["service", "status"])
        as_json = json.loads(CliRunner().invoke(cli, ["service", "status", "--json"]).stdout)
    assert result.exit_code == 0, result.output
    assert "memd: running, but not as this service (pid" in result.output, result.output
    assert as_json["running"] is False and as_json["daemon"]["pid"] == os.getpid()
