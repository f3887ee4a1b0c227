"""Module boundaries (docs/architecture.md): no import cycle, dependencies point downwards only, nothing
below the stage layer receives a stage config, the house is at most 13 floors tall, and no package file
outgrows 500 lines; no test module imports another. Read from the import statements themselves (top level or
inside a function), so a boundary cannot be crossed silently by a late import."""

import ast
from pathlib import Path

import pytest

from rlhfkit import config

PACKAGE = Path(__file__).resolve().parents[2] / "rlhfkit"
MAX_LINES = 500
# each top-level file or folder of the package one unit, one floor above the highest unit it imports
MAX_FLOORS = 13
# the ground: imports nothing of rlhfkit but these
GROUND = {
    "config": ("rlhfkit.errors", "rlhfkit.config"),
    "errors.py": (),
    "attention_masks.py": (),
    "ops.py": (),
    "policy_losses.py": ("rlhfkit.ops",),
    "distill_ops.py": ("rlhfkit.ops",),
    "preference_ops.py": (),
    "plots.py": (),
    "intervals.py": (),
    "rouge.py": (),
    "devices.py": (),
    "distributed.py": (),
    "faults.py": ("rlhfkit.errors",),
    "launch.py": ("rlhfkit.faults", "rlhfkit.errors"),
    "preemption.py": ("rlhfkit.errors",),
    "supplied.py": ("rlhfkit.errors",),
}
# a file or folder of the package -> the packages none of its files may import
FORBIDDEN = {
    "eval": ("rlhfkit.trainers", "rlhfkit.onpolicy", "rlhfkit.stages", "rlhfkit.pipeline_command"),
    # the reward-model evaluation the trainers use: no policy evaluation, no stage
    "reward_eval": ("rlhfkit.eval", "rlhfkit.trainers", "rlhfkit.onpolicy", "rlhfkit.stages"),
    # the report every stage writes: below every evaluation and stage
    "report": ("rlhfkit.eval", "rlhfkit.reward_eval", "rlhfkit.trainers", "rlhfkit.onpolicy", "rlhfkit.stages"),
    # one command path under both shells (command.py): neither shell imports the other
    "cli.py": ("rlhfkit.api",),
    "api.py": ("rlhfkit.cli",),
    "data": ("rlhfkit.eval", "rlhfkit.trainers", "rlhfkit.onpolicy", "rlhfkit.stages"),
    "scoring.py": ("rlhfkit.eval", "rlhfkit.trainers", "rlhfkit.onpolicy"),
    "generation.py": ("rlhfkit.eval", "rlhfkit.trainers", "rlhfkit.onpolicy"),
    "decoding": ("rlhfkit.generation", "rlhfkit.environments", "rlhfkit.eval", "rlhfkit.trainers", "rlhfkit.onpolicy"),
    "environments": ("rlhfkit.eval", "rlhfkit.trainers", "rlhfkit.onpolicy", "rlhfkit.stages", "rlhfkit.generation"),
    "rollout.py": ("rlhfkit.eval", "rlhfkit.trainers", "rlhfkit.onpolicy", "rlhfkit.generation"),
    # the trainers evaluate a reward model with reward_eval's library, never through its command module
    "trainers": ("rlhfkit.onpolicy", "rlhfkit.stages", "rlhfkit.pipeline_command", "rlhfkit.reward_eval.command"),
    "onpolicy": ("rlhfkit.stages", "rlhfkit.pipeline_command"),
}
ENTRY_POINTS = ("cli.py", "api.py", "command.py", "stages.py")  # the only files that may import the registry
# the stage layer and above: commands and stages receive their whole config, everything below a typed section
STAGE_LAYER = (
    "cli.py",
    "api.py",
    "command.py",
    "stages.py",
    "pipeline_command.py",
    "recipe_check.py",
    "memory_plan.py",
    "config",
    "trainers",
    "onpolicy/trainer.py",  # the on-policy stage: the rest of onpolicy/ receives the plans and sections it builds
    "data/analyze.py",
    "data/make_task.py",
    "eval/compare.py",
    "eval/gsm8k.py",
    "eval/judge_eval.py",
    "eval/generate.py",
    "reward_eval/command.py",
    "report/runs_report.py",
)


def imports_of(source: str, package: list[str]) -> list[tuple[int, str]]:
    """(line, module) of every import in `source`, a module of `package`, relative imports made
    absolute; `from m import n` gives both m and m.n, since n may be a module."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join([*package[: len(package) - node.level + 1], *([node.module] if node.module else [])])
            found += [(node.lineno, base)] + [(node.lineno, f"{base}.{alias.name}") for alias in node.names]
    return found


def module_name(path: Path) -> str:
    return ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__")


def file_imports(path: Path) -> list[tuple[int, str]]:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return imports_of(path.read_text(), parts[:-1])  # an __init__.py's package is its folder, like a module's


def files_under(name: str) -> list[Path]:
    target = PACKAGE / name
    return sorted(target.rglob("*.py")) if target.is_dir() else [target]


def within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def import_graph(sources: dict[str, str], packages: set[str]) -> dict[str, set[str]]:
    """module -> the modules of `sources` it imports, late imports included; a package in `packages` is
    named by its folder and its source is its __init__.py."""
    graph = {}
    for name, source in sources.items():
        package = name.split(".") if name in packages else name.split(".")[:-1]
        graph[name] = {module for _, module in imports_of(source, package) if module in sources and module != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def package_graph() -> dict[str, set[str]]:
    files = list(PACKAGE.rglob("*.py"))
    packages = {module_name(p) for p in files if p.name == "__init__.py"}
    return import_graph({module_name(p): p.read_text() for p in files}, packages)


def test_relative_imports_are_resolved_against_the_importing_package():
    source = "from .. import ops\nfrom ..trainers.reward import run\n\ndef f():\n    from .command import run_eval\n"
    assert {module for _, module in imports_of(source, ["rlhfkit", "reward_eval"])} == {
        "rlhfkit",
        "rlhfkit.ops",
        "rlhfkit.trainers.reward",
        "rlhfkit.trainers.reward.run",
        "rlhfkit.reward_eval.command",
        "rlhfkit.reward_eval.command.run_eval",
    }
    assert (5, "rlhfkit.reward_eval.command") in imports_of(source, ["rlhfkit", "reward_eval"])  # a late import counts


def test_a_cycle_closed_by_a_function_level_import_is_found():
    planted = {
        "p": "",
        "p.a": "from .b import x\n",
        "p.b": "def f():\n    from .c import y\n",
        "p.c": "from . import a\n",
        "p.d": "",
    }
    assert cycles(import_graph(planted, {"p"})) == [["p.a", "p.b", "p.c"]]
    assert cycles(import_graph(planted | {"p.c": "from . import d\n"}, {"p"})) == []


def test_no_import_cycle_among_package_files():
    found = cycles(package_graph())
    assert not found, "import cycles (function-level imports included):\n" + "\n".join(" -> ".join(c) for c in found)


@pytest.mark.parametrize("layer", sorted(GROUND))
def test_the_ground_imports_nothing_of_rlhfkit_but_what_it_names(layer):
    crossings = [
        f"{path.relative_to(PACKAGE.parent)}:{line} imports {module}"
        for path in files_under(layer)
        for line, module in file_imports(path)
        if within(module, "rlhfkit") and not any(within(module, allowed) for allowed in GROUND[layer])
    ]
    assert not crossings, "\n".join(crossings)


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_no_upward_imports(layer):
    crossings = [
        f"{path.relative_to(PACKAGE.parent)}:{line} imports {module}"
        for path in files_under(layer)
        for line, module in file_imports(path)
        if any(within(module, package) for package in FORBIDDEN[layer])
    ]
    assert not crossings, "\n".join(crossings)


def test_only_the_entry_points_import_the_stage_registry():
    importers = sorted(
        f"{path.relative_to(PACKAGE.parent)}:{line}"
        for path in PACKAGE.rglob("*.py")
        if path.relative_to(PACKAGE).as_posix() not in ENTRY_POINTS
        for line, module in file_imports(path)
        if within(module, "rlhfkit.stages")
    )
    assert not importers, importers


def package_sources() -> dict[str, str]:
    """Each package file's source, by its path inside the package (`onpolicy/trainer.py`)."""
    return {path.relative_to(PACKAGE).as_posix(): path.read_text() for path in sorted(PACKAGE.rglob("*.py"))}


def below_the_stage_layer(relative: str) -> bool:
    return not any(relative == part or relative.startswith(part + "/") for part in STAGE_LAYER)


STAGE_CONFIGS = {name for name in config.__all__ if name.endswith("Config")}  # OnPolicyConfig, SFTConfig, ...


def holds_a_stage_config(annotation: ast.expr | None) -> bool:
    """Whether an annotation names a stage config as the value held: `OnPolicyConfig`, `GRPOConfig | None`;
    `type[OnPolicyConfig]` is a class to compare with, which holds no option."""
    if annotation is None:
        return False
    if isinstance(annotation, ast.Subscript) and ast.unparse(annotation.value) == "type":
        return False
    if isinstance(annotation, ast.Name):
        return annotation.id in STAGE_CONFIGS
    return any(holds_a_stage_config(child) for child in ast.iter_child_nodes(annotation))


def stage_config_takers(sources: dict[str, str]) -> list[str]:
    """`path:line name` of every function below the stage layer that takes `cfg` or a stage config, and of every
    field or variable there that holds one."""
    found = []
    for path, source in sources.items():
        if not below_the_stage_layer(path):
            continue
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                arguments = node.args.posonlyargs + node.args.args + node.args.kwonlyargs
                if any(a.arg == "cfg" or holds_a_stage_config(a.annotation) for a in arguments):
                    found.append(f"{path}:{node.lineno} {node.name}")
            elif isinstance(node, ast.AnnAssign) and holds_a_stage_config(node.annotation):
                found.append(f"{path}:{node.lineno} {ast.unparse(node.target)}")
    return found


def report_builders(sources: dict[str, str]) -> list[str]:
    """`path:line` of every class named Report outside report/."""
    return [
        f"{path}:{node.lineno}"
        for path, source in sources.items()
        if path.split("/")[0] != "report"
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.ClassDef) and node.name == "Report"
    ]


def episode_driver_namers(sources: dict[str, str]) -> list[str]:
    """The files that name `EpisodeDriver` outside the environments, the sampler and the decoding steps."""
    allowed = ("environments/", "generation.py", "decoding/")
    return [path for path, source in sources.items() if not path.startswith(allowed) and "EpisodeDriver" in source]


def test_each_placement_guard_finds_a_planted_violation():
    planted = {
        "onpolicy/trainer.py": "def run(cfg):\n    pass\n",  # the stage: takes its config
        "onpolicy/collect.py": "def draw(cfg, update):\n    pass\n",
        "onpolicy/scoring.py": "class Setup:\n    options: OnPolicyConfig | None\n",
        "onpolicy/update.py": "def plan(options: RolloutOptions, sampling: GRPOConfig):\n    pass\n",
        "onpolicy/algorithms.py": "def algorithm_of(config: type[OnPolicyConfig]):\n    pass\n",  # a class
        "eval/winrate.py": "from ..environments.driver import EpisodeDriver\n\nclass Report:\n    pass\n",
        "report/report.py": "class Report:\n    pass\n",
        "decoding/eager.py": "from ..environments import EpisodeDriver\n",
    }
    assert stage_config_takers(planted) == [
        "onpolicy/collect.py:1 draw", "onpolicy/scoring.py:2 options", "onpolicy/update.py:1 plan"
    ]
    assert report_builders(planted) == ["eval/winrate.py:3"]
    assert episode_driver_namers(planted) == ["eval/winrate.py"]


def test_nothing_below_the_stage_layer_receives_a_stage_config():
    """Below the stages a function gets a typed section (LoraOptions, RolloutOptions, ...) or a plan built from
    the config (UpdatePlan), never `cfg`; in onpolicy/ only the trainer, which builds them, holds the config."""
    takers = stage_config_takers(package_sources())
    assert not takers, "\n".join(takers)


def test_only_report_defines_a_report():
    """Every stage and command writes its report.html through `report.report.Report`: no second builder."""
    builders = report_builders(package_sources())
    assert not builders, builders


def test_only_the_sampler_and_the_environments_name_the_episode_driver():
    """Stages and evaluations hand the sampler an `EpisodePlan`; the driver of a chunk's episodes is built and run
    inside sampling alone."""
    naming = episode_driver_namers(package_sources())
    assert not naming, naming


def test_no_package_file_over_500_lines():
    long = {
        str(p.relative_to(PACKAGE.parent)): n
        for p in PACKAGE.rglob("*.py")
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert not long, f"split these by responsibility: {long}"


def unit_of(module: str) -> str:
    """The top-level file or folder of the package that `module` belongs to."""
    return ".".join(module.split(".")[:2])


def floors(graph: dict[str, set[str]]) -> dict[str, list[str]]:
    """unit -> its longest chain of imports down to the ground (the unit first; its floor is the length),
    each unit one floor above the highest unit it imports. The package facade (`rlhfkit/__init__.py`,
    which loads the API's names on first use) is no unit."""
    units: dict[str, set[str]] = {}
    for module, imported in graph.items():
        unit = unit_of(module)
        if unit != "rlhfkit":
            units.setdefault(unit, set()).update(unit_of(m) for m in imported if unit_of(m) not in (unit, "rlhfkit"))
    chains: dict[str, list[str]] = {}

    def chain(unit: str, above: tuple[str, ...]) -> list[str]:
        if unit in above:
            raise AssertionError("units import each other: " + " -> ".join([*above[above.index(unit) :], unit]))
        if unit not in chains:
            below = [chain(u, (*above, unit)) for u in sorted(units.get(unit, ()))]
            chains[unit] = [unit, *max(below, key=len, default=[])]
        return chains[unit]

    for unit in sorted(units):
        chain(unit, ())
    return chains


def test_floors_count_each_folder_once_and_follow_the_highest_import():
    planted = {
        "rlhfkit": {"rlhfkit.top"},
        "rlhfkit.top": {"rlhfkit.pkg.b", "rlhfkit.low"},
        "rlhfkit.pkg.a": {"rlhfkit.low"},
        "rlhfkit.pkg.b": {"rlhfkit.pkg.a", "rlhfkit"},
        "rlhfkit.low": set(),
    }
    assert floors(planted) == {
        "rlhfkit.low": ["rlhfkit.low"],
        "rlhfkit.pkg": ["rlhfkit.pkg", "rlhfkit.low"],
        "rlhfkit.top": ["rlhfkit.top", "rlhfkit.pkg", "rlhfkit.low"],
    }
    with pytest.raises(AssertionError, match="units import each other: rlhfkit.low -> rlhfkit.pkg -> rlhfkit.low"):
        floors(planted | {"rlhfkit.low": {"rlhfkit.pkg.b"}})


def test_the_house_is_at_most_max_floors_tall():
    chains = floors(package_graph())
    longest = max(chains.values(), key=len)
    assert len(longest) <= MAX_FLOORS, f"{len(longest)} floors, at most {MAX_FLOORS}: " + " -> ".join(longest)


TESTS = PACKAGE.parent / "tests"


def imported_test_modules(path: Path, root: Path = PACKAGE.parent) -> list[str]:
    """The modules of tests/ that the file at `path` (under `root`) imports other than tests/support/ and
    conftest.py (the package `tests` itself aside: `from .. import support` names it)."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    return [
        f"{path.relative_to(root)}:{line} imports {module}"
        for line, module in imports_of(path.read_text(), parts[:-1])
        if within(module, "tests") and module != "tests"
        and not within(module, "tests.support") and not within(module, "tests.conftest")
    ]


def test_a_test_module_importing_another_is_found(tmp_path):
    planted = tmp_path / "tests" / "entry" / "test_api.py"
    planted.parent.mkdir(parents=True)
    planted.write_text("from ..support.tiny import stage_args\nfrom .. import conftest\n\n"
                       "def f():\n    from ..models.test_models import tokenizer_of\n")
    assert imported_test_modules(planted, tmp_path) == [
        "tests/entry/test_api.py:5 imports tests.models.test_models",
        "tests/entry/test_api.py:5 imports tests.models.test_models.tokenizer_of",
    ]


def test_no_test_module_imports_another():
    """Tests share code through tests/support/ and conftest.py only: a test module imported by another ties the
    two modules' places and names together, and one module's helpers become everyone's."""
    files = sorted(TESTS.rglob("*.py"))
    assert len(files) > 100
    found = [crossing for path in files for crossing in imported_test_modules(path)]
    assert not found, "\n".join(found)
