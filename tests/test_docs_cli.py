"""Every command and flag the documentation names exists (README.md and docs/*.md).

What is checked, in code spans and code blocks (prose is never parsed as a command line):

* ``hitl WORD …``: each word names a subcommand of ``serve_app.cli.build_parser()`` (an
  upper-case placeholder such as ``hitl COMMAND --help`` stands for any), and every ``--flag``
  after it is an option of that subcommand;
* ``python -m MODULE …``, ``python FILE.py …``, ``benchmarks/NAME.py …`` and ``LOADTEST_ARGS="…"``
  (``make loadtest``'s ``python -m loadtest.run``): every ``--flag`` after it is an option of that
  program's own argparse parser, captured by calling its ``main``;
* a flag on its own (`` `--coverage-window-s 3600` ``): an option of one of those parsers;
* flags after another program (``serve``, ``ray``, ``kubectl``, ``pip``, …) are that program's
  business and are left alone;
* ``pip install hitl-review…``: the package is not on any index, so the docs install from a checkout.
"""

from __future__ import annotations

import argparse
import importlib
import re
import runpy
import shlex
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from hitl_review.serve_app.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9]*(?:-[a-z0-9]+)*")
EXTERNAL = {
    "serve",
    "ray",
    "kubectl",
    "pip",
    "pip3",
    "make",
    "locust",
    "uvicorn",
    "curl",
    "docker",
    "alembic",
    "promtool",
    "redis-server",
    "redis-cli",
    "git",
    "apt-get",
    "pytest",
}
SEPARATORS = {";", "&&", "||", "|"}


@dataclass(frozen=True)
class Line:
    """One line of a code block, or one code span: where it is and its text."""

    doc: str
    lineno: int
    text: str

    def where(self) -> str:
        return f"{self.doc}:{self.lineno}: `{self.text.strip()}`"


def code_lines(path: Path) -> Iterator[Line]:
    """The code of a Markdown file: each line of a fenced block, each inline code span."""
    in_block = False
    pending: tuple[int, str] | None = None  # a block line ending in a backslash, and its start
    for n, raw in enumerate(path.read_text().splitlines(), 1):
        if raw.lstrip().startswith("```"):
            in_block = not in_block
            continue
        if in_block:
            text = raw.split("#", 1)[0] if raw.lstrip().startswith("#") else raw.split(" #", 1)[0]  # comments are prose
            if pending is not None:
                text = pending[1] + " " + text
            if text.rstrip().endswith("\\"):
                pending = (pending[0] if pending else n, text.rstrip()[:-1])
                continue
            yield Line(path.name, pending[0] if pending else n, text)
            pending = None
        else:
            for span in re.findall(r"`([^`]+)`", raw):
                yield Line(path.name, n, span)


# ---------------------------------------------------------------------------- the parsers


class _Captured(Exception):
    def __init__(self, parser: argparse.ArgumentParser) -> None:
        self.parser = parser


def _capture(main: Callable[..., Any], takes_argv: bool) -> argparse.ArgumentParser:
    """The parser ``main`` builds: its first ``parse_known_args`` raises it out, before any work."""

    def grab(self: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> Any:
        raise _Captured(self)

    saved_parse, saved_argv = argparse.ArgumentParser.parse_known_args, sys.argv
    argparse.ArgumentParser.parse_known_args = grab  # type: ignore[method-assign,assignment]
    sys.argv = ["prog"]
    try:
        main([]) if takes_argv else main()
    except _Captured as got:
        return got.parser
    finally:
        argparse.ArgumentParser.parse_known_args = saved_parse  # type: ignore[method-assign]
        sys.argv = saved_argv
    raise AssertionError(f"{main} returned without parsing its arguments")


@cache
def program_parser(program: str) -> argparse.ArgumentParser | None:
    """``program``: a module (``loadtest.run``) or a script path (``benchmarks/e2e.py``); None when
    the project has no such program."""
    if program.endswith(".py"):
        path = ROOT / program
        if not path.is_file():
            return None
        if (path.parent / "__init__.py").is_file():  # in a package: import it as its module
            return program_parser(program.removesuffix(".py").replace("/", "."))
        ns = runpy.run_path(str(path), run_name="docs_cli_capture")
        main = ns.get("main")
    else:
        try:
            module = importlib.import_module(program)
        except ModuleNotFoundError:
            return None
        main = getattr(module, "main", None)
        if main is None:
            try:
                main = getattr(importlib.import_module(program + ".__main__"), "main", None)
            except ModuleNotFoundError:
                return None
    assert callable(main), f"{program} has no main() to read its options from"
    code = main.__code__
    return _capture(main, takes_argv=code.co_argcount > 0)


def options(parser: argparse.ArgumentParser) -> set[str]:
    return {s for s in parser._option_string_actions if s.startswith("--")}


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    found: dict[str, argparse.ArgumentParser] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            found.update(action.choices)
    return found


def every_hitl_parser(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    yield parser
    for sub in subcommands(parser).values():
        yield from every_hitl_parser(sub)


# ---------------------------------------------------------------------------- reading a line


def segments(text: str) -> Iterator[list[str]]:
    """The commands of a line: its words, split at ``;``, ``&&``, ``|`` and ``(``/``)``."""
    try:
        words = shlex.split(text.replace("(", " ").replace(")", " "), posix=True)
    except ValueError:  # an unbalanced quote in prose-like code: plain words
        words = text.split()
    current: list[str] = []
    for w in words:
        if w in SEPARATORS:
            if current:
                yield current
            current = []
        else:
            current.append(w)
    if current:
        yield current


@dataclass
class Finding:
    line: Line
    problem: str

    def __str__(self) -> str:
        return f"{self.line.where()}: {self.problem}"


def _program_at(words: list[str], i: int) -> tuple[str, str | None, int] | None:
    """What program starts at ``words[i]``: (kind, name, index of its first argument), kind being
    ``hitl``, ``program`` (one of ours) or ``external``; None when nothing starts there."""
    w = words[i]
    base = w.rsplit("/", 1)[-1]
    if w.startswith("LOADTEST_ARGS="):
        return ("program", "loadtest.run", i)
    if base == "hitl" and (w == "hitl" or w.endswith("/bin/hitl")):
        return ("hitl", None, i + 1)
    if re.fullmatch(r"(\$\(PY\)|python3?|\S*/bin/python3?)", w):
        if i + 2 < len(words) + 1 and i + 1 < len(words):
            nxt = words[i + 1]
            if nxt == "-m" and i + 2 < len(words):
                return ("program", words[i + 2], i + 3)
            if nxt.endswith(".py"):
                return ("program", nxt, i + 2)
        return ("external", None, i + 1)
    if re.fullmatch(r"(benchmarks|loadtest|harness|archive|scripts|examples)/[\w/]+\.py", w) and i + 1 < len(words):
        return ("program", w, i + 1)  # a path with arguments after it is run; alone it only names a file
    if base in EXTERNAL:
        return ("external", None, i + 1)
    return None


def check_hitl(line: Line, args: list[str], root: argparse.ArgumentParser) -> Iterator[Finding]:
    parser, path = root, ["hitl"]
    any_sub = False
    i = 0
    while i < len(args):
        word = args[i]
        subs = subcommands(parser)
        if word.startswith("-") or not subs:
            break
        if word in subs:
            parser = subs[word]
            path.append(word)
        elif "/" in word and all(w in subs for w in word.split("/")):  # hitl status/watch: alternatives
            any_sub = True
            break
        elif word.isupper() or word.startswith(("<", "[")) or word == "…":  # COMMAND, <cmd>
            any_sub = True
            break
        else:
            yield Finding(line, f"`{' '.join(path)}` has no subcommand {word!r} (it has: {', '.join(sorted(subs))})")
            return
        i += 1
    known = set().union(*(options(p) for p in every_hitl_parser(parser))) if any_sub else options(parser)
    for word in args[i:]:
        for flag in FLAG.findall(word.split("=", 1)[0]):
            if flag not in known:
                yield Finding(line, f"`{' '.join(path)}` has no option {flag}")


def check_line(line: Line, root: argparse.ArgumentParser, union: set[str]) -> Iterator[Finding]:
    if re.search(r"\bpip3? install\b[^`]*\bhitl-review\b", line.text):
        yield Finding(
            line, "hitl-review is not published on a package index: install from the checkout (pip install .)"
        )
    for words in segments(line.text):
        # The first program of a segment owns the rest of it (`hitl serve` is not `serve`).
        starts = next(([(i, p)] for i in range(len(words)) if (p := _program_at(words, i)) is not None), [])
        if not starts:
            for w in words:  # flags on their own: one of the project's programs must have each
                for flag in FLAG.findall(w.split("=", 1)[0]):
                    if flag not in union:
                        yield Finding(line, f"no command of this project has the option {flag}")
            continue
        # Flags before the first program in the segment are unscoped (e.g. `--jobs 10` in prose-like code).
        first = starts[0][0]
        for w in words[:first]:
            for flag in FLAG.findall(w.split("=", 1)[0]):
                if flag not in union:
                    yield Finding(line, f"no command of this project has the option {flag}")
        for i, (kind, name, arg0) in starts:
            args = words[arg0:]
            if kind == "hitl":
                yield from check_hitl(line, args, root)
            elif kind == "program":
                assert name is not None
                parser = program_parser(name)
                if parser is None:
                    yield Finding(line, f"the project has no program {name}")
                    continue
                if name.startswith("loadtest") and words[i].startswith("LOADTEST_ARGS="):
                    args = shlex.split(words[i].split("=", 1)[1]) + args
                for w in args:
                    for flag in FLAG.findall(w.split("=", 1)[0]):
                        if flag not in options(parser):
                            yield Finding(line, f"{name} has no option {flag}")
            # kind == "external": its own flags are its business.


PROGRAM_FILE = re.compile(r"\b(?:benchmarks|loadtest|harness|archive|scripts|examples)/[\w/]+\.py\b")


def _programs_named() -> set[str]:
    """Every project program the docs name (run or only mentioned), so a flag on its own may be one
    of theirs: script paths and ``python -m`` modules that have a ``main``."""
    names: set[str] = {"loadtest.run"}
    for doc in DOCS:
        text = doc.read_text()
        names.update(PROGRAM_FILE.findall(text))
        names.update(re.findall(r"python3? -m ([\w.]+)", text))
    return names


def _has_main(program: str) -> bool:
    path = ROOT / program
    if program.endswith(".py"):
        return path.is_file() and re.search(r"^def main\(", path.read_text(), re.M) is not None
    return True


def findings() -> list[Finding]:
    root = build_parser()
    union = set().union(*(options(p) for p in every_hitl_parser(root)))
    for name in sorted(_programs_named()):
        parser = program_parser(name) if _has_main(name) else None
        if parser is not None:
            union |= options(parser)
    found: list[Finding] = []
    for doc in DOCS:
        for line in code_lines(doc):
            found.extend(check_line(line, root, union))
    return found


# ---------------------------------------------------------------------------- the tests


def test_every_documented_command_and_flag_exists():
    problems = findings()
    assert problems == [], "the docs name commands or options that do not exist:\n" + "\n".join(map(str, problems))


@pytest.mark.parametrize(
    "text,problem",
    [
        ("hitl serve --port 8000", "has no subcommand 'serve'"),
        ("hitl up --retention-s 60", "`hitl up` has no option --retention-s"),
        ("--max-upload-bytes", "no command of this project has the option --max-upload-bytes"),
        ("hitl admin nonsense", "`hitl admin` has no subcommand 'nonsense'"),
        ("python -m loadtest.run --seconds 20 --no-such-flag", "loadtest.run has no option --no-such-flag"),
        ("benchmarks/chaos.py --jobs 10 --colour", "benchmarks/chaos.py has no option --colour"),
        ('LOADTEST_ARGS="--seconds 120 --usres 100"', "loadtest.run has no option --usres"),
        ("pip install hitl-review", "not published"),
        ("pip install 'hitl-review[demo]'", "not published"),
    ],
)
def test_the_checker_catches_what_the_issue_named(text: str, problem: str):
    root = build_parser()
    union = set().union(*(options(p) for p in every_hitl_parser(root))) | options(program_parser("loadtest.run"))
    got = [str(f) for f in check_line(Line("t.md", 1, text), root, union)]
    assert any(problem in g for g in got), got


@pytest.mark.parametrize(
    "text",
    [
        "hitl up --no-ui --detector-delay-ms 80",
        "hitl admin gc-artifacts --older-than-days 90 --dry-run",
        "hitl COMMAND --help",
        "hitl status JOB_ID ; hitl watch JOB_ID",
        "serve start --http-host 0.0.0.0 --http-port 8000 --address HEAD:6379",
        "pip install '.[server,models]'",
        "--coverage-window-s 3600",
        "python -m loadtest.run --seconds 20 --users 10 --no-bench",
    ],
)
def test_the_checker_passes_what_exists(text: str):
    root = build_parser()
    union = set().union(*(options(p) for p in every_hitl_parser(root))) | options(program_parser("loadtest.run"))
    assert [str(f) for f in check_line(Line("t.md", 1, text), root, union)] == []
