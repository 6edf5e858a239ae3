#!/usr/bin/env python3
"""A reward program for colocated-rl: GSM8K's rule as verl scores it, over the JSON-lines protocol.

    colocated-rl --data gsm8k.jsonl --reward "python3 examples/rewards/gsm8k.py"

The rule (verl's gsm8k reward): only the completion's last 300 characters count; the answer is the
number after the last "#### " there, with its commas and dollar signs dropped; it scores 1.0 when
it equals the ground truth as text, --format-score (default 0.0) when there is such a number and it
is wrong, and 0.0 when there is none. With --flexible the answer is instead the last run of digits,
dots and commas there that is not "" or "." (kept as written, commas included).

The protocol (docs/rewards.md): the job writes one request per line on stdin, a group of
completions of one prompt,
    {"op": "score", "id": "s3p1", "items": [{"data_source": ..., "prompt": ..., "completion": ...,
                                             "ground_truth": ..., "extra_info": ...}, ...]}
and reads one reply line on stdout, one score per item, a number or an object:
    {"id": "s3p1", "scores": [{"score": 1.0, "correct": true, "has_answer": 1}, ...]}
Keys beside "score" and "correct" are the run's extra metrics (reward_extra/has_answer/mean).
Anything else this program prints must go to stderr: stdout carries the replies. A program written
for verl plugs in by calling its compute_score(data_source, completion, ground_truth, extra_info)
in place of score() below.
"""
import argparse
import json
import re
import sys

STRICT = re.compile(r"#### (\-?[0-9\.\,]+)")
NUMBER = re.compile(r"(\-?[0-9\.\,]+)")


def extract(completion, flexible):
    """The completion's final answer as text, or None."""
    tail = completion[-300:]  # long chains of thought: only the end can hold the answer
    if not flexible:
        found = STRICT.findall(tail)
        return found[-1].replace(",", "").replace("$", "") if found else None
    found = NUMBER.findall(tail)
    if not found:
        return None
    for candidate in reversed(found):
        if candidate not in ("", "."):
            return candidate
    return found[0]  # every candidate was "" or ".": verl keeps the last one it looked at


def score(item, flexible, format_score):
    answer = extract(item["completion"], flexible)
    truth = str(item["ground_truth"])
    if answer is None:
        return {"score": 0.0, "correct": False, "has_answer": 0}
    right = answer == truth
    return {"score": 1.0 if right else format_score, "correct": right, "has_answer": 1}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--flexible", action="store_true",
                        help="the last number anywhere, not only after '#### '")
    parser.add_argument("--format-score", type=float, default=0.0,
                        help="the score of a wrong answer in the right format (verl's default 0)")
    args = parser.parse_args()
    for line in sys.stdin:
        if not line.strip():
            continue
        request = json.loads(line)
        scores = [score(item, args.flexible, args.format_score) for item in request["items"]]
        sys.stdout.write(json.dumps({"id": request["id"], "scores": scores}) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
