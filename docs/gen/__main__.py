"""``python -m docs.gen`` writes the generated reference pages; ``--check`` only says which are stale."""

from __future__ import annotations

import argparse
import sys

from docs.gen import COMMAND, stale_pages, write_all


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=COMMAND, description=__doc__)
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if a page is stale")
    args = parser.parse_args(argv)
    if args.check:
        stale = stale_pages()
        for path in stale:
            print(f"stale: docs/{path} (regenerate with `{COMMAND}`)", file=sys.stderr)
        return 1 if stale else 0
    for path in write_all():
        print(f"wrote docs/{path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
