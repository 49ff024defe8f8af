"""The generated Python package's shape, on every Python variant, read from its imports with
`ast`: what is the user's sits at its top among few entries, and each module imports only
from its own layer or the layers below it.

The layers, bottom first (the package's __init__.py and docs/architecture.md say the same):
  0. handlers/ (the user's), settings.py, registry.py and dependencies.py (what a handler
     imports), __init__.py
  1. queue/: the queue client
  2. worker/ and dashboard/
  3. cli/ and __main__.py: the entry points; testing/: the helpers of the project's own tests
"""

from __future__ import annotations

import ast
import itertools
import shutil
from pathlib import Path

import pytest

from testkit.project import PYTHON_VARIANTS, Variant, render

LAYERS = (
    ("handlers", "settings", "registry", "dependencies", "__init__"),
    ("queue",),
    ("worker", "dashboard"),
    ("cli", "__main__", "testing"),
)
# Files and folders at the package's top, __init__.py, __main__.py and handlers/ counted.
MAX_TOP_ENTRIES = 12
PACKAGE = "my_app"


def top_entries(package: Path) -> list[str]:
    return sorted(p.name for p in package.iterdir() if p.name != "__pycache__")


def module_name(package: Path, path: Path) -> str:
    """`path`'s dotted name inside `package` ("worker.loop"; a package's __init__.py is the
    package: "worker"; the top's own is "__init__")."""
    parts = list(path.relative_to(package).with_suffix("").parts)
    if parts[-1] == "__init__" and len(parts) > 1:
        parts.pop()
    return ".".join(parts)


def modules(package: Path) -> dict[str, Path]:
    return {module_name(package, path): path for path in sorted(package.rglob("*.py"))}


def resolve(package: Path, importer: str, is_package: bool, node: ast.ImportFrom) -> list[str]:
    """The package's modules an `from ... import ...` reaches (a name that is a submodule
    counts as that module), [] for other packages' imports."""
    if node.level == 0:
        if node.module is None or not node.module.startswith(PACKAGE):
            return []
        base = node.module.removeprefix(PACKAGE).lstrip(".").split(".") if node.module else []
    else:
        here = importer.split(".") if importer != "__init__" else []
        parent = here if is_package else here[:-1]
        up = node.level - 1
        if up > len(parent):
            raise AssertionError(f"{importer}: relative import above the package")
        base = parent[: len(parent) - up] + (node.module.split(".") if node.module else [])
    base = [part for part in base if part]
    found = []
    for alias in node.names:
        candidate = [*base, alias.name]
        on_disk = package.joinpath(*candidate)
        if on_disk.with_suffix(".py").exists() or (on_disk / "__init__.py").exists():
            found.append(".".join(candidate))
        else:
            found.append(".".join(base) or "__init__")
    return found


def imports(package: Path) -> dict[str, set[str]]:
    """Each module's imports of the package's other modules, wherever they are in it (inside
    a function, or under TYPE_CHECKING, alike)."""
    graph: dict[str, set[str]] = {}
    for name, path in modules(package).items():
        is_package = path.name == "__init__.py" and name != "__init__"
        tree = ast.parse(path.read_text(), str(path))
        graph[name] = {
            target
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom)
            for target in resolve(package, name, is_package, node)
        } - {name}
    return graph


def layer(module: str) -> int:
    top = module.split(".")[0]
    for n, names in enumerate(LAYERS):
        if top in names:
            return n
    raise AssertionError(f"{module}: in no layer; add it to LAYERS (and to the package's docs)")


def upward_imports(package: Path) -> list[str]:
    """Every import of a module of a layer above the importer's; every module must be in a
    layer."""
    graph = imports(package)
    for module in graph:
        layer(module)
    return [
        f"{module} (layer {layer(module)}) imports {target} (layer {layer(target)})"
        for module, targets in sorted(graph.items())
        for target in sorted(targets)
        if layer(target) > layer(module)
    ]


@pytest.fixture(scope="module", params=PYTHON_VARIANTS, ids=str)
def package(
    request: pytest.FixtureRequest, template: Path, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    variant: Variant = request.param
    project = render(template, tmp_path_factory.mktemp(str(variant)), **variant.answers)
    return project / "src" / PACKAGE


@pytest.mark.quick
def test_the_package_top_holds_few_entries_the_users_first(package: Path) -> None:
    entries = top_entries(package)
    print(f"{len(entries)} entries at the top: {', '.join(entries)}")
    assert len(entries) <= MAX_TOP_ENTRIES, entries
    assert {"handlers", "settings.py"} <= set(entries)


@pytest.mark.quick
def test_no_module_imports_from_a_layer_above_its_own(package: Path) -> None:
    graph = imports(package)
    assert graph["cli"] and graph["worker.loop"], "the import graph is read"
    assert upward_imports(package) == []


# Each check fails on a copy of a rendered package with one violation planted.


@pytest.fixture
def copy(package: Path, tmp_path: Path) -> Path:
    copy = tmp_path / PACKAGE
    shutil.copytree(package, copy)
    return copy


@pytest.mark.quick
def test_a_planted_upward_import_fails_the_layer_check(copy: Path) -> None:
    client = copy / "queue" / "client.py"
    client.write_text(client.read_text() + "\n\ndef _late() -> None:\n    from ..cli import main\n")
    handler = copy / "handlers" / "send_email.py"
    handler.write_text(handler.read_text() + "\nfrom ..worker.logs import job_fields\n")
    assert upward_imports(copy) == [
        "handlers.send_email (layer 0) imports worker.logs (layer 2)",
        "queue.client (layer 1) imports cli (layer 3)",
    ]
    with pytest.raises(AssertionError):
        test_no_module_imports_from_a_layer_above_its_own(copy)


@pytest.mark.quick
def test_a_crowded_top_fails_the_entry_count(copy: Path) -> None:
    for n in range(MAX_TOP_ENTRIES + 1 - len(top_entries(copy))):
        (copy / f"extra_{n}.py").write_text("")
    with pytest.raises(AssertionError):
        test_the_package_top_holds_few_entries_the_users_first(copy)
    with pytest.raises(AssertionError, match="extra_0: in no layer"):
        upward_imports(copy)


# The path a setting takes from the command line to the claim, read from the calls that pass
# it on: from a function of one module to one of another, with an argument that carries it
# (the setting by name, or an object holding it: the settings, the worker's context). The
# claim is the call of complete_and_claim(), which the transport implements.
CARRIERS = {"settings", "context"}
CLAIM = "complete_and_claim"
MAX_SETTING_PATH = 4


def _mentions(node: ast.AST, names: set[str]) -> bool:
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name) and sub.id.lstrip("_") in names:
            return True
        if isinstance(sub, ast.Attribute) and sub.attr.lstrip("_") in names:
            return True
    return False


def _carries(call: ast.Call, names: set[str]) -> bool:
    return any(_mentions(arg, names) for arg in [*call.args, *(k.value for k in call.keywords)])


def _is_abstract(function: ast.AST) -> bool:
    decorators = getattr(function, "decorator_list", [])
    return any(_mentions(decorator, {"abstractmethod"}) for decorator in decorators)


class _Package:
    """Its modules' trees, what each defines (functions, classes, their methods) and the
    names each imports, resolved to the module that defines them."""

    def __init__(self, package: Path) -> None:
        self.paths = modules(package)
        self.trees = {name: ast.parse(path.read_text()) for name, path in self.paths.items()}
        self.defines = {
            name: {
                node.name
                for node in tree.body
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
            }
            for name, tree in self.trees.items()
        }
        # method name -> the modules whose classes implement it (abstract ones left out)
        self.methods: dict[str, set[str]] = {}
        for name, tree in self.trees.items():
            for node in tree.body:
                if isinstance(node, ast.ClassDef):
                    for item in node.body:
                        concrete = not _is_abstract(item)
                        if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef) and concrete:
                            self.methods.setdefault(item.name, set()).add(name)
        self.package = package

    def imported(self, module: str) -> dict[str, set[str]]:
        """The names `module` imports from the package, each with the modules it reaches (a
        name two functions import from two modules reaches both)."""
        path = self.paths[module]
        is_package = path.name == "__init__.py" and module != "__init__"
        found: dict[str, set[str]] = {}
        for node in ast.walk(self.trees[module]):
            if isinstance(node, ast.ImportFrom):
                targets = resolve(self.package, module, is_package, node)
                for alias, target in zip(node.names, targets, strict=False):
                    home = self.home(target, alias.name)
                    found.setdefault(alias.asname or alias.name, set()).add(home)
        return found

    def home(self, module: str, name: str) -> str:
        """The module that defines `name` as `module` has it (following re-exports)."""
        if module not in self.trees or name in self.defines[module]:
            return module
        if module.endswith(name) and module.rpartition(".")[2] == name:
            return module  # the name is the module itself
        again = self.imported(module).get(name)
        return min(again) if again else module

    def targets(self, module: str, call: ast.Call, imported: dict[str, set[str]]) -> set[str]:
        function = call.func
        if isinstance(function, ast.Name):
            if function.id in self.defines[module]:
                return {module}
            return imported.get(function.id, set())
        if not isinstance(function, ast.Attribute):
            return set()
        if isinstance(function.value, ast.Name):
            if function.value.id in imported:  # a class's or module's: Settings.from_env()
                return imported[function.value.id]
            if function.value.id == "self":
                return {module}
        implementations = self.methods.get(function.attr, set())
        return implementations if len(implementations) == 1 else set()

    def hands_on(self, names: set[str]) -> dict[str, set[str]]:
        """module -> the other modules it calls with an argument that carries `names`."""
        edges: dict[str, set[str]] = {}
        for module, tree in self.trees.items():
            imported = self.imported(module)
            for call in (node for node in ast.walk(tree) if isinstance(node, ast.Call)):
                if _carries(call, names):
                    edges.setdefault(module, set()).update(self.targets(module, call, imported))
            edges.setdefault(module, set()).discard(module)
        return edges

    def claimers(self, names: set[str]) -> set[str]:
        """The modules that call complete_and_claim() with an argument carrying `names`."""
        return {
            module
            for module, tree in self.trees.items()
            for node in ast.walk(tree)
            if isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == CLAIM
            and _carries(node, names)
        }


def setting_path(package: Path, setting: str, entry: str = "cli") -> list[str]:
    """The shortest chain of modules that hands `setting` on from `entry` (the command line)
    to the claim, the transport that makes it last."""
    graph = _Package(package)
    names = CARRIERS | {setting}
    edges = graph.hands_on(names)
    (transport,) = graph.methods[CLAIM]
    claimers = graph.claimers(names)
    paths, seen = [[entry]], {entry}
    while paths:
        path = paths.pop(0)
        if path[-1] in claimers:
            return [*path, transport] if path[-1] != transport else path
        for following in sorted(edges.get(path[-1], ())):
            if following not in seen:
                seen.add(following)
                paths.append([*path, following])
    raise AssertionError(f"no module hands {setting} from {entry} on to {CLAIM}()")


def path_problems(path: list[str]) -> list[str]:
    """What is wrong with a setting's path: too many modules, or a step up a layer (coming
    back)."""
    problems = []
    if len(path) > MAX_SETTING_PATH:
        problems.append(f"{len(path)} modules, more than {MAX_SETTING_PATH}")
    for here, following in itertools.pairwise(path):
        if layer(following) > layer(here):
            problems.append(f"{here} (layer {layer(here)}) hands it up to {following}")
    return problems


def describe_path(package: Path, setting: str, path: list[str]) -> str:
    graph = _Package(package)
    named = {m for m, tree in graph.trees.items() if _mentions(tree, {setting})}
    readers = ", ".join(sorted(named))
    steps = " -> ".join(f"{m}{' (names it)' if m in named else ''}" for m in path)
    return f"{setting}: {steps}\n  modules that name it: {readers}"


@pytest.mark.quick
@pytest.mark.parametrize("setting", ["batch_size", "lease_seconds"])
def test_a_setting_goes_from_the_command_line_to_the_claim_downwards(
    package: Path, setting: str
) -> None:
    path = setting_path(package, setting)
    print(describe_path(package, setting, path))
    assert path[0] == "cli" and path[-1].startswith("queue."), path
    assert path_problems(path) == []


def write_package(root: Path, files: dict[str, str]) -> Path:
    package = root / PACKAGE
    for name, text in files.items():
        path = package / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    for folder in {p.parent for p in package.rglob("*.py")}:
        (folder / "__init__.py").touch()
    return package


TRANSPORT = (
    "class Queue:\n    async def complete_and_claim(self, *args, **kw):\n        return []\n"
)


@pytest.mark.quick
def test_a_planted_long_or_climbing_path_fails_the_setting_check(tmp_path: Path) -> None:
    """A chain of five modules, and one that goes down to queue/ and back up to worker/."""
    long = write_package(
        tmp_path / "long",
        {
            "cli/__init__.py": "from ..worker.loop import run\n\ndef main(settings):\n"
            "    run(settings)\n",
            "worker/loop.py": "from .steps import step\n\ndef run(settings):\n    step(settings)\n",
            "worker/steps.py": "from .more import more\n\ndef step(settings):\n"
            "    more(settings)\n",
            "worker/more.py": "def more(settings, queue):\n"
            "    queue.complete_and_claim(settings.worker_name)\n",
            "queue/transport.py": TRANSPORT,
        },
    )
    path = setting_path(long, "batch_size")
    assert path == ["cli", "worker.loop", "worker.steps", "worker.more", "queue.transport"]
    assert path_problems(path) == ["5 modules, more than 4"]

    climbing = write_package(
        tmp_path / "climbing",
        {
            "cli/__init__.py": "from ..queue.lease import read\n\ndef main(settings):\n"
            "    read(settings)\n",
            "queue/lease.py": "from ..worker.loop import claim\n\ndef read(settings):\n"
            "    claim(settings)\n",
            "worker/loop.py": "def claim(settings, queue):\n"
            "    queue.complete_and_claim(settings.worker_name)\n",
            "queue/transport.py": TRANSPORT,
        },
    )
    path = setting_path(climbing, "lease_seconds")
    assert path == ["cli", "queue.lease", "worker.loop", "queue.transport"]
    assert path_problems(path) == ["queue.lease (layer 1) hands it up to worker.loop"]
