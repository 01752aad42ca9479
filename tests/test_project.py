"""Ground rules of the house that a test can hold: the core never imports flwr; CI runs README's test command;
the documents link only to what exists and speak of the project, not of how it was built."""

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent


def test_core_is_framework_free():
    offenders = [
        str(p.relative_to(ROOT))
        for p in (ROOT / "hddm_flower").rglob("*.py")
        if re.search(r"^\s*(import flwr|from flwr)", p.read_text(), re.M)
    ]
    assert offenders == []


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    block = readme.split("## Tests", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    readme_cmds = [ln.strip() for ln in block.strip().splitlines()]
    ci = [ln.strip() for ln in (ROOT / ".ci" / "run").read_text().splitlines() if ln.strip() and not ln.startswith("#")]
    assert readme_cmds[-1] == ci[-1]  # the test command itself
    assert 'pip install -q -e ".[test]"' in ci and 'pip install -e ".[test]"' in readme_cmds


def test_pyproject_has_no_legacy_federations_block():
    assert "[tool.flwr.federations" not in (ROOT / "pyproject.toml").read_text()


DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
REPO_PATH = re.compile(r"`((?:hddm_flower|strategies|clients|tests|benchmarks|scripts|configs|docs|\.ci)/[^`\s:]*)`")
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _anchor(heading: str) -> str:
    """GitHub's anchor of a Markdown heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _tracked_text_files() -> list[Path]:
    """The repository's text files (``git ls-files``: what a clone has, no build outputs)."""
    try:
        out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    skip = {".png", ".jpg", ".jpeg", ".json", ".tar", ".safetensors", ".pt"}
    return [ROOT / f for f in out.splitlines() if Path(f).suffix not in skip and (ROOT / f).is_file()]


def test_readme_is_a_front_door():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 200


def test_documents_link_only_to_what_exists():
    bad = []
    for doc in DOCS:
        text = doc.read_text()
        for url in LINK.findall(text):
            if url.startswith(("http://", "https://", "mailto:")):
                continue
            path, _, anchor = url.partition("#")
            target = (doc.parent / path).resolve() if path else doc
            if not target.exists():
                bad.append(f"{doc.name}: {url}")
            elif anchor and target.suffix == ".md":
                headings = re.findall(r"^#+ (.*)$", target.read_text(), re.M)
                if anchor not in {_anchor(h) for h in headings}:
                    bad.append(f"{doc.name}: {url} (no such heading)")
        for path in REPO_PATH.findall(text):
            if any(c in path for c in "{*<"):  # a pattern, not a path
                continue
            module = path.split(".", 1)[0] + ".py"  # `clients/expert_pool.workers`: a name in a module
            if not (ROOT / path).exists() and not (ROOT / module).exists():
                bad.append(f"{doc.name}: `{path}`")
    assert bad == []


def test_no_file_cites_documents_outside_the_repository():
    pattern = re.compile(r"DESIGN(\.md)?\s*§|DESIGN\.md|\bnotes/[A-Z]+\.md|PAPER\.md|FLOWER\.md|benchmarks/README")
    offenders = [
        f"{p.relative_to(ROOT)}:{i}"
        for p in _tracked_text_files()
        if p != Path(__file__)
        for i, line in enumerate(p.read_text(errors="replace").splitlines(), 1)
        if pattern.search(line)
    ]
    assert offenders == []


def test_no_file_tells_work_history():
    """The project speaks of itself, not of how or by whom it was built (pytest's scope="session" is fine)."""
    pattern = re.compile(r"\bsessions?\b|\bengineers?\b|\bissue #?[0-9]+", re.I)
    allowed = re.compile(r'scope="session"|test session')
    offenders = [
        f"{p.relative_to(ROOT)}:{i}"
        for p in _tracked_text_files()
        if p != Path(__file__)
        for i, line in enumerate(p.read_text(errors="replace").splitlines(), 1)
        if pattern.search(line) and not allowed.search(line)
    ]
    assert offenders == []


def test_configuration_reference_documents_every_key():
    """docs/configuration.md has a row for every field of every config section, and no row for a field that is gone."""
    import dataclasses

    from hddm_flower.config.schema import Config

    text = (ROOT / "docs" / "configuration.md").read_text()
    documented: dict[str, set[str]] = {}
    for title, body in re.findall(r"^### (.+?)\n(.*?)(?=^#|\Z)", text, re.M | re.S):
        section = title.strip().strip("`")
        rows = re.findall(r"^\| ([^|]+) \|", body, re.M)
        documented[section] = {k for row in rows for k in re.findall(r"`([a-z_0-9]+)`", row)}
    problems, cfg = [], Config()
    for f in dataclasses.fields(cfg):
        if dataclasses.is_dataclass(getattr(cfg, f.name)):
            section = getattr(cfg, f.name)
            keys = {g.name for g in dataclasses.fields(section)}
            have = documented.get(f.name, set())
            problems += [f"{f.name}.{k} undocumented" for k in sorted(keys - have)]
            problems += [f"{f.name}.{k} documented but not in the schema" for k in sorted(have - keys)]
            for g in dataclasses.fields(section):  # a block inside a section (optim) has its own heading
                if dataclasses.is_dataclass(getattr(section, g.name)):
                    inner = {h.name for h in dataclasses.fields(getattr(section, g.name))}
                    problems += [f"{g.name}.{k} undocumented" for k in sorted(inner - documented.get(g.name, set()))]
        elif f.name not in documented.get("Top level", set()):
            problems.append(f"{f.name} undocumented")
    assert problems == []


def _core_imports() -> dict[str, set[str]]:
    """Module → the core modules it imports (at any depth of the file: a deferred import is still a dependency)."""
    import ast

    core = ROOT / "hddm_flower"
    names = {
        ".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"): p for p in core.rglob("*.py")
    }
    graph = {}
    for name, path in names.items():
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = package.split(".")
                base = base[: len(base) - node.level + 1] if node.level else []
                target = ".".join(base + ([node.module] if node.module else []))
                candidates = [target] + [f"{target}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                candidates = [a.name for a in node.names]
            else:
                continue
            deps |= {c for c in candidates if c in names and c != name}
        graph[name] = deps
    return graph


def test_core_has_no_import_circle():
    graph = _core_imports()
    state: dict[str, int] = {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for dep in sorted(graph[node]):
            if state.get(dep) == 1:
                raise AssertionError("import circle: " + " → ".join(path[path.index(dep) :] + [dep]))
            if dep not in state:
                visit(dep, path + [dep])
        state[node] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert (
        "hddm_flower.evaluation.evaluate" in graph and "hddm_flower.stages.assemble" in graph
    )  # the walk saw the tree


def _code_lines(*roots: str):
    """(path, line number, line) of the Python code under ``roots``, docstrings and comments included."""
    for root in roots:
        for p in sorted((ROOT / root).rglob("*.py")):
            for i, line in enumerate(p.read_text().splitlines(), 1):
                yield p.relative_to(ROOT).as_posix(), i, line


APP_CODE = ("hddm_flower", "strategies", "clients", "scripts", "benchmarks")


def test_the_dataset_directory_has_one_home():
    """The dataset's layout is spelled in hddm_flower/data/layout.py only; meta.json is read by Dataset.open only;
    shards are opened by one webdataset builder and written by one writer."""
    quoted = re.compile(
        r"""["'](meta\.json|uncond\.safetensors|shard-%06d\.tar|shard-\*\.tar|gmm\.safetensors|reference-stats|prompt-clusters)["']"""
        r"""|f["']cluster-\{[^}]*\}["']"""
    )
    spelled = [
        f"{p}:{i}"
        for p, i, line in _code_lines(*APP_CODE)
        if quoted.search(line) and p not in ("hddm_flower/data/layout.py", "hddm_flower/rundir.py")
    ]
    assert spelled == []
    calls = {
        name: [f"{p}:{i}:{line}" for p, i, line in _code_lines(*APP_CODE) if re.search(rf"\b{name}\(", line)]
        for name in ("read_meta", "WebDataset", "ShardWriter")
    }
    readers = [c for c in calls["read_meta"] if not c.startswith("hddm_flower/data/dataset.py") or "def " not in c]
    assert len(readers) == 1 and readers[0].startswith("hddm_flower/data/dataset.py"), readers  # Dataset.open
    assert [c.split(":")[0] for c in calls["WebDataset"]] == ["hddm_flower/data/shards.py"]
    assert [c.split(":")[0] for c in calls["ShardWriter"]] == ["hddm_flower/data/writer.py"]


# where a dataset may be opened from its folder: the entry points of a process (the command line, the ServerApp,
# a node's handler through Dataset.for_node, a worker process), a stage that makes a new dataset (prepare, a late cluster's extension), and
# the data package itself (Dataset.open; extend_dataset reads its two sources)
DATASET_OPENERS = {
    "clients/train_worker.py",
    "hddm_flower/cli.py",
    "hddm_flower/data/__init__.py",
    "hddm_flower/data/dataset.py",
    "hddm_flower/gmm/evaluate.py",
    "hddm_flower/reproduce/run.py",
    "hddm_flower/reproduce/training.py",
    "hddm_flower/stages/add_expert.py",
    "hddm_flower/stages/prepare.py",
    "strategies/server_app.py",
}


def test_a_dataset_is_opened_at_the_entry_points_and_passed_down():
    """Below the entry points a dataset travels as a ``Dataset``: every parameter named ``dataset`` of the library
    and the Flower apps is annotated ``Dataset``, none is named ``dataset_dir``, no adapter turns a path into one,
    and ``Dataset.open`` is called only in :data:`DATASET_OPENERS`."""
    import ast

    untyped, adapters = [], []
    for root in ("hddm_flower", "strategies", "clients"):
        for path in sorted((ROOT / root).rglob("*.py")):
            name = path.relative_to(ROOT).as_posix()
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    if node.name == "as_dataset":
                        adapters.append(f"{name}:{node.lineno}")
                    for a in node.args.posonlyargs + node.args.args + node.args.kwonlyargs:
                        annotation = ast.unparse(a.annotation) if a.annotation else None
                        if a.arg == "dataset_dir" or (a.arg == "dataset" and annotation != "Dataset"):
                            untyped.append(f"{name}:{node.lineno} {node.name}({a.arg}: {annotation})")
                elif isinstance(node, ast.Name) and node.id == "as_dataset":
                    adapters.append(f"{name}:{node.lineno}")
    assert untyped == [] and adapters == []
    openers = {p for p, _, line in _code_lines("hddm_flower", "strategies", "clients") if "Dataset.open(" in line}
    assert openers <= DATASET_OPENERS, sorted(openers - DATASET_OPENERS)
    assert "hddm_flower/cli.py" in openers  # the scan saw the code


def test_a_runs_ensemble_is_built_in_one_place():
    """A run's Ensemble is built by hddm_pipeline.build_ensemble only (the pipeline, evaluation, samples.png and
    ``hddm sample``), its defaults the config's: no sampling default typed again as a literal there. The other
    constructions build something else: one routing mode over a given ensemble (evaluation/evaluate.py), the
    monolith (reproduce/run.py), the GMM's exact ensemble (gmm/evaluate.py), random weights for timing (benchmarks/sampling.py)."""
    built = {p for p, _, line in _code_lines(*APP_CODE) if re.search(r"\bEnsemble\(", line) and "class " not in line}
    others = {"hddm_flower/evaluation/evaluate.py", "hddm_flower/reproduce/run.py", "hddm_flower/gmm/evaluate.py"}
    assert built == {"hddm_flower/hddm_pipeline.py", "benchmarks/sampling.py"} | others
    from hddm_flower.config.schema import Config
    from hddm_flower.hddm_pipeline import sampling_defaults

    keys = "|".join(sampling_defaults(Config()))
    pipeline = [line for p, _, line in _code_lines("hddm_flower") if p == "hddm_flower/hddm_pipeline.py"]
    assert pipeline and not [line for line in pipeline if re.search(rf"\.get\(\s*[\"']({keys})[\"']", line)]


def test_no_class_is_defined_inside_a_function():
    """Classes of the library and the Flower apps are module-level (a class made per call, like a strategy whose
    base is chosen at run time, is a wrapper around an instance instead: strategies/round_strategy.py)."""
    import ast

    nested = []
    for root in ("hddm_flower", "strategies", "clients"):
        for path in sorted((ROOT / root).rglob("*.py")):
            for fn in ast.walk(ast.parse(path.read_text())):
                if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    nested += [
                        f"{path.relative_to(ROOT)}:{c.lineno} {fn.name}.{c.name}"
                        for c in ast.walk(fn)
                        if isinstance(c, ast.ClassDef)
                    ]
    assert nested == []


def _app_syntax_trees():
    """(path relative to the repository, parsed module) of every Python file of the library, the Flower apps,
    scripts and benchmarks."""
    import ast

    for root in APP_CODE:
        for path in sorted((ROOT / root).rglob("*.py")):
            yield path.relative_to(ROOT), ast.parse(path.read_text())


def test_no_module_imports_another_modules_private_name():
    """A name that starts with one underscore is its module's own: what another module needs is public (no
    ``from .x import _y`` in the library, the Flower apps, scripts or benchmarks)."""
    import ast

    private = [
        f"{path}:{node.lineno} {a.name}"
        for path, tree in _app_syntax_trees()
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module != "__future__"
        for a in node.names
        if a.name.startswith("_") and not a.name.startswith("__")
    ]
    assert private == []


TRANSFORMERS_LOADERS = {
    "AutoConfig", "AutoImageProcessor", "AutoModel", "AutoTokenizer", "CLIPModel", "CLIPProcessor", "CLIPTextModel"
}  # fmt: skip


def test_every_diffusers_load_is_eager():
    """Every diffusers ``from_pretrained`` (a model, the VAE, a pipeline) passes ``low_cpu_mem_usage`` or the
    keywords of ``hddm_pipeline.eager_loading``: without accelerate (no dependency) diffusers warns at each lazy
    load. ``HDDMPipeline.from_pretrained`` applies them itself; transformers' loaders do not warn."""
    import ast

    loads, lazy = 0, []
    for path, tree in _app_syntax_trees():
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            receiver = ast.unparse(node.func.value).split(".")[-1]
            if node.func.attr != "from_pretrained" or receiver in TRANSFORMERS_LOADERS | {"HDDMPipeline"}:
                continue
            loads += 1
            eager = any(k.arg == "low_cpu_mem_usage" for k in node.keywords) or any(
                k.arg is None and isinstance(k.value, ast.Call) and ast.unparse(k.value.func) == "eager_loading"
                for k in node.keywords
            )
            if not eager:
                lazy.append(f"{path}:{node.lineno} {receiver}.from_pretrained")
    assert lazy == []
    assert loads >= 10  # the walk saw the project's diffusers loads (experts, router, VAE, feature net, pipelines)


def test_a_module_over_400_lines_says_why_in_its_docstring():
    """A module of the project longer than 400 lines is split along its jobs or says why it is one ("Its length is
    …" in its docstring), so a reader knows whether a long file is a design or an accident."""
    import ast

    long = []
    for p in _tracked_text_files():
        if p.suffix != ".py" or p.relative_to(ROOT).parts[0] == "tests":
            continue
        text = p.read_text()
        if len(text.splitlines()) > 400 and "Its length is" not in (ast.get_docstring(ast.parse(text)) or ""):
            long.append(f"{p.relative_to(ROOT)}: {len(text.splitlines())} lines")
    assert not long, long
