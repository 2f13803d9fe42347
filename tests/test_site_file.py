"""The site file (core/sweep/site.py, docs/cluster.md#site-file): found by --site, $CORE_SITE, the
user's and the system's place; validated strictly; rendered into each Slurm job's script, under the
sweep's own settings. Submission goes to the simulated Slurm of tests/slurm_support.py."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from slurm_support import SimulatedSlurm

import core.sweep.cluster
import core.sweep.site
import core.sweep.slurm_jobs
from core.base.errors import ConfigError
from core.cli import main
from core.sweep.cluster import batch_script
from core.sweep.site import find_site, load_site
from core.sweep.slurm_settings import SlurmSettings
from core.sweep.spec import SweepError, make_sweep_spec

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "site.toml"


@pytest.fixture(autouse=True)
def _no_real_site(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No site file of this machine's (the user's, /etc's) reaches a test."""
    monkeypatch.delenv("CORE_SITE", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setattr(core.sweep.site, "SYSTEM_SITE_FILE", tmp_path / "etc" / "site.toml")


@pytest.fixture
def simulated_slurm(monkeypatch: pytest.MonkeyPatch) -> SimulatedSlurm:
    slurm = SimulatedSlurm()
    monkeypatch.setattr(core.sweep.slurm_jobs, "unavailable_reason", lambda: None)
    monkeypatch.setattr(core.sweep.cluster, "make_scheduler", lambda: slurm)
    return slurm


def _site(tmp_path: Path, text: str, name: str = "site.toml") -> Path:
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def _sweep(tmp_path: Path, slurm: str = "", accelerator: str = "cpu") -> Path:
    path = tmp_path / "sim.toml"
    path.write_text(
        f'name = "sim"\nrepeats = 1\ntimeout_seconds = 60\n[grid]\nworkload = "fcnn"\naccelerator = "{accelerator}"\n'
        "steps = 2\nmicro_batch_size = 4\nworkload_options = {layers = 1, hidden_width = 8}\n"
        f"[slurm]\npoll_seconds = 5\n{slurm}"
    )
    return path


def _complete(slurm: SimulatedSlurm, poll: int) -> None:
    for job_id, job in slurm.jobs.items():
        if job["state"] == "PENDING":
            slurm.end(job_id, "COMPLETED", result="ok", exit_code=0)


def _submitted_script(slurm: SimulatedSlurm) -> str:
    (job,) = slurm.jobs.values()
    return str(job["script"])


# --- the example and validation -------------------------------------------------------------------


def test_the_shipped_example_site_file_validates() -> None:
    site = load_site(EXAMPLE)
    assert site.settings.slurm.account == "benchmarking" and site.settings.container is not None
    assert sorted(site.machines) == ["a100-node", "cpu-node"]
    assert site.machines["a100-node"].name == "a100-node" and site.machines["a100-node"].devices == 4


def test_docs_show_the_example_site_file_as_shipped() -> None:
    docs = (EXAMPLE.parents[1] / "docs" / "cluster.md").read_text()
    section = docs[docs.index("## Site file") :]
    shown = section[section.index("```toml\n") + len("```toml\n") :]
    assert shown[: shown.index("```")] == EXAMPLE.read_text()


@pytest.mark.parametrize(
    ("text", "field", "allowed"),
    [
        ("setpu = []", "setpu", "unknown setting (did you mean 'setup'?)"),
        ("[slurm]\nacount = 'x'", "slurm.acount", "did you mean 'account'?"),
        ("[slurm]\ngpus_per_node = '4'", "slurm.gpus_per_node", "integer"),
        ("[slurm]\ngpus_per_node = 65", "slurm.gpus_per_node", "less than or equal to 64"),
        ("[slurm]\npartition = 'gpu a100'", "slurm.partition", "one word"),
        ("[slurm]\ntime_limit_minutes = 0", "slurm.time_limit_minutes", "greater than or equal to 1"),
        ('setup = ["module load x\\nrm -rf /"]', "setup", "one line of shell"),
        ("setup = 'module load x'", "setup", "list"),
        ("[container]\nruntime = 'docker'\nimage = 'x.sif'", "container.runtime", "'apptainer' or 'pyxis'"),
        ("[container]\nruntime = 'apptainer'", "container.image", "required"),
        ("[container]\nruntime = 'apptainer'\nimage = 'x.sif'\nflags = ['--bind /a']", "container.flags", "one word"),
        ("[machines.gpu-node]\naccelerator = 'cpu'", "machines.gpu-node.description", "required"),
        (
            "[machines.n]\nname = 'm'\ndescription = ''\nsource = ''\naccelerator = 'cpu'\ndevice = 'x'\ndevices = 1\n"
            "precisions = ['fp32']",
            "machines.n.name",
            "the table's own",
        ),
    ],
)
def test_a_bad_site_file_is_refused_naming_the_file_the_field_the_value_and_what_is_allowed(
    tmp_path: Path, text: str, field: str, allowed: str
) -> None:
    path = _site(tmp_path, text)
    with pytest.raises(ConfigError) as caught:
        load_site(path)
    assert caught.value.field == field
    assert allowed in caught.value.allowed and f"site file {path}" in caught.value.allowed


def test_an_unknown_accelerator_in_the_container_flags_is_refused_by_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    site = _site(
        tmp_path, "[container]\nruntime = 'apptainer'\nimage = 'x.sif'\naccelerator_flags = {nvida = ['--nv']}"
    )
    assert main(["sweep", str(_sweep(tmp_path)), "--site", str(site), "--dry-run"]) == 2
    error = capsys.readouterr().err
    assert "container.accelerator_flags = 'nvida'" in error and "did you mean 'nvidia'" in error


# --- where it is found ----------------------------------------------------------------------------


def test_the_site_file_is_found_by_option_then_environment_then_user_then_system(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = {
        where: _site(tmp_path, f"[slurm]\naccount = '{where}'", f"{where}/site.toml")
        for where in ("option", "env", "user", "system")
    }
    user = tmp_path / "config" / "core" / "site.toml"
    user.parent.mkdir(parents=True)
    files["user"].rename(user)
    monkeypatch.setattr(core.sweep.site, "SYSTEM_SITE_FILE", files["system"])
    environ = {"CORE_SITE": str(files["env"]), "XDG_CONFIG_HOME": str(tmp_path / "config")}

    def account(option: Path | None, env: dict[str, str]) -> str | None:
        site = find_site(option, env)
        return None if site is None else site.settings.slurm.account

    assert account(files["option"], environ) == "option"
    assert account(None, environ) == "env"
    assert find_site(None, environ).found_by == "$CORE_SITE"  # type: ignore[union-attr]
    assert account(None, {"XDG_CONFIG_HOME": environ["XDG_CONFIG_HOME"]}) == "user"
    assert account(None, {"HOME": str(tmp_path / "nobody")}) == "system"
    files["system"].unlink()
    assert find_site(None, {"HOME": str(tmp_path / "nobody")}) is None


def test_a_site_file_named_but_missing_is_an_error_not_silence(tmp_path: Path) -> None:
    with pytest.raises(SweepError, match=r"site file .*nowhere.toml \(from \$CORE_SITE\): cannot be read"):
        find_site(None, {"CORE_SITE": str(tmp_path / "nowhere.toml")})
    with pytest.raises(SweepError, match=r"\(from --site\)"):
        find_site(tmp_path / "nowhere.toml", {})


def test_print_site_says_which_file_and_what_it_sets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["sweep", "--print-site"]) == 0
    assert "no site file: --site not given, $CORE_SITE not set" in capsys.readouterr().out
    monkeypatch.setenv("CORE_SITE", str(EXAMPLE))
    assert main(["sweep", "--print-site"]) == 0
    out = capsys.readouterr().out
    assert f"site file {EXAMPLE} (found by $CORE_SITE)" in out
    assert "slurm.account = 'benchmarking'" in out and "setup: module load cuda/12.4" in out
    assert "container flags for nvidia cells: --nv" in out and "machine a100-node: 4 x NVIDIA A100" in out
    assert main(["sweep"]) == 2
    assert "FILE is required" in capsys.readouterr().err


# --- machines and time limits -----------------------------------------------------------------------


def test_a_site_machine_is_usable_as_machine_name(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sweep = _sweep(tmp_path, accelerator="nvidia")
    command = ["sweep", str(sweep), "--dry-run", "--database", str(tmp_path / "r.db"), "--machine", "a100-node"]
    assert main(command) == 2  # no site file: an unknown name
    assert main([*command, "--site", str(EXAMPLE)]) == 0
    assert "planned for machine 'a100-node'" in capsys.readouterr().out


def test_the_site_time_limit_is_a_default_and_its_maximum_a_bound(tmp_path: Path) -> None:
    site = load_site(_site(tmp_path, "[slurm]\ntime_limit_minutes = 30\nmax_time_limit_minutes = 90"))
    spec = make_sweep_spec({"name": "s", "grid": {"workload": "fcnn", "accelerator": "cpu"}})
    assert site.applied_to(spec).slurm.time_limit_minutes == 30  # type: ignore[union-attr]
    own = spec.model_copy(update={"slurm": SlurmSettings(time_limit_minutes=60)})
    assert site.applied_to(own).slurm.time_limit_minutes == 60  # type: ignore[union-attr]
    too_long = spec.model_copy(update={"slurm": SlurmSettings(time_limit_minutes=91)})
    with pytest.raises(ConfigError, match="at most 90 minutes, the site's max_time_limit_minutes") as caught:
        site.applied_to(too_long)
    assert caught.value.field == "slurm.time_limit_minutes" and caught.value.value == 91
    bounded_only = load_site(_site(tmp_path, "[slurm]\nmax_time_limit_minutes = 30", "max.toml"))
    with pytest.raises(ConfigError) as caught:
        bounded_only.applied_to(spec)  # 3600 s a repeat: a job of 60 minutes
    assert caught.value.field == "timeout_seconds"


def test_a_sweep_past_the_site_maximum_is_refused_before_anything_is_submitted(
    tmp_path: Path, simulated_slurm: SimulatedSlurm, capsys: pytest.CaptureFixture[str]
) -> None:
    site = _site(tmp_path, "[slurm]\nmax_time_limit_minutes = 10")
    command = ["sweep", str(_sweep(tmp_path)), "--executor", "slurm", "--database", str(tmp_path / "r.db")]
    assert main([*command, "--site", str(site), "--slurm-time-limit-minutes", "20"]) == 2
    assert "invalid slurm.time_limit_minutes (--slurm-time-limit-minutes) = 20" in capsys.readouterr().err
    assert simulated_slurm.jobs == {}


# --- rendering: each combination, through the simulated sbatch ------------------------------------

_SLURM = (
    "[slurm]\naccount = 'proj'\npartition = 'gpu'\nqos = 'normal'\nconstraint = 'a100'\ngpus_per_node = 4\n"
    "gpu_bind = 'closest'\n"
)
_SETUP = "setup = ['module load cuda/12.4', 'export NCCL_DEBUG=WARN']\n"
_APPTAINER = (
    "[container]\nruntime = 'apptainer'\nimage = '/img/core$cuda.sif'\nflags = ['--bind=/shared']\n"
    "accelerator_flags = {cpu = ['--cleanenv'], nvidia = ['--nv']}\n"
)
_PYXIS = "[container]\nruntime = 'pyxis'\nimage = 'registry#core:cpu'\npython = '/opt/venv/bin/python'\n"


@pytest.mark.parametrize("setup", [False, True])
@pytest.mark.parametrize("container", [None, "apptainer", "pyxis"])
@pytest.mark.parametrize("directives", [False, True])
def test_the_job_script_carries_the_sites_lines(
    tmp_path: Path, simulated_slurm: SimulatedSlurm, monkeypatch: pytest.MonkeyPatch, directives: bool, setup: bool,
    container: str | None,
) -> None:  # fmt: skip
    submit = simulated_slurm.submit

    def keep_script(script: Path, options: list[str], **named: object) -> str:
        job_id = submit(script, options, **named)  # type: ignore[arg-type]
        simulated_slurm.jobs[job_id]["script"] = script.read_text()
        return job_id

    monkeypatch.setattr(simulated_slurm, "submit", keep_script)
    text = (_SETUP if setup else "") + (_SLURM if directives else "")
    text += {None: "", "apptainer": _APPTAINER, "pyxis": _PYXIS}[container]
    site = _site(tmp_path, text or "# nothing set\n")
    simulated_slurm.on_poll = _complete
    sweep = ["sweep", str(_sweep(tmp_path)), "--executor", "slurm", "--database", str(tmp_path / "r.db")]
    assert main([*sweep, "--site", str(site)]) == 0

    script = _submitted_script(simulated_slurm)
    lines = script.splitlines()
    sbatch = [line for line in lines if line.startswith("#SBATCH")]
    expected = [
        "#SBATCH --account=proj", "#SBATCH --partition=gpu", "#SBATCH --qos=normal", "#SBATCH --constraint=a100",
        "#SBATCH --gpus-per-node=4", "#SBATCH --gpu-bind=closest",
    ]  # fmt: skip
    assert sbatch == (expected if directives else [])
    first_command = next(i for i, line in enumerate(lines) if line and not line.startswith("#"))
    assert all(lines.index(line) < first_command for line in sbatch)  # sbatch reads none after a command
    if setup:
        start = lines.index("set -e")
        assert lines[start + 1 : start + 4] == ["module load cuda/12.4", "export NCCL_DEBUG=WARN", "set +e"]
        assert start < next(i for i, line in enumerate(lines) if "core.running.child" in line)
    else:
        assert "set -e" not in lines
    (worker,) = [line for line in lines if "core.running.child" in line]
    if container == "apptainer":  # the cpu cell's own flag, not nvidia's; the image quoted
        assert worker.startswith("apptainer exec --bind=/shared --cleanenv '/img/core$cuda.sif' python3 -m ")
    elif container == "pyxis":
        assert worker.startswith(
            "srun --nodes=1 --ntasks=1 '--container-image=registry#core:cpu' /opt/venv/bin/python -m "
        )
    else:
        assert worker.startswith(f"{core.sweep.cluster.shlex.quote(core.sweep.cluster.sys.executable)} -m ")
    subprocess.run(["bash", "-n"], input=script, text=True, check=True)  # a script bash can read


@pytest.mark.parametrize(
    ("sweep_slurm", "overridden"),
    [
        ("partition = 'debug'", "--partition"),
        ("account = 'mine'", "--account"),
        ("gpus_per_node = 1", "--gpus-per-node"),
        ("extra_options = ['--qos=high']", "--qos"),
        ("extra_options = ['--constr=h100']", "--constraint"),  # sbatch reads a beginning as the whole
        ("extra_options = ['--gpu-bind=none']", "--gpu-bind"),
    ],
)
def test_the_sweeps_own_slurm_settings_override_the_sites(
    tmp_path: Path, simulated_slurm: SimulatedSlurm, sweep_slurm: str, overridden: str
) -> None:
    site = load_site(_site(tmp_path, _SLURM))
    spec = make_sweep_spec(
        {"name": "s", "grid": {"workload": "fcnn", "accelerator": "cpu"}, "slurm": _table(sweep_slurm)}
    )
    directives = site.directives(spec.slurm)
    assert not [line for line in directives if line.startswith(f"#SBATCH {overridden}=")]
    assert len(directives) == 5  # the site's other five stay


def _table(line: str) -> dict[str, object]:
    import tomllib

    return tomllib.loads(line)


def test_no_site_leaves_the_script_as_it_was(tmp_path: Path) -> None:
    script = batch_script(tmp_path / "request.json", tmp_path / "result.json", tmp_path / "ended.json")
    assert "#SBATCH" not in script and "set -e" not in script
    assert script.splitlines()[2] == "started=$(date +%s%N)"


def test_the_resume_command_names_the_site_file_found(
    tmp_path: Path, simulated_slurm: SimulatedSlurm, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Found by $CORE_SITE: a resume in another shell, without it, must use the same file.
    site = _site(tmp_path, _SLURM)
    monkeypatch.setenv("CORE_SITE", str(site))

    def interrupt(slurm: SimulatedSlurm, number: int) -> None:
        raise KeyboardInterrupt

    simulated_slurm.on_poll = interrupt
    sweep = ["sweep", str(_sweep(tmp_path)), "--executor", "slurm", "--database", str(tmp_path / "r.db")]
    assert main(sweep) == 130
    assert f"--site={site}" in capsys.readouterr().err


# --- against the real single-host Slurm (scripts/local-slurm.sh); skipped without one -------------


@pytest.mark.slow
def test_the_site_account_partition_and_setup_reach_a_real_job(tmp_path: Path) -> None:
    from core.sweep.slurm_jobs import unavailable_reason

    missing = unavailable_reason()
    if missing is not None:
        pytest.skip(f"no Slurm to submit to ({missing})")
    partitions = subprocess.run(["sinfo", "--noheader", "--format=%P"], capture_output=True, text=True, check=True)
    partition = partitions.stdout.split()[0].rstrip("*")
    marker = tmp_path / "seen-by-the-job"
    site = _site(
        tmp_path,
        f"setup = ['echo \"$SLURM_JOB_ACCOUNT $SLURM_JOB_PARTITION\" > {marker}']\n"
        f"[slurm]\naccount = 'core-site-test'\npartition = '{partition}'\n",
    )
    sweep = _sweep(tmp_path, slurm="exclusive = false\n").read_text().replace("poll_seconds = 5", "poll_seconds = 1")
    (tmp_path / "sim.toml").write_text(sweep)
    command = ["sweep", str(tmp_path / "sim.toml"), "--executor", "slurm", "--database", str(tmp_path / "r.db")]
    assert main([*command, "--site", str(site)]) == 0
    # The job's own environment: Slurm's account and partition, written by the site's setup line.
    assert marker.read_text().split() == ["core-site-test", partition]


def test_a_job_array_carries_the_sites_sbatch_lines(
    tmp_path: Path, simulated_slurm: SimulatedSlurm, monkeypatch: pytest.MonkeyPatch
) -> None:
    # sbatch reads #SBATCH lines from the script it is given: an array's, not the job.sh each task runs.
    submit, scripts = simulated_slurm.submit, []

    def keep_script(script: Path, options: list[str], **named: object) -> str:
        scripts.append((options, script.read_text()))
        return submit(script, options, **named)  # type: ignore[arg-type]

    monkeypatch.setattr(simulated_slurm, "submit", keep_script)
    simulated_slurm.on_poll = _complete
    sweep = _sweep(tmp_path)
    sweep.write_text(sweep.read_text().replace("repeats = 1", "repeats = 3"))
    site = _site(tmp_path, _SETUP + _SLURM)
    assert (
        main(["sweep", str(sweep), "--executor", "slurm", "--database", str(tmp_path / "r.db"), "--site", str(site)])
        == 0
    )

    ((options, script),) = scripts
    assert any(option.startswith("--array=0-2") for option in options)
    lines = script.splitlines()
    sbatch = [line for line in lines if line.startswith("#SBATCH")]
    assert sbatch == [
        "#SBATCH --account=proj", "#SBATCH --partition=gpu", "#SBATCH --qos=normal", "#SBATCH --constraint=a100",
        "#SBATCH --gpus-per-node=4", "#SBATCH --gpu-bind=closest",
    ]  # fmt: skip
    first_command = next(i for i, line in enumerate(lines) if line and not line.startswith("#"))
    assert all(lines.index(line) < first_command for line in sbatch)
