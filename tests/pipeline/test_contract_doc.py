"""docs/tables.md is the table contract as the code has it (pipeline.schema.contract_doc)."""

from __future__ import annotations

from pathlib import Path

from fleetlens.pipeline.schema import TABLES
from fleetlens.pipeline.schema.contract_doc import DESCRIPTIONS, contract_markdown

PAGE = Path(__file__).resolve().parents[2] / "docs" / "tables.md"


def test_every_table_of_the_contract_is_described() -> None:
    assert sorted(DESCRIPTIONS) == sorted(TABLES)


def test_docs_tables_md_is_what_the_contract_prints() -> None:
    assert PAGE.read_text() == contract_markdown(), (
        "docs/tables.md is stale: python -m fleetlens.pipeline.schema.contract_doc "
        "> docs/tables.md")


def test_the_page_lists_every_required_column_in_order() -> None:
    text = contract_markdown()
    for name, table in TABLES.items():
        section = text.split(f"\n## {name}\n", 1)[1].split("\n## ", 1)[0]
        listed = [line.split("`")[1] for line in section.splitlines() if line.startswith("| `")]
        assert listed == list(table.dtypes), name
