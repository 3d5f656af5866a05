"""Line files and our subwords as peers read them: the few file helpers every stage that feeds
another toolkit shares (kept in the suite, below the stages and the peers, so neither imports the other)."""

from __future__ import annotations


def read_lines(path: str) -> list[str]:
    """The lines of a UTF-8 text file, without their newlines."""
    with open(path, encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f]


def write_lines(path: str, lines: list[str]) -> str:
    """Write ``lines`` one per line; returns ``path``."""
    with open(path, "w", encoding="utf-8") as f:
        f.write("".join(line + "\n" for line in lines))
    return path


def tokenizer(subword_model: str):
    """Our learned BPE as pyonmttok applies it, so a peer toolkit sees exactly our subwords."""
    import pyonmttok

    return pyonmttok.Tokenizer("aggressive", joiner_annotate=True, bpe_model_path=subword_model)


def read_docs(path: str) -> list[list[str]]:
    """Documents of a file in which blank lines separate documents."""
    docs, cur = [], []
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.rstrip("\n")
            if line.strip():
                cur.append(line)
            elif cur:
                docs.append(cur)
                cur = []
    return docs + ([cur] if cur else [])


def write_docs(path: str, docs: list[list[str]]) -> str:
    """Documents one sentence a line, a blank line between documents; returns ``path``."""
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n\n".join("\n".join(d) for d in docs) + "\n")
    return path
