"""Backend descriptors: the ``backends/*.yaml`` files, their schema, and where they are found.

A descriptor says what a backend is (device type, how to detect it, which distributed backend it
uses), what it can do (declared capabilities), what is known to fail on it (test-id patterns with a
reason and a link), and how the relay treats its downstream repository (trust level, label).

This module is torch-free on purpose: the relay reads descriptors as its allowlist and must run
without torch. Detection and capability probing, which need torch, live in ``conformance.detect``
and ``conformance.capabilities``.
"""

from __future__ import annotations

import datetime
import enum
import functools
import os
import re
from pathlib import Path
from typing import Literal

import yaml
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import Version
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

__all__ = [
    "CAPABILITIES",
    "BackendDescriptor",
    "Capability",
    "DescriptorError",
    "Detect",
    "KnownFailure",
    "QuarantinedTest",
    "RelayTarget",
    "Semantics",
    "Tolerance",
    "TrustLevel",
    "descriptor_dirs",
    "load_descriptor",
    "load_descriptors",
    "packaged_backends_dir",
    "torch_in_bound",
]

ENV_BACKENDS_DIR = "CONFORMANCE_BACKENDS_DIR"


class Capability(str, enum.Enum):
    """A feature a backend may have; tests ask for them with ``@requires(...)``."""

    collectives = "collectives"
    dtensor = "dtensor"
    compile = "compile"
    aot_compile = "aot_compile"
    symmetric_memory = "symmetric_memory"
    put_signal = "put_signal"
    bf16 = "bf16"
    parallelisms = "parallelisms"


CAPABILITIES: tuple[str, ...] = tuple(c.value for c in Capability)


class TrustLevel(str, enum.Enum):
    """The relay's four trust levels; what each one does is the levels table in ``relay/trust.py``."""

    L1 = "L1"
    L2 = "L2"
    L3 = "L3"
    L4 = "L4"


class DescriptorError(ValueError):
    """A descriptor file is missing, unreadable or invalid; the message names file, field and fix."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Detect(_Strict):
    """How to recognise the backend on the local machine.

    ``accelerator`` is the type of ``torch.accelerator.current_accelerator(check_available=True)`` ("none"
    when no accelerator device is present, whatever torch was built for); ``torch_version`` maps attributes of ``torch.version`` to whether they must be
    set (e.g. ROCm is a ``cuda`` accelerator with ``torch.version.hip`` set).
    """

    accelerator: str = Field(description='accelerator type, or "none" for CPU-only machines')
    torch_version: dict[str, bool] = Field(default_factory=dict)

    @property
    def specificity(self) -> int:
        return 1 + len(self.torch_version)


class _TestPattern(_Strict):
    """A ``match`` compared with ``<suite>::<test name>`` (e.g.
    ``collectives::test_all_reduce[PREMUL_SUM-float32]``); ``*`` matches any run of characters and
    every other character, brackets included, is literal."""

    match: str

    @field_validator("match")
    @classmethod
    def _has_suite(cls, value: str) -> str:
        if "::" not in value:
            raise ValueError(
                f"pattern {value!r} must look like '<suite>::<test name>', e.g. "
                "'collectives::test_all_reduce[PREMUL_SUM-*]'"
            )
        return value

    def matches(self, test_id: str) -> bool:
        return _glob_regex(self.match).fullmatch(test_id) is not None


def torch_in_bound(bound: str | SpecifierSet, version: str) -> bool:
    """Whether torch ``version`` lies within the PEP 440 specifier ``bound`` (e.g. ``"<2.15"``).

    The local label is ignored (``2.14.1+cu130`` is 2.14.1). A pre-release, development or main build
    counts as after the release before it and before the release it leads to: ``2.16.0a0+git1234``
    (a build from main) and ``2.16.0.dev20260101`` (a nightly) are ``>=2.15`` and ``<2.16``. PEP 440's
    ``<`` alone would exclude pre-releases of 2.16 from ``<2.16``; a main build does not have 2.16's
    fixes yet, so here it is within. Every other operator is packaging's, with pre-releases allowed.
    """
    specifiers = SpecifierSet(bound) if isinstance(bound, str) else bound
    public = Version(Version(version).public)
    return all(public < Version(s.version) if s.operator == "<" else s.contains(public, prereleases=True)
               for s in specifiers)


class KnownFailure(_TestPattern):
    """A test-id pattern known to fail on this backend, applied as xfail or as skip; ``torch`` bounds it to
    the torch versions where it fails (outside its bound the entry does not apply)."""

    reason: str = Field(min_length=1)
    link: str = Field(min_length=1)
    mode: Literal["xfail", "skip"] = "xfail"
    min_world_size: int = Field(
        default=1, ge=1,
        description="the failure shows only with at least this many ranks (a result that depends on which "
                    "rank holds a value, data that must cross ranks); below it the test runs normally",
    )
    torch: str | None = Field(
        default=None,
        description='PEP 440 specifier of the torch versions the failure shows on, e.g. "<2.15" (fixed in 2.15) '
                    'or ">=2.14,<2.16"; unset: every version. See torch_in_bound for main and local builds',
    )

    @field_validator("torch")
    @classmethod
    def _specifier(cls, value: str | None) -> str | None:
        if value is None:
            return None
        try:
            specifiers = SpecifierSet(value)
        except InvalidSpecifier:
            raise ValueError(
                f"{value!r} is not a PEP 440 version specifier -> write e.g. \"<2.15\" (fixed in 2.15) "
                "or \">=2.14,<2.16\"") from None
        if not len(specifiers):
            raise ValueError(f"{value!r} is empty -> remove 'torch' to apply the entry to every version")
        return value

    def applies_to_torch(self, version: str | None) -> bool:
        """Whether the entry applies to torch ``version`` (None: any version)."""
        return self.torch is None or version is None or torch_in_bound(self.torch, version)


class QuarantinedTest(_TestPattern):
    """A test-id pattern whose failures the relay reports as non-blocking until ``expires``: the test
    still runs and its failures are still shown, apart, but a check's conclusion ignores them."""

    reason: str = Field(min_length=1)
    expires: datetime.date = Field(description="last day the quarantine applies")
    link: str | None = None

    def applies_on(self, day: datetime.date) -> bool:
        return day <= self.expires


class Tolerance(_Strict):
    """How far a result computed in parallel may be from a single-device reference, for one dtype."""

    rtol: float = Field(ge=0)
    atol: float = Field(ge=0)


TOLERANCE_DTYPES = ("float32", "bfloat16")


@functools.lru_cache(maxsize=None)  # every collected test is matched against every known failure
def _glob_regex(pattern: str) -> re.Pattern[str]:
    return re.compile(".*".join(re.escape(part) for part in pattern.split("*")))


class RelayTarget(_Strict):
    """How the relay treats this backend's downstream repository."""

    repository: str = Field(description="downstream repository, owner/name")
    # Required: a file cut short before it (a half-written file, a checkout in progress) must not
    # read as L1 and then as the real level again at the next reload.
    level: TrustLevel = Field(description="the backend's trust level, L1 .. L4 (no default: a trust decision is written down)")
    label: str | None = Field(default=None, description="L3 label; default ciflow/crcr/<name>")
    level_since: datetime.date | None = Field(
        default=None, description="date the backend reached its level (the level review's time at level)"
    )
    callback_token_sha256: str | None = Field(
        default=None, description="sha256 hex of a static callback token, for CI without OIDC"
    )
    quarantine: tuple[QuarantinedTest, ...] = Field(
        default=(), description="tests whose failures do not block (each with a reason and an expiry)"
    )
    repository_id: int | None = Field(
        default=None, gt=0, description="GitHub's numeric id of the repository (OIDC repository_id); unset: pinned at the first callback"
    )
    repository_owner_id: int | None = Field(
        default=None, gt=0, description="numeric id of the repository's owner (OIDC repository_owner_id); unset: pinned likewise"
    )
    workflow_ref: str | None = Field(
        default=None, max_length=500,
        description="if set, OIDC callbacks must come from this workflow (the token's workflow_ref, owner/repo/path@ref)",
    )

    @field_validator("repository")
    @classmethod
    def _owner_name(cls, value: str) -> str:
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9-]*/[A-Za-z0-9._-]+", value):
            raise ValueError(f"{value!r} is not 'owner/name'")
        return value

    @field_validator("callback_token_sha256")
    @classmethod
    def _hex_digest(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"[0-9a-f]{64}", value):
            raise ValueError("must be the 64-character lowercase sha256 hex digest of the token")
        return value


class Semantics(_Strict):
    """How the backend behaves where torch leaves it to the backend. The suite's checks read these
    instead of assuming gloo's behaviour; the defaults are gloo's (the CPU reference)."""

    wait_blocks_host: bool = Field(
        default=True,
        description="Work.wait() returns once the work is complete, so is_completed() is then True (gloo); "
                    "false: wait() only orders the current stream after the backend's (NCCL)",
    )
    p2p_tags: bool = Field(
        default=True,
        description="point-to-point messages between a pair match by tag; false: by posting order, tags ignored (NCCL)",
    )
    collective_timeout: Literal["raises", "aborts_process"] = Field(
        default="raises",
        description="a collective whose peer never comes: raises on the host when the group's timeout "
                    "passes (gloo), or its watchdog tears the rank process down (NCCL)",
    )
    ending_fails_pending_work: bool = Field(
        default=False,
        description="ending a group (abort, shutdown, destroy_process_group) with work pending completes that "
                    "work with an error (NCCL: the communicator is aborted); false: the work is left to its own "
                    "timeout (gloo)",
    )
    nan_check: str | None = Field(
        default=None,
        description="the environment variable that, set to 1 when a group is created, makes that group check "
                    "each collective's input for NaN and fail the call when it holds one (NCCL: "
                    "TORCH_NCCL_NAN_CHECK, a device-side assert); buffers a rank receives into are not checked. "
                    "null: the backend has no such check (gloo)",
    )
    sources: dict[str, str] = Field(
        default_factory=dict,
        description="for each semantic set here: the source line that says so (a link)",
    )

    @field_validator("nan_check")
    @classmethod
    def _nan_check_is_a_variable_name(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"[A-Z][A-Z0-9_]*", value):
            raise ValueError(f"{value!r} is not an environment variable's name: give the variable alone, in capitals "
                             "(e.g. TORCH_NCCL_NAN_CHECK; the suite sets it to 1), or null where the backend has no "
                             "NaN check")
        return value

    @model_validator(mode="after")
    def _sources_name_semantics(self) -> "Semantics":
        semantics = [name for name in type(self).model_fields if name != "sources"]
        unknown = sorted(set(self.sources) - set(semantics))
        if unknown:
            raise ValueError(f"sources: {', '.join(map(repr, unknown))} is not a semantic; "
                             f"allowed: {', '.join(semantics)}")
        return self


class BackendDescriptor(_Strict):
    """One ``backends/<name>.yaml`` file."""

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9_-]*$")
    description: str = ""
    device_type: str = Field(description="torch device type: cpu, cuda, xpu, or a PrivateUse1 name")
    detect: Detect
    distributed_backend: str = Field(description="gloo, nccl, xccl, or any registered name")
    setup_modules: tuple[str, ...] = Field(
        default=(), description="modules imported in every rank before the process group starts"
    )
    world_size: int | Literal["devices"] = Field(
        default=2, description='ranks of a run unless told (--world-size); "devices": one per device of the machine')
    symmetric_memory_backend: str | None = Field(
        default=None, min_length=1,
        description="allocation backend every rank selects at start, before any allocation "
                    "(torch.distributed._symmetric_memory.set_backend: NCCL, CUDA, NVSHMEM); null keeps torch's",
    )
    p2p_matching: Literal["tag", "order"] = Field(
        default="order",
        description="how a receive finds its message from one peer: 'tag' (by tag, and in posting order "
                    "among messages of one tag: gloo) or 'order' (in posting order, tags ignored: NCCL)",
    )
    capabilities: dict[str, bool]
    known_failures: tuple[KnownFailure, ...] = ()
    semantics: Semantics = Field(default_factory=Semantics)
    tolerances: dict[str, Tolerance] = Field(
        default_factory=dict,
        description="per dtype (float32, bfloat16): how far a parallel training run may be from the "
                    "single-device reference (the parallelisms suite); a dtype not listed is compared bitwise",
    )
    relay: RelayTarget | None = None
    relay_retired: str | None = Field(
        default=None, min_length=1, max_length=500,
        description="why a backend that was in the relay's allowlist left it (its relay section removed); "
                    "without it a reload keeps the backend, taking the missing section for a file cut short",
    )
    source: str = Field(default="", exclude=True, description="file the descriptor came from")

    @field_validator("capabilities")
    @classmethod
    def _known_capabilities(cls, value: dict[str, bool]) -> dict[str, bool]:
        unknown = sorted(set(value) - set(CAPABILITIES))
        if unknown:
            raise ValueError(
                f"unknown capability {', '.join(map(repr, unknown))}; "
                f"allowed: {', '.join(CAPABILITIES)}"
            )
        missing = [c for c in CAPABILITIES if c not in value]
        if missing:
            raise ValueError(
                f"capability {', '.join(map(repr, missing))} not declared; "
                "declare every capability as true or false"
            )
        return value

    @field_validator("world_size", mode="before")
    @classmethod
    def _positive_world_size(cls, value):
        if isinstance(value, int) and not isinstance(value, bool):
            if value < 1:
                raise ValueError("Input should be greater than or equal to 1")  # pydantic's own words for ge=1
            return value
        if value != "devices":
            raise ValueError(f'must be a positive number of ranks, or "devices" for one rank per device; got {value!r}')
        return value

    @field_validator("tolerances")
    @classmethod
    def _tolerance_dtypes(cls, value: dict[str, Tolerance]) -> dict[str, Tolerance]:
        unknown = sorted(set(value) - set(TOLERANCE_DTYPES))
        if unknown:
            raise ValueError(f"unknown dtype {', '.join(map(repr, unknown))}; allowed: {', '.join(TOLERANCE_DTYPES)}")
        return value

    @model_validator(mode="after")
    def _retired_without_relay(self) -> "BackendDescriptor":
        if self.relay is not None and self.relay_retired is not None:
            raise ValueError("relay_retired is set but so is relay -> remove one: relay_retired replaces the relay section")
        return self

    @model_validator(mode="after")
    def _put_signal_needs_symmetric_memory(self) -> "BackendDescriptor":
        if self.capabilities.get("put_signal") and not self.capabilities.get("symmetric_memory"):
            raise ValueError("capabilities: put_signal is true but symmetric_memory is false")
        return self

    @property
    def relay_label(self) -> str | None:
        if self.relay is None:
            return None
        return self.relay.label or f"ciflow/crcr/{self.name}"

    def declares(self, capability: str) -> bool:
        return self.capabilities[capability]

    def known_failure_for(self, test_id: str, world_size: int | None = None,
                          torch_version: str | None = None) -> KnownFailure | None:
        """The first known failure that applies to ``test_id`` in a run of ``world_size`` ranks on torch
        ``torch_version`` (None: any size, any version)."""
        return next((kf for kf in self.known_failures
                     if kf.matches(test_id) and (world_size is None or world_size >= kf.min_world_size)
                     and kf.applies_to_torch(torch_version)), None)


_PLAIN_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_-]{0,63}")


def _field_name(loc: tuple) -> str:
    """The field's dotted path; a key that is not a plain name is not echoed (it may be a line of some
    other file, a secret included)."""
    return ".".join(str(p) if isinstance(p, int) or _PLAIN_KEY.fullmatch(str(p)) else "<a key>" for p in loc)


def _position(node: yaml.Node | None, loc: tuple) -> str:
    """' (line L, column C)' of the field at ``loc``: its key, or the nearest enclosing node when it is missing."""
    found = node
    for index, part in enumerate(loc):
        child = None
        if isinstance(found, yaml.MappingNode):
            pair = next(((k, v) for k, v in found.value if isinstance(k, yaml.ScalarNode) and k.value == str(part)), None)
            if pair is not None:
                child = pair[0] if index == len(loc) - 1 else pair[1]
        elif isinstance(found, yaml.SequenceNode) and isinstance(part, int) and part < len(found.value):
            child = found.value[part]
        if child is None:
            break
        found = child
    if found is None:
        return ""
    return f" (line {found.start_mark.line + 1}, column {found.start_mark.column + 1})"


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """A YAML error's position and kind, without the text of the line (it may hold a secret)."""
    mark = getattr(exc, "problem_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    problem = getattr(exc, "problem", None) or "unreadable"
    problem = re.sub(r"'[^']{2,}'|\"[^\"]{2,}\"", "'…'", problem)  # a token's text is the line's content
    return f"not valid YAML{where}: {problem} (the line itself is not shown)"


def _fix_hint(loc: tuple, msg: str) -> str:
    field = _field_name(loc)
    if msg.startswith("Extra inputs are not permitted"):
        return f"remove '{field}' (not a descriptor field; see backends/privateuse1.yaml.template)"
    if msg.startswith("Field required"):
        return f"add '{field}'"
    return "fix the value"


# libyaml's parser where PyYAML was built with it: every process of a run loads the descriptors, and it
# parses them about ten times faster than the pure-Python one.
_FAST_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _parse_yaml(text: str):
    try:
        return yaml.load(text, Loader=_FAST_LOADER)  # noqa: S506 - a safe loader
    except yaml.YAMLError:
        return yaml.safe_load(text)  # a text libyaml refuses: the pure-Python parser's verdict and words


def load_descriptor(path: Path) -> BackendDescriptor:
    """load_descriptor(path) -> BackendDescriptor: parse and validate one YAML file.

    Raises DescriptorError naming the file, each bad field (with its line and column) and how to fix
    it; never a line's content, which may hold a secret.
    """
    try:
        text = path.read_text()
        data = _parse_yaml(text)
    except OSError as exc:
        raise DescriptorError(f"{path}: cannot read descriptor: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise DescriptorError(f"{path}: not valid YAML: not UTF-8 text") from None
    except yaml.YAMLError as exc:
        raise DescriptorError(f"{path}: {_yaml_problem(exc)}") from None
    if not isinstance(data, dict):
        raise DescriptorError(f"{path}: a descriptor is a YAML mapping, got {type(data).__name__}")
    try:
        descriptor = BackendDescriptor.model_validate({**data, "source": str(path)})
    except ValidationError as exc:
        node = yaml.compose(text, Loader=_FAST_LOADER)  # where each bad field is: only needed now
        lines = []
        for err in exc.errors():
            field = _field_name(err["loc"]) or "<root>"
            msg = err["msg"].removeprefix("Value error, ")
            lines.append(f"  {field}: {msg} -> {_fix_hint(err['loc'], err['msg'])}{_position(node, err['loc'])}")
        raise DescriptorError(f"{path}: invalid backend descriptor:\n" + "\n".join(lines)) from None
    if descriptor.name != path.stem:
        raise DescriptorError(
            f"{path}: name: {descriptor.name!r} does not match the file name -> "
            f"rename the file to {descriptor.name}.yaml or set name: {path.stem}"
        )
    return descriptor


def packaged_backends_dir() -> Path:
    """The descriptors shipped with the package (a wheel) or with the source checkout."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "_packaged_backends", here.parent / "backends"):
        if candidate.is_dir():
            return candidate
    raise DescriptorError(f"no packaged backends directory next to {here}; reinstall the package")


def descriptor_dirs(extra: str | os.PathLike | None = None) -> list[Path]:
    """Directories to load, lowest precedence first: packaged, then $CONFORMANCE_BACKENDS_DIR or extra."""
    dirs = [packaged_backends_dir()]
    user = extra if extra is not None else os.environ.get(ENV_BACKENDS_DIR)
    if user:
        path = Path(user)
        if not path.is_dir():
            source = "--backends-dir" if extra is not None else ENV_BACKENDS_DIR
            raise DescriptorError(f"{source}: {path} is not a directory -> point it at a folder of *.yaml")
        dirs.append(path)
    return dirs


def load_descriptors(extra_dir: str | os.PathLike | None = None) -> dict[str, BackendDescriptor]:
    """load_descriptors(extra_dir=None) -> {name: descriptor}.

    Loads the packaged descriptors, then those of ``extra_dir`` (or ``$CONFORMANCE_BACKENDS_DIR``);
    a user descriptor with the same name overrides the packaged one.
    """
    result: dict[str, BackendDescriptor] = {}
    for directory in descriptor_dirs(extra_dir):
        for path in sorted(directory.glob("*.yaml")):
            descriptor = load_descriptor(path)
            result[descriptor.name] = descriptor
    return result
