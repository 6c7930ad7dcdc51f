"""`faultline ml ...`: train the log classifier and write its artifact, or try it on lines."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path


def build_parser() -> argparse.ArgumentParser:
    """The `faultline ml` argument parser (train, predict)."""
    parser = argparse.ArgumentParser(prog="faultline ml", description="The learned log classifier.")
    sub = parser.add_subparsers(dest="ml_command", required=True, metavar="ACTION")
    train = sub.add_parser("train", help="train on the labeled lines, print the held-out report, write an artifact")
    train.add_argument("--data", type=Path, default=None, help="labeled TSV (default: the shipped ml/data one)")
    train.add_argument("--out", type=Path, default=None, help="artifact folder (default: ml/artifacts)")
    train.add_argument("--seed", type=int, default=0, help="seed for variants and splits (default 0)")
    train.add_argument("--variants", type=int, default=20, help="generated variants per labeled line (default 20)")
    train.add_argument("--test-size", type=float, default=0.2, help="held-out share of base lines (default 0.2)")
    train.add_argument(
        "--thread-folds",
        type=int,
        default=5,
        help="folds of the cross-validation over the real lines split by thread (default 5; 0 skips it)",
    )
    predict = sub.add_parser("predict", help="classify lines given as arguments, or read from stdin")
    predict.add_argument("lines", nargs="*", help="log lines (default: one per stdin line)")
    predict.add_argument("--model", type=Path, default=None, help="artifact path (default: the newest shipped)")
    return parser


def _train(args: argparse.Namespace) -> int:
    """Train, report, save; print the artifact path and version."""
    from ml.classifier import train  # scikit-learn loads only when training

    started = time.monotonic()

    def say(message: str) -> None:
        print(message, flush=True)

    result = train.train(
        args.data,
        seed=args.seed,
        n_variants=args.variants,
        test_size=args.test_size,
        n_thread_folds=args.thread_folds,
        log=say,
    )
    path = train.save(result, args.out)
    size_kib = path.stat().st_size / 1024
    print(f"wrote {path} ({size_kib:.0f} KiB) in {time.monotonic() - started:.1f} s")
    print(f"version {result.metadata['version']}, held-out accuracy {result.metadata['heldout_accuracy']:.4f}")
    if "thread_cv" in result.metadata:
        print(train.macro_line(result.metadata["thread_cv"]))  # the headline again, after the long report
    return 0


def _predict(args: argparse.Namespace) -> int:
    """Print category, confidence and the line, tab-separated."""
    from ml.classifier import model

    lines = args.lines or [line.rstrip("\n") for line in sys.stdin]
    classifier = model.load(args.model)
    for line, (category, confidence) in zip(lines, classifier.predict(lines), strict=True):
        print(f"{category}\t{confidence:.3f}\t{line}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point for `faultline ml`; returns the exit status."""
    args = build_parser().parse_args(argv)
    try:
        if args.ml_command == "train":
            return _train(args)
        return _predict(args)
    except (OSError, ValueError, RuntimeError) as exc:  # bad data path or rows, unreadable artifact
        print(f"faultline ml {args.ml_command}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
