"""``kinetic completion bash|zsh|fish``: scripts made from the parser, run in the real
shells (bash always; zsh and fish where installed) as they complete a command line."""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kinetic._cli import _parser, main
from kinetic._cli.completion import SHELLS, command_tree, script

CASES = [
    # (the words typed, the one being completed last), what must be offered
    (["kinetic", ""], {"init", "jobs", "batch", "accelerators", "completion", "up", "pool"}),
    (["kinetic", "jo"], {"jobs"}),
    (["kinetic", "jobs", ""], {"list", "status", "logs", "debug", "cancel"}),
    (["kinetic", "--project", "p", "--zone", "z", "jobs", "de"], {"debug"}),
    (["kinetic", "jobs", "debug", "--"], {"--port", "--working-dir", "--timeout", "--json"}),
    (["kinetic", "init", "--"], {"--local", "--join", "--create", "--doctor", "--yes"}),
    (["kinetic", "accelerators", "--"], {"--live", "--json"}),
    (["kinetic", "completion", ""], {"bash", "zsh", "fish"}),
    (["kinetic", "profile", "create", "x", "--builder", ""], {"docker", "cloudbuild"}),
    (["kinetic", "--project", "jobs", ""], {"init", "jobs", "batch"}),  # "jobs" was a value
]


def test_the_tree_is_the_parsers() -> None:
    tree = command_tree(_parser())
    assert {"", "jobs", "jobs debug", "init", "completion", "pool add"} <= set(tree)
    root = tree[""]
    assert root.words[0] == "init"
    assert {"--backend", "--project", "--version"} <= set(root.options)
    assert root.valued["--project"] == []
    assert "--version" not in root.valued  # takes no value
    assert tree["completion"].words == list(SHELLS)
    assert tree["profile create"].valued["--builder"] == ["docker", "cloudbuild"]
    assert "-y" in tree["init"].options
    assert "--yes" not in tree["init"].valued


def test_every_command_of_the_parser_is_in_every_script() -> None:
    parser = argparse.ArgumentParser(prog="demo")
    sub = parser.add_subparsers(dest="group")
    new = sub.add_parser("brand-new")
    new.add_argument("--flavour", choices=["plain", "salted"])
    for shell in SHELLS:
        text = script(shell, parser, prog="demo")
        for word in ("brand-new", "--flavour", "salted"):
            assert word in text
        assert "_demo_" in text


def test_unknown_shell() -> None:
    with pytest.raises(ValueError, match="bash, zsh, fish"):
        script("tcsh", _parser())


def test_the_command_prints_the_script(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["completion", "bash"]) == 0
    out = capsys.readouterr().out
    assert out == script("bash", _parser())
    assert out.rstrip().endswith("complete -o default -F _kinetic kinetic")
    with pytest.raises(SystemExit) as info:
        main(["completion", "tcsh"])
    assert info.value.code == 2


def _script_file(tmp_path: Path, shell: str) -> Path:
    """The script as `kinetic completion SHELL` prints it, in a real process."""
    done = subprocess.run(
        [sys.executable, "-m", "kinetic", "completion", shell],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    path = tmp_path / f"kinetic.{shell}"
    path.write_text(done.stdout)
    return path


def _bash(path: Path, words: list[str]) -> set[str]:
    quoted = " ".join("'" + w + "'" for w in words)
    program = (
        f"source {path}\nCOMP_WORDS=({quoted}); COMP_CWORD={len(words) - 1}\n"
        '_kinetic; printf "%s\\n" "${COMPREPLY[@]}"\n'
    )
    done = subprocess.run(
        ["bash", "--norc", "-c", program], capture_output=True, text=True, timeout=30, check=True
    )
    return set(done.stdout.split())


def test_bash_completes(tmp_path: Path) -> None:
    path = _script_file(tmp_path, "bash")
    for words, offered in CASES:
        got = _bash(path, words)
        assert offered <= got, (words, got)
    assert _bash(path, ["kinetic", "jobs", "debug", "--"]) == {
        "--help", "--port", "--working-dir", "--timeout", "--json",
    }  # fmt: skip
    assert _bash(path, ["kinetic", "profile", "create", "x", "--builder", "c"]) == {"cloudbuild"}
    # After an option without choices: file names (here, the script itself).
    assert _bash(path, ["kinetic", "--cluster", str(tmp_path) + "/kin"]) == {str(path)}


@pytest.mark.skipif(shutil.which("zsh") is None, reason="zsh is not installed")
def test_zsh_completes(tmp_path: Path) -> None:
    path = _script_file(tmp_path, "zsh")
    for words, offered in CASES:
        array = " ".join("'" + w + "'" for w in words)
        program = (
            'compadd() { shift; print -rl -- "$@" }\n_files() { print __files__ }\n'
            f"compdef() {{ : }}\nsource {path}\nwords=({array}); CURRENT=${{#words}}; _kinetic\n"
        )
        done = subprocess.run(
            ["zsh", "-f", "-c", program], capture_output=True, text=True, timeout=30, check=True
        )
        got = {w for w in done.stdout.split() if w.startswith(words[-1])}
        assert offered <= got, (words, got)


@pytest.mark.skipif(shutil.which("fish") is None, reason="fish is not installed")
def test_fish_completes(tmp_path: Path) -> None:
    path = _script_file(tmp_path, "fish")
    for words, offered in CASES:
        line = " ".join(words)
        done = subprocess.run(
            ["fish", "--no-config", "-c", f"source {path}; complete -C '{line}'"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
        got = {row.split("\t")[0] for row in done.stdout.splitlines()}
        assert offered <= got, (words, got)
