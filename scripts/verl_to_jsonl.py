#!/usr/bin/env python3
"""Converts verl's Parquet data files to the JSON lines colocated-rl's --data reads.

    pip install pyarrow
    python3 scripts/verl_to_jsonl.py ~/data/gsm8k/train.parquet gsm8k.jsonl
    colocated-rl --data gsm8k.jsonl --reward "python3 examples/rewards/gsm8k.py" ...

Each row is written as it is, one JSON object a line: verl's fields ("data_source", "prompt" as a
list of chat messages, "reward_model": {"ground_truth": ...}, "extra_info") are what --data reads
(docs/rewards.md). Values Parquet holds that JSON has no form for are written as text: bytes as
UTF-8 (or base64 when they are not), dates and times in ISO 8601; NaN as null. The product itself
reads no Parquet: this script, run once, is the only place pyarrow is needed.
"""
import argparse
import base64
import datetime
import decimal
import json
import math
import sys


def plain(v):
    """v as a value json.dumps writes."""
    if isinstance(v, dict):
        return {str(k): plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        # pyarrow gives a map column as a list of (key, value) pairs
        return [plain(x) for x in v]
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, bytes):
        try:
            return v.decode("utf-8")
        except UnicodeDecodeError:
            return base64.b64encode(v).decode("ascii")
    if isinstance(v, (datetime.date, datetime.time, datetime.datetime)):
        return v.isoformat()
    if isinstance(v, datetime.timedelta):
        return v.total_seconds()
    if isinstance(v, decimal.Decimal):
        return float(v)
    if hasattr(v, "tolist"):  # a numpy array or scalar
        return plain(v.tolist())
    return v


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("parquet", help="verl's data file (train.parquet, test.parquet)")
    parser.add_argument("out", help="the JSON lines file to write ('-': stdout)")
    parser.add_argument("--limit", type=int, default=0, help="the first N rows only")
    args = parser.parse_args()
    try:
        import pyarrow.parquet as pq
    except ImportError:
        sys.exit("verl_to_jsonl.py needs pyarrow: pip install pyarrow")
    table = pq.ParquetFile(args.parquet)
    out = sys.stdout if args.out == "-" else open(args.out, "w", encoding="utf-8")
    rows = 0
    for batch in table.iter_batches(batch_size=1024):
        for row in batch.to_pylist():
            out.write(json.dumps(plain(row), ensure_ascii=False) + "\n")
            rows += 1
            if args.limit and rows >= args.limit:
                break
        if args.limit and rows >= args.limit:
            break
    if out is not sys.stdout:
        out.close()
    fields = ", ".join(table.schema_arrow.names)
    print(f"{args.parquet}: {rows} rows ({fields}) -> {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
