"""pgfork.binary: which pgfork binary the console script and the plugins run.

The bundled binary (a platform wheel's pgfork/_bin/pgfork) is tested by
clients/zero-setup.sh, which installs the built wheel; here the package has
none (an editable install), so the lookup goes on to $PGFORK_BIN and PATH."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pgfork import BinaryNotFound, find_binary, require_binary
from pgfork.binary import bundled


def executable(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)
    return path


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    monkeypatch.delenv("PGFORK_BIN", raising=False)
    monkeypatch.setenv("PATH", "")
    return monkeypatch


def test_no_bundled_binary_in_a_source_install() -> None:
    assert bundled() is None


def test_none_found(env: pytest.MonkeyPatch) -> None:
    assert find_binary() is None
    with pytest.raises(BinaryNotFound, match="pip install pgfork"):
        require_binary()


def test_pgfork_bin(env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    exe = executable(tmp_path / "custom" / "pgfork-build", "#!/bin/sh\n")
    on_path = executable(tmp_path / "path" / "pgfork", "#!/bin/sh\n")
    env.setenv("PATH", str(on_path.parent))
    env.setenv("PGFORK_BIN", str(exe))
    assert find_binary() == str(exe)  # before PATH


def test_pgfork_bin_not_executable(env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    f = tmp_path / "pgfork"
    f.write_text("")
    env.setenv("PGFORK_BIN", str(f))
    with pytest.raises(BinaryNotFound, match="PGFORK_BIN=.* is not an executable"):
        find_binary()


def test_path_skips_the_console_script(env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # What pip writes for `pgfork = "pgfork._cli:main"`: never the binary.
    script = executable(tmp_path / "venv" / "bin" / "pgfork",
                        f"#!{sys.executable}\nimport sys\nfrom pgfork._cli import main\nsys.exit(main())\n")
    real = executable(tmp_path / "usr" / "bin" / "pgfork", "#!/bin/sh\necho real\n")
    env.setenv("PATH", os.pathsep.join([str(script.parent), str(real.parent)]))
    assert find_binary() == str(real)


def test_console_script_runs_the_binary(tmp_path: Path) -> None:
    real = executable(tmp_path / "bin" / "pgfork", '#!/bin/sh\necho "ran $0 with $*"\n')
    env = {k: v for k, v in os.environ.items() if k != "PGFORK_BIN"}
    out = subprocess.run([sys.executable, "-m", "pgfork._cli", "--version"], capture_output=True, text=True,
                         env={**env, "PATH": str(real.parent)}, check=True).stdout
    assert out.startswith("ran ") and out.endswith(" with --version\n")


def test_console_script_without_binary(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PGFORK_BIN"}
    p = subprocess.run([sys.executable, "-m", "pgfork._cli", "--version"], capture_output=True, text=True,
                       env={**env, "PATH": str(tmp_path)})
    assert p.returncode == 127
    assert "pip install pgfork" in p.stderr and "PGFORK_BIN" in p.stderr
