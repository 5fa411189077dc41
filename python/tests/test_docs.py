"""The user documents hold together: every relative link resolves (files and #anchors), README
stays a front page whose headline figures come from the one results set, and no document keeps
a diary of dated runs."""

import collections
import pathlib
import re
import urllib.parse

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "results"


def documents():
    docs = [ROOT / "README.md", ROOT / "bench" / "README.md", RESULTS / "README.md"]
    return docs + sorted((ROOT / "docs").glob("*.md"))


def without_code(text):
    """Markdown outside fenced code blocks and inline code spans."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", "", text)


def anchors(path):
    """GitHub's anchors for a Markdown file's headings: lower case, punctuation dropped, spaces
    to hyphens, a repeated heading numbered."""
    seen = collections.Counter()
    found = set()
    text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.S | re.M)
    for heading in re.findall(r"^#{1,6}\s+(.*?)\s*#*\s*$", text, flags=re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        found.add(slug if seen[slug] == 0 else f"{slug}-{seen[slug]}")
        seen[slug] += 1
    return found


def relative_links(path):
    text = without_code(path.read_text())
    for target in re.findall(r"\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)", text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        yield target


@pytest.mark.parametrize("doc", documents(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(doc):
    assert doc.exists(), f"{doc.relative_to(ROOT)} is missing"
    broken = []
    for target in relative_links(doc):
        file_part, _, anchor = target.partition("#")
        dest = (doc.parent / urllib.parse.unquote(file_part)).resolve() if file_part else doc
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading with that anchor in {dest.name}")
    assert not broken, f"{doc.relative_to(ROOT)}: " + "; ".join(broken)


def test_the_readme_is_a_front_page():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines; the details go in docs/"


@pytest.mark.parametrize("doc", documents(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_document_keeps_a_diary_of_dated_runs(doc):
    dated = [line for line in doc.read_text().splitlines()
             if re.search(r"\b20\d\d-\d\d-\d\d\b", line)]
    assert not dated, f"{doc.relative_to(ROOT)} names dated runs (history lives in git): {dated}"


def test_the_results_folder_holds_one_set_and_says_what_each_file_is():
    listed = set(re.findall(r"^\| \[([^\]]+)\]\(", (RESULTS / "README.md").read_text(), flags=re.M))
    present = {p.name for p in RESULTS.iterdir()} - {"README.md"}
    assert present == listed, (f"bench/results/ holds {sorted(present)}; its README describes "
                               f"{sorted(listed)}")


def test_the_readme_headline_figures_come_from_the_results_set():
    """Each figure of README's first table appears in the results set's table, so that a new
    set without a new README (or the reverse) fails here."""
    readme = (ROOT / "README.md").read_text()
    table = re.search(r"^\|.*?\n(?=\n)", readme, flags=re.S | re.M)
    assert table, "README.md has no headline table"
    results = (RESULTS / "compare.txt").read_text()
    sections = {m.group(1): m.group(0) for m in
                re.finditer(r"^(W\d\w*):.*?(?=\n\n|\Z)", results, flags=re.S | re.M)}
    figure = re.compile(r"(\d[\d,]*(?:\.\d+)?) (ms|GB/s|tasks/s)")
    rows = table.group(0).splitlines()[2:]
    assert len(rows) >= 4, f"too few rows in README's table: {rows}"

    def shown(value, unit, section):  # compare.txt prints three significant figures
        number = float(value.replace(",", ""))
        return any(found.group(2) == unit and
                   abs(float(found.group(1).replace(",", "")) - number) <= 0.005 * number
                   for found in figure.finditer(section))

    missing = []
    for row in rows:
        workload = re.match(r"\|\s*(W\d\w*):", row)
        assert workload and workload.group(1) in sections, f"no results table for: {row}"
        missing += [f"{workload.group(1)} {value} {unit}" for value, unit in figure.findall(row)
                    if not shown(value, unit, sections[workload.group(1)])]
    assert not missing, f"README figures not in bench/results/compare.txt: {missing}"
