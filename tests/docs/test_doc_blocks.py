"""Every code block of README.md and docs/*.md runs as written (doc_blocks.py: how blocks are found and marked).

- python blocks run in page order, each in a namespace of its own (a block imports what it uses: nothing
  is injected or carried over from the block above; the page's `# name.py` blocks are importable modules),
  in a fresh folder per page (so `configs/quickstart.yaml` is the example shipped with fedhet);
  `<!-- doc-test: skip (reason) -->` blocks are listed as skipped with their reason, `slow` ones run with
  `pytest -m slow`;
- every `fedhet ...` line of a shell block parses with fedhet's own parser, the config file and overrides it
  names load and validate (not those under runs/, which earlier commands write), and the cheap ones
  (`fedhet methods`, `configs`, `data list`, `sweep --check`) run;
- every yaml block is an experiment config that validates, or a tune search space;
- every `--run-config "..."` string parses with Flower's own parser (text values quoted) and validates against an
  App fedhet writes, unless the page shows its `error:` right there (an example of a refused key).
"""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from doc_blocks import (  # noqa: E402
    SHELLS,
    Block,
    blocks,
    fedhet_commands,
    node_config_strings,
    pages,
    run_config_strings,
    stray_markers,
)

PAGES = pages()
ALL = [b for page in PAGES for b in blocks(page)]
PYTHON = [b for b in ALL if b.lang == "python"]
EXTRAS = ("flwr", "ray", "timm", "transformers", "peft", "diffusers", "datasets", "tensorboard")  # pyproject extras
PLACEHOLDERS = ("...",)  # `fedhet tune ... --stop-after 5`: the arguments of the command above


def _ids(page: Path) -> str:
    return page.name


def _pages_with(select: object) -> list[Path]:
    return [p for p in PAGES if any(select(b) for b in blocks(p))]  # type: ignore[operator]


@pytest.fixture
def registries() -> object:
    """Blocks register plug-ins (a model, a dataset, a method); the registries are restored afterwards."""
    from fedhet.algorithms.registry import ALGORITHMS
    from fedhet.data.registry import DATASETS
    from fedhet.models import MODELS

    for registry in (ALGORITHMS, MODELS, DATASETS):
        registry.load()  # the built-ins first, so restoring the items keeps them
    saved = [(r._items, dict(r._items)) for r in (ALGORITHMS, MODELS, DATASETS)]
    yield
    for items, before in saved:
        items.clear()
        items.update(before)


def _page_folder(page: Path, folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Work in `folder`, with the page's `# name.py` blocks written there."""
    for block in blocks(page):
        if block.lang == "python" and block.filename and block.marker != "skip":
            (folder / block.filename).write_text(block.code)
            monkeypatch.delitem(sys.modules, block.filename[: -len(".py")], raising=False)  # not another run's
    monkeypatch.chdir(folder)
    monkeypatch.syspath_prepend(str(folder))  # `from my_app import server_app` in a later block


def _run_python(page: Path, with_slow: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """The page's blocks, each in a fresh module of its own (registered: `@dataclass` looks its module up), so a
    block runs as a reader who copies it alone would run it."""
    for block in blocks(page):
        if block.lang != "python" or block.marker == "skip" or (block.marker == "slow" and not with_slow):
            continue
        module = types.ModuleType(f"doc_block_{page.stem}_{block.line}")
        monkeypatch.setitem(sys.modules, module.__name__, module)
        try:
            exec(compile(block.code, block.name, "exec"), module.__dict__)  # noqa: S102 - our own documentation
        except ModuleNotFoundError as err:
            if err.name not in EXTRAS:
                raise AssertionError(f"the python block at {block.name} fails: {err}") from err
            pytest.skip(f"{block.name} needs {err.name}, a fedhet extra this environment lacks")
        except Exception as err:
            raise AssertionError(f"the python block at {block.name} fails: {type(err).__name__}: {err}") from err


@pytest.mark.parametrize("page", _pages_with(lambda b: b.lang == "python" and b.marker is None), ids=_ids)
def test_python_blocks_run(page: Path, tmp_path: Path, monkeypatch, registries) -> None:
    _page_folder(page, tmp_path, monkeypatch)
    _run_python(page, with_slow=False, monkeypatch=monkeypatch)


def test_a_block_sees_nothing_of_the_block_above(tmp_path: Path, monkeypatch) -> None:
    """A block that uses an import of the block above fails (a reader copying it alone would get a NameError);
    one that imports the page's `# name.py` block runs."""
    page = tmp_path / "page.md"
    page.write_text("```python\n# page_module.py\nimport math\n\nTAU = 2 * math.pi\n```\n\n"
                    "```python\nfrom page_module import TAU\n\nassert TAU > 6\n```\n")
    _page_folder(page, tmp_path, monkeypatch)
    _run_python(page, with_slow=False, monkeypatch=monkeypatch)
    page.write_text(page.read_text() + "\n```python\nprint(math.pi)\n```\n")
    with pytest.raises(AssertionError, match="page.md:14 fails: NameError: name 'math' is not defined"):
        _run_python(page, with_slow=False, monkeypatch=monkeypatch)


@pytest.mark.slow
@pytest.mark.parametrize("page", _pages_with(lambda b: b.lang == "python" and b.marker == "slow"), ids=_ids)
def test_python_blocks_run_with_the_slow_ones(page: Path, tmp_path: Path, monkeypatch, registries) -> None:
    _page_folder(page, tmp_path, monkeypatch)
    _run_python(page, with_slow=True, monkeypatch=monkeypatch)


@pytest.mark.parametrize("block", [b for b in ALL if b.marker == "skip"], ids=lambda b: b.name)
def test_skipped_blocks_are_listed_with_their_reason(block: Block) -> None:
    assert block.reason, f"{block.name}: say why in <!-- doc-test: skip (reason) -->"
    pytest.skip(f"{block.name} ({block.lang}) skipped: {block.reason}")


def test_doc_test_markers_are_well_formed() -> None:
    assert [problem for page in PAGES for problem in stray_markers(page)] == []


def test_the_flower_strategy_example_runs_with_the_run_config_of_run_simulation(tmp_path: Path, monkeypatch,
                                                                                 registries) -> None:
    """docs/flower.md's App under what `run_simulation` gives its ServerApp: an empty run config (its
    `context.run_config["num-server-rounds"]` was a KeyError there); on the in-process grid, as 4 SuperNodes."""
    pytest.importorskip("flwr")
    from flower_testing import AppGrid
    from flwr.app import Context, RecordDict
    from flwr.supercore.task_identity import TaskIdentity

    for name, value in (("_run_id", 1), ("_node_id", 0), ("_task_id", 1)):  # as inside a ServerApp process
        monkeypatch.setattr(TaskIdentity, name, value)

    page = Path(__file__).resolve().parents[2] / "docs" / "flower.md"
    example = next(b for b in blocks(page) if "FedhetStrategy.from_config(CONFIG" in b.code)
    _page_folder(page, tmp_path, monkeypatch)
    namespace: dict[str, object] = {}
    exec(compile(example.code, example.name, "exec"), namespace)  # noqa: S102 - our own documentation
    grid = AppGrid([namespace["client_app"]] * 4)
    namespace["server_app"](grid, Context(run_id=1, node_id=0, state=RecordDict(), run_config={}, node_config={}))
    assert sum(kind == "train" for _, kind in grid.sent) == 4 * 3  # 4 clients, the example's default 3 rounds


def _check_command(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str | None:
    """None if `fedhet ARGV` parses, its config and overrides validate, and (when cheap) it runs; else why not."""
    from fedhet.cli import main, parse_args
    from fedhet.config import load_config

    try:
        args = parse_args(argv)
    except SystemExit:  # argparse's own usage error, printed
        return f"does not parse: {capsys.readouterr().err.strip().splitlines()[-1]}"
    except Exception as err:  # noqa: BLE001 - fedhet's one-line usage errors
        return f"does not parse: {type(err).__name__}: {err}"
    config, overrides = getattr(args, "config", None), list(getattr(args, "overrides", None) or [])
    if config is not None and "=" in config:
        config, overrides = None, [config, *overrides]
    app_folder = argv[:2] == ["flower", "check"]  # its first argument is a Flower App folder, not a config
    checks_config = hasattr(args, "config") and (config is not None or overrides) and not app_folder
    if checks_config and config not in PLACEHOLDERS and not (config or "").startswith("runs/"):
        try:
            load_config(config, overrides)
        except Exception as err:  # noqa: BLE001 - reported with the line
            return f"its config does not load: {type(err).__name__}: {err}"
    cheap = argv[:1] in (["methods"], ["configs"]) or argv[:2] == ["data", "list"] or "--check" in argv
    if cheap and main(argv) != 0:
        return f"exits with an error: {capsys.readouterr().err.strip()}"
    return None


@pytest.mark.parametrize("page", _pages_with(lambda b: b.lang in SHELLS and fedhet_commands(b)), ids=_ids)
def test_fedhet_command_lines_parse_and_their_configs_validate(page: Path, tmp_path: Path, monkeypatch, capsys,
                                                               registries) -> None:
    _page_folder(page, tmp_path, monkeypatch)
    problems = []
    for block in blocks(page):
        if block.lang in SHELLS and block.marker != "skip":
            for argv in fedhet_commands(block):
                why = _check_command(argv, capsys)
                if why:
                    problems.append(f"{block.name}: fedhet {' '.join(argv)}: {why}")
    assert problems == []


def _run_config_problem(text: str) -> str | None:
    """None if Flower parses `--run-config TEXT` and an App fedhet writes (FedAvg or FedProx on the quickstart)
    accepts it; else why not."""
    from flwr.common.config import parse_config_args

    from fedhet.config import load_config
    from fedhet.runtimes.flower.run_config import RUNTIME_KEYS, experiment_run_config, read_run_config

    try:
        override = parse_config_args([text])
    except Exception as err:  # noqa: BLE001 - Flower's ClickException
        return f"Flower cannot parse it ({err}); quote text values: key=\"text\""
    errors = []
    for method in ("fedavg", "fedprox"):
        app = experiment_run_config(load_config("configs/quickstart.yaml", [f"method={method}"]).to_dict())
        unknown = set(override) - set(app) - set(RUNTIME_KEYS)
        try:
            assert not unknown, f"keys the App does not list: {sorted(unknown)}"
            read_run_config({**app, **override})
            return None
        except Exception as err:  # noqa: BLE001 - reported
            errors.append(f"{method} App: {err}")
    return "; ".join(errors)


@pytest.mark.parametrize("page", [p for p in PAGES if run_config_strings(p)], ids=_ids)
def test_run_config_examples_parse_in_flower_and_validate(page: Path, monkeypatch, tmp_path: Path) -> None:
    pytest.importorskip("flwr")
    monkeypatch.chdir(tmp_path)
    problems = []
    for text, shows_error in run_config_strings(page):
        why = _run_config_problem(text)
        if why and (not shows_error or "Flower cannot parse" in why):  # an error example must still parse
            problems.append(f"{page.name}: --run-config {text!r}: {why}")
    assert problems == []


def test_the_checker_finds_the_blocks_and_catches_bad_lines(tmp_path: Path, monkeypatch, capsys) -> None:
    """The checks above would pass silently if nothing were found, or if a bad line went through."""
    commands = [argv for b in ALL if b.lang in SHELLS for argv in fedhet_commands(b)]
    assert len(commands) >= 40 and len(PYTHON) >= 8
    bash = Block(PAGES[0], 1, "bash", "FEDHET_DATA=/d fedhet flower simulate configs/quickstart.yaml \\\n"
                                      "    [--num-cpus 2] rounds=3 &  # comment\nflwr run app\n")
    assert fedhet_commands(bash) == [["flower", "simulate", "configs/quickstart.yaml", "--num-cpus", "2", "rounds=3"]]
    monkeypatch.chdir(tmp_path)
    assert _check_command(["run", "configs/quickstart.yaml", "rounds=2"], capsys) is None
    assert "does not load" in str(_check_command(["run", "configs/quickstart.yaml", "trian.lr=0.1"], capsys))
    assert "does not load" in str(_check_command(["run", "configs/no_such.yaml"], capsys))
    assert "does not parse" in str(_check_command(["run", "configs/quickstart.yaml", "--no-such-flag"], capsys))
    assert "cannot parse" in str(_run_config_problem('method=fedbn data.domains="[mnist, usps]"'))
    assert _run_config_problem('method="fedbn" rounds=5') is None


@pytest.mark.parametrize("page", [p for p in PAGES if node_config_strings(p)], ids=_ids)
def test_node_config_examples_parse_in_flower(page: Path) -> None:
    """`flower-supernode --node-config "..."` goes through the same Flower parser: text values quoted."""
    pytest.importorskip("flwr")
    from flwr.common.config import parse_config_args

    for text in node_config_strings(page):
        assert all(value != "" for value in parse_config_args([text]).values()), text


@pytest.mark.parametrize("page", _pages_with(lambda b: b.lang in ("yaml", "yml") and b.marker != "skip"), ids=_ids)
def test_yaml_blocks_are_valid_configs(page: Path, tmp_path: Path, monkeypatch, registries) -> None:
    """A YAML block is an experiment config (validated as `fedhet run` would) or a tune search space."""
    import yaml

    from fedhet.config import load_config
    from fedhet.tune.config import parse_space

    _page_folder(page, tmp_path, monkeypatch)
    problems = []
    for block in blocks(page):
        if block.lang not in ("yaml", "yml") or block.marker == "skip":
            continue
        try:
            tree = yaml.safe_load(block.code)
            assert isinstance(tree, dict), "not a mapping"
            if {"client", "preset"} & set(tree):
                parse_space(tree)
            else:
                load_config(base=tree)
        except Exception as err:  # noqa: BLE001 - reported with the block
            problems.append(f"{block.name}: {type(err).__name__}: {err}")
    assert problems == []
