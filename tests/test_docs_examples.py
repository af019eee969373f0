"""The examples in README.md, data/README.md and docs/*.md (docs/results.md aside) run, or name only what exists.

The convention: every fenced code block is checked. A block that cannot run here (it needs a GPU, real data,
minutes of training, a server, an export folder) is marked by an HTML comment on the line just above its fence,

    <!-- not run: needs a GPU -->

which the rendered page does not show. What each kind of block gets:

- `python`: run, in a fresh namespace, in a temporary folder, with the demo checkpoints
  (`runs/streamrec_demo/checkpoints/best.ckpt`, `runs/translate_demo/checkpoints/best.ckpt`) replaced by tiny
  ones trained once per run. A marked block is compiled and its `from X import Y` lines resolved.
- `bash`: never run in full (these are training runs, servers and data downloads); each command of ours is
  checked, as is each command written in backticks in the prose (`python -m streamrec.score --cold-slots 1`):
  `python -m PROG [SUBCOMMAND]` and `python PATH.py` are real programs, every `--flag` and `-f` the command
  passes appears in that program's `--help`, every `--config` file exists, `make TARGET` is a target of the
  Makefile, and `python -c CODE` compiles and resolves its imports. Other tools (curl, pip, git, awk) are not
  checked.
- `yaml`: every key under `model:` is an option of the app's `fit --help`.

On every page, every `model.KEY` / `--model.KEY` written anywhere is an option of the app's `fit --help` (the
page's app; either app on the shared pages), and every dotted name of ours (`core.nn.attention`,
`streamrec.ranking.batch.rank`) is a module of the tree or a name defined at the top of one.
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import importlib.util
import io
import re
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", REPO / "data" / "README.md",
         *sorted(p for p in (REPO / "docs").glob("*.md") if p.name != "results.md")]
sys.path.insert(0, str(Path(__file__).parent))
import program_help  # noqa: E402 (by name: the other files that use it share its cached texts)

FENCE = re.compile(r"^(\s*)```(\S*)\s*$")
NOT_RUN = re.compile(r"<!--\s*not run:\s*(.+?)\s*-->")
DEMO_CKPTS = {"streamrec": "runs/streamrec_demo/checkpoints/best.ckpt",
              "translate": "runs/translate_demo/checkpoints/best.ckpt"}
PAGE_APP = {"streamrec.md": "streamrec", "translate.md": "translate"}  # other pages: either app


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # of the opening fence, 1-based
    lang: str
    text: str
    not_run: str | None  # the reason, for a marked block

    @property
    def name(self) -> str:
        return f"{self.page.relative_to(REPO)}:{self.line}"


def blocks(page: Path) -> list[Block]:
    """The fenced code blocks of `page`, with the reason of a `<!-- not run: ... -->` just above each."""
    found, lines, start = [], page.read_text(encoding="utf-8").splitlines(), None
    for number, line in enumerate(lines):
        match = FENCE.match(line)
        if not match:
            continue
        if start is None:
            start, indent, lang = number, match.group(1), match.group(2)
            continue
        body = [row[len(indent):] if row.startswith(indent) else row.lstrip() for row in lines[start + 1:number]]
        above = NOT_RUN.search(lines[start - 1]) if start else None
        found.append(Block(page, start + 1, lang, "\n".join(body) + "\n", above.group(1) if above else None))
        start = None
    assert start is None, f"{page.relative_to(REPO)}:{start + 1}: a fence that never closes"
    return found


BLOCKS = [b for page in PAGES for b in blocks(page)]


def of_kind(*langs: str) -> list[Block]:
    return [b for b in BLOCKS if b.lang in langs]


def test_every_block_says_its_language() -> None:
    assert not [b.name for b in BLOCKS if not b.lang], "fenced blocks without a language (```bash, ```python)"
    known = {"bash", "python", "yaml", "json", "text"}
    assert not [f"{b.name} ({b.lang})" for b in BLOCKS if b.lang not in known], f"languages other than {known}"


def test_the_block_reader_sees_marks_and_indented_fences(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("text\n<!-- not run: needs a GPU -->\n```bash\npython x.py\n```\n- item:\n\n  ```python\n"
                    "  print(1)\n  ```\n", encoding="utf-8")
    assert [(b.line, b.lang, b.text, b.not_run) for b in blocks(page)] == [
        (3, "bash", "python x.py\n", "needs a GPU"), (8, "python", "print(1)\n", None)]


# ----------------------------------------------------------------------------- python blocks
@pytest.fixture(scope="session")
def tiny_translate_ckpt(built_once, data_script) -> Path:
    """A tiny translator from a real fit of a few steps on a small demo corpus."""
    def build(folder: Path) -> None:
        import lightning as L

        from translate.data.corpus import TranslationDataModule
        from translate.model.module import TranslationModule

        demo = data_script("make_translate_demo")
        demo.write_corpus(demo.generate(train_size=300, val_size=30, test_size=30, seed=0), folder / "corpus")
        L.seed_everything(0, verbose=False)
        data = TranslationDataModule(*(str(folder / "corpus" / s) for s in ("train", "val", "test")), max_len=32,
                                     max_tokens=512, cache_dir=str(folder / "spm"))
        module = TranslationModule(data.src_vocab_size, data.tgt_vocab_size, pad_id=data.pad_id, max_len=32,
                                   d_model=16, n_heads=2, n_encoder_layers=1, n_decoder_layers=1, d_ff=32, lr=3e-3)
        trainer = L.Trainer(max_steps=10, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                            enable_model_summary=False, limit_val_batches=0, use_distributed_sampler=False)
        trainer.fit(module, data)
        trainer.save_checkpoint(folder / "tiny.ckpt")

    return built_once("docs examples: tiny translator", build) / "tiny.ckpt"


def resolve_imports(code: str, where: str) -> None:
    """Every `from X import Y` and `import X` in `code` names a module and attribute that exist."""
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.ImportFrom) and node.module:
            module = importlib.import_module(node.module)
            missing = [a.name for a in node.names if not hasattr(module, a.name)
                       and importlib.util.find_spec(f"{node.module}.{a.name}") is None]
            assert not missing, f"{where}: `from {node.module} import {', '.join(missing)}`: no such name"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                importlib.import_module(alias.name)


PYTHON = of_kind("python")


@pytest.mark.parametrize("block", PYTHON, ids=[b.name for b in PYTHON])
def test_python_example_runs(block: Block, request, tmp_path, monkeypatch) -> None:
    if block.not_run:
        resolve_imports(block.text, block.name)
        return
    code = block.text
    for app, demo in DEMO_CKPTS.items():
        if demo in code:
            ckpt = request.getfixturevalue("tiny_ckpt" if app == "streamrec" else "tiny_translate_ckpt")
            code = code.replace(demo, str(ckpt))
    monkeypatch.chdir(tmp_path)
    with contextlib.redirect_stdout(io.StringIO()):
        exec(compile(code, block.name, "exec"), {"__name__": "__doc_example__"})  # noqa: S102


# ----------------------------------------------------------------------------- shell blocks
def commands(text: str) -> list[list[str]]:
    """The commands of a shell block: continuation lines joined, comments dropped, `&&` and `;` split."""
    joined = re.sub(r"\\\n", " ", text)
    found = []
    for line in joined.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        tokens, command = shlex.split(line, comments=True), []
        for token in tokens:
            if token in ("&&", ";", "|", "||"):
                found.append(command)
                command = []
            else:
                command.append(token.rstrip(";"))
        found.append(command)
    return [c for c in found if c]


def program_of(command: list[str]) -> tuple[str | None, list[str]]:
    """`(program, its arguments)` for a command of ours (`python -m ...`, `python X.py`, through srun or
    torchrun), `(None, [])` for any other tool."""
    while command and (re.match(r"^\w+=", command[0]) or command[0] in ("srun", "exec", "time")):
        command = command[1:]
    if command and command[0] == "torchrun":  # torchrun [its options] -m MODULE ...
        command = ["python", *command[command.index("-m"):]]
    if not command or Path(command[0]).name not in ("python", "python3"):
        return None, []
    if command[1] == "-m":
        program = f"python -m {command[2]}"
        rest = command[3:]
        if rest and f"{program} {rest[0]}" in program_help.PROGRAMS:
            program, rest = f"{program} {rest[0]}", rest[1:]
        return program, rest
    return f"python {command[1]}", command[2:]


def flags(arguments: list[str]) -> list[str]:
    return [a.split("=", 1)[0] for a in arguments if re.match(r"^--?[A-Za-z]", a)]


def check_command(command: list[str], where: str) -> list[str]:
    """What is wrong with one command of a shell block ([] when nothing is)."""
    if command[0] == "make":
        targets = set(re.findall(r"^([\w.-]+):", (REPO / "Makefile").read_text(encoding="utf-8"), re.M))
        return [f"{where}: make {t}: no such Makefile target" for t in command[1:] if t not in targets]
    if command[:2] == ["python", "-c"]:
        resolve_imports(command[2], where)
        return []
    program, arguments = program_of(command)
    if program is None:
        return []
    if program.startswith("python -m ") and program not in program_help.PROGRAMS:
        return [f"{where}: `{program}`: not a program of tests/program_help.py's PROGRAMS"]
    if not program.startswith("python -m ") and not (REPO / program.split()[1]).is_file():
        return [f"{where}: `{program}`: no such script"]
    text = program_help.help_text(program)
    problems = [f"{where}: `{program}` has no option {flag}" for flag in flags(arguments)
                if not re.search(rf"(?<![\w.-]){re.escape(flag)}(?![\w-])", text)]
    for flag, value in zip(arguments, arguments[1:], strict=False):
        if flag == "--config" and value.startswith("configs/") and not (REPO / value).is_file():
            problems.append(f"{where}: --config {value}: no such file")
    return problems


def test_the_command_reader() -> None:
    text = ("python -m streamrec fit --config a.yaml \\\n    --model.lr=3e-3   # a comment\n"
            "torchrun --nnodes 2 -m translate fit --trainer.devices 4\nsrun python x.py -i in && curl -s h\n")
    assert commands(text) == [["python", "-m", "streamrec", "fit", "--config", "a.yaml", "--model.lr=3e-3"],
                              ["torchrun", "--nnodes", "2", "-m", "translate", "fit", "--trainer.devices", "4"],
                              ["srun", "python", "x.py", "-i", "in"], ["curl", "-s", "h"]]
    assert [program_of(c)[0] for c in commands(text)] == ["python -m streamrec fit", "python -m translate fit",
                                                          "python x.py", None]
    assert flags(["--config", "a.yaml", "--model.lr=3e-3", "-i", "-1"]) == ["--config", "--model.lr", "-i"]


SHELL = of_kind("bash")


@pytest.mark.parametrize("block", SHELL, ids=[b.name for b in SHELL])
def test_shell_example_names_real_programs_and_flags(block: Block) -> None:
    problems = [p for command in commands(block.text) for p in check_command(command, block.name)]
    assert not problems, "\n".join(problems)


INLINE_COMMAND = re.compile(r"`((?:python -m |python (?:data|benchmarks)/)[^`]+)`")


def inline_commands(page: Path) -> list[tuple[int, str]]:
    """(line, command) for each command of ours written in backticks in the page's prose."""
    found, fenced = [], False
    for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            found += [(number, command) for command in INLINE_COMMAND.findall(line)]
    return found


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_commands_in_prose_name_real_programs_and_flags(page: Path) -> None:
    problems = [p for number, command in inline_commands(page)
                for p in check_command(shlex.split(command), f"{page.relative_to(REPO)}:{number}")]
    assert not problems, "\n".join(problems)


# ----------------------------------------------------------------------------- model options named anywhere
def fit_help(page: Path) -> list[str]:
    app = PAGE_APP.get(page.name)
    return [program_help.help_text(f"python -m {a} fit") for a in ([app] if app else ["streamrec", "translate"])]


def model_keys(block: Block) -> list[str]:
    """`model.a.b` for each leaf under `model:` in a YAML block."""
    import yaml

    def leaves(node, prefix: str):
        if isinstance(node, dict):
            for key, value in node.items():
                yield from leaves(value, f"{prefix}.{key}")
        else:
            yield prefix

    config = yaml.safe_load(block.text) or {}
    return list(leaves(config["model"], "model")) if "model" in config else []


MODEL_OPTION = re.compile(r"(?<![\w./-])-{0,2}(model\.[a-z_][\w.]*[a-z_0-9])")
FILE_NAME = re.compile(r"\.(?:py|safetensors|onnx(?:\.data)?|bin|json|ckpt|pt)$")  # `model.safetensors` is a file
LINKED = {"model.num_items", "model.max_len", "model.num_features", "model.features_per_item",
          "model.src_vocab_size", "model.tgt_vocab_size", "model.pad_id"}  # linked from the data: not in --help


def model_options(page: Path) -> list[tuple[int, str]]:
    """(line, `model.KEY`) for each model option the page names (files such as `model.py` left out)."""
    found = []
    for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
        found += [(number, key) for key in MODEL_OPTION.findall(line) if not FILE_NAME.search(key)]
    return found


def known(key: str, helps: list[str]) -> bool:
    return key in LINKED or any(re.search(rf"--{re.escape(key)}(?![\w-])", text) for text in helps)


def test_model_option_reader() -> None:
    page = Path("x.md")
    assert MODEL_OPTION.findall("`--model.contrastive.weight 0.1`, `model.arch: rnn`, `model.py`, "
                                "rec.model, streamrec/model/module.py, `model.objective.loss`.") == [
        "model.contrastive.weight", "model.arch", "model.py", "model.objective.loss"]
    assert page.name not in PAGE_APP


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_model_option_named_is_one(page: Path) -> None:
    helps = fit_help(page)
    named = model_options(page) + [(b.line, key) for b in BLOCKS if b.page == page and b.lang == "yaml"
                                   for key in model_keys(b)]
    unknown = sorted({f"{page.relative_to(REPO)}:{line}: {key}" for line, key in named if not known(key, helps)})
    assert not unknown, "options no `fit --help` lists:\n" + "\n".join(unknown)


# ----------------------------------------------------------------------------- dotted names of ours


def test_the_name_checker() -> None:
    assert program_help.missing_name("core.nn.attention") is None
    assert program_help.missing_name("core.nn.AttentionCapture") is None
    assert program_help.missing_name("core.runtime.checkpoint.load_module") is None
    assert program_help.missing_name("streamrec.Recommender.load") is None  # streamrec.api's, imported
    assert program_help.missing_name("streamrec.Recommender.nowhere") == "`streamrec.api` has no `Recommender.nowhere`"
    assert program_help.missing_name("core.enable_cpu_fastpath") == "`core` has no `enable_cpu_fastpath`"
    assert program_help.missing_name("core.masks") == "`core` has no `masks`"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_dotted_name_of_ours_exists(page: Path) -> None:
    wrong = []
    for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
        for dotted in program_help.DOTTED.findall(line):
            why = program_help.missing_name(dotted)
            if why:
                wrong.append(f"{page.relative_to(REPO)}:{number}: {dotted}: {why}")
    assert not wrong, "\n".join(wrong)


def test_the_streamrec_module_table_lists_real_modules() -> None:
    """docs/streamrec.md's table of the package: every module it lists exists, and every module is listed."""
    listed, rows = set(), 0
    for line in (REPO / "docs" / "streamrec.md").read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.split("|")[1:-1]]
        if len(cells) >= 2 and (re.fullmatch(r"`[\w/]+/`", cells[0]) or cells[0] == "programs"):
            rows += 1
            folder = cells[0].strip("`") if cells[0] != "programs" else ""
            listed.update(f"streamrec/{folder}{name}.py" for name in re.findall(r"`(\w+)`", cells[1]))
    tree = {str(p.relative_to(REPO)) for p in (REPO / "streamrec").rglob("*.py")
            if p.name not in ("__init__.py", "__main__.py")}
    assert rows >= 4
    assert not listed - tree, f"listed, not in the tree: {sorted(listed - tree)}"
    assert not tree - listed, f"in the tree, not listed: {sorted(tree - listed)}"
