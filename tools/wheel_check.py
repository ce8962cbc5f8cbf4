"""Golden file lists and content checks for opmux wheels and sdists.

The expected content of a wheel is computed from the source tree and targets.toml, never
written down by hand: every Python module of the package, every file under
``kernels/jit/csrc`` and ``kernels/jit/include``, ``py.typed``, the generated ``_version.py``
and ``_build_info.py``, the target's AOT libraries, its prebuilt torch bridges (one per release of
its ``bridge_torch``, named in the build info) and the dist-info files - and nothing else.
Every check returns a list of problems, each naming the file concerned.
"""

from __future__ import annotations

import argparse
import ast
import email.parser
import glob
import re
import sys
import tempfile
import zipfile
from pathlib import Path, PurePosixPath

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tools import stage as _stage
from tools import targets as _targets

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

__all__ = [
    "check_package_data",
    "check_sdist",
    "check_wheel",
    "expected_package_files",
    "required_data_files",
]

PKG = "python/opmux"
DATA_DIRS = ("kernels/jit/csrc", "kernels/jit/include", "kernels/configs")
GENERATED = ("_version.py",)
#: the prebuilt torch bridges: written by setup.py at build time (ignored in the tree), each
#: named in _build_info's "bridges", so the golden list takes them from there
BRIDGES = "opmux/kernels/bridges"
DEFAULT_LICENSE_GLOBS = ("LICEN[CS]E*", "COPYING*", "NOTICE*", "AUTHORS*")
STRAY = re.compile(r"(__pycache__|\.py[cod]$|\.git/|\.orig$|\.rej$|~$|\.egg-info/|/tests?/)")


def _package_tree(root: Path) -> list[str]:
    """Files of the package in the tree, relative to python/ (e.g. ``opmux/__init__.py``)."""
    prefix = PKG.rsplit("/", 1)[0] + "/"
    return [p[len(prefix) :] for p in _stage.source_files(root) if p.startswith(PKG + "/")]


def required_data_files(root: Path) -> set[str]:
    """Non-Python files the wheel must carry: every file under csrc/, include/ and configs/ (tuned
    launch configurations), py.typed."""
    files = {p for p in _package_tree(root) if any(p.startswith(f"opmux/{d}/") for d in DATA_DIRS)}
    if (Path(root) / PKG / "py.typed").exists():
        files.add("opmux/py.typed")
    return files


def expected_package_files(root: Path) -> set[str]:
    """Package files (relative to site-packages) that every target's wheel contains."""
    modules = {p for p in _package_tree(root) if p.endswith(".py")}
    return modules | required_data_files(root) | {f"opmux/{g}" for g in GENERATED}


def _package_data_globs(pyproject: dict) -> dict[str, list[str]]:
    return pyproject.get("tool", {}).get("setuptools", {}).get("package-data", {})


def check_package_data(pyproject_path: Path, root: Path) -> list[str]:
    """Evaluate the package-data globs of a pyproject against the tree, as setuptools does
    (``glob.glob(pattern, recursive=True)`` relative to the package directory), and name every
    required data file that no glob matches."""
    root = Path(root)
    data = tomllib.loads(Path(pyproject_path).read_text(encoding="utf-8"))
    pkg_dir = data.get("tool", {}).get("setuptools", {}).get("package-dir", {}).get("", ".")
    matched: set[str] = set()
    for package, patterns in _package_data_globs(data).items():
        base = root / pkg_dir / package.replace(".", "/")
        for pattern in patterns:
            for hit in glob.glob(str(base / pattern), recursive=True):
                hit_path = Path(hit)
                if hit_path.is_file():
                    matched.add(hit_path.relative_to(root / pkg_dir).as_posix())
    missing = sorted(required_data_files(root) - matched)
    return [
        f"{Path(pyproject_path).name}: [tool.setuptools.package-data] does not match {pkg_dir}/{m}; "
        f"the wheel would lack it (use globs like 'kernels/jit/include/**/*')"
        for m in missing
    ]


def _norm_req(req: str) -> str:
    """A canonical form of a requirement string (specifier order and spaces do not matter)."""
    try:
        from packaging.requirements import Requirement
    except ImportError:  # pragma: no cover
        return req.replace(" ", "")
    r = Requirement(req)
    spec = ",".join(sorted(str(s) for s in r.specifier))
    return f"{r.name.lower()}{spec}" + (f";{r.marker}" if r.marker else "")


def read_build_info(text: str) -> dict:
    """The BUILD_INFO dict of a _build_info.py, without executing it."""
    for node in ast.parse(text).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "BUILD_INFO" for t in node.targets):
            return ast.literal_eval(node.value)
        if (
            isinstance(node, ast.AnnAssign)
            and getattr(node.target, "id", None) == "BUILD_INFO"
            and node.value is not None
        ):
            return ast.literal_eval(node.value)
    raise ValueError("_build_info.py has no BUILD_INFO = {...} assignment")


def _dist_info_files(root: Path, dist_info: str, pyproject: dict) -> set[str]:
    files = {f"{dist_info}/{n}" for n in ("METADATA", "WHEEL", "RECORD", "top_level.txt")}
    project = pyproject.get("project", {})
    if project.get("scripts") or project.get("gui-scripts") or project.get("entry-points"):
        files.add(f"{dist_info}/entry_points.txt")
    globs = project.get("license-files", DEFAULT_LICENSE_GLOBS)
    for pattern in globs:
        for hit in glob.glob(str(Path(root) / pattern), recursive=True):
            if Path(hit).is_file():
                files.add(f"{dist_info}/licenses/{Path(hit).relative_to(root).as_posix()}")
    return files


def check_wheel(wheel: Path, root: Path, target: _targets.Target) -> list[str]:
    """Every problem with ``wheel`` as the ``target`` build of the tree at ``root``."""
    wheel, root = Path(wheel), Path(root)
    problems: list[str] = []
    name_part = wheel.name.split("-")
    if len(name_part) != 5:
        return [f"{wheel.name}: not a wheel file name (name-version-py-abi-plat.whl)"]
    dist, version, py_tag, abi_tag, plat_tag = name_part[0], name_part[1], *name_part[2:4], name_part[4][:-4]
    want_dist = target.distribution.replace("-", "_")
    if dist != want_dist:
        problems.append(
            f"{wheel.name}: distribution {dist!r}, expected {want_dist!r} for target {target.name!r}"
        )
    with zipfile.ZipFile(wheel) as zf:
        names = [n for n in zf.namelist() if not n.endswith("/")]
        contents = {n: zf.read(n) for n in names if n.endswith(("_build_info.py", "METADATA", "WHEEL"))}
    have = set(names)
    if len(have) != len(names):
        problems.append(f"{wheel.name}: duplicate archive members")

    info_path = "opmux/_build_info.py"
    info: dict = {}
    if info_path in contents:
        try:
            info = read_build_info(contents[info_path].decode())
        except (ValueError, SyntaxError) as exc:
            problems.append(f"{wheel.name}: {info_path}: {exc}")
    # AOT libraries: all of the target's, except those the build recorded as left out because
    # the compiler is absent (e.g. hipcc here); anything else missing is an error.
    missing_ok = {
        lib
        for lib, why in info.get("aot_missing", {}).items()
        if isinstance(why, dict) and why.get("why") == "toolchain"
    }
    aot_libs = {
        f"opmux/kernels/aot/libopmux_aot_{lib}.so" for lib in target.aot.libraries if lib not in missing_ok
    }
    bridges = {f"{BRIDGES}/{name}" for name in info.get("bridges", {})}
    problems += _check_bridges(wheel.name, info, target)
    pyproject = tomllib.loads((root / target.pyproject).read_text(encoding="utf-8"))
    dist_info = f"{dist}-{version}.dist-info"
    expected = (
        expected_package_files(root) | aot_libs | bridges | _dist_info_files(root, dist_info, pyproject)
    )

    for f in sorted(expected - have):
        problems.append(f"{wheel.name}: missing {f}")
    # auditwheel repair (release builds) grafts external libraries, e.g. libgomp, into <dist>.libs/
    grafted = {f for f in have - expected if re.match(rf"^{re.escape(dist)}\.libs/[^/]+\.so(\.[0-9.]+)?$", f)}
    # ... and records what it grafted in an SBOM (auditwheel >= 6.3)
    grafted |= {f for f in have - expected if f == f"{dist_info}/sboms/auditwheel.cdx.json"}
    for f in sorted(have - expected - grafted):
        why = " (stray: cache/VCS/test file)" if STRAY.search("/" + f) else ""
        problems.append(f"{wheel.name}: unexpected file {f}{why}")

    # Tag: a wheel with AOT libraries is py3-none-<platform>; one without is py3-none-any.
    has_so = any(n.endswith(".so") for n in have)
    want_plat = "!any" if has_so else "any"
    if (py_tag, abi_tag) != ("py3", "none") or (plat_tag == "any") != (want_plat == "any"):
        problems.append(
            f"{wheel.name}: tag {py_tag}-{abi_tag}-{plat_tag}, expected py3-none-"
            + ("<platform>" if has_so else "any")
        )
    if f"{dist_info}/WHEEL" in contents:
        purelib = b"Root-Is-Purelib: true" in contents[f"{dist_info}/WHEEL"]
        if purelib == has_so:
            problems.append(
                f"{wheel.name}: {dist_info}/WHEEL Root-Is-Purelib does not match the presence of .so files"
            )

    # Metadata: name and the torch requirement come from targets.toml.
    meta_raw = contents.get(f"{dist_info}/METADATA")
    if meta_raw:
        meta = email.parser.Parser().parsestr(meta_raw.decode())
        if meta["Name"] != target.distribution:
            problems.append(f"{wheel.name}: METADATA Name {meta['Name']!r}, expected {target.distribution!r}")
        requires = [_norm_req(r) for r in meta.get_all("Requires-Dist") or []]
        for req in target.requirements:
            if _norm_req(req) not in requires:
                problems.append(f"{wheel.name}: METADATA lacks Requires-Dist {req!r} (has {requires})")
        if meta["Requires-Python"] != ">=3.10":
            problems.append(
                f"{wheel.name}: METADATA Requires-Python {meta['Requires-Python']!r}, expected '>=3.10'"
            )

    # Build info: target, distribution, arch list and AOT list agree with the table and the files.
    if info:
        for key, want in (
            ("target", target.name),
            ("distribution", target.distribution),
            ("version", version),
        ):
            got = info.get(key)
            if key == "version":
                got = (got or "").replace("-", "_")
            if got != want:
                problems.append(f"{wheel.name}: {info_path} {key} = {info.get(key)!r}, expected {want!r}")
        shipped = sorted(
            PurePosixPath(f).name for f in have if f.startswith("opmux/kernels/aot/") and f.endswith(".so")
        )
        if sorted(info.get("aot", [])) != shipped:
            problems.append(
                f"{wheel.name}: {info_path} aot = {info.get('aot')!r} but the wheel ships {shipped}"
            )
        device_libs = [lib for lib in target.aot.libraries if lib != "cpu" and lib not in missing_ok]
        want_archs = list(target.aot.archs) if device_libs else []
        if list(info.get("archs", [])) != want_archs:
            problems.append(
                f"{wheel.name}: {info_path} archs = {info.get('archs')!r}, expected {want_archs!r}"
            )
        want_cuda = (
            {"toolkit": target.aot.toolkit, "driver": target.driver}
            if "libopmux_aot_cuda.so" in shipped
            else None
        )
        cuda = info.get("cuda")
        got_cuda = {"toolkit": cuda.get("toolkit"), "driver": cuda.get("driver")} if cuda else None
        if got_cuda != want_cuda:
            problems.append(f"{wheel.name}: {info_path} cuda = {cuda!r}, expected {want_cuda!r}")
        for lib in info.get("aot_missing", {}):
            if lib not in missing_ok:
                problems.append(f"{wheel.name}: AOT library for {lib} left out: {info['aot_missing'][lib]}")

    problems += _check_device_code(wheel, target, have)

    size_mb = wheel.stat().st_size / 1e6
    if size_mb > target.wheel_size_mb:
        problems.append(
            f"{wheel.name}: {size_mb:.1f} MB exceeds the {target.wheel_size_mb:g} MB budget of target "
            f"{target.name!r} (targets.toml wheel_size_mb)"
        )
    return problems


def _check_bridges(wheel: str, info: dict, target: _targets.Target) -> list[str]:
    """Every torch release of the target's ``bridge_torch`` has its bridge, recorded in the build
    info (the files themselves are in the golden list from there), or was left out because the
    build machine could not compile or fetch it (OPMUX_REQUIRE_AOT=1 refuses that at build time)."""
    if not info:
        return []
    built = {entry.get("requested") for entry in info.get("bridges", {}).values()}
    missing = info.get("bridges_missing", {})
    out = []
    for version in target.bridge_torch:
        why = missing.get(version, {})
        if version in built or why.get("why") in ("toolchain", "torch"):
            continue
        reason = f": {why.get('message')}" if why else ""
        out.append(f"{wheel}: no torch bridge for torch {version} (targets.toml bridge_torch){reason}")
    extra = sorted(v for v in built if v not in target.bridge_torch)
    if extra:
        out.append(f"{wheel}: torch bridges for {extra}, which targets.toml bridge_torch does not list")
    return out


def _check_device_code(wheel: Path, target: _targets.Target, have: set[str]) -> list[str]:
    """The CUDA AOT library holds exactly the table's cubins and PTX (read with cuobjdump)."""
    member = "opmux/kernels/aot/libopmux_aot_cuda.so"
    if member not in have:
        return []
    from tools import fatbin

    tool = fatbin.find_cuobjdump()
    if tool is None:
        return [
            f"{wheel.name}: cannot verify {member}'s device code: no cuobjdump (pip install nvidia-cuda-cuobjdump, or the CUDA toolkit)"
        ]
    with tempfile.TemporaryDirectory() as tmp, zipfile.ZipFile(wheel) as zf:
        lib = Path(zf.extract(member, tmp))
        code = fatbin.read_device_code(lib, cuobjdump=tool)
    want_cubins = set(target.aot.archs)
    want_ptx = {target.aot.ptx} if target.aot.ptx else set()
    out = []
    if set(code.cubins) != want_cubins:
        out.append(
            f"{wheel.name}: {member} holds cubins {sorted(code.cubins)}, targets.toml says {sorted(want_cubins)}"
        )
    if set(code.ptx) != want_ptx:
        out.append(
            f"{wheel.name}: {member} holds PTX {sorted(code.ptx)}, targets.toml says {sorted(want_ptx)}"
        )
    return out


def sdist_required_files(root: Path, target: _targets.Target) -> set[str]:
    """Files an sdist must contain (a subset check: setuptools adds PKG-INFO, setup.cfg, ...)."""
    # The sdist carries no target: every target's pyproject and what setup.py imports.
    table = _targets.load(Path(root) / "targets.toml")
    files = {"setup.py", "targets.toml", "README.md", "MANIFEST.in", *(t.pyproject for t in table.values())}
    files |= {"tools/__init__.py", "tools/targets.py", "tools/release.py", "tools/torch_bridges.py"}
    files |= {p for p in _stage.source_files(root) if p.startswith(("csrc/", PKG + "/"))}
    return files


def check_sdist(sdist: Path, root: Path, target: _targets.Target) -> list[str]:
    """Every required file missing from the sdist, and every stray one (caches, objects, tests)."""
    import tarfile

    sdist = Path(sdist)
    with tarfile.open(sdist) as tf:
        members = [m.name for m in tf.getmembers() if m.isfile()]
    top = members[0].split("/", 1)[0] if members else ""
    have = {m.split("/", 1)[1] for m in members if "/" in m}
    problems = [f"{sdist.name}: missing {f}" for f in sorted(sdist_required_files(root, target) - have)]
    for f in sorted(have):
        if ".egg-info/" in f:
            continue  # setuptools' own SOURCES.txt etc.
        if STRAY.search("/" + f) or f.endswith((".so", ".o")):
            problems.append(f"{sdist.name}: unexpected file {f}")
    if not top.startswith(target.distribution.replace("-", "_")):
        problems.append(f"{sdist.name}: top directory {top!r} does not start with the distribution name")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--target", required=True)
    parser.add_argument("--root", type=Path, default=_targets.ROOT)
    parser.add_argument("artifacts", nargs="+", type=Path, help="wheel or sdist files")
    args = parser.parse_args(argv)
    target = _targets.load(args.root / "targets.toml")[args.target]
    problems = check_package_data(args.root / target.pyproject, args.root)
    for artifact in args.artifacts:
        if artifact.suffix == ".whl":
            problems += check_wheel(artifact, args.root, target)
        else:
            problems += check_sdist(artifact, args.root, target)
    for p in problems:
        print(f"FAIL {p}", file=sys.stderr)
    if not problems:
        print(
            f"wheel_check: {', '.join(a.name for a in args.artifacts)}: golden file list, metadata, tag, "
            f"build info and size budget OK for target {target.name!r}"
        )
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
