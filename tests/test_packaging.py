"""The installed package: every module, the DTD and the shipped transformers in the wheel;
the optional parts as extras (a missing one named in one line); license and metadata; the
systemd unit and the Containerfile; the wheel installed into a fresh venv serving the demo."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from pathlib import Path
from urllib.parse import urlparse

import pytest

from bridgemgr.extras import EXTRA_OF

ROOT = Path(__file__).resolve().parents[1]


def test_every_package_folder_is_listed_in_pyproject():
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "bridgemgr").rglob("__init__.py")}
    assert found | {"bridgemgr.dtd"} == listed


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_wheel_contains_the_dtd_and_the_console_script(tmp_path):
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(ROOT)],
        check=True,
        capture_output=True,
    )
    wheel = next(tmp_path.glob("imqbridge-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    assert "bridgemgr/dtd/sun_jmsbridge_1_0.dtd" in names
    assert "bridgemgr/providers/embedded/store.py" in names
    assert "bridgemgr/providers/java/src/com/sun/messaging/bridge/service/MessageTransformer.java" in names
    entry = next(n for n in names if n.endswith("entry_points.txt"))
    assert "imqbridgemgr = bridgemgr.cli:main" in zipfile.ZipFile(wheel).read(entry).decode()
    # the shipped transformers under our own name (a top-level `transformers` is Hugging Face's)
    assert "bridgemgr/transformers/uppercase.py" in names
    assert not [n for n in names if n.startswith("transformers/")]
    assert "bridgemgr/py.typed" in names
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    metadata = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    for extra in ("spark", "java", "postgres", "amqp", "all", "test"):
        assert f"Provides-Extra: {extra}" in metadata
    assert "License-Expression: Apache-2.0" in metadata and "Project-URL: Source," in metadata


# --- pyproject: extras, license, URLs, classifiers ----------------------------------------------

PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
OPTIONAL = {
    "pyspark": "spark",
    "pyarrow": "spark",
    "jpype1": "java",
    "psycopg": "postgres",
    "pika": "amqp",
    "starlette": "console",
    "uvicorn": "console",
}


def _name(requirement: str) -> str:
    return re.split(r"[\[<>=~!; ]", requirement, maxsplit=1)[0].lower()


def test_optional_parts_are_extras_and_the_test_extra_installs_them_all():
    core = {_name(r) for r in PYPROJECT["dependencies"]}
    extras = PYPROJECT["optional-dependencies"]
    assert not core & (set(OPTIONAL) | {"pandas"}), "pip install imqbridge must not pull the optional parts"
    for package, extra in OPTIONAL.items():
        assert package in {_name(r) for r in extras[extra]}, (package, extra)
    assert "imqbridge[spark,java,postgres,amqp,console]" in extras["all"]
    assert "imqbridge[all]" in extras["test"]  # tests/run installs [test]: everything it uses
    assert "IMQBRIDGE_EXTRAS=test" in (ROOT / "tests" / "run").read_text()
    assert EXTRA_OF == {
        "pyspark": "spark",
        "pyarrow": "spark",
        "jpype": "java",
        "psycopg": "postgres",
        "pika": "amqp",
        "starlette": "console",
        "uvicorn": "console",
    }  # the import names of the same packages


def test_pandas_is_only_a_constraint_of_the_spark_extra():
    """pandas comes with pyspark[sql]; no module of ours imports it."""
    importing = [
        path
        for path in (ROOT / "bridgemgr").rglob("*.py")
        if re.search(r"^\s*(import|from)\s+pandas\b", path.read_text(), re.M)
    ]
    assert not importing


def test_license_urls_classifiers_and_py_typed():
    license_text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in license_text and "Version 2.0, January 2004" in license_text
    assert "TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION" in license_text
    assert "END OF TERMS AND CONDITIONS" in license_text and len(license_text) > 10_000  # the full text
    assert PYPROJECT["license"] == "Apache-2.0" and PYPROJECT["license-files"] == ["LICENSE"]
    assert {"Homepage", "Documentation", "Source", "Issues"} <= set(PYPROJECT["urls"])
    assert "Typing :: Typed" in PYPROJECT["classifiers"]
    assert "Programming Language :: Python :: 3.11" in PYPROJECT["classifiers"]
    assert (ROOT / "bridgemgr" / "py.typed").exists()


# --- a missing extra: one line naming it -----------------------------------------------------------

BLOCKER = '''\
"""Makes the modules of $BLOCK_MODULES look not installed (as without their imqbridge extra)."""
import os
import sys

BLOCKED = {m for m in os.environ.get("BLOCK_MODULES", "").split(",") if m}


class Blocker:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, Blocker())
'''
BLOCKED = "pyspark,pyarrow,jpype,psycopg,pika,pandas,starlette,uvicorn"


def without_extras(tmp_path: Path) -> dict[str, str]:
    """The environment of a process in which no optional package can be imported."""
    folder = tmp_path / "blocker"
    folder.mkdir(exist_ok=True)
    (folder / "sitecustomize.py").write_text(BLOCKER)
    return dict(os.environ, PYTHONPATH=f"{folder}{os.pathsep}{ROOT}", BLOCK_MODULES=BLOCKED)


def bridge_xml(name: str, factory: str | None, url: str = "") -> str:
    target = "host" if factory is None else "far"
    far = (
        ""
        if factory is None
        else (
            f'<connection-factory ref-name="far" lookup-name="ConnectionFactory">'
            f'<property name="java.naming.factory.initial" value="{factory}"/>'
            f'<property name="java.naming.provider.url" value="{url}"/></connection-factory>'
        )
    )
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        '<!DOCTYPE jmsbridge SYSTEM "sun_jmsbridge_1_0.dtd">\n'
        f'<jmsbridge name="{name}"><link name="l1" transacted="false">'
        '<source connection-factory-ref="host" destination-ref="in"/>'
        f'<target connection-factory-ref="{target}" destination-ref="out"/></link>'
        f'<connection-factory ref-name="host"/>{far}'
        '<destination ref-name="in" name="q.in"/><destination ref-name="out" name="q.out"/>'
        "</jmsbridge>\n"
    )


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_missing_extra_is_one_line_naming_it(tmp_path):
    """Each optional part used without its extra: a bridge that uses it fails with one line
    naming the extra (the others run), a store that needs it stops the start with one line,
    a job command prints one line and exits 1; never a traceback."""
    env = without_extras(tmp_path)
    (tmp_path / "spark.xml").write_text(bridge_xml("bs", None))
    (tmp_path / "amqp.xml").write_text(bridge_xml("ba", "imq.amqp", "amqp://u:p@127.0.0.1:1/%2F"))
    (tmp_path / "java.xml").write_text(
        bridge_xml("bj", "org.apache.activemq.jndi.ActiveMQInitialContextFactory", "tcp://127.0.0.1:1")
    )
    props = tmp_path / "broker.properties"
    props.write_text(
        "\n".join(
            [
                f"imq.varhome={tmp_path / 'var'}",
                "imq.portmapper.port=0",
                "imq.jms.tcp.port=0",
                "imq.bridge.enabled=true",
                "imq.bridge.admin.user=admin",
                "imq.bridge.admin.password=pw-9f2c1a",
                "imq.bridge.activelist=bs,ba,bj",
                "imq.bridge.bs.type=jms",
                "imq.bridge.bs.xmlurl=spark.xml",
                "imq.bridge.bs.runner=spark",
                "imq.bridge.ba.type=jms",
                "imq.bridge.ba.xmlurl=amqp.xml",
                "imq.bridge.bj.type=jms",
                "imq.bridge.bj.xmlurl=java.xml",
            ]
        )
        + "\n"
    )
    serve = subprocess.Popen(
        [sys.executable, "-m", "bridgemgr.cli", "serve", "-props", str(props)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    lines: list[str] = []
    try:
        assert serve.stdout is not None
        for line in serve.stdout:  # "Running", and an ERROR line per bridge, in any order
            lines.append(line.rstrip())
            if any("Running" in x for x in lines) and sum(" ERROR " in x for x in lines) >= 3:
                break
    finally:
        serve.terminate()
        lines += serve.communicate(timeout=60)[0].splitlines()
    text = "\n".join(lines)
    assert "Traceback" not in text, text
    for part, module, extra in (
        ("the AMQP provider (imq.amqp)", "pika", "amqp"),
        ("the Java provider", "jpype", "java"),
        ("Spark (runner=spark links, drain, the dmq jobs)", "pyspark", "spark"),
    ):
        assert f"{part} needs {module}: pip install 'imqbridge[{extra}]'" in text, text

    store = subprocess.run(
        [
            sys.executable,
            "-m",
            "bridgemgr.cli",
            "serve",
            "-props",
            str(props),
            "-D",
            "imq.bridge.enabled=false",
            "-D",
            "imq.persist.store=jdbc",
            "-D",
            "imq.persist.jdbc.postgresql.property.url=jdbc:postgresql://127.0.0.1:1/db",
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=60,
    )
    assert store.returncode == 1
    assert store.stderr.strip().splitlines()[-1] == (
        "Error: the service cannot start: imq.persist.store=jdbc needs psycopg: pip install 'imqbridge[postgres]'"
    ), store.stderr
    assert "Traceback" not in store.stderr + store.stdout

    console = subprocess.run(
        [sys.executable, "-m", "bridgemgr.cli", "serve", "-props", str(props), "-D", "imq.console.port=0"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=60,
    )
    assert console.returncode == 1
    assert console.stderr.strip().splitlines()[-1] == (
        "Error: the service cannot start: the management port (imq.console.port) needs starlette: "
        "pip install 'imqbridge[console]'"
    ), console.stderr
    assert "Traceback" not in console.stderr + console.stdout

    (tmp_path / "archive").mkdir()
    report = subprocess.run(
        [sys.executable, "-m", "bridgemgr.cli", "dmq", "report", "--archive", str(tmp_path / "archive")],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert (report.returncode, report.stdout) == (1, "")
    assert report.stderr == (
        "Error: Spark (runner=spark links, drain, the dmq jobs) needs pyspark: pip install 'imqbridge[spark]'\n"
    )


# --- the systemd unit and the Containerfile ------------------------------------------------------------

UNIT = ROOT / "examples" / "systemd" / "imqbridge.service"
CONTAINERFILE = ROOT / "Containerfile"


def test_the_systemd_unit_is_hardened_and_verifies(tmp_path):
    text = UNIT.read_text()
    settings = dict(line.split("=", 1) for line in text.splitlines() if re.match(r"^[A-Za-z]+=", line))
    assert settings["User"] == "imqbridge" and settings["KillSignal"] == "SIGTERM"
    assert settings["Restart"] == "on-failure" and settings["NoNewPrivileges"] == "true"
    assert settings["ProtectSystem"] == "strict" and settings["StateDirectory"] == "imqbridge"
    assert settings["Environment"] == "IMQ_VARHOME=/var/lib/imqbridge"
    exec_start = settings["ExecStart"].split()
    assert exec_start[1:3] == ["serve", "-props"]
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed: the unit's syntax was not verified")
    # verify wants ExecStart's program to exist: this interpreter's imqbridgemgr stands in
    program = Path(sys.executable).parent / "imqbridgemgr"
    unit = tmp_path / "imqbridge.service"
    unit.write_text(text.replace(exec_start[0], str(program if program.exists() else "/bin/true")))
    result = subprocess.run([analyze, "verify", str(unit)], capture_output=True, text=True, timeout=60)
    # it warns (unknown keys, bad values) on stderr with exit status 0: silence is success
    assert (result.returncode, result.stdout, result.stderr) == (0, "", ""), result.stderr


def containerfile() -> list[tuple[str, str]]:
    """The Containerfile's instructions, (KEYWORD, arguments), continuation lines joined."""
    text = re.sub(r"\\\n", " ", CONTAINERFILE.read_text())
    return [
        (line.split(None, 1)[0].upper(), line.split(None, 1)[1].strip())
        for line in text.splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]


def _values(instructions: list[tuple[str, str]], keyword: str) -> list[str]:
    return [args for kw, args in instructions if kw == keyword]


def _env(instructions: list[tuple[str, str]]) -> dict[str, str]:
    return dict(pair.split("=", 1) for args in _values(instructions, "ENV") for pair in args.split())


def _command(instructions: list[tuple[str, str]]) -> list[str]:
    return json.loads(_values(instructions, "ENTRYPOINT")[-1]) + json.loads(_values(instructions, "CMD")[-1])


def _healthcheck(instructions: list[tuple[str, str]]) -> tuple[dict[str, str], list[str]]:
    """The HEALTHCHECK's options (--interval=30s -> interval: 30s) and its exec-form command."""
    options, _, command = _values(instructions, "HEALTHCHECK")[-1].partition("CMD ")
    return dict(o[2:].split("=", 1) for o in options.split()), json.loads(command)


def test_the_containerfile_checks_health_on_the_exposed_metrics_port():
    instructions = containerfile()
    options, command = _healthcheck(instructions)
    assert set(options) == {"interval", "timeout", "start-period", "retries"}
    assert command[:2] == ["python", "-c"]  # the venv's python: the slim image has no curl
    url = re.search(r"'(http://127\.0\.0\.1:(\d+)/healthz)'", command[2])
    assert url, command
    exposed = {int(p) for args in _values(instructions, "EXPOSE") for p in args.split()}
    serve = _command(instructions)
    assert f"imq.metrics.port={url.group(2)}" in serve and "imq.metrics.host=0.0.0.0" in serve
    assert int(url.group(2)) in exposed


def test_the_containerfile_runs_unprivileged_with_its_var_dir_as_a_volume():
    instructions = containerfile()
    assert _values(instructions, "FROM") == ["python:3.11-slim"]
    assert _values(instructions, "USER") == ["imqbridge"]  # not root
    env = _env(instructions)
    assert json.loads(_values(instructions, "VOLUME")[-1]) == [env["IMQ_VARHOME"]]
    exposed = {int(p) for args in _values(instructions, "EXPOSE") for p in args.split()}
    command = _command(instructions)
    assert command[:3] == ["imqbridgemgr", "serve", "--demo"]
    ports = {int(arg.split("=")[1]) for arg in command if re.match(r"imq\..*port=\d+$", arg)}
    assert exposed >= ports | {7676, 7672}  # the port mapper and the STOMP bridge's defaults too
    for args in _values(instructions, "COPY"):
        for source in args.split()[:-1]:
            assert (ROOT / source).exists(), source


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_wheel_serves_the_demo_from_a_fresh_venv(tmp_path):
    """The Containerfile's layout built with pip: a wheel from only the files it copies,
    installed into a fresh venv without any extra (the core's dependencies come from this
    interpreter's site-packages, so no network; the optional packages are blocked), then its
    command, `imqbridgemgr serve --demo`, run from an empty folder until the demo's JMS
    bridge has moved the orders (through the shipped transformer), then SIGTERM."""
    instructions = containerfile()
    context = tmp_path / "context"
    for args in _values(instructions, "COPY"):
        *sources, dest = args.split()
        dest_dir = context / Path(dest).relative_to("/tmp/imqbridge-src")
        dest_dir.mkdir(parents=True, exist_ok=True)
        for source in sources:
            if (ROOT / source).is_dir():
                shutil.copytree(
                    ROOT / source, dest_dir, dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__")
                )
            else:
                shutil.copy(ROOT / source, dest_dir)
    # without PYTHONPATH (a Spark test before this one sets it to this tree and the venv's site):
    # pip would find imqbridge installed there already and install nothing into the fresh venv
    clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path / "dist"), str(context)],
        check=True,
        capture_output=True,
        timeout=240,
        env=clean,
    )
    wheel = next((tmp_path / "dist").glob("imqbridge-*.whl"))

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120, env=clean)
    python = venv / "bin" / "python"
    site = Path(
        subprocess.run(
            [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
            env=clean,
        ).stdout.strip()
    )
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps", "--no-index", str(wheel)],
        check=True,
        capture_output=True,
        timeout=120,
        env=clean,
    )
    # the core's dependencies, from here (a path line: this site's own .pth files do not run)
    (site / "deps-from-test.pth").write_text(
        "\n".join(sorted({sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]})) + "\n"
    )
    (site / "sitecustomize.py").write_text(BLOCKER)
    home = tmp_path / "empty"
    home.mkdir()
    env = dict(clean)
    env.update(
        _env(instructions),
        IMQ_VARHOME=str(tmp_path / "var"),
        BLOCK_MODULES=BLOCKED,
        PATH=f"{venv / 'bin'}{os.pathsep}{os.environ['PATH']}",
    )

    found = subprocess.run(
        [python, "-c", "import bridgemgr.transformers.uppercase as m; print(m.__file__)"],
        capture_output=True,
        text=True,
        env=env,
        cwd=home,
    )
    assert found.returncode == 0, found.stderr
    assert found.stdout.startswith(str(site)), found.stdout
    command = _command(instructions)
    command[0] = str(venv / "bin" / command[0])
    # the ports the image fixes are free ones here, and loopback only
    command += [
        "-D",
        "imq.hostname=127.0.0.1",
        "-D",
        "imq.portmapper.port=0",
        "-D",
        "imq.bridge.stomp.tcp.port=0",
        "-D",
        "imq.bridge.admin.port=0",
        "-D",
        "imq.jms.tcp.port=0",
        "-D",
        "imq.metrics.port=0",
        "-D",
        "imq.metrics.host=127.0.0.1",
    ]
    serve = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=home)
    lines: list[str] = []
    try:
        assert serve.stdout is not None
        for line in serve.stdout:
            lines.append(line.rstrip())
            if "Running" in line:
                break
        # the HEALTHCHECK's command, run by the venv's python, on the port the service took
        metrics = next(line.split()[1] for line in lines if line.startswith("metrics: "))
        _, health = _healthcheck(instructions)
        health = [str(python), health[1], re.sub(r"127\.0\.0\.1:\d+", urlparse(metrics).netloc, health[2])]
        assert subprocess.run(health, capture_output=True, timeout=30, env=env).returncode == 0
    finally:
        serve.send_signal(signal.SIGTERM)
        lines += serve.communicate(timeout=60)[0].splitlines()
    assert subprocess.run(health, capture_output=True, timeout=30, env=env).returncode != 0  # nothing listens
    text = "\n".join(lines)
    assert (
        "demo: sent 1000 persistent orders to demo.in; the JMS bridge 'demo' moved 1000 to demo.out (last: 'ORDER 999')"
    ) in text, text
    assert serve.returncode == 0 and lines[-1] == "Stopped cleanly.", text
    assert "Traceback" not in text and "ERROR" not in text, text
    assert "Operate it:  imqbridgemgr list bridge -b " in text, text  # as started: from the PATH
