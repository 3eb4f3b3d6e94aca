"""Spider (text-to-SQL) dev set, scored by execution accuracy.

Data: ``<data_dir>/spider/dev.json``, ``tables.json`` and
``database/<db_id>/<db_id>.sqlite``. Questions whose database is missing (offline:
``wta_1``) are skipped and counted in ``task.skipped``. The paper used the first
100 dev questions (``limit: 100``).

Prompt: an instruction, one fixed few-shot example on a made-up schema (not from
Spider), then the question's schema as ``CREATE TABLE`` statements, the question
and ``SQL:``. The scorer keeps the answer up to the first ``;``.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from mtad.tasks.base import Example, Task, TaskUnavailable
from mtad.tasks.common import data_root, source_label

INSTRUCTION = (
    "Write one SQLite query that answers the question about the database below. "
    "Reply with the SQL query only, ending with a semicolon."
)

FEW_SHOT_SCHEMA = """CREATE TABLE department (
  dept_id number,
  name text,
  budget number,
  PRIMARY KEY (dept_id)
);
CREATE TABLE employee (
  emp_id number,
  name text,
  age number,
  dept_id number,
  PRIMARY KEY (emp_id),
  FOREIGN KEY (dept_id) REFERENCES department(dept_id)
);"""
FEW_SHOT_QUESTION = "What are the names of the departments that have more than 3 employees?"
FEW_SHOT_SQL = (
    "SELECT T1.name FROM department AS T1 JOIN employee AS T2 ON T1.dept_id = T2.dept_id "
    "GROUP BY T1.dept_id HAVING count(*) > 3;"
)

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _q(name: str) -> str:
    return name if _IDENT.match(name) else '"' + name.replace('"', '""') + '"'


def schema_ddl(entry: dict) -> str:
    """A database's schema from its ``tables.json`` entry, as CREATE TABLE statements."""
    tables = entry["table_names_original"]
    cols = entry["column_names_original"]
    types = entry["column_types"]
    pks: set[int] = set()
    for pk in entry.get("primary_keys", []):
        pks.update(pk if isinstance(pk, list) else [pk])
    fks = entry.get("foreign_keys", [])
    out = []
    for ti, table in enumerate(tables):
        idx = [i for i, (tj, _) in enumerate(cols) if tj == ti]
        lines = [f"  {_q(cols[i][1])} {types[i]}" for i in idx]
        pk_cols = [_q(cols[i][1]) for i in idx if i in pks]
        if pk_cols:
            lines.append(f"  PRIMARY KEY ({', '.join(pk_cols)})")
        for a, b in fks:
            if cols[a][0] == ti:
                ref_table = tables[cols[b][0]]
                lines.append(
                    f"  FOREIGN KEY ({_q(cols[a][1])}) REFERENCES {_q(ref_table)}({_q(cols[b][1])})"
                )
        out.append(f"CREATE TABLE {_q(table)} (\n" + ",\n".join(lines) + "\n);")
    return "\n".join(out)


def build_prompt(schema: str, question: str, few_shot: bool = True) -> str:
    parts = [INSTRUCTION, ""]
    if few_shot:
        parts += [FEW_SHOT_SCHEMA, f"Question: {FEW_SHOT_QUESTION}", f"SQL: {FEW_SHOT_SQL}", ""]
    parts += [schema, f"Question: {question}", "SQL:"]
    return "\n".join(parts)


@dataclass(kw_only=True, eq=False)
class SpiderTask(Task):
    name: str = "spider"
    limit: int | None = 100
    max_prompt_tokens: int = 1024
    data_dir: str | None = None
    split_file: str = "dev.json"
    tables_file: str = "tables.json"
    few_shot: bool = True

    def spider_dir(self) -> Path:
        return data_root(self.data_dir) / "spider"

    def load(self) -> list[Example]:
        from datasets import load_dataset

        root = self.spider_dir()
        split, tables_path = root / self.split_file, root / self.tables_file
        for p in (split, tables_path):
            if not p.is_file():
                raise TaskUnavailable(
                    f"Spider file {p} is missing; the repository ships data/spider/ "
                    "(see data/SOURCES.md), or point the task's data_dir at a folder holding "
                    "spider/dev.json, spider/tables.json and spider/database/"
                )
        ds = load_dataset("json", data_files=str(split), split="train")
        ds = ds.select_columns(["db_id", "question", "query"])
        with open(tables_path, encoding="utf-8") as f:
            schemas = {t["db_id"]: t for t in json.load(f)}
        ddl_cache: dict[str, str] = {}
        missing: Counter[str] = Counter()
        examples: list[Example] = []
        for i, row in enumerate(ds):
            if self.limit is not None and len(examples) >= self.limit:
                break
            db = row["db_id"]
            db_path = root / "database" / db / f"{db}.sqlite"
            if not db_path.is_file() or db not in schemas:
                missing[db] += 1
                continue
            if db not in ddl_cache:
                ddl_cache[db] = schema_ddl(schemas[db])
            prompt = build_prompt(ddl_cache[db], row["question"], self.few_shot)
            examples.append(
                Example(
                    id=f"spider-{split.stem}-{i}",
                    turns=[prompt],
                    reference={"query": row["query"], "db_path": str(db_path), "db_id": db},
                    meta={"db_id": db, "question": row["question"], "index": i},
                )
            )
        self.source = source_label(root)
        self.substitute = False
        self.skipped = (
            {
                "count": sum(missing.values()),
                "reason": "SQLite database not available",
                "db_ids": dict(missing),
            }
            if missing
            else {}
        )
        return examples
