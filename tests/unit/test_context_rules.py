"""Ignore rules against git's documented cases (gitignore(5)): pure, no files, no git.

``walk`` lists an in-memory tree the way the context walk does (a directory's own
``.gitignore`` applies to it and below; an excluded directory is not entered), so the
expected listings are what ``git ls-files --others --exclude-standard`` prints for the
same tree (checked against real git in ``tests/local/test_context.py``).
"""

from __future__ import annotations

import pytest

from kinetic._core.context_rules import (
    DEFAULT_EXCLUDES,
    SECRETS,
    ExcludeRules,
    IgnoreFile,
)

# (patterns of a .gitignore at the root, path, is a directory, ignored?)
SINGLE_LAYER = [
    # A pattern without a slash matches at any depth, files and directories alike.
    (["*.log"], "a.log", False, True),
    (["*.log"], "deep/er/b.log", False, True),
    (["*.log"], "a.log.txt", False, False),
    (["build"], "build", True, True),
    (["build"], "src/build", False, True),
    # A slash at the start or in the middle anchors the pattern to its file's directory.
    (["/build"], "build", True, True),
    (["/build"], "src/build", True, False),
    (["doc/frotz"], "doc/frotz", True, True),
    (["doc/frotz"], "a/doc/frotz", True, False),
    (["doc/*.md"], "doc/a.md", False, True),
    (["doc/*.md"], "doc/sub/a.md", False, False),  # `*` does not cross `/`
    # A trailing slash matches directories only.
    (["build/"], "build", True, True),
    (["build/"], "build", False, False),
    (["build/"], "src/build", True, True),
    (["frotz/"], "a/frotz", True, True),
    # Leading `**/` matches in all directories; trailing `/**` everything inside;
    # `/**/` zero or more directories.
    (["**/foo"], "foo", False, True),
    (["**/foo"], "x/y/foo", True, True),
    (["**/foo/bar"], "x/foo/bar", False, True),
    (["abc/**"], "abc", True, False),  # the directory itself is not matched
    (["abc/**"], "abc/x", False, True),
    (["abc/**"], "abc/x/y", True, True),
    (["a/**/b"], "a/b", False, True),
    (["a/**/b"], "a/x/b", False, True),
    (["a/**/b"], "a/x/y/b", False, True),
    (["a/**/b"], "x/a/b", False, False),
    # `?` and ranges.
    (["fil?.txt"], "file.txt", False, True),
    (["fil?.txt"], "fi.txt", False, False),
    (["r[a-c].py"], "rb.py", False, True),
    (["r[a-c].py"], "rd.py", False, False),
    # Negation: the last matching pattern decides.
    (["*.log", "!keep.log"], "keep.log", False, False),
    (["*.log", "!keep.log"], "other.log", False, True),
    (["!keep.log", "*.log"], "keep.log", False, True),
    # Comments, blank lines, escapes, trailing spaces.
    (["# comment", "", "x"], "# comment", False, False),
    (["\\#hash"], "#hash", False, True),
    (["\\!bang"], "!bang", False, True),
    (["spaced   "], "spaced", False, True),
    (["esc\\ "], "esc ", False, True),
    (["esc\\ "], "esc", False, False),
]


@pytest.mark.parametrize(("patterns", "path", "is_dir", "ignored"), SINGLE_LAYER)
def test_gitignore_pattern(patterns: list[str], path: str, is_dir: bool, ignored: bool) -> None:
    rules = ExcludeRules([IgnoreFile(".gitignore", tuple(patterns))])
    assert rules.excludes(path, is_dir=is_dir) is ignored


Tree = dict[str, "str | Tree"]


def walk(tree: Tree, rules: ExcludeRules, rel: str = "") -> list[str]:
    """The files of an in-memory tree that travel (files: str content, dirs: dicts)."""
    if ".gitignore" in tree:
        lines = tuple(str(tree[".gitignore"]).splitlines())
        source = f"{rel}/.gitignore" if rel else ".gitignore"
        rules = rules.nested(IgnoreFile(source, lines, scope=rel))
    out: list[str] = []
    for name in sorted(tree):
        path = f"{rel}/{name}" if rel else name
        entry = tree[name]
        if isinstance(entry, dict):
            if not rules.excludes(path, is_dir=True):
                out += walk(entry, rules, path)
        elif name != ".gitignore" and not rules.excludes(path, is_dir=False):
            out.append(path)
    return out


TREES = [
    pytest.param(
        {".gitignore": "logs/\n!logs/keep.txt\n", "logs": {"keep.txt": "", "x": ""}},
        [],
        id="no re-include inside an excluded directory",
    ),
    pytest.param(
        {".gitignore": "logs/*\n!logs/keep.txt\n", "logs": {"keep.txt": "", "x": "", "s": {}}},
        ["logs/keep.txt"],
        id="re-include when only the contents are excluded",
    ),
    pytest.param(
        {".gitignore": "foo/**\n!foo/bar\n", "foo": {"bar": "", "baz": "", "x": {"bar": ""}}},
        ["foo/bar"],
        id="trailing /** leaves the directory itself",
    ),
    pytest.param(
        {".gitignore": "*\n!*/\n!*.py\n", "a.py": "", "x": {"b.py": "", "c.txt": ""}},
        ["a.py", "x/b.py"],
        id="ignore all but python files",
    ),
    pytest.param(
        {".gitignore": "/*\n!/src\n", "top.txt": "", "src": {"main.py": ""}, "o": {"x": ""}},
        ["src/main.py"],
        id="only one top-level directory",
    ),
    pytest.param(
        {
            ".gitignore": "*.dat\n/top-only\n",
            "a.dat": "",
            "top-only": "",
            "z.tmp": "",
            "sub": {
                ".gitignore": "!keep.dat\n/anch\n*.tmp\n",
                "keep.dat": "",
                "x.dat": "",
                "top-only": "",
                "anch": "",
                "y.tmp": "",
                "deeper": {"anch": ""},
            },
        },
        ["sub/deeper/anch", "sub/keep.dat", "sub/top-only", "z.tmp"],
        id="nested .gitignore: relative to its directory, overrides the root's",
    ),
    pytest.param(
        {".gitignore": "build\n!build/\nbuild/*.o\n", "build": {"a.o": "", "a.c": ""}},
        ["build/a.c"],
        id="a directory re-included by a later pattern",
    ),
    pytest.param(
        {".gitignore": "data/\n", "data": "a file named data", "sub": {"data": {"x": ""}}},
        ["data"],
        id="directory-only pattern leaves a file of that name",
    ),
]


@pytest.mark.parametrize(("tree", "expected"), TREES)
def test_gitignore_tree(tree: Tree, expected: list[str]) -> None:
    assert walk(tree, ExcludeRules()) == expected


def test_layers_in_rising_priority() -> None:
    info_exclude = IgnoreFile(".git/info/exclude", ("*.tmp", "secret/"))
    root = IgnoreFile(".gitignore", ("!keep.tmp", "*.bin"))
    sub = IgnoreFile("sub/.gitignore", ("!*.bin",), scope="sub")
    kinetic = IgnoreFile(".kineticignore", ("!secret/", "notes/"))
    rules = ExcludeRules([info_exclude, root, sub], kinetic)
    assert rules.decide("a.tmp", is_dir=False) == (True, ".git/info/exclude")
    assert rules.decide("keep.tmp", is_dir=False) == (False, ".gitignore")  # over info/exclude
    assert rules.decide("a.bin", is_dir=False) == (True, ".gitignore")
    assert rules.decide("sub/a.bin", is_dir=False) == (False, "sub/.gitignore")  # deeper wins
    assert rules.decide("secret", is_dir=True) == (False, ".kineticignore")  # re-included
    assert rules.decide("notes", is_dir=True) == (True, ".kineticignore")
    assert rules.decide("main.py", is_dir=False) == (False, None)


def test_defaults_apply_under_every_layer_and_kineticignore_overrides_them() -> None:
    rules = ExcludeRules([IgnoreFile(".gitignore", ("*.log",))])
    for name in ("__pycache__", ".git", "node_modules", ".venv", "x.egg-info"):
        assert rules.decide(f"pkg/{name}", is_dir=True) == (True, "defaults")
    assert rules.excludes("m.pyc", is_dir=False)
    again = ExcludeRules.with_ignore_file(["!node_modules/"])
    assert not again.excludes("node_modules", is_dir=True)
    assert "node_modules" in DEFAULT_EXCLUDES


@pytest.mark.parametrize(
    ("path", "is_dir"),
    [
        (".ssh", True),
        ("deep/.ssh", True),
        ("id_rsa", False),
        ("keys/id_ed25519.pub", False),
        (".netrc", False),
        (".aws", True),
        ("home/.config/gcloud", True),
        ("application_default_credentials.json", False),
        (".kube", True),
        (".docker/config.json", False),
        (".env", False),
        (".env.production", False),
        ("conf/credentials.json", False),
        ("server.pem", False),
        ("tls/site.key", False),
        (".git-credentials", False),
        (".pypirc", False),
        (".npmrc", False),
    ],
)
def test_secrets_are_left_out_and_only_kineticignore_ships_one(path: str, is_dir: bool) -> None:
    name = path.rsplit("/", 1)[-1]
    git = IgnoreFile(".gitignore", ("!" + name + ("/" if is_dir else ""),))
    rules = ExcludeRules([git])
    assert rules.decide(path, is_dir=is_dir) == (True, SECRETS)  # git cannot re-include
    assert rules.flags_secret(path, is_dir=is_dir) == (True, True)
    shipped = ExcludeRules([git], IgnoreFile(".kineticignore", (f"!{path}",)))
    assert shipped.flags_secret(path, is_dir=is_dir) == (False, True)  # kept, and named


def test_look_alikes_of_secrets_travel_unflagged() -> None:
    rules = ExcludeRules()
    for path in ("keys.py", "app.key.txt", "environment.py", ".envrc", "docker/config.json"):
        assert rules.flags_secret(path, is_dir=False) == (False, False), path
    assert rules.flags_secret("config", is_dir=True) == (False, False)


def test_patterns_above_the_package_root_use_a_prefix() -> None:
    # The work tree's top holds `proj/sub/`: the package root is proj/, so inside it the
    # pattern is about sub/; `/x` at the top is about the top's x, not proj/x.
    above = IgnoreFile("../.gitignore", ("proj/sub/", "/x", "*.o"), prefix="proj/")
    rules = ExcludeRules([above])
    assert rules.excludes("sub", is_dir=True)
    assert not rules.excludes("x", is_dir=False)
    assert rules.excludes("deep/a.o", is_dir=False)


def test_nested_scope_does_not_leak_to_siblings() -> None:
    nested = ExcludeRules().nested(IgnoreFile("a/.gitignore", ("*.txt",), scope="a"))
    assert nested.excludes("a/x.txt", is_dir=False)
    assert nested.excludes("a/b/x.txt", is_dir=False)
    assert not nested.excludes("ab/x.txt", is_dir=False)
    assert not nested.excludes("x.txt", is_dir=False)


def test_signature_names_the_rules() -> None:
    a = ExcludeRules.with_ignore_file(["x"])
    assert a == ExcludeRules.with_ignore_file(["x"])
    assert a.signature != ExcludeRules.with_ignore_file(["y"]).signature
    assert a.signature != ExcludeRules().signature
    assert a.nested(IgnoreFile("s/.gitignore", ("z",), scope="s")).signature != a.signature
