"""The docs tell the truth about the code: the configuration reference is the settings
class word for word, every troubleshooting entry is a message the code prints, and the
front page is short and runs only commands that tests run."""

from __future__ import annotations

import re
from pathlib import Path

from inferq.settings import settings_table

ROOT = Path(__file__).resolve().parents[3]
SOURCES = ("inferq", "api", "worker", "housekeeper", "cli")
# Each command on the front page, and the test that runs it.
FRONT_PAGE_COMMANDS = {
    "scripts/inferq run examples/prompts.jsonl --model demo": (
        "tests/integration/cli/test_local_run.py",
        'program=[str(ROOT / "scripts" / "inferq")]',
    ),
    # What CI runs, on a clean clone.
    "scripts/test": (".ci/run", "scripts/test"),
    # compose for real, with Docker (not part of CI, which has no Docker engine).
    "docker compose up -d": ("scripts/compose-check", "up -d"),
}


def test_the_configuration_reference_lists_every_setting_with_its_default() -> None:
    page = (ROOT / "docs" / "configuration.md").read_text()
    start = page.index("<!-- settings-table:start -->") + len("<!-- settings-table:start -->")
    end = page.index("<!-- settings-table:end -->")
    assert page[start:end].strip() == settings_table(), (
        "docs/configuration.md's settings table is stale: paste `inferq settings --markdown` "
        "into it"
    )


def test_every_troubleshooting_entry_is_a_message_the_code_prints() -> None:
    headings = re.findall(r"^### `(.+)`$", (ROOT / "docs" / "troubleshooting.md").read_text(), re.M)
    code = "\n".join(
        path.read_text() for package in SOURCES for path in (ROOT / package).rglob("*.py")
    )
    assert len(headings) >= 20
    assert [h for h in headings if h not in code] == []


def test_the_front_page_is_short_and_each_of_its_commands_is_run_by_a_test() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) < 150
    commands = [
        line
        for block in re.findall(r"```sh\n(.*?)```", readme, re.S)
        for line in block.splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert commands == list(FRONT_PAGE_COMMANDS)
    for command, (path, marker) in FRONT_PAGE_COMMANDS.items():
        assert marker in (ROOT / path).read_text(), f"nothing in {path} runs `{command}`"


def test_the_docs_link_to_nothing_outside_the_repository_or_the_site() -> None:
    for page in (ROOT / "docs").rglob("*.md"):
        for target in re.findall(r"\]\(([^)#]+)", page.read_text()):
            if target.startswith("http"):
                continue
            assert (page.parent / target).exists(), f"{page.name} links to missing {target}"


def test_every_error_code_the_code_can_raise_is_on_the_error_page() -> None:
    from docs.sitegen.error_codes import raised_codes
    from docs.sitegen.errors_page import error_codes_markdown, problems

    assert problems() == [], "docs/sitegen/error_codes.toml is out of step with the code"
    codes = raised_codes()
    page = error_codes_markdown()
    assert len(codes) >= 30
    assert [code for code in codes if f'<span id="{code}"></span>`{code}`' not in page] == []
    assert "<!-- error-codes -->" in (ROOT / "docs" / "errors.md").read_text()


def test_the_error_code_finder_sees_each_way_a_code_is_given() -> None:
    from docs.sitegen.error_codes import raised_codes

    codes = raised_codes()
    assert "InvalidRequest" in codes["context_length_exceeded"]  # a code= argument
    assert "ModelNotFound" in codes["model_not_found"]  # a class attribute
    assert "_Refused" in codes["duplicate_custom_id"]  # a class that takes code first
    assert "code" in codes["invalid_api_key"]  # a value assigned to `code`
    assert "dict" in codes["request_too_large"]  # a "code" key


def test_the_figures_on_the_front_page_and_the_results_page_are_what_the_results_say() -> None:
    from bench.results_page import stale

    assert stale() == [], "run `python -m bench.results_page --write`"


def test_the_first_request_section_is_what_the_compose_check_runs() -> None:
    import sys

    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        from compose_check import first_request_blocks
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    blocks = first_request_blocks((ROOT / "docs" / "deployment.md").read_text())
    code = "\n".join(text for _, text in blocks)
    for step in ("INFERQ_BOOTSTRAP_ADMIN_KEY", "docker compose ps", "/v1/models", "OpenAI("):
        assert step in code
    assert "client.batches.create" in code
    assert "inferq keys create" in code
    assert "compose_check.py first-request" in (ROOT / "scripts" / "compose-check").read_text()


def test_mermaid_is_served_from_the_site_itself() -> None:
    config = (ROOT / "mkdocs.yml").read_text()
    assert "- assets/javascripts/mermaid.min.js" in config
    script = (ROOT / "docs" / "assets" / "javascripts" / "mermaid.min.js").read_text()
    assert 'globalThis["mermaid"]' in script


def test_the_compatibility_page_has_a_row_for_every_field_each_endpoint_takes() -> None:
    from docs.sitegen.compat_page import ENDPOINTS, compatibility_markdown, stale_notes

    assert stale_notes() == [], "docs/sitegen/compat_page.py notes fields that are gone"
    page = compatibility_markdown()
    tables = page.split("### ")[1:]
    assert len(tables) == len(ENDPOINTS)
    for table, (endpoint, model) in zip(tables, ENDPOINTS, strict=True):
        assert table.startswith((f"`{endpoint}`", endpoint))
        rows = [row.split(" | ")[:2] for row in table.splitlines() if row.startswith("| `")]
        fields = {f.alias or name for name, f in model.model_fields.items()}
        assert {row[0].strip("| `") for row in rows} == fields, endpoint
    chat = dict(row.split(" | ")[:2] for row in tables[0].splitlines() if row.startswith("| `"))
    assert chat["| `logit_bias`"] == "honoured"
    assert chat["| `prompt_logprobs`"] == "honoured"
    assert chat["| `store`"] == "ignored"
    assert chat["| `modalities`"] == "refused (some values)"
    assert "<!-- compatibility -->" in (ROOT / "docs" / "compatibility.md").read_text()
