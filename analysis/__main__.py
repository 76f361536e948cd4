"""python -m analysis [--check]: regenerate outputs/report/REPORT.md from outputs/results."""

import argparse
import sys
from pathlib import Path

from analysis.report import write_report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m analysis", description=__doc__)
    parser.add_argument("--out", type=Path, default=Path("outputs"), help="the harness's out dir")
    parser.add_argument("--check", action="store_true", help="exit 1 if a claim fails")
    args = parser.parse_args(argv)
    results = args.out / "results"
    if not results.is_dir():
        print(
            f"error: no results in {results}; run python -m harness +experiment=NAME first",
            file=sys.stderr,
        )
        return 2
    path, claims = write_report(results, args.out / "report")
    for claim in claims.itertuples():
        print(f"{claim.result:7} {claim.experiment}: {claim.claim} (worst {claim.worst})")
    print(f"report: {path}")
    failing = claims[claims["result"].isin(["FAIL", "NO DATA", "ERROR"])]
    return 1 if args.check and not failing.empty else 0


sys.exit(main())
