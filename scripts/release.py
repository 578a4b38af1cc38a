"""The release tool behind `scripts/release` (docs/releasing.md). Not run in CI: a maintainer
runs it, on a machine with docker and the network.

One version, `X.Y.Z`, in the places that must agree: pyproject.toml's `version` (what
`mpsched --version` prints), `extender.__version__` (the metrics' `mpsched_build_info`), the
`newTag` of the `mpsched` image in every kustomization that
sets it (the image the manifests run), the newest entry of CHANGELOG.md, and the git tag
`vX.Y.Z` that `build` creates. `check` says where they disagree; tests/deploy/test_release.py
runs the same check on every commit.

    scripts/release check                 # the versions agree, the locks and the base are pinned
    scripts/release set-version X.Y.Z     # pyproject, every newTag, a CHANGELOG heading
    scripts/release lock                  # requirements.lock, requirements-build.lock (pip-tools)
    scripts/release pin-base              # the Dockerfile's base image by digest (docker pull)
    scripts/release build --registry R [--push]   # docker build -t R/mpsched:X.Y.Z, tag vX.Y.Z
"""

from __future__ import annotations

import argparse
import datetime as dt
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
IMAGE = "mpsched"
#: The package's own `__version__` line.
PACKAGE_VERSION = re.compile(r'(?m)^__version__ = "(?P<version>[^"]*)"$')
VERSION = re.compile(r"^\d+\.\d+\.\d+$")
#: A CHANGELOG entry's heading: "## [0.1.0] - 2026-12-05", or "- Unreleased" until released.
CHANGELOG_ENTRY = re.compile(r"^## \[(?P<version>[^\]]+)\] - (?P<date>\S+)\s*$", re.MULTILINE)
#: The base image in the Dockerfile's FROM lines: an exact tag, and a digest once pinned.
BASE = re.compile(r"^FROM (?P<image>python:[0-9.]+-slim-\w+)(?P<digest>@sha256:[0-9a-f]{64})?",
                  re.MULTILINE)  # fmt: skip
LOCKS = {
    # lock file: (source, pip-compile options)
    "requirements.lock": ("pyproject.toml", ["--extra", "fast", "--strip-extras"]),
    "requirements-build.lock": ("requirements-build.in", ["--strip-extras"]),
}


class ReleaseError(Exception):
    """A step that cannot go on; the message says why and what to do."""


def pyproject_version(root: Path = ROOT) -> str:
    version: str = tomllib.loads((root / "pyproject.toml").read_text())["project"]["version"]
    return version


def image_tags(root: Path = ROOT) -> dict[str, str]:
    """Every kustomization under deploy/ that sets the mpsched image's tag → that tag."""
    tags = {}
    for path in sorted((root / "deploy").rglob("kustomization.yaml")):
        doc = yaml.safe_load(path.read_text()) or {}
        for image in doc.get("images") or []:
            if image.get("name") == IMAGE and "newTag" in image:
                tags[path.relative_to(root).as_posix()] = str(image["newTag"])
    return tags


def changelog_entries(root: Path = ROOT) -> list[tuple[str, str]]:
    """(version, date or "Unreleased") of every CHANGELOG.md entry, newest first."""
    text = (root / "CHANGELOG.md").read_text()
    return [(m["version"], m["date"]) for m in CHANGELOG_ENTRY.finditer(text)]


def version_problems(root: Path = ROOT) -> list[str]:
    """Where the version's places disagree; [] when they all say pyproject's version."""
    version = pyproject_version(root)
    problems = []
    if not VERSION.match(version):
        problems.append(f"pyproject.toml: version {version!r} is not X.Y.Z")
    package = PACKAGE_VERSION.search((root / "extender" / "__init__.py").read_text())
    if package is None or package["version"] != version:
        found = package["version"] if package else None
        problems.append(f"extender/__init__.py: __version__ {found!r}, pyproject says {version!r}")
    tags = image_tags(root)
    if not tags:
        problems.append("deploy/: no kustomization sets the mpsched image's newTag")
    problems += [
        f"{path}: image tag {tag!r}, pyproject says {version!r}"
        for path, tag in tags.items()
        if tag != version
    ]
    entries = changelog_entries(root)
    if not entries:
        problems.append("CHANGELOG.md: no '## [X.Y.Z] - DATE' entry")
    elif entries[0][0] != version:
        problems.append(f"CHANGELOG.md: newest entry {entries[0][0]!r}, pyproject says {version!r}")
    return problems


def base_images(root: Path = ROOT) -> list[tuple[str, str]]:
    """(image, digest or "") of each of the Dockerfile's FROM lines."""
    text = (root / "Dockerfile").read_text()
    return [(m["image"], (m["digest"] or "").lstrip("@")) for m in BASE.finditer(text)]


def _run(*argv: str, capture: bool = False) -> str:
    try:
        done = subprocess.run(argv, cwd=ROOT, check=True, text=True, capture_output=capture)
    except FileNotFoundError as exc:
        raise ReleaseError(f"{argv[0]} is not installed") from exc
    except subprocess.CalledProcessError as exc:
        raise ReleaseError(
            f"{' '.join(argv)} failed ({exc.returncode}): {exc.stderr or ''}"
        ) from exc
    return done.stdout or ""


def set_version(version: str, root: Path = ROOT) -> None:
    if not VERSION.match(version):
        raise ReleaseError(f"{version!r} is not X.Y.Z")
    path = root / "pyproject.toml"
    text, count = re.subn(r'(?m)^version = "[^"]*"$', f'version = "{version}"', path.read_text())
    if count != 1:
        raise ReleaseError("pyproject.toml: no single 'version = ...' line")
    path.write_text(text)
    package = root / "extender" / "__init__.py"
    package.write_text(PACKAGE_VERSION.sub(f'__version__ = "{version}"', package.read_text()))
    for rel in image_tags(root):
        kpath = root / rel
        ktext = re.sub(r'(?m)^(\s*newTag:\s*)"?[^"\s]*"?$', rf'\g<1>"{version}"', kpath.read_text())
        kpath.write_text(ktext)
    if not any(v == version for v, _ in changelog_entries(root)):
        log = root / "CHANGELOG.md"
        head, sep, rest = log.read_text().partition("\n## [")
        log.write_text(f"{head}\n## [{version}] - Unreleased\n\n- (what changed)\n{sep}{rest}")


def lock() -> None:
    for target, (source, options) in LOCKS.items():
        _run("pip-compile", "--quiet", "--generate-hashes", "--allow-unsafe", "--no-emit-index-url",
             "--no-emit-find-links", *options, "-o", target, source)  # fmt: skip


def pin_base() -> None:
    images = {image for image, _ in base_images()}
    if len(images) != 1:
        raise ReleaseError(f"Dockerfile: expected one base image in its FROM lines, found {images}")
    (image,) = images
    _run("docker", "pull", image)
    repo_digest = _run("docker", "image", "inspect", "--format", "{{index .RepoDigests 0}}",
                       image, capture=True).strip()  # fmt: skip
    digest = repo_digest.rpartition("@")[2]
    if not re.fullmatch(r"sha256:[0-9a-f]{64}", digest):
        raise ReleaseError(f"docker gave no digest for {image}: {repo_digest!r}")
    path = ROOT / "Dockerfile"
    path.write_text(BASE.sub(lambda m: f"FROM {m['image']}@{digest}", path.read_text()))
    print(f"Dockerfile: {image}@{digest}; commit it")


def build(registry: str, *, push: bool) -> None:
    problems = version_problems()
    version = pyproject_version()
    entries = changelog_entries()
    if entries and entries[0][1] == "Unreleased":
        problems.append(f"CHANGELOG.md: give [{version}] its date ({dt.date.today()})")
    problems += [f"Dockerfile: {image} has no digest (scripts/release pin-base)"
                 for image, digest in base_images() if not digest]  # fmt: skip
    if _run("git", "status", "--porcelain", capture=True).strip():
        problems.append("the work tree has uncommitted changes")
    if problems:
        raise ReleaseError("not releasable: " + "; ".join(problems))
    ref = f"{registry.rstrip('/')}/{IMAGE}:{version}"
    _run("docker", "build", "--pull=false", "-t", ref, ".")
    _run("git", "tag", "-a", f"v{version}", "-m", f"mpsched {version}")
    if push:
        _run("docker", "push", ref)
    print(f"built {ref}, tagged v{version}; push the tag: git push origin v{version}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/release", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="step", required=True)
    sub.add_parser("check")
    sub.add_parser("set-version").add_argument("version")
    sub.add_parser("lock")
    sub.add_parser("pin-base")
    b = sub.add_parser("build")
    b.add_argument("--registry", required=True, help="e.g. registry.example.com/platform")
    b.add_argument("--push", action="store_true")
    args = parser.parse_args(argv)
    try:
        match args.step:
            case "check":
                problems = version_problems()
                for problem in problems:
                    print(problem, file=sys.stderr)
                if not problems:
                    print(f"mpsched {pyproject_version()}: pyproject, image tags, CHANGELOG agree")
                return 1 if problems else 0
            case "set-version":
                set_version(args.version)
            case "lock":
                lock()
            case "pin-base":
                pin_base()
            case "build":
                build(args.registry, push=args.push)
    except ReleaseError as exc:
        print(f"scripts/release: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
