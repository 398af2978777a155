"""``kinetic completion bash|zsh|fish``: a shell completion script, made from the parser.

    kinetic completion bash > ~/.local/share/bash-completion/completions/kinetic
    kinetic completion zsh > "${fpath[1]}/_kinetic"
    kinetic completion fish > ~/.config/fish/completions/kinetic.fish

The script is generated from the command line's own ``argparse`` parser each time it
is printed, so it offers exactly the commands and options this version has. It
completes without running Python: :func:`command_tree` walks the parser once into a
table (per command path: its subcommands, its options, which options take a value
and the choices of those that have them), and each shell's script holds that table
as a ``case``/``switch`` function plus a small driver. The driver walks the words
typed so far (a subcommand word extends the path; an option that takes a value skips
the next word), then offers the path's subcommands and choices, or its options when
the word being completed starts with ``-``; after an option with choices, the
choices; after another option that takes a value, file names.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass, field

from kinetic._cli._output import EXIT_OK

SHELLS = ("bash", "zsh", "fish")


@dataclass
class Node:
    """One command path's completions.

    :ivar words: subcommands and the choices of its positional arguments.
    :ivar options: every option string (``-y``, ``--yes``).
    :ivar valued: the options that take a value, with their choices (empty: any value).
    """

    words: list[str] = field(default_factory=list)
    options: list[str] = field(default_factory=list)
    valued: dict[str, list[str]] = field(default_factory=dict)


def command_tree(parser: argparse.ArgumentParser) -> dict[str, Node]:
    """Every command path of ``parser`` (``""``, ``"jobs"``, ``"jobs list"``) and its
    completions, parents before children. Pure."""
    tree: dict[str, Node] = {}

    def walk(path: str, p: argparse.ArgumentParser) -> None:
        node = tree[path] = Node()
        children: list[tuple[str, argparse.ArgumentParser]] = []
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, child in action.choices.items():
                    node.words.append(name)
                    children.append((name, child))
            elif action.option_strings:
                node.options.extend(action.option_strings)
                if action.nargs != 0:
                    choices = [str(c) for c in action.choices or ()]
                    for flag in action.option_strings:
                        node.valued[flag] = choices
            elif action.choices:
                node.words.extend(str(c) for c in action.choices)
        for name, child in children:
            walk(f"{path} {name}".strip(), child)

    walk("", parser)
    return tree


def script(shell: str, parser: argparse.ArgumentParser, prog: str = "kinetic") -> str:
    """The completion script of ``shell`` for ``parser``. Pure.

    :raises ValueError: ``shell`` is not one of :data:`SHELLS`.
    """
    tree = command_tree(parser)
    if shell == "bash":
        return _bash(tree, prog)
    if shell == "zsh":
        return _zsh(tree, prog)
    if shell == "fish":
        return _fish(tree, prog)
    raise ValueError(f"no completion for shell {shell!r}: choose one of {', '.join(SHELLS)}")


# --------------------------------------------------------------------------- the table


def _fn(prog: str) -> str:
    return "_" + "".join(c if c.isalnum() else "_" for c in prog)


def _quote(word: str) -> str:
    """``word`` in single quotes, for every one of the three shells (no ``'`` inside)."""
    if "'" in word:
        raise ValueError(f"a completion word holds a quote: {word!r}")
    return f"'{word}'"


def _table(tree: Mapping[str, Node]) -> dict[str, list[tuple[str, str]]]:
    """The four lookups each script defines, as (key, space-separated words) pairs:
    ``words`` and ``options`` by path, ``valued`` by path (its value-taking options),
    ``choices`` by ``path|option``."""
    out: dict[str, list[tuple[str, str]]] = {
        "words": [],
        "options": [],
        "valued": [],
        "choices": [],
    }
    for path, node in tree.items():
        for name, words in (("words", node.words), ("options", node.options)):
            if words:
                out[name].append((path, " ".join(words)))
        if node.valued:
            out["valued"].append((path, " ".join(node.valued)))
        for flag, choices in node.valued.items():
            if choices:
                out["choices"].append((f"{path}|{flag}", " ".join(choices)))
    return out


def _posix_lookups(fn: str, tree: Mapping[str, Node]) -> str:
    """bash/zsh: one ``case`` function per lookup, echoing the words of a key."""
    parts = []
    for name, rows in _table(tree).items():
        cases = "\n".join(f"        {_quote(key)}) echo {_quote(value)} ;;" for key, value in rows)
        parts.append(f'{fn}_{name}() {{\n    case "$1" in\n{cases}\n    esac\n}}\n')
    return "\n".join(parts)


# --------------------------------------------------------------------------- bash


def _posix_walk(fn: str) -> str:
    """The walk over the typed words (bash and zsh share it): sets ``kpath``."""
    return f"""{fn}_walk() {{
    # $@: the words after the program name, before the one being completed.
    kpath=""
    local word skip=""
    for word in "$@"; do
        if [ -n "$skip" ]; then skip=""; continue; fi
        case " $({fn}_valued "$kpath") $({fn}_valued "") " in
            *" $word "*) skip=1; continue ;;
        esac
        case " $({fn}_words "$kpath") " in
            *" $word "*) [ -n "$({fn}_options "${{kpath:+$kpath }}$word")$({fn}_words \
"${{kpath:+$kpath }}$word")" ] && kpath="${{kpath:+$kpath }}$word" ;;
        esac
    done
}}
{fn}_candidates() {{
    # $1: the word before the cursor, $2: the word being completed (kpath is set).
    local valued
    valued=" $({fn}_valued "$kpath") $({fn}_valued "") "
    case "$valued" in
        *" $1 "*)
            if [ -n "$({fn}_choices "$kpath|$1")" ]; then
                {fn}_choices "$kpath|$1"
            elif [ -n "$({fn}_choices "|$1")" ]; then
                {fn}_choices "|$1"
            else
                echo __files__
            fi
            return 0 ;;
    esac
    case "$2" in
        -*) {fn}_options "$kpath" ;;
        *) {fn}_words "$kpath" ;;
    esac
}}
"""


def _header(shell: str, prog: str, how: str) -> str:
    from kinetic._version import __version__

    return (
        f"# {shell} completion for `{prog}`: generated by `{prog} completion {shell}` "
        f"(Kinetic {__version__}).\n# {how}\n"
    )


def _bash(tree: Mapping[str, Node], prog: str) -> str:
    fn = _fn(prog)
    how = f"Load it: source <({prog} completion bash), or save it as a completion file."
    return f"""{_header("bash", prog, how)}
{_posix_lookups(fn, tree)}
{_posix_walk(fn)}
{fn}() {{
    local kpath cur prev words
    cur="${{COMP_WORDS[COMP_CWORD]}}"
    prev="${{COMP_WORDS[COMP_CWORD-1]}}"
    {fn}_walk "${{COMP_WORDS[@]:1:COMP_CWORD-1}}"
    words="$({fn}_candidates "$prev" "$cur")"
    if [ "$words" = __files__ ]; then
        COMPREPLY=($(compgen -f -- "$cur"))
    else
        COMPREPLY=($(compgen -W "$words" -- "$cur"))
    fi
}}
complete -o default -F {fn} {prog}
"""


# --------------------------------------------------------------------------- zsh


def _zsh(tree: Mapping[str, Node], prog: str) -> str:
    fn = _fn(prog)
    how = (
        f'Save it as "_{prog}" in a directory of $fpath, or: source <({prog} completion zsh) '
        "(after compinit)."
    )
    return f"""#compdef {prog}
{_header("zsh", prog, how)}
{_posix_lookups(fn, tree)}
{_posix_walk(fn)}
{fn}() {{
    local kpath cand
    {fn}_walk "${{(@)words[2,CURRENT-1]}}"
    cand="$({fn}_candidates "${{words[CURRENT-1]}}" "${{words[CURRENT]}}")"
    if [[ "$cand" == __files__ ]]; then
        _files
    else
        compadd -- ${{=cand}}
    fi
}}
if [[ "${{zsh_eval_context[-1]}}" == loadautofunc ]]; then
    {fn} "$@"
else
    compdef {fn} {prog}
fi
"""


# --------------------------------------------------------------------------- fish


def _fish_lookups(fn: str, tree: Mapping[str, Node]) -> str:
    parts = []
    for name, rows in _table(tree).items():
        cases = "\n".join(
            f"        case {_quote(key)}\n            echo {_quote(value)}" for key, value in rows
        )
        parts.append(f"function {fn}_{name}\n    switch $argv[1]\n{cases}\n    end\nend\n")
    return "\n".join(parts)


def _fish(tree: Mapping[str, Node], prog: str) -> str:
    fn = _fn(prog)
    how = f"Save it as ~/.config/fish/completions/{prog}.fish, or: {prog} completion fish | source"
    return f"""{_header("fish", prog, how)}
{_fish_lookups(fn, tree)}
function {fn}_complete
    set -l typed (commandline -opc)
    set -l cur (commandline -ct)
    set -l kpath ''
    set -l skip 0
    for word in $typed[2..-1]
        if test $skip = 1
            set skip 0
            continue
        end
        if contains -- $word (string split ' ' -- ({fn}_valued $kpath) ({fn}_valued ''))
            set skip 1
            continue
        end
        if contains -- $word (string split ' ' -- ({fn}_words $kpath))
            set -l next (string trim -- "$kpath $word")
            if test -n "$({fn}_options $next)$({fn}_words $next)"
                set kpath $next
            end
        end
    end
    set -l prev ''
    if test (count $typed) -gt 1
        set prev $typed[-1]
    end
    if string match -q -- '-*' $prev
        and contains -- $prev (string split ' ' -- ({fn}_valued $kpath) ({fn}_valued ''))
        set -l choices ({fn}_choices "$kpath|$prev")
        test -z "$choices"; and set choices ({fn}_choices "|$prev")
        if test -n "$choices"
            string split -n ' ' -- $choices
        else
            __fish_complete_path $cur
        end
        return
    end
    if string match -q -- '-*' $cur
        string split -n ' ' -- ({fn}_options $kpath)
    else
        string split -n ' ' -- ({fn}_words $kpath)
    end
end
complete -c {prog} -f -a '({fn}_complete)'
"""


# --------------------------------------------------------------------------- command


def add_parser(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], root: argparse.ArgumentParser
) -> None:
    """Add the ``completion`` command, which completes ``root``'s command line."""
    p = sub.add_parser(
        "completion",
        help="print a shell completion script (bash, zsh or fish)",
        description="Print a completion script for SHELL, made from this version's commands.",
    )
    p.add_argument("shell", choices=SHELLS, help="the shell: bash, zsh or fish")
    p.set_defaults(root_parser=root)


def run(ns: argparse.Namespace) -> int:
    """Run ``completion``; return the exit status."""
    print(script(ns.shell, ns.root_parser), end="")
    return EXIT_OK
