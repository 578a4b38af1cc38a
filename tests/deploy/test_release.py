"""A release is one version everywhere and a reproducible image: pyproject's version (what
`mpsched --version` prints) is every kustomization's mpsched image tag and CHANGELOG's newest
entry, and `scripts/release check` catches each place that disagrees; the locks pin every
dependency with hashes and the Dockerfile installs from them alone, on a base pinned to an
exact release; and every root, under the documented overlay that sets a registry, renders no
unqualified image."""

from __future__ import annotations

import re
import shutil
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

import release
from extender.cli import version as installed_version
from tests.deploy.manifests import DEPLOY, REPO, images, overlay, render, render_dir, roots

PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
VERSION = PYPROJECT["project"]["version"]
REGISTRY = "registry.example.com/platform"


def test_pyproject_the_image_tags_and_the_changelog_agree() -> None:
    assert release.version_problems() == []
    assert set(release.image_tags()) == {
        "deploy/cluster-scheduler/kustomization.yaml",
        "deploy/own-scheduler/kustomization.yaml",
    }
    assert release.changelog_entries()[0][0] == VERSION
    # What the installed command reports (an editable install: installed from this pyproject).
    assert installed_version() == VERSION
    for root in roots():
        ours = [i for i in images(render(root)) if i.split(":")[0].endswith("mpsched")]
        assert ours and all(i.endswith(f":{VERSION}") for i in ours), (root, ours)


@pytest.fixture
def copy(tmp_path: Path) -> Path:
    """The files that carry the version, copied."""
    for name in ("pyproject.toml", "CHANGELOG.md", "extender/__init__.py"):
        (tmp_path / name).parent.mkdir(exist_ok=True)
        shutil.copy(REPO / name, tmp_path / name)
    shutil.copytree(DEPLOY, tmp_path / "deploy")
    return tmp_path


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))


def test_the_check_names_each_place_that_disagrees(copy: Path) -> None:
    assert release.version_problems(copy) == []
    _edit(
        copy / "deploy/own-scheduler/kustomization.yaml", f'newTag: "{VERSION}"', 'newTag: "9.9.9"'
    )
    _edit(copy / "CHANGELOG.md", f"## [{VERSION}]", "## [9.9.8]")
    _edit(copy / "extender/__init__.py", f'"{VERSION}"', '"9.9.7"')
    assert release.version_problems(copy) == [
        f"extender/__init__.py: __version__ '9.9.7', pyproject says '{VERSION}'",
        f"deploy/own-scheduler/kustomization.yaml: image tag '9.9.9', pyproject says '{VERSION}'",
        f"CHANGELOG.md: newest entry '9.9.8', pyproject says '{VERSION}'",
    ]
    _edit(copy / "pyproject.toml", f'version = "{VERSION}"', 'version = "1.0"')
    assert "pyproject.toml: version '1.0' is not X.Y.Z" in release.version_problems(copy)


def _lock(name: str) -> dict[str, tuple[Version, int]]:
    """A pip-compile lock: name → (pinned version, number of hashes)."""
    pins: dict[str, tuple[Version, int]] = {}
    current = ""
    for line in (REPO / name).read_text().splitlines():
        found = re.match(r"^([A-Za-z0-9._-]+)==([^\s\\]+)", line)
        if found:
            current = canonicalize_name(found[1])
            pins[current] = (Version(found[2]), 0)
        elif "--hash=sha256:" in line:
            version, hashes = pins[current]
            pins[current] = (version, hashes + 1)
        elif line.strip() and not line.lstrip().startswith("#"):
            raise AssertionError(f"{name}: unexpected line {line!r}")
    return pins


def _satisfied(requirements: list[str], pins: dict[str, tuple[Version, int]]) -> None:
    for text in requirements:
        req = Requirement(text)
        name = canonicalize_name(req.name)
        assert name in pins, f"{name} is not locked"
        assert req.specifier.contains(pins[name][0], prereleases=True), (text, pins[name])


def test_the_locks_pin_every_dependency_with_hashes() -> None:
    runtime = _lock("requirements.lock")
    build = _lock("requirements-build.lock")
    for pins in (runtime, build):
        assert all(hashes >= 1 for _, hashes in pins.values()), pins
    project = PYPROJECT["project"]
    _satisfied([*project["dependencies"], *project["optional-dependencies"]["fast"]], runtime)
    # Nothing of the simulator or the dev tools in the image.
    assert not {"numpy", "matplotlib", "pytest", "mypy"} & set(runtime)
    compile_requires = ["mypy>=1.10"]  # tools/mpsched_build.py's COMPILE_REQUIRES
    _satisfied([*PYPROJECT["build-system"]["requires"], *compile_requires], build)
    # A package in both is the same version in both (the build runs beside the runtime's).
    for name in set(runtime) & set(build):
        assert runtime[name][0] == build[name][0], name


def test_the_dockerfile_installs_from_the_locks_on_a_pinned_base() -> None:
    text = re.sub(r"\\\n", " ", (REPO / "Dockerfile").read_text())
    installs = [line for line in text.splitlines() if "pip install" in line]
    for lock in ("requirements.lock", "requirements-build.lock"):
        (line,) = [i for i in installs if f"-r {lock}" in i]
        assert "--require-hashes" in line and "--no-deps" in line, line
    # The project itself: built with no index, installed with no index and no dependencies.
    assert re.search(r"pip wheel --no-deps --no-build-isolation --no-index\b", text)
    assert re.search(r"pip install --no-deps --no-index /wheels/mpsched-", text)
    bases = release.base_images()
    assert len(bases) == 2 and len({image for image, _ in bases}) == 1, bases
    image = bases[0][0]
    # An exact Python release on a named Debian release, not a floating tag like 3.11-slim.
    assert re.fullmatch(r"python:3\.11\.\d+-slim-(bookworm|trixie)", image), image
    header = (REPO / "requirements.lock").read_text()
    assert "autogenerated by pip-compile with Python 3.11" in header


@pytest.mark.parametrize("root", roots())
def test_every_root_with_a_registry_set_renders_no_unqualified_image(
    root: str, tmp_path: Path
) -> None:
    bare = images(render(root))
    assert f"mpsched:{VERSION}" in bare  # without the overlay: no registry
    images_field = [{"name": "mpsched", "newName": f"{REGISTRY}/mpsched"}]
    rendered = images(render_dir(overlay(tmp_path / "mine", root, images=images_field)))
    assert len(rendered) == len(bare)
    for image in rendered:
        host = image.split("/")[0]
        assert "/" in image and ("." in host or ":" in host or host == "localhost"), image
        assert re.search(r":[\w.-]+$|@sha256:[0-9a-f]{64}$", image), f"{image}: no tag"
    assert f"{REGISTRY}/mpsched:{VERSION}" in rendered


def test_set_version_moves_every_place_together(copy: Path) -> None:
    release.set_version("0.2.0", copy)
    assert release.version_problems(copy) == []
    assert release.pyproject_version(copy) == "0.2.0"
    assert set(release.image_tags(copy).values()) == {"0.2.0"}
    newest, previous = release.changelog_entries(copy)[:2]
    assert newest == ("0.2.0", "Unreleased") and previous[0] == VERSION


def _documented_overlay() -> str:
    """The overlay docs/installing.md tells users to write, its two blocks joined."""
    text = (REPO / "docs" / "installing.md").read_text()
    blocks: list[str] = re.findall(r"```\n(.*?)```", text, re.S)
    main = next(b for b in blocks if b.startswith("# mine/kustomization.yaml"))
    extra = next(b for b in blocks if b.startswith("configMapGenerator:"))
    return main + extra


def test_the_overlay_the_install_docs_show_renders_as_they_say(tmp_path: Path) -> None:
    (tmp_path / "mpsched").symlink_to(REPO)  # the checkout beside `mine/`
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "kustomization.yaml").write_text(_documented_overlay())
    mine_config = (REPO / "config" / "mpsched.yaml").read_text() + "# mine\n"
    (mine / "mpsched.yaml").write_text(mine_config)
    objects = render_dir(mine)
    assert sorted(set(images(objects))) == [
        f"{REGISTRY}/mpsched:{VERSION}",
        "registry.k8s.io/kube-scheduler:v1.33.4",
    ]
    (agent,) = [d for d in objects if d["kind"] == "DaemonSet"]
    assert agent["spec"]["template"]["spec"]["runtimeClassName"] == "nvidia"
    configs = [d for d in objects if d["metadata"]["name"] == "mpsched-config"]
    assert sorted(d["metadata"]["namespace"] for d in configs) == ["mpsched-node", "mpsched-system"]
    assert all(d["data"]["mpsched.yaml"] == mine_config for d in configs)


def test_the_docs_state_the_supported_range_the_code_checks() -> None:
    from extender.commands.preflight_versions import SUPPORTED_MINORS

    supported = f"1.{SUPPORTED_MINORS[0]} to 1.{SUPPORTED_MINORS[-1]}"
    installing = (REPO / "docs" / "installing.md").read_text()
    assert f"**Kubernetes {supported}**" in installing and "`SUPPORTED_MINORS`" in installing
    for minor in SUPPORTED_MINORS:
        assert f"| 1.{minor} | `deploy/components/kube-scheduler-1.{minor}`" in installing
    design = (REPO / "docs" / "design.md").read_text()
    assert f"The API server {supported}" in design
