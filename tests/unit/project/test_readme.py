"""The README's configuration table is the settings class, word for word."""

from pathlib import Path

from inferq.settings import settings_table

ROOT = Path(__file__).resolve().parents[3]


def test_the_readme_lists_every_setting_with_its_default() -> None:
    readme = (ROOT / "README.md").read_text()
    start = readme.index("<!-- settings-table:start -->") + len("<!-- settings-table:start -->")
    end = readme.index("<!-- settings-table:end -->")
    assert readme[start:end].strip() == settings_table(), (
        "README's settings table is stale: paste `inferq settings --markdown` into it"
    )
