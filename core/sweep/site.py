"""A site file: the defaults an HPC site's staff write once for their cluster (docs/cluster.md#site-file).

Found by ``core sweep --site FILE``, else ``$CORE_SITE``, else ``$XDG_CONFIG_HOME/core/site.toml``
(``~/.config/core/site.toml``), else ``/etc/core/site.toml``. It gives a Slurm sweep's jobs their
account, partition, QOS, constraint, GPUs per node and binding, time limits, setup lines and a
container, and names the site's machine profiles (``--machine NAME``). The sweep file's ``[slurm]``
table and the ``--slurm-*`` flags override the site's values; the site's override nothing else.

Unlike a sweep file's values, which only ever become sbatch arguments, a site file's ``setup``
lines are shell lines of the job script: the file is the staff's, trusted as /etc/profile is.
Every other value is quoted or checked to be one plain word.
"""

from __future__ import annotations

import os
import re
import shlex
import sys
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from core.base.errors import ConfigError, ConfigErrors, did_you_mean
from core.base.machine import MachineProfile
from core.sweep.slurm_settings import SlurmSettings
from core.sweep.spec import SweepError, SweepSpec

SITE_ENVIRONMENT_VARIABLE = "CORE_SITE"
#: the last place looked: the cluster's own, written by its administrators
SYSTEM_SITE_FILE = Path("/etc/core/site.toml")
MAX_SITE_FILE_BYTES = 1 << 20
_PLAIN_WORD = re.compile(r"^[^\s\x00-\x1f\x7f]+$")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_SBATCH_OPTION = re.compile(r"^--(?P<name>[A-Za-z0-9][A-Za-z0-9-]*)")
_MAX_MINUTES = 365 * 24 * 60


def _plain(value: str | None) -> str | None:
    if value is not None and not _PLAIN_WORD.match(value):
        raise ValueError("one word: no spaces or control characters, not empty")
    return value


class SiteSlurm(BaseModel):
    """The ``[slurm]`` table of a site file: each value an ``#SBATCH`` line of every job's script."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    account: str | None = Field(default=None, description="sbatch --account")
    partition: str | None = Field(default=None, description="sbatch --partition")
    qos: str | None = Field(default=None, description="sbatch --qos")
    constraint: str | None = Field(default=None, description="sbatch --constraint (node features, e.g. 'a100&ib')")
    gpus_per_node: int | None = Field(default=None, ge=0, le=64, description="sbatch --gpus-per-node")
    gpu_bind: str | None = Field(default=None, description="sbatch --gpu-bind (e.g. 'closest', 'none')")
    time_limit_minutes: int | None = Field(
        default=None, ge=1, le=_MAX_MINUTES, description="a job's --time where the sweep's [slurm] names none"
    )
    max_time_limit_minutes: int | None = Field(
        default=None, ge=1, le=_MAX_MINUTES, description="the longest --time a sweep's job may ask for"
    )

    _plain_names = field_validator("account", "partition", "qos", "constraint", "gpu_bind")(_plain)


#: (site field, sbatch long option) of each #SBATCH line a site file may give, in the script's order
SITE_DIRECTIVES: tuple[tuple[str, str], ...] = (
    ("account", "account"),
    ("partition", "partition"),
    ("qos", "qos"),
    ("constraint", "constraint"),
    ("gpus_per_node", "gpus-per-node"),
    ("gpu_bind", "gpu-bind"),
)


class SiteContainer(BaseModel):
    """The ``[container]`` table: the image each job's worker runs inside."""

    model_config = ConfigDict(extra="forbid", strict=True)

    runtime: Literal["apptainer", "pyxis"] = Field(
        description="apptainer: `apptainer exec FLAGS IMAGE`; pyxis: `srun --container-image=IMAGE FLAGS`"
    )
    image: str = Field(min_length=1, description="a .sif file or an image reference the runtime takes")
    python: str = Field(default="python3", min_length=1, description="the interpreter with core inside the image")
    flags: list[str] = Field(
        default_factory=list,
        max_length=64,
        description="words after `apptainer exec` (or srun's options) for every job, e.g. '--bind=/scratch'",
    )
    accelerator_flags: dict[str, list[str]] = Field(
        default_factory=dict,
        description="further words for the cells of each accelerator (core knows no vendor): "
        "nvidia = ['--nv'], amd = ['--rocm']",
    )

    @field_validator("image", "python")
    @classmethod
    def _one_word(cls, value: str) -> str:
        return _plain(value) or value

    @field_validator("flags")
    @classmethod
    def _words(cls, words: list[str]) -> list[str]:
        for word in words:
            _plain(word)
        return words

    @field_validator("accelerator_flags")
    @classmethod
    def _words_by_accelerator(cls, table: dict[str, list[str]]) -> dict[str, list[str]]:
        for accelerator, words in table.items():
            _plain(accelerator)
            for word in words:
                _plain(word)
        return table


class SiteFile(BaseModel):
    """A site file, as read (docs/cluster.md#site-file)."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    setup: list[str] = Field(
        default_factory=list,
        max_length=256,
        description="shell lines each job runs before core ('module load cuda/12.4', 'export NCCL_DEBUG=WARN')",
    )
    slurm: SiteSlurm = Field(default_factory=SiteSlurm, description="the site's sbatch defaults")
    container: SiteContainer | None = Field(default=None, description="an image each job's worker runs inside")
    machines: dict[str, dict[str, Any]] = Field(
        default_factory=dict, description="the site's machine profiles by node type: --machine NAME"
    )

    @field_validator("setup")
    @classmethod
    def _shell_lines(cls, lines: list[str]) -> list[str]:
        for line in lines:
            if not line.strip() or _CONTROL.search(line.replace("\t", " ")):
                raise ValueError("each setup line is one line of shell, not empty, without control characters")
        return lines


@dataclass(frozen=True)
class Site:
    """A site file found and validated: where it is, how it was found, what it says."""

    path: Path
    found_by: str
    settings: SiteFile
    machines: Mapping[str, MachineProfile]

    def applied_to(self, spec: SweepSpec) -> SweepSpec:
        """``spec`` with the site's default time limit where its ``[slurm]`` names none; ConfigError
        where the jobs would ask for more than the site's maximum."""
        slurm = spec.slurm or SlurmSettings()
        default = self.settings.slurm.time_limit_minutes
        if slurm.time_limit_minutes is None and default is not None:
            slurm = slurm.model_copy(update={"time_limit_minutes": default})
            spec = spec.model_copy(update={"slurm": slurm})
        maximum = self.settings.slurm.max_time_limit_minutes
        asked = slurm.job_time_limit_minutes(spec.timeout_seconds)
        if maximum is not None and asked > maximum:
            field, value = (
                ("slurm.time_limit_minutes", slurm.time_limit_minutes)
                if slurm.time_limit_minutes is not None
                else ("timeout_seconds", spec.timeout_seconds)
            )
            raise ConfigError(
                field,
                value,
                f"a job of at most {maximum} minutes, the site's max_time_limit_minutes (site file {self.path}); "
                f"this asks for {asked}",
            )
        return spec

    def directives(self, sweep: SlurmSettings | None) -> list[str]:
        """The ``#SBATCH`` lines of the site's values that the sweep's own settings leave to it."""
        given = _options_given(sweep or SlurmSettings())
        lines = []
        for field, option in SITE_DIRECTIVES:
            value = getattr(self.settings.slurm, field)
            if value is not None and option not in given:
                lines.append(f"#SBATCH --{option}={value}")
        return lines

    def job_lines(self, accelerator: str, sweep: SlurmSettings | None) -> JobLines:
        """What the site puts into the script of one job whose cell runs on ``accelerator``."""
        return JobLines(
            directives=tuple(self.directives(sweep)),
            setup=tuple(self.settings.setup),
            container=tuple(container_words(self.settings.container, accelerator)),
            python=self.settings.container.python if self.settings.container else None,
            source=str(self.path),
        )

    def check_accelerators(self, known: Collection[str]) -> None:
        """Refuse a ``container.accelerator_flags`` key no loaded plugin registers: its flags would
        silently never apply (``nvida = ['--nv']``)."""
        container = self.settings.container
        for name in container.accelerator_flags if container else ():
            if name not in known:
                raise ConfigError(
                    "container.accelerator_flags",
                    name,
                    f"a registered accelerator ({', '.join(sorted(known))}){did_you_mean(name, known)} "
                    f"(site file {self.path})",
                )


@dataclass(frozen=True)
class JobLines:
    """A site's part of one job's script: its #SBATCH lines, setup lines and container words."""

    directives: tuple[str, ...] = ()
    setup: tuple[str, ...] = ()
    container: tuple[str, ...] = ()  # the words before the interpreter; none: no container
    python: str | None = None  # the interpreter inside the container
    source: str = ""

    def header(self) -> str:
        """The lines after the script's first comment: #SBATCH lines first (sbatch reads them only
        before the first command), then the setup, where a failing line ends the job at once."""
        lines = list(self.directives)
        if self.setup:
            lines += [
                f"# the site's setup ({self.source}): a failing line ends the job",
                "set -e",
                *self.setup,
                "set +e",
            ]
        return "".join(f"{line}\n" for line in lines)

    def worker(self, arguments: Sequence[str]) -> str:
        """The worker's command line: this interpreter, or the container's inside it."""
        python = self.python if self.container and self.python else sys.executable
        return " ".join(shlex.quote(word) for word in (*self.container, python, *arguments))


def container_words(container: SiteContainer | None, accelerator: str) -> list[str]:
    """The words that run a command inside the site's container, for a cell of ``accelerator``."""
    if container is None:
        return []
    flags = [*container.flags, *container.accelerator_flags.get(accelerator, [])]
    if container.runtime == "apptainer":
        return ["apptainer", "exec", *flags, container.image]
    # One task: the worker starts a multi-node run's other processes itself.
    return ["srun", "--nodes=1", "--ntasks=1", f"--container-image={container.image}", *flags]


def _options_given(sweep: SlurmSettings) -> set[str]:
    """The sbatch long options the sweep's own settings give (a field, or ``extra_options``, where a
    beginning of an option stands for it, as sbatch reads it)."""
    given = {
        option
        for field, option in SITE_DIRECTIVES
        if field in SlurmSettings.model_fields and getattr(sweep, field) is not None
    }
    for option in sweep.extra_options:
        match = _SBATCH_OPTION.match(option)
        if match is None:
            continue
        name = match.group("name")
        given |= {site_option for _, site_option in SITE_DIRECTIVES if site_option.startswith(name)}
    return given


# --- finding and reading ---------------------------------------------------------------------


def site_file_candidates(environ: Mapping[str, str]) -> list[tuple[Path, str]]:
    """Where a site file is looked for when ``--site`` is not given, each with how it is named."""
    candidates = []
    if environ.get(SITE_ENVIRONMENT_VARIABLE):
        candidates.append((Path(environ[SITE_ENVIRONMENT_VARIABLE]), f"${SITE_ENVIRONMENT_VARIABLE}"))
    config_home = environ.get("XDG_CONFIG_HOME") or os.path.join(environ.get("HOME", "~"), ".config")
    candidates.append((Path(os.path.expanduser(config_home)) / "core" / "site.toml", "$XDG_CONFIG_HOME/core/site.toml"))
    candidates.append((SYSTEM_SITE_FILE, str(SYSTEM_SITE_FILE)))
    return candidates


def find_site(option: str | Path | None = None, environ: Mapping[str, str] | None = None) -> Site | None:
    """The site file in force, validated: ``option`` (``--site``), else ``$CORE_SITE``, else the
    user's, else the system's; None where none is given and none exists.

    :raises SweepError: a file named by ``--site`` or ``$CORE_SITE`` is missing, or one is unreadable.
    :raises ConfigError: naming the site file, the field, the value and what is allowed.
    """
    environ = os.environ if environ is None else environ
    if option is not None:
        return load_site(Path(option), "--site")
    for path, found_by in site_file_candidates(environ):
        named = found_by == f"${SITE_ENVIRONMENT_VARIABLE}"
        if named or os.path.lexists(path):
            return load_site(path, found_by)
    return None


def load_site(path: Path, found_by: str = "--site") -> Site:
    """Read and validate the site file at ``path`` (``found_by`` names how it was found)."""
    from core.base.files import describe_os_error

    try:
        with open(path, "rb") as stream:
            data = stream.read(MAX_SITE_FILE_BYTES + 1)
    except OSError as error:
        raise SweepError(f"site file {path} (from {found_by}): cannot be read: {describe_os_error(error)}") from None
    if len(data) > MAX_SITE_FILE_BYTES:
        raise SweepError(f"site file {path} is larger than 1 MiB; a site file holds settings, not data")
    try:
        if sys.version_info >= (3, 11):
            import tomllib
        else:  # pragma: no cover - Python 3.10
            import tomli as tomllib
        document = tomllib.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as error:
        raise SweepError(f"cannot parse site file {path}: {error}") from None
    settings = _validated(path, document)
    return Site(path=path, found_by=found_by, settings=settings, machines=_machines(path, settings.machines))


def _errors_in(path: Path, errors: list[ConfigError]) -> ConfigError:
    named = [ConfigError(e.field, e.value, f"{e.allowed} (site file {path})", missing=e.missing) for e in errors]
    return named[0] if len(named) == 1 else ConfigErrors(named)


def _validated(path: Path, document: dict[str, Any]) -> SiteFile:
    from core.base.config import config_errors

    try:
        return SiteFile.model_validate(document)
    except ValidationError as error:
        raise _errors_in(path, config_errors(error, SiteFile, unknown="unknown setting; a site file has")) from None


def _machines(path: Path, tables: Mapping[str, Mapping[str, Any]]) -> dict[str, MachineProfile]:
    """The ``[machines.NAME]`` tables as profiles named NAME (a ``name`` key, if any, must agree)."""
    from core.base.config import config_errors

    profiles = {}
    for name, table in tables.items():
        if not isinstance(table, Mapping):
            raise _errors_in(path, [ConfigError(f"machines.{name}", table, "a table of a machine profile's figures")])
        if table.get("name", name) != name:
            raise _errors_in(path, [ConfigError(f"machines.{name}.name", table["name"], f"{name!r}, the table's own")])
        try:
            profiles[name] = MachineProfile.model_validate({**table, "name": name})
        except ValidationError as error:
            problems = config_errors(
                error, MachineProfile, unknown="unknown profile key; allowed", prefix=f"machines.{name}"
            )
            raise _errors_in(path, problems) from None
    return profiles


def describe_site(site: Site | None, environ: Mapping[str, str] | None = None) -> list[str]:
    """``core sweep --print-site``: which file was found and what it sets, one line a value."""
    if site is None:
        places = ", ".join(f"{path} ({how})" for path, how in site_file_candidates(environ or os.environ))
        return [f"no site file: --site not given, ${SITE_ENVIRONMENT_VARIABLE} not set, none at {places}"]
    lines = [f"site file {site.path} (found by {site.found_by})"]
    settings = site.settings
    for field, value in settings.slurm.model_dump(exclude_none=True).items():
        lines.append(f"  slurm.{field} = {value!r}")
    lines += [f"  setup: {line}" for line in settings.setup]
    if settings.container is not None:
        lines.append(f"  container: {' '.join(container_words(settings.container, '<accelerator>'))}")
        for accelerator, flags in settings.container.accelerator_flags.items():
            lines.append(f"  container flags for {accelerator} cells: {' '.join(flags)}")
    for name, profile in site.machines.items():
        lines.append(f"  machine {name}: {profile.devices} x {profile.device} ({profile.accelerator})")
    if len(lines) == 1:
        lines.append("  (sets nothing)")
    return lines
