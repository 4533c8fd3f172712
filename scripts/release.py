#!/usr/bin/env python3
"""Packages the binaries `make release` built into everything a user installs.

    scripts/release.py --version 0.1.0 --bin-dir BUILD --dist dist [--skip-js] [--skip-java] [--skip-rust]

BUILD holds one static binary per platform, named pgfork-<os>-<arch>
(Go's GOOS/GOARCH). Written into dist/ (see docs: README.md "Install"):

  pgfork-<version>-<os>-<arch>.tar.gz     the binary `pgfork`, LICENSE, README.md
  npm/pgfork-<platform>-<version>.tgz      @pgfork/<platform>: bin/pgfork ("os"/"cpu" set)
  npm/pgfork-<version>.tgz                 clients/js packed, optionalDependencies on
                                           every @pgfork/<platform> at <version>
  python/pgfork-<version>-py3-none-<tags>.whl   clients/python with pgfork/_bin/pgfork
  python/pgfork-<version>-py3-none-any.whl      clients/python without a binary
  maven/io/pgfork/<artifact>/<version>/    a Maven repository (file-based: users point a
                                           <repository> at dist/maven or copy it into
                                           ~/.m2/repository): pgfork-parent's pom, and for
                                           pgfork, pgfork-junit5 and pgfork-spring the jar,
                                           the sources jar and the flattened pom; .sha1/.md5
                                           beside each, maven-metadata.xml per artifact
  cargo/<crate>-<version>.crate            clients/rust packaged (`cargo package --locked`): pgfork,
                                           pgfork-macros, and pgfork-bin-<os>-<arch> (Rust's names:
                                           linux-x86_64, macos-aarch64, ...) with bin/pgfork for each
                                           platform built, which pgfork depends on for that platform
  cargo/index/                             those crates' registry index entries (a registry of
                                           the release: clients/rust/README.md)
  SHA256SUMS                               over every other file in dist/

The version is the one given (the Makefile reads it from the VERSION file);
it is stamped into staged copies of package.json and the wheels' metadata,
never into tracked files. The wheels are written here with zipfile (a wheel
is a zip with METADATA, WHEEL, entry_points.txt and RECORD), from
clients/python/pyproject.toml, so releasing needs no build backend. The
archives are reproducible: fixed order, owner and mtime (SOURCE_DATE_EPOCH,
else the commit's time; the jars too, through project.build.outputTimestamp).

The jars come from one Maven build (`mvn -o -Drevision=<version>
-Dmaven.test.skip=true package` of the three modules, in a copy of
clients/java: offline, from ~/.m2, when that has every plugin and dependency,
as after clients/java/test.sh or clients/prepare.sh; online otherwise). Java
is part of the release: without Maven (`mvn`) the release fails, unless
--skip-java leaves the Maven repository out (RELEASEFLAGS=--skip-java).
Likewise Rust: without cargo the release fails, unless --skip-rust.
"""

from __future__ import annotations

import argparse
import base64
import gzip
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from pathlib import Path

try:
    import tomllib
except ImportError:  # Python < 3.11
    sys.exit("release: Python >= 3.11 is needed (tomllib reads clients/python/pyproject.toml)")

ROOT = Path(__file__).resolve().parent.parent

# Go's GOOS/GOARCH → node's process.platform/process.arch, and the wheel
# platform tags pip accepts for a static binary (no libc needed: manylinux and
# musllinux alike; macOS 12 is the oldest Go 1.26 runs on).
PLATFORMS = {
    ("linux", "amd64"): ("linux", "x64", ["manylinux_2_17_x86_64", "manylinux2014_x86_64", "musllinux_1_1_x86_64"]),
    ("linux", "arm64"): ("linux", "arm64", ["manylinux_2_17_aarch64", "manylinux2014_aarch64", "musllinux_1_1_aarch64"]),
    ("darwin", "arm64"): ("darwin", "arm64", ["macosx_12_0_arm64"]),
    ("darwin", "amd64"): ("darwin", "x64", ["macosx_12_0_x86_64"]),
}
# Every platform the main npm package depends on optionally (all of them,
# also when this run built fewer: the version is the same).
ALL_NPM = [f"{PLATFORMS[p][0]}-{PLATFORMS[p][1]}" for p in PLATFORMS]

VERSION_RE = re.compile(r"^(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)(-[0-9A-Za-z.-]+)?$")


def log(msg: str) -> None:
    print(f"release: {msg}", file=sys.stderr, flush=True)


def epoch() -> int:
    if os.environ.get("SOURCE_DATE_EPOCH"):
        return int(os.environ["SOURCE_DATE_EPOCH"])
    try:
        return int(subprocess.run(["git", "-C", str(ROOT), "log", "-1", "--format=%ct"],
                                  check=True, capture_output=True, text=True).stdout.strip())
    except (OSError, subprocess.CalledProcessError, ValueError):
        return 315532800  # 1980-01-01, the oldest time a zip can hold


def tracked(sub: str) -> list[Path]:
    """Files under ROOT/sub that git tracks or would track (untracked but not
    ignored), as paths relative to ROOT/sub: what a checkout has, never build
    output or caches."""
    out = subprocess.run(["git", "-C", str(ROOT / sub), "ls-files", "-z", "-c", "-o", "--exclude-standard", "."],
                         check=True, capture_output=True).stdout.decode()
    files = sorted({Path(p) for p in out.split("\0") if p})
    return [p for p in files if (ROOT / sub / p).is_file() and "__pycache__" not in p.parts
            and "node_modules" not in p.parts]


# --- tarballs -----------------------------------------------------------------

def write_tarball(dest: Path, members: list[tuple[str, Path, int]], mtime: int, prefix: str = "") -> None:
    """A reproducible .tar.gz of (name, source, mode) members, root-owned."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, src, mode in members:
            data = src.read_bytes()
            ti = tarfile.TarInfo(prefix + name)
            ti.size, ti.mode, ti.mtime = len(data), mode, mtime
            ti.uid = ti.gid = 0
            ti.uname = ti.gname = ""
            tar.addfile(ti, io.BytesIO(data))
    tmp = dest.with_name(dest.name + ".partial")
    with open(tmp, "wb") as f, gzip.GzipFile(filename="", mode="wb", fileobj=f, mtime=mtime) as gz:
        gz.write(buf.getvalue())
    tmp.rename(dest)


# --- npm ----------------------------------------------------------------------

def npm_pack(stage: Path, dest_dir: Path, ignore_scripts: bool) -> Path:
    args = ["npm", "pack", "--json", "--pack-destination", str(dest_dir), "--loglevel=error"]
    if ignore_scripts:
        args.append("--ignore-scripts")
    p = subprocess.run(args, cwd=stage, capture_output=True, text=True)
    if p.returncode != 0:
        sys.stderr.write(p.stdout + p.stderr)
        raise SystemExit(f"release: npm pack in {stage} failed (exit {p.returncode}; its output above)")
    # The JSON array starts on a line of its own, after any lifecycle script's output.
    m = re.search(r"^\[\s*$", p.stdout, re.M)
    if m is None:
        raise SystemExit(f"release: npm pack printed no JSON: {p.stdout[-500:]}")
    name = json.loads(p.stdout[m.start():])[0]["filename"]
    return dest_dir / name


def npm_platform_package(version: str, goos: str, goarch: str, binary: Path, work: Path, dest: Path) -> Path:
    node_os, node_cpu, _ = PLATFORMS[(goos, goarch)]
    plat = f"{node_os}-{node_cpu}"
    stage = work / f"npm-{plat}"
    (stage / "bin").mkdir(parents=True)
    shutil.copyfile(binary, stage / "bin" / "pgfork")
    os.chmod(stage / "bin" / "pgfork", 0o755)
    shutil.copyfile(ROOT / "LICENSE", stage / "LICENSE")
    (stage / "README.md").write_text(
        f"# @pgfork/{plat}\n\nThe `pgfork` binary for {goos}/{goarch} ({node_os} {node_cpu}), "
        f"version {version}.\n\nInstall the `pgfork` package instead: it depends on this one "
        "optionally, and npm installs the one package that fits the machine. "
        "See https://github.com/pgfork/pgfork.\n")
    pkg = {
        "name": f"@pgfork/{plat}",
        "version": version,
        "description": f"The pgfork binary for {node_os}-{node_cpu} (installed by the pgfork package)",
        "license": "Apache-2.0",
        "repository": {"type": "git", "url": "git+https://github.com/pgfork/pgfork.git"},
        "os": [node_os],
        "cpu": [node_cpu],
        "files": ["bin/pgfork"],
        "preferUnplugged": True,
    }
    (stage / "package.json").write_text(json.dumps(pkg, indent=2) + "\n")
    return npm_pack(stage, dest, ignore_scripts=True)


def npm_main_package(version: str, work: Path, dest: Path) -> Path:
    """clients/js packed from a staged copy (its node_modules linked in, so
    the build runs with the devDependencies npm ci installed), with the
    version and optionalDependencies stamped into the copy's package.json."""
    js = ROOT / "clients" / "js"
    if not (js / "node_modules" / ".bin" / "tsc").exists():
        log("clients/js/node_modules is missing: npm ci --ignore-scripts (from package-lock.json)")
        subprocess.run(["npm", "ci", "--ignore-scripts", "--no-audit", "--no-fund", "--loglevel=error"],
                       cwd=js, check=True)
    stage = work / "npm-pgfork"
    for rel in tracked("clients/js"):
        if rel.parts[0] in ("dist",):
            continue
        (stage / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(js / rel, stage / rel)
    (stage / "node_modules").symlink_to(js / "node_modules")
    pkg = json.loads((stage / "package.json").read_text())
    pkg["version"] = version
    opt = dict(pkg.get("optionalDependencies") or {})
    for plat in ALL_NPM:
        opt[f"@pgfork/{plat}"] = version
    pkg["optionalDependencies"] = opt
    (stage / "package.json").write_text(json.dumps(pkg, indent=2) + "\n")
    # prepack builds dist/ (tsc, ESM + CommonJS) in the copy.
    return npm_pack(stage, dest, ignore_scripts=False)


# --- Python wheels -------------------------------------------------------------

def _b64(digest: bytes) -> str:
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def _requirement(req: str, extra: str | None) -> str:
    if extra is None:
        return req
    if ";" in req:
        r, marker = req.split(";", 1)
        return f'{r.strip()}; ({marker.strip()}) and extra == "{extra}"'
    return f'{req}; extra == "{extra}"'


def wheel_metadata(project: dict, version: str, readme: str) -> str:
    lines = ["Metadata-Version: 2.1", f"Name: {project['name']}", f"Version: {version}"]
    if project.get("description"):
        lines.append(f"Summary: {project['description']}")
    if project.get("requires-python"):
        lines.append(f"Requires-Python: {project['requires-python']}")
    lic = project.get("license")
    if isinstance(lic, dict) and lic.get("text"):
        lines.append(f"License: {lic['text']}")
    lines.append("Project-URL: Source, https://github.com/pgfork/pgfork")
    for req in project.get("dependencies", []):
        lines.append(f"Requires-Dist: {_requirement(req, None)}")
    for extra, reqs in project.get("optional-dependencies", {}).items():
        lines.append(f"Provides-Extra: {extra}")
        for req in reqs:
            lines.append(f"Requires-Dist: {_requirement(req, extra)}")
    lines.append("Description-Content-Type: text/markdown")
    return "\n".join(lines) + "\n\n" + readme


def entry_points(project: dict) -> str:
    groups: dict[str, dict[str, str]] = {}
    if project.get("scripts"):
        groups["console_scripts"] = project["scripts"]
    for group, eps in project.get("entry-points", {}).items():
        groups[group] = eps
    return "".join(f"[{g}]\n" + "".join(f"{k} = {v}\n" for k, v in eps.items()) + "\n"
                   for g, eps in groups.items())


def write_wheel(dest_dir: Path, version: str, tags: list[str], binary: Path | None, mtime: int) -> Path:
    py = ROOT / "clients" / "python"
    project = tomllib.loads((py / "pyproject.toml").read_text())["project"]
    name = project["name"]
    dist_info = f"{name}-{version}.dist-info"
    plat = ".".join(tags)
    whl = dest_dir / f"{name}-{version}-py3-none-{plat}.whl"

    files: list[tuple[str, bytes, int]] = []
    for rel in tracked("clients/python/src"):
        if rel.parts[0] != name or rel.suffix == ".pyc":
            continue
        files.append((rel.as_posix(), (py / "src" / rel).read_bytes(), 0o644))
    if binary is not None:
        files.append((f"{name}/_bin/pgfork", binary.read_bytes(), 0o755))
    files.append((f"{dist_info}/METADATA",
                  wheel_metadata(project, version, (py / "README.md").read_text()).encode(), 0o644))
    wheel = ["Wheel-Version: 1.0", "Generator: pgfork scripts/release.py",
             f"Root-Is-Purelib: {'true' if binary is None else 'false'}"]
    wheel += [f"Tag: py3-none-{t}" for t in tags]
    files.append((f"{dist_info}/WHEEL", ("\n".join(wheel) + "\n").encode(), 0o644))
    files.append((f"{dist_info}/entry_points.txt", entry_points(project).encode(), 0o644))
    files.append((f"{dist_info}/licenses/LICENSE", (ROOT / "LICENSE").read_bytes(), 0o644))

    record = [f"{n},sha256={_b64(hashlib.sha256(d).digest())},{len(d)}" for n, d, _ in files]
    record.append(f"{dist_info}/RECORD,,")
    files.append((f"{dist_info}/RECORD", ("\n".join(record) + "\n").encode(), 0o644))

    ts = max(mtime, 315532800)
    date_time = time.gmtime(ts)[:6]
    tmp = whl.with_name(whl.name + ".partial")
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as z:
        for n, d, mode in files:
            zi = zipfile.ZipInfo(n, date_time=date_time)
            zi.external_attr = (0o100000 | mode) << 16
            zi.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(zi, d)
    tmp.rename(whl)
    return whl


# --- Maven ----------------------------------------------------------------------

# The published modules of clients/java (the examples are not).
MAVEN_GROUP = "io.pgfork"
MAVEN_MODULES = ["pgfork", "pgfork-junit5", "pgfork-spring"]


def _zip_time(mtime: int) -> tuple[int, ...]:
    return time.gmtime(max(mtime, 315532800))[:6]


def need_maven() -> None:
    if shutil.which("mvn") is None:
        raise SystemExit("release: mvn not found: the Java artifacts (dist/maven) are part of the release; "
                         "install Maven and a JDK >= 17 (Debian: apt-get install maven openjdk-17-jdk-headless), "
                         "or leave them out with RELEASEFLAGS=--skip-java")


def maven_build(version: str, work: Path, mtime: int) -> Path:
    """Builds the modules' jars and flattened poms in a copy of clients/java
    (the checkout's target/ directories are the tests'); returns the copy."""
    stage = work / "java"
    for rel in tracked("clients/java"):
        (stage / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / "clients" / "java" / rel, stage / rel)
    ts = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(max(mtime, 315532800)))
    args = ["mvn", "-B", "-ntp", "-q", f"-Drevision={version}", "-Dmaven.test.skip=true",
            f"-Dproject.build.outputTimestamp={ts}", "-pl", ",".join(MAVEN_MODULES), "-am", "package"]
    p = subprocess.run(["mvn", "-o"] + args[1:], cwd=stage, capture_output=True, text=True)
    if p.returncode != 0 and "offline mode" in p.stdout + p.stderr:
        log("the Java build needs downloads ~/.m2 does not have: building online")
        p = subprocess.run(args, cwd=stage, capture_output=True, text=True)
    if p.returncode != 0:
        sys.stderr.write(p.stdout + p.stderr)
        raise SystemExit(f"release: the Java build failed (exit {p.returncode}; its output above): "
                         f"{' '.join(args)} in a copy of clients/java; RELEASEFLAGS=--skip-java leaves Java out")
    return stage


def _sources_jar(dest: Path, module: Path, rel_module: str, mtime: int) -> None:
    """What maven-source-plugin would write (src/main/java and
    src/main/resources, tracked files only), reproducibly."""
    files: list[tuple[str, Path]] = []
    for root in ("src/main/java", "src/main/resources"):
        if not (module / root).is_dir():
            continue
        for rel in tracked(f"{rel_module}/{root}"):
            files.append((rel.as_posix(), module / root / rel))
    date_time = _zip_time(mtime)
    tmp = dest.with_name(dest.name + ".partial")
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as z:
        entries = [("META-INF/MANIFEST.MF", b"Manifest-Version: 1.0\r\nCreated-By: pgfork scripts/release.py\r\n\r\n")]
        entries += [(n, src.read_bytes()) for n, src in sorted(files)]
        for n, d in entries:
            zi = zipfile.ZipInfo(n, date_time=date_time)
            zi.external_attr = (0o100644) << 16
            zi.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(zi, d)
    tmp.rename(dest)


def _with_checksums(f: Path) -> None:
    """The .sha1 and .md5 Maven checks a download from a repository against."""
    data = f.read_bytes()
    f.with_name(f.name + ".sha1").write_text(hashlib.sha1(data).hexdigest())
    f.with_name(f.name + ".md5").write_text(hashlib.md5(data).hexdigest())


def maven_repository(version: str, work: Path, dest: Path, mtime: int) -> list[Path]:
    """dest laid out as a Maven repository: io/pgfork/<artifact>/<version>/."""
    stage = maven_build(version, work, mtime)
    stamp = time.strftime("%Y%m%d%H%M%S", time.gmtime(mtime))
    written = []
    for artifact, module in [("pgfork-parent", "")] + [(m, m) for m in MAVEN_MODULES]:
        src = stage / module
        adir = dest / MAVEN_GROUP.replace(".", "/") / artifact
        vdir = adir / version
        vdir.mkdir(parents=True)
        files = []
        pom = src / ".flattened-pom.xml"
        if not pom.is_file():
            raise SystemExit(f"release: the Java build wrote no {pom} (flatten-maven-plugin): the poms would say ${{revision}}")
        text = pom.read_text()
        if "${revision}" in text or f"<version>{version}</version>" not in text:
            raise SystemExit(f"release: {pom} does not carry version {version}")
        shutil.copyfile(pom, vdir / f"{artifact}-{version}.pom")
        files.append(vdir / f"{artifact}-{version}.pom")
        if module:
            jar = src / "target" / f"{artifact}-{version}.jar"
            if not jar.is_file():
                raise SystemExit(f"release: the Java build wrote no {jar}")
            shutil.copyfile(jar, vdir / jar.name)
            files.append(vdir / jar.name)
            sources = vdir / f"{artifact}-{version}-sources.jar"
            _sources_jar(sources, ROOT / "clients" / "java" / module, f"clients/java/{module}", mtime)
            files.append(sources)
        meta = adir / "maven-metadata.xml"
        meta.write_text(
            '<?xml version="1.0" encoding="UTF-8"?>\n<metadata>\n'
            f"  <groupId>{MAVEN_GROUP}</groupId>\n  <artifactId>{artifact}</artifactId>\n"
            f"  <versioning>\n    <latest>{version}</latest>\n    <release>{version}</release>\n"
            f"    <versions>\n      <version>{version}</version>\n    </versions>\n"
            f"    <lastUpdated>{stamp}</lastUpdated>\n  </versioning>\n</metadata>\n")
        files.append(meta)
        for f in files:
            _with_checksums(f)
        written += files
    return written


# --- Rust crates ------------------------------------------------------------------

# Go's GOOS/GOARCH → the platform crate pgfork-bin-<os>-<arch> of clients/rust
# (Rust's target_os and target_arch: the pgfork crate depends on it there).
RUST_PLATFORMS = {
    ("linux", "amd64"): "linux-x86_64",
    ("linux", "arm64"): "linux-aarch64",
    ("darwin", "arm64"): "macos-aarch64",
    ("darwin", "amd64"): "macos-x86_64",
}

# The largest .crate the public registry takes (10 MiB; a platform crate with
# its compressed binary is about 7 MB).
CRATE_MAX = 10 * 1024 * 1024


def need_cargo() -> None:
    if shutil.which("cargo") is None:
        raise SystemExit("release: cargo not found: the Rust crates (dist/cargo) are part of the release; "
                         "install Rust (stable >= 1.89), or leave them out with RELEASEFLAGS=--skip-rust")


def _cargo(args: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    """cargo ARGS --offline (its caches, as after clients/rust/test.sh),
    online when that lacks a download; exits on failure."""
    p = subprocess.run(["cargo"] + args + ["--offline"], cwd=cwd, env=env, capture_output=True, text=True)
    if p.returncode != 0 and "offline" in p.stderr:
        log(f"cargo {args[0]} needs downloads the cargo cache does not have: running it online")
        p = subprocess.run(["cargo"] + args, cwd=cwd, env=env, capture_output=True, text=True)
    if p.returncode != 0:
        sys.stderr.write(p.stdout + p.stderr)
        raise SystemExit(f"release: cargo {' '.join(args)} failed (exit {p.returncode}; its output above), "
                         "in a copy of clients/rust; RELEASEFLAGS=--skip-rust leaves Rust out")
    return p


def _lock_entries(lock: Path, skip: set[str]) -> set[tuple[str, str, str]]:
    return {(q["name"], q["version"], q.get("checksum", ""))
            for q in tomllib.loads(lock.read_text()).get("package", []) if q["name"] not in skip}


def _index_path(name: str) -> str:
    """Where a registry index keeps crate NAME's entries."""
    n = name.lower()
    if len(n) <= 2:
        return f"{len(n)}/{n}"
    if len(n) == 3:
        return f"3/{n[0]}/{n}"
    return f"{n[:2]}/{n[2:4]}/{n}"


def _index_entry(pkg: dict, crate: Path, ours: set[str]) -> dict:
    """The registry index's line for a packaged crate (what publishing
    sends the registry), from `cargo metadata`: a dependency on a crate of
    this release is in the same registry (registry null); the others name
    the registry cargo resolved them from."""
    deps = []
    for d in pkg["dependencies"]:
        if d["name"] in ours:
            registry = None
        elif d.get("path") or not d.get("source"):
            raise SystemExit(f"release: {pkg['name']} depends on {d['name']} by path only: it cannot be published")
        else:
            registry = d["source"].removeprefix("registry+")
        deps.append({
            "name": d["rename"] or d["name"], "req": d["req"], "features": d["features"],
            "optional": d["optional"], "default_features": d["uses_default_features"],
            "target": d["target"], "kind": d["kind"] or "normal", "registry": registry,
            "package": d["name"] if d["rename"] else None,
        })
    return {"name": pkg["name"], "vers": pkg["version"], "deps": deps, "features": pkg["features"],
            "cksum": hashlib.sha256(crate.read_bytes()).hexdigest(), "yanked": False,
            "links": pkg["links"], "rust_version": pkg["rust_version"], "v": 2}


def rust_crates(version: str, built: list[tuple[str, str, Path]], work: Path, dest: Path) -> list[Path]:
    """clients/rust packaged as `cargo package` does for publishing, into
    dest: pgfork-macros, pgfork, and pgfork-bin-<os>-<arch> (bin/pgfork)
    for each platform built; and dest/index, those crates' registry index
    entries (a registry made of it and these files: clients/rust/README.md).

    In a staged copy of the workspace: the version stamped (the
    workspace's, and its dependencies' `=VERSION`); the platform crates of
    platforms not built dropped, and the pgfork crate's dependencies on
    them (so the crates resolve from this release alone); each binary put
    into its crate. `cargo update --workspace` then changes the lock's
    entries of the workspace's own crates only (checked: every other entry
    is Cargo.lock's), and `cargo package --locked` checks the manifests
    (metadata, no path-only dependency), lists the files and builds each
    crate from its packaged files, resolving the release's crates among
    themselves. Builds in $CARGO_TARGET_DIR, else clients/rust/target."""
    src = ROOT / "clients" / "rust"
    stage = work / "rust"
    for rel in tracked("clients/rust"):
        if rel.parts[0] == "target":
            continue
        (stage / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src / rel, stage / rel)
    root_toml = stage / "Cargo.toml"
    old = tomllib.loads(root_toml.read_text())["workspace"]["package"]["version"]
    text = re.sub(r'(\bversion = "=?)' + re.escape(old) + '"', lambda m: m.group(1) + version + '"',
                  root_toml.read_text())
    platforms = {RUST_PLATFORMS[(goos, goarch)]: b for goos, goarch, b in built}
    dropped = [p for p in RUST_PLATFORMS.values() if p not in platforms]
    for plat in dropped:
        text = "".join(line for line in text.splitlines(keepends=True) if f"pgfork-bin-{plat}" not in line)
        shutil.rmtree(stage / f"pgfork-bin-{plat}")
    root_toml.write_text(text)
    pgfork_toml = stage / "pgfork" / "Cargo.toml"
    lines = pgfork_toml.read_text().splitlines(keepends=True)
    for plat in dropped:
        i = lines.index(f"pgfork-bin-{plat}.workspace = true\n")
        if not lines[i - 1].startswith("[target."):
            raise SystemExit(f"release: clients/rust/pgfork/Cargo.toml: pgfork-bin-{plat} is not the one line "
                             "of its [target.'cfg(…)'.dependencies] table")
        del lines[i - 1:i + 1]
    pgfork_toml.write_text("".join(lines))
    ws = tomllib.loads(root_toml.read_text())["workspace"]
    targets = {d for t in tomllib.loads(pgfork_toml.read_text()).get("target", {}).values()
               for d in t.get("dependencies", {})}
    if ws["package"]["version"] != version or targets != {f"pgfork-bin-{p}" for p in platforms}:
        raise SystemExit(f"release: could not stamp version {version} and the platform crates "
                         f"{', '.join(platforms)} into a copy of clients/rust (workspace version "
                         f"{ws['package']['version']}, pgfork's platform crates {sorted(targets)})")
    for plat, b in platforms.items():
        crate = stage / f"pgfork-bin-{plat}"
        (crate / "bin").mkdir()
        shutil.copyfile(b, crate / "bin" / "pgfork")
        os.chmod(crate / "bin" / "pgfork", 0o755)
    names = ["pgfork-macros", "pgfork"] + [f"pgfork-bin-{p}" for p in platforms]
    for n in names:
        shutil.copyfile(ROOT / "LICENSE", stage / n / "LICENSE")

    env = dict(os.environ)
    env.setdefault("CARGO_TARGET_DIR", str(src / "target"))
    own = {"pgfork-example", "pgfork-macros", "pgfork"} | {f"pgfork-bin-{p}" for p in RUST_PLATFORMS.values()}
    _cargo(["update", "--workspace"], stage, env)
    if _lock_entries(stage / "Cargo.lock", own) != _lock_entries(src / "Cargo.lock", own):
        raise SystemExit("release: clients/rust/Cargo.lock is not up to date (stamping the version changed more "
                         "than the workspace's own entries): run cargo build --locked there and fix it")
    p = _cargo(["package", "--locked"] + [a for n in names for a in ("-p", n)], stage, env)
    warnings = [line for line in p.stderr.splitlines() if line.startswith("warning")]
    if warnings:
        sys.stderr.write(p.stderr)
        raise SystemExit(f"release: cargo package warned (its output above): {warnings[0]}")
    meta = json.loads(_cargo(["metadata", "--no-deps", "--format-version", "1"], stage, env).stdout)
    pkgs = {q["name"]: q for q in meta["packages"]}
    dest.mkdir(parents=True)
    written = []
    for n in names:
        crate = Path(env["CARGO_TARGET_DIR"]) / "package" / f"{n}-{version}.crate"
        if not crate.is_file():
            raise SystemExit(f"release: cargo package wrote no {crate}")
        if crate.stat().st_size > CRATE_MAX:
            raise SystemExit(f"release: {crate.name} is {crate.stat().st_size} bytes: more than the "
                             f"{CRATE_MAX} a crate may have to be published")
        shutil.copyfile(crate, dest / crate.name)
        written.append(dest / crate.name)
        entry = dest / "index" / _index_path(n)
        entry.parent.mkdir(parents=True, exist_ok=True)
        entry.write_text(json.dumps(_index_entry(pkgs[n], dest / crate.name, set(names)), sort_keys=True) + "\n")
    if dropped:
        log(f"the pgfork crate depends on the platform crates of {', '.join(platforms)} only: "
            "publish crates from a release of every platform")
    return written


# --- main ---------------------------------------------------------------------

def sha256sums(dist: Path) -> None:
    lines = []
    for p in sorted(dist.rglob("*")):
        if p.is_file() and p.name != "SHA256SUMS":
            h = hashlib.sha256(p.read_bytes()).hexdigest()
            lines.append(f"{h}  {p.relative_to(dist).as_posix()}\n")
    (dist / "SHA256SUMS").write_text("".join(lines))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--version", required=True, help="the release version (semantic: 1.2.3 or 1.2.3-rc.1)")
    ap.add_argument("--bin-dir", required=True, type=Path, help="where the binaries pgfork-<os>-<arch> are")
    ap.add_argument("--dist", required=True, type=Path, help="output directory (must be empty or absent)")
    ap.add_argument("--skip-js", action="store_true", help="no npm packages (no node/npm here)")
    ap.add_argument("--skip-java", action="store_true", help="no Maven repository dist/maven (no Maven here)")
    ap.add_argument("--skip-rust", action="store_true", help="no crates dist/cargo (no cargo here)")
    a = ap.parse_args()
    a.dist, a.bin_dir = a.dist.resolve(), a.bin_dir.resolve()  # npm pack runs elsewhere

    if not VERSION_RE.match(a.version):
        log(f"version {a.version!r} is not a release version such as 1.2.3 (npm and pip need one): fix VERSION")
        return 2
    bins = sorted(a.bin_dir.glob("pgfork-*-*"))
    built = []
    for b in bins:
        goos, goarch = b.name.split("-")[1:3]
        if (goos, goarch) not in PLATFORMS:
            log(f"{b}: {goos}/{goarch} is not a platform the packages know (known: "
                f"{', '.join('/'.join(p) for p in PLATFORMS)})")
            return 2
        built.append((goos, goarch, b))
    if not built:
        log(f"no binaries pgfork-<os>-<arch> in {a.bin_dir}")
        return 2
    if a.dist.exists() and any(a.dist.iterdir()):
        log(f"{a.dist} is not empty: remove it first (make release does)")
        return 2
    if not a.skip_java:
        need_maven()  # before anything is built
    if not a.skip_rust:
        need_cargo()
    mtime = epoch()
    (a.dist / "npm").mkdir(parents=True, exist_ok=True)
    (a.dist / "python").mkdir(parents=True, exist_ok=True)

    with tempfile.TemporaryDirectory(prefix="pgfork-release-") as tmp:
        work = Path(tmp)
        for goos, goarch, b in built:
            tgz = a.dist / f"pgfork-{a.version}-{goos}-{goarch}.tar.gz"
            write_tarball(tgz, [("pgfork", b, 0o755), ("LICENSE", ROOT / "LICENSE", 0o644),
                                ("README.md", ROOT / "README.md", 0o644)], mtime)
            log(f"wrote {tgz}")
            whl = write_wheel(a.dist / "python", a.version, PLATFORMS[(goos, goarch)][2], b, mtime)
            log(f"wrote {whl}")
            if not a.skip_js:
                log(f"wrote {npm_platform_package(a.version, goos, goarch, b, work, a.dist / 'npm')}")
        whl = write_wheel(a.dist / "python", a.version, ["any"], None, mtime)
        log(f"wrote {whl}")
        if not a.skip_js:
            log("packing clients/js (npm pack: builds it)")
            log(f"wrote {npm_main_package(a.version, work, a.dist / 'npm')}")
        if not a.skip_java:
            log("building clients/java (mvn package: jars, flattened poms)")
            t0 = time.monotonic()
            jars = maven_repository(a.version, work, a.dist / "maven", mtime)
            log(f"wrote {a.dist / 'maven'} ({sum(1 for j in jars if j.suffix == '.jar')} jars, "
                f"{time.monotonic() - t0:.0f} s)")
        if not a.skip_rust:
            log("packaging clients/rust (cargo package --locked: builds each crate)")
            t0 = time.monotonic()
            crates = rust_crates(a.version, built, work, a.dist / "cargo")
            log(f"wrote {', '.join(c.name for c in crates)} into {a.dist / 'cargo'} ({time.monotonic() - t0:.0f} s)")
    sha256sums(a.dist)
    log(f"wrote {a.dist / 'SHA256SUMS'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
