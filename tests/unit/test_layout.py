"""The layout's promises: the training process never imports the offline side (numba, the
prepare pipeline), accelerator plugins depend only on torch, Lightning and the model, the
import graph of omnibert's modules has no circle and no arrow pointing up the layers, run/'s
subjects import only the subjects they build on, and no source file passes 450 lines."""

from __future__ import annotations

import ast
import graphlib
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from omnibert.prepare.instances import InstanceSettings
from omnibert.prepare.pipeline import prepare

SRC = Path(__file__).resolve().parents[2] / "src" / "omnibert"
REFERENCE = Path(__file__).parents[1] / "fixtures" / "reference"
#: modules the training process must never load (offline data generation)
OFFLINE = ("numba", "omnibert.prepare.pipeline", "omnibert.prepare.instances",
           "omnibert.prepare.instance_kernel", "omnibert.prepare.shards")  # fmt: skip

TRAINING_SIDE = """
import json, sys
import omnibert.apps.train, omnibert.data.datamodule, omnibert.data.converted
from omnibert.data.datamodule import PretrainingDataModule
from omnibert.data.sources import ArrowSource
dm = PretrainingDataModule(source=ArrowSource, train_path=sys.argv[1], eval_path=sys.argv[1],
                           max_seq_length=32, max_predictions_per_seq=5, micro_batch_size=4,
                           num_workers=0)
dm.setup("fit")
batch = next(iter(dm.train_dataloader()))
next(iter(dm.val_dataloader()))
print(json.dumps({"shape": list(batch["input_ids"].shape),
                  "loaded": sorted(m for m in sys.modules if m.startswith(("numba", "omnibert")))}))
"""


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory, bert_vocab_file: Path) -> Path:
    out = tmp_path_factory.mktemp("layout") / "train"
    settings = InstanceSettings(max_seq_length=32, max_predictions_per_seq=5, dupe_factor=1)
    prepare([str(REFERENCE / "tiny_docs.txt")], bert_vocab_file, out, settings, progress=False)
    return out


def test_training_reads_shards_without_importing_numba_or_the_prepare_pipeline(shards):
    done = subprocess.run(
        [sys.executable, "-c", TRAINING_SIDE, str(shards)],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["shape"] == [4, 32]  # the batch really was read from the shards
    offline = [m for m in report["loaded"] if m.startswith(OFFLINE)]
    assert offline == [], offline
    assert "omnibert.data.sources" in report["loaded"]


def _imports(path: Path) -> set[str]:
    """Every module a file imports (top level or inside functions)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


@pytest.mark.parametrize("path", sorted((SRC / "accelerators").glob("*.py")), ids=lambda p: p.name)
def test_accelerator_plugins_depend_only_on_torch_lightning_and_the_model(path):
    allowed = ("omnibert.accelerators", "omnibert.models", "omnibert.errors", "omnibert.compat",
               "omnibert.threads")  # fmt: skip
    ours = {m for m in _imports(path) if m.split(".")[0] == "omnibert"}
    outside = sorted(m for m in ours if not m.startswith(allowed))
    assert outside == [], f"{path.name} imports {outside}"


def test_the_thread_choice_imports_no_torch():
    """omnibert.threads runs in omnibert-train before torch loads (the OpenMP wait policy)."""
    imported = {m.split(".")[0] for m in _imports(SRC / "threads.py")}
    assert imported <= {"__future__", "collections", "math", "os", "pathlib", "sys", "omnibert"}


def test_the_compat_shims_import_only_torch_and_lightning():
    """omnibert.compat sits under the accelerator plugins: it imports nothing of omnibert."""
    imported = {m.split(".")[0] for m in _imports(SRC / "compat.py")}
    stdlib = {"__future__", "collections", "contextlib", "importlib", "inspect", "logging",
              "pathlib", "types", "typing"}  # fmt: skip
    assert imported <= stdlib | {"torch", "lightning"}, imported


@pytest.mark.parametrize(
    "package",
    [
        "data",
        "formats",
        "models",
        "packing",
        "tokenization",
        "optim",
        "accelerators",
        "convert",
        "checkpoints",
    ],
)
def test_training_side_packages_never_import_the_offline_side(package):
    for path in sorted((SRC / package).rglob("*.py")):
        offline = sorted(m for m in _imports(path) if m.startswith(("omnibert.prepare", "numba")))
        if package == "packing":  # the packing algorithms compile with numba, imported lazily
            offline = [m for m in offline if m != "numba"]
        assert offline == [], f"{path.relative_to(SRC)} imports {offline}"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in sorted(SRC.rglob("*.py"))}


def _omnibert_imports(module: str, path: Path) -> set[str]:
    """The omnibert modules ``module`` imports anywhere in its file (top level, inside
    functions, under ``TYPE_CHECKING``): ``from a.b import c`` names ``a.b.c`` when that is a
    module, else ``a.b``; relative imports are resolved against the module's package."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            names = [f"{base}.{alias.name}" for alias in node.names]
            names = [n if n in MODULES else base for n in names]
        else:
            continue
        for name in names:
            while name and name not in MODULES:  # an attribute of a module: that module
                name = name.rpartition(".")[0]
            if name and name != module:
                found.add(name)
    return found


def import_graph() -> dict[str, set[str]]:
    """omnibert module -> the omnibert modules it imports."""
    return {module: _omnibert_imports(module, path) for module, path in MODULES.items()}


def _room(module: str) -> str:
    """The folder (or top-level module) under ``omnibert`` a module lives in."""
    return module.split(".")[1] if "." in module else module


#: room -> rooms it must never import: arrows run down, from the apps to what they wire
BELOW_RUN = ("data", "convert", "tasks", "formats", "models", "packing", "tokenization",
             "optim", "accelerators", "callbacks", "finetune", "config",
             "checkpoints")  # fmt: skip
FORBIDDEN = {room: ("prepare", "run", "apps") for room in BELOW_RUN} | {"run": ("apps",)}


def test_the_import_graph_reads_the_code():
    """The parser sees what the code imports: a top-level import, a lazy one inside a
    function, one under TYPE_CHECKING and a ``from package import module``."""
    graph = import_graph()
    assert "omnibert.data.schema" in graph["omnibert.data.checks"]  # top level
    assert "omnibert.tokenization.vocab" in graph["omnibert.data.checks"]  # inside a function
    assert "omnibert.models.bert" in graph["omnibert.models"]  # under TYPE_CHECKING
    assert (
        "omnibert.data.schema" in graph["omnibert.prepare.metadata"]
    )  # from omnibert.data import schema
    assert len(graph) > 100 and all(graph[m] <= graph.keys() for m in graph)


def test_no_import_circles_among_omnibert_modules():
    """Not one cycle, of any length (graphlib names one when there is one)."""
    try:
        graphlib.TopologicalSorter(import_graph()).prepare()
    except graphlib.CycleError as err:
        pytest.fail(f"import circle: {' -> '.join(err.args[1])}")


def test_no_import_points_up_the_layers():
    """Training-time code never imports the offline side or the layers that run it (data,
    convert, tasks, ... never import prepare/ or run/), and run/ never imports the apps."""
    upward = sorted(
        f"{module} -> {target}"
        for module, targets in import_graph().items()
        for target in targets
        if _room(target) in FORBIDDEN.get(_room(module), ())
    )
    assert upward == [], upward


#: the rooms under omnibert, bottom to top: a room imports only itself and the rooms of the
#: layers below its own (two rooms of one layer never import each other). run/'s subjects are
#: kept apart by RUN_SUBJECTS.
LAYERS = (
    ("omnibert", "stopping", "compat", "logs", "reporting"),  # "omnibert": its __version__
    ("errors",),
    ("threads", "paths", "formats", "tokenization", "models", "packing"),
    ("config",),
    ("optim", "finetune", "accelerators", "convert", "data"),
    ("tasks", "prepare"),
    ("checkpoints",),
    ("callbacks",),
    ("run",),
    ("apps",),
)
LAYER = {room: level for level, rooms in enumerate(LAYERS) for room in rooms}
#: run/'s subject -> the subjects it may import: the two jobs meet only in the pipeline, sizing
#: and the pipeline stand on their own, the tools read fine-tuning's inputs and outputs, the
#: sweep report writes fine-tuning's GLUE table
RUN_SUBJECTS = {
    "pipeline": set(),
    "sizing": set(),
    "finetuning": {"pipeline"},
    "launching": {"finetuning"},
    "tools": {"pipeline", "finetuning"},
    "pretraining": {"pipeline", "sizing", "launching"},
}
#: rooms that may import the offline side (prepare/): the apps, and itself
OFFLINE_USERS = ("apps", "prepare")
MAX_LINES = 450
ROOT = SRC.parents[1]


def _subject(module: str) -> str | None:
    """run/'s subject of a module (``omnibert.run.sizing.memory`` -> ``sizing``), else None."""
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[1] == "run" else None


def layout_violations(graph: dict[str, set[str]]) -> list[str]:
    """Every arrow of ``graph`` that breaks a rule above, as ``"source -> target"``."""
    broken = []
    for module, targets in graph.items():
        for target in targets:
            here, there = _room(module), _room(target)
            up = here != there and LAYER[there] >= LAYER[here]
            offline = there == "prepare" and here not in OFFLINE_USERS
            subject, other = _subject(module), _subject(target)
            apart = subject and other and other != subject and other not in RUN_SUBJECTS[subject]
            if up or offline or apart:
                broken.append(f"{module} -> {target}")
    return sorted(broken)


def test_every_room_has_its_layer():
    rooms = {_room(module) for module in import_graph()}
    assert rooms == set(LAYER), rooms ^ set(LAYER)


def test_the_rooms_import_only_down_and_the_subjects_of_run_stay_apart():
    """Nothing imports up the layers (checkpoints never import the callbacks, run/ or the
    apps; data never imports tasks, ...), only the apps import prepare/, and run/'s subjects
    import only the subjects they build on (sizing never imports fine-tuning, the tools
    never import launching, the pipeline imports neither job)."""
    assert layout_violations(import_graph()) == []


@pytest.mark.parametrize(
    ("source", "target"),
    [
        ("omnibert.run.sizing.memory", "omnibert.run.finetuning.job"),
        ("omnibert.run.tools.evaluation", "omnibert.run.launching.sweeps"),
        ("omnibert.run.pipeline.stages", "omnibert.run.pretraining.job"),
        ("omnibert.run.finetuning.job", "omnibert.run.pretraining.plan"),
        ("omnibert.checkpoints.saving", "omnibert.apps.train"),
        ("omnibert.checkpoints.resuming", "omnibert.callbacks.requeue"),
        ("omnibert.models.bert", "omnibert.data.collate"),
        ("omnibert.config.train", "omnibert.apps.compose"),
        ("omnibert.callbacks.stop", "omnibert.prepare.pipeline"),
    ],
)
def test_each_rule_refuses_an_arrow_that_breaks_it(source, target):
    graph = import_graph()
    assert target not in graph[source]  # the code keeps the rule today
    graph[source] = graph[source] | {target}
    assert layout_violations(graph) == [f"{source} -> {target}"]


SUBJECT_PACKAGES = sorted(
    [p for p in (SRC / "run").iterdir() if (p / "__init__.py").is_file()] + [SRC / "checkpoints"]
)


def test_run_holds_only_its_subject_packages():
    assert [p.name for p in (SRC / "run").glob("*.py")] == ["__init__.py"]
    assert {p.name for p in SUBJECT_PACKAGES if p.parent.name == "run"} == set(RUN_SUBJECTS)


@pytest.mark.parametrize("package", SUBJECT_PACKAGES, ids=lambda p: p.name)
def test_a_subject_package_is_small_and_says_what_it_holds_in_one_line(package):
    """At most 8 modules; its ``__init__`` is a one-line docstring and nothing else, so
    importing one module of a subject loads no other."""
    modules = sorted(p.name for p in package.glob("*.py") if p.name != "__init__.py")
    assert 1 <= len(modules) <= 8, modules
    tree = ast.parse((package / "__init__.py").read_text(encoding="utf-8"))
    docstring = ast.get_docstring(tree) or ""
    assert docstring and "\n" not in docstring, docstring
    assert len(tree.body) == 1


def files_over(limit: int, paths: list[Path]) -> dict[str, int]:
    """The files among ``paths`` longer than ``limit`` lines, with their lengths."""
    lengths = {str(p): len(p.read_text(encoding="utf-8").splitlines()) for p in paths}
    return {name: n for name, n in lengths.items() if n > limit}


def test_no_source_file_passes_450_lines(tmp_path):
    sources = sorted([*SRC.rglob("*.py"), *(ROOT / "kernels").rglob("*.py")])
    assert len(sources) > 150 and files_over(MAX_LINES, sources) == {}
    long = tmp_path / "long.py"  # the check itself sees a file one line too long
    long.write_text("x = 1\n" * (MAX_LINES + 1), encoding="utf-8")
    assert files_over(MAX_LINES, [*sources[:3], long]) == {str(long): MAX_LINES + 1}


TESTS = ROOT / "tests"
#: what starts a whole job in another process: a console script, a launcher, a script
JOB = re.compile(r"omnibert-(prepare|train|finetune|eval|export|predict)\b|torch\.distributed\.run"
                 r"|\btorchrun\b|\bmpirun\b|\bsrun\b|scripts/|\"scripts\"")  # fmt: skip


def _job_starts(path: Path) -> list[str]:
    """The lines of a test file that start a job in another process (none without subprocess)."""
    text = path.read_text()
    if "subprocess" not in text:
        return []
    return [line.strip() for line in text.splitlines() if JOB.search(line)]


def test_every_test_file_lives_in_a_lane():
    assert not sorted(p.name for p in TESTS.glob("test_*.py")), "tests/unit/ or tests/e2e/"
    assert len(list((TESTS / "unit").glob("test_*.py"))) > 40
    assert len(list((TESTS / "e2e").glob("test_*.py"))) > 40


def test_the_fast_lane_starts_no_job_in_another_process():
    # this file names the jobs in its rule (and its import check is `python -c`, no job)
    lane = [p for p in sorted((TESTS / "unit").glob("test_*.py")) if p.name != Path(__file__).name]
    starts = {p.name: _job_starts(p) for p in lane}
    assert not {name: lines for name, lines in starts.items() if lines}, "move it to tests/e2e/"
    # the rule sees a job where there is one
    assert _job_starts(TESTS / "e2e" / "test_ranks.py")
    assert _job_starts(TESTS / "e2e" / "test_command_line.py")


def test_each_config_is_defined_once():
    """The typed configs of omnibert.config are the schemas Hydra composes against: no second
    set of schema classes beside them."""
    assert not (SRC / "schema.py").exists()
    assert not (SRC / "apps" / "app_schemas.py").exists()
    from omnibert.apps.compose import SCHEMAS

    assert {module for module, _ in SCHEMAS.values()} <= {
        m for m in MODULES if m.startswith("omnibert.config.")
    }


def test_no_signature_takes_a_composed_config_or_a_typed_one():
    """Below the apps, functions take the typed config only (tests compose configs as the apps
    do and pass the typed config): no ``DictConfig | ...`` parameter anywhere in src/."""
    either = re.compile(r"DictConfig\s*\|")
    found = [
        f"{path.relative_to(SRC)}:{number}"
        for path in MODULES.values()
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if either.search(line)
    ]
    assert found == []
