"""python -m expertd stats [--socket PATH] [--json]: the daemon's counters."""
from __future__ import annotations

import argparse
import json
import sys

from . import Client, Error


def main(argv: "list[str] | None" = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m expertd", description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    st = sub.add_parser("stats", help="print the daemon's counters")
    st.add_argument("--socket", default="/run/expertd/expertd.sock")
    st.add_argument("--json", action="store_true", help="one JSON object")
    args = ap.parse_args(argv)
    try:
        with Client.connect(args.socket, "python-stats", monitor=True) as c:
            s = c.stats()
    except Error as e:
        print(f"python -m expertd: {e}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(s))
    else:
        w = max(len(k) for k in s)
        for k, v in s.items():
            print(f"{k:<{w}}  {v:g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
