"""The documentation site's generated pages and navigation, without building the site.

(``tox -e docs`` builds it with ``mkdocs build --strict``; these checks are the fast part:
every catalog entry and every setting reaches its generated page, and the navigation
names only pages that exist.)
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType

from kinetic._cli.config import KNOBS
from kinetic._core import accelerators as acc
from kinetic._core import config

REPO = Path(__file__).resolve().parent.parent.parent


def _hooks() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_hooks", REPO / "docs" / "gen" / "hooks.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_accelerators_page_lists_the_whole_catalog() -> None:
    page = _hooks().accelerators_page()
    for gpu_type, gpu in acc.GPU_CATALOG.items():
        for count in gpu.machine_types:
            cfg = acc.make_gpu(gpu_type, count)
            assert f"| `{cfg.name}` | {count} | `{cfg.machine_type}` |" in page
    for tpu_type, tpu in acc.TPU_CATALOG.items():
        for chips in tpu.slices:
            t = acc.make_tpu(tpu_type, chips)
            assert f"| `{t.name}` | {chips} | `{t.topology}` | {t.num_nodes} |" in page
    for form in acc.valid_forms():
        assert form in page


def test_configuration_page_lists_every_setting_and_knob() -> None:
    page = _hooks().configuration_page()
    for name, variable in config.SETTING_VARIABLES.items():
        assert re.search(rf"^\| `{name}` \|.*\| `{variable}` \|", page, re.MULTILINE), name
    for _name, variable, _unset in KNOBS:
        assert f"`{variable}`" in page
    for field in config.PROFILE_FIELDS:
        assert f"`{field}`" in page
    assert f"`{config.DEFAULT_ZONE}`" in page


def test_navigation_names_existing_or_generated_pages() -> None:
    text = (REPO / "mkdocs.yml").read_text()
    nav = text[text.index("\nnav:") :]
    named = re.findall(r":\s+([\w/.-]+\.md)\s*$", nav, re.MULTILINE)
    generated = set(_hooks().PAGES)
    assert len(named) >= 25
    for page in named:
        assert page in generated or (REPO / "docs" / page).is_file(), page
    # Every hand-written page is reachable from the navigation.
    written = {str(p.relative_to(REPO / "docs")) for p in (REPO / "docs").rglob("*.md")}
    assert written <= set(named), written - set(named)
