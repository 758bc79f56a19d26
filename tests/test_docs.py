"""The documentation (docs/architecture.md, Documentation): the site builds strictly, the params reference is
the schema's, the README stays a front door, and what the pages show (YAML, commands, CLI help) is real."""

from __future__ import annotations

import ast
import itertools
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from rung import config
from rung.config.base import Section
from tests import params_reference
from tests.conftest import forget

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
README = ROOT / "README.md"
PAGES = [README, *sorted(DOCS.rglob("*.md"))]
# Pages that concurrent work adds, linked before they exist. Each must be absent: once one lands, this
# test says to delete it here and to add it to mkdocs.yml's nav.
PENDING: set[Path] = set()


def _mkdocs(root: Path, site: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    cmd = [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)]
    return subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=120)


def _blocks(text: str, lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", text, flags=re.M | re.S)


def _prose(text: str) -> str:
    """A page without its fenced code blocks (a `# comment` in bash is not a heading)."""
    return re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)


def _anchors(page: Path) -> set[str]:
    return {params_reference.slug(h) for h in re.findall(r"^#+ (.+)$", _prose(page.read_text()), flags=re.M)}


def test_site_builds_strictly(tmp_path):
    done = _mkdocs(ROOT, tmp_path / "site")
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "site" / "reference" / "params" / "index.html").is_file()


def test_strict_build_fails_on_a_missing_page_link_or_anchor(tmp_path):
    # The check above can fail: the same site with a nav entry whose page is missing, a dead link and a
    # dead anchor does not build, and says which.
    shutil.copytree(DOCS, tmp_path / "docs")
    nav = (ROOT / "mkdocs.yml").read_text().replace("  - Home: index.md\n", "  - Home: index.md\n  - Lost: lost.md\n")
    (tmp_path / "mkdocs.yml").write_text(nav)
    with (tmp_path / "docs" / "index.md").open("a") as f:
        f.write("\n[gone](no-such-page.md) and [here](pipeline.md#no-such-heading)\n")
    done = _mkdocs(tmp_path, tmp_path / "site")
    assert done.returncode != 0
    assert all(name in done.stderr for name in ("lost.md", "no-such-page.md", "no-such-heading")), done.stderr


def test_params_reference_is_the_schemas():
    assert params_reference.PAGE.read_text() == params_reference.render(), (
        "docs/reference/params.md differs from rung/config: run `python -m tests.params_reference` and commit it"
    )


class _Probe(Section):
    documented: int = 1
    """A key with its docstring."""
    bare: int = 2


def test_a_key_without_docstring_fails_the_reference():
    with pytest.raises(params_reference.UndocumentedKey, match=r"^bare \(.*_Probe\.bare\): no docstring"):
        params_reference.render(_Probe)


def test_readme_is_a_front_door():
    text = README.read_text()
    assert len(text.splitlines()) <= 250
    assert "make demo" in _blocks(text, "bash")[0] and "make test" in _blocks(text, "bash")[0]
    assert "| rl/main | 55.4% [50, 61] |" in text  # the demo's table


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page):
    """Every relative link of a page (the README's included, which the site does not build) names a file
    that exists and, with #anchor, a heading of it."""
    for target in re.findall(r"\]\(([^)\s]+)\)", _prose(page.read_text())):
        if re.match(r"^[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if file in PENDING:
            assert not file.exists(), f"{file.name} exists now: remove it from PENDING and add it to mkdocs.yml's nav"
            continue
        assert file.exists(), f"{page.name}: link to {target}: no such file"
        if anchor and file.suffix == ".md":
            assert anchor in _anchors(file), f"{page.name}: link to {target}: no such heading"


def _params_blocks() -> list[tuple[str, dict]]:
    out = []
    for page in PAGES:
        for block in _blocks(page.read_text(), "yaml"):
            data = yaml.safe_load(block)  # every YAML block parses
            if isinstance(data, dict) and set(data) <= set(config.Params.model_fields):
                out.append((page.name, data))
    return out


def test_yaml_blocks_of_params_validate(default_params):
    """Each block of params sections, put in place of those sections of params.yaml, passes the schema."""
    blocks = _params_blocks()
    assert len(blocks) >= 6  # the data, benchmark, SFT, RL, vLLM and GPU examples
    for page, data in blocks:
        try:
            config.parse({**default_params, **data}, f"{page} block {sorted(data)}")
        except config.ConfigError as e:
            pytest.fail(str(e))


def test_environments_the_docs_show_validate(default_params, tmp_path, monkeypatch):
    """Every environment the pages show (an `environment` of a YAML block, or inline as `environment: ...`) passes
    the schema and `rung validate`'s check of environments; the docs' own class from its python block, written
    where its first line says."""
    from rung import envs

    [calc] = [b for b in _blocks((DOCS / "environments.md").read_text(), "python") if b.startswith("# mypkg/calc.py")]
    (tmp_path / "mypkg").mkdir()
    (tmp_path / "mypkg" / "__init__.py").write_text("")
    (tmp_path / "mypkg" / "calc.py").write_text(calc)
    monkeypatch.syspath_prepend(str(tmp_path))
    forget("mypkg")  # another test's mypkg may be imported already
    shown = [data["environment"] for _, data in _params_blocks() if "environment" in data]
    shown += [yaml.safe_load(v) for page in PAGES for v in re.findall(r"`environment: ([^`]+)`", page.read_text())]
    assert len(shown) >= 5 and "python" in shown and False in shown  # blocks, the short form, the opt-out
    for value in shown:
        key = "rl.stages.main.environment" if value is False else "environment"
        try:
            params = config.parse(config.with_overrides(default_params, {key: value}), f"environment: {value}")
        except config.ConfigError as e:
            pytest.fail(str(e))
        if value is not False:
            envs.check(params.environment, None, key)


def _commands() -> list[list[str]]:
    """The shell commands of the pages' bash blocks, continuation lines joined, comments dropped."""
    out = []
    for page in PAGES:
        for block in _blocks(page.read_text(), "bash"):
            for line in block.replace("\\\n", " ").splitlines():
                words = shlex.split(line, comments=True)
                while words and "=" in words[0] and not words[0].startswith("-"):
                    words = words[1:]  # VAR=value prefixes
                if words:
                    out.append([Path(words[0]).name, *words[1:]])
    return out


def _sets(words: list[str], flag: str) -> dict:
    pairs = [b for a, b in itertools.pairwise(words) if a in flag.split("|")]
    return {k: yaml.safe_load(v) for k, _, v in (p.partition("=") for p in pairs)}  # as flows.run.overrides


def _dvc_exp_set(default_params: dict, words: list[str], tmp_path: Path) -> dict:
    """params.yaml after the command's `-S` overrides, as DVC applies them (Hydra's grammar: a key that
    params.yaml leaves out, such as an RL stage's lora, needs `++`, else "Could not override")."""
    from dvc.utils.hydra import apply_overrides

    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(default_params, sort_keys=False))
    try:
        apply_overrides(path, [b for a, b in itertools.pairwise(words) if a == "-S"])
    except Exception as e:  # DVC's InvalidArgumentError hides Hydra's reason in its cause
        pytest.fail(f"{' '.join(words)}: {e}: {str(e.__cause__).splitlines()[0]}")
    return yaml.safe_load(path.read_text())


def test_commands_shown_validate(default_params, tmp_path):
    """`rung <command>` names a command; `rung run` recipes with their --set, `dvc exp run -S` (through
    DVC's own override parser) and `rung sweep` grids applied to params.yaml pass the schema, as they
    would before anything runs."""
    from typer.main import get_command

    from flows.cli import app

    commands = set(get_command(app).commands)
    checked = 0
    for words in _commands():
        where = " ".join(words)
        if words[0] == "rung":
            assert words[1] in commands, f"{where}: no such rung command"
        if words[:2] == ["rung", "run"]:
            data = config.with_overrides(config.read_yaml(ROOT / words[2]), _sets(words, "--set|-S"))
        elif words[:3] == ["dvc", "exp", "run"] and "-S" in words:
            data = _dvc_exp_set(default_params, words, tmp_path)
        elif words[:2] == ["rung", "sweep"]:
            grid = json.loads(words[2])
            for point in itertools.product(*grid.values()):
                config.parse(config.with_overrides(default_params, dict(zip(grid, point, strict=True))), where)
            checked += 1
            continue
        else:
            continue
        config.parse(data, where)
        checked += 1
    assert checked >= 6


def test_cli_help_names_a_guide():
    from typer.main import get_command

    from flows.cli import app

    group = get_command(app)
    for name, command in [("rung", group), *group.commands.items()]:
        guides = re.findall(r"docs/[\w/.-]+\.md", command.epilog or "")
        assert guides, f"{name} --help names no guide"
        assert all((ROOT / g).is_file() for g in guides), f"{name} --help: {guides}"


ARCHITECTURE = DOCS / "architecture.md"
MAPPED = ("rung", "flows", "tasks", "bench")  # the code docs/architecture.md maps, module by module


def _holds_code(init: Path) -> bool:
    """A package's __init__.py with anything beyond its docstring (imports, settings, functions)."""
    body = ast.parse(init.read_text()).body
    return any(not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)) for n in body)


def _modules(root: Path) -> set[str]:
    files = itertools.chain.from_iterable((root / top).rglob("*.py") for top in MAPPED)
    return {f.relative_to(root).as_posix() for f in files if f.name != "__init__.py" or _holds_code(f)}


def _named_paths(page: Path) -> set[str]:
    """Every `path` the page shows in code spans under one of the repository's code or docs folders."""
    spans = re.findall(r"`([^`\s]+)`", _prose(page.read_text()))
    return {s for s in spans if re.fullmatch(r"(rung|flows|tasks|bench|tests|docs)/[\w./-]*", s)}


def _unmapped(root: Path, page: Path) -> tuple[list[str], list[str]]:
    named = _named_paths(page)
    missing = sorted(_modules(root) - named)
    absent = sorted(p for p in named if not (root / p).exists())
    return missing, absent


def test_architecture_names_every_module_and_only_paths_that_exist():
    missing, absent = _unmapped(ROOT, ARCHITECTURE)
    assert not missing, f"docs/architecture.md does not name these modules (say what each is for): {missing}"
    assert not absent, f"docs/architecture.md names paths that do not exist: {absent}"


def test_a_new_module_or_a_stale_path_fails_the_map(tmp_path):
    for top in MAPPED:
        (tmp_path / top).mkdir()
    (tmp_path / "rung" / "kept.py").write_text('"""Named."""\n')
    (tmp_path / "rung" / "new.py").write_text('"""Not named."""\n')
    (tmp_path / "rung" / "part").mkdir()
    (tmp_path / "rung" / "part" / "__init__.py").write_text('"""A docstring only: the package row says it."""\n')
    (tmp_path / "flows" / "__init__.py").write_text('"""Holds code."""\n\nX = 1\n')
    page = tmp_path / "page.md"
    page.write_text("`rung/kept.py` and `rung/moved.py`, `rung/part/`\n\n```\n`rung/new.py`\n```\n")
    assert _unmapped(tmp_path, page) == (["flows/__init__.py", "rung/new.py"], ["rung/moved.py"])
