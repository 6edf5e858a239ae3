#!/usr/bin/env python3
"""Writes examples/count_words.jsonl and examples/reverse_words.jsonl: two --data tasks on the
embedded default model's words, every prompt distinct.

Distinct prompts matter: the job holds out rows whose prompt it never trains on, so a file that
repeats a prompt many times (the old count_words.jsonl had only 16 one-word prompts in 327 rows)
holds out whole answer classes, which no amount of training on the other rows can reach.

    python3 scripts/make_example_tasks.py            # rewrites both files (seeded: same bytes)
"""
import json
import random
from pathlib import Path

# Words the default tokenizer keeps as single pieces (trainer/tasks.cpp, default_task_rows).
WORDS = ["red", "big", "old", "green", "small", "quick", "lazy", "dark", "happy", "young",
         "bright", "quiet", "tree", "river", "book", "Leo"]
ROWS = 2000


def distinct_rows(make, rng):
    rows, seen = [], set()
    while len(rows) < ROWS:
        row = make(rng)
        if row["prompt"] not in seen:
            seen.add(row["prompt"])
            rows.append(row)
    return rows


def count_row(rng):
    # 1-6 words, repeats allowed; a 1-word list has only 16 prompts, so its class is rare.
    words = [rng.choice(WORDS) for _ in range(rng.randint(1, 6))]
    return {"prompt": f"How many words: {' '.join(words)}? Answer:", "answer": len(words)}


def reverse_row(rng):
    words = rng.sample(WORDS, rng.randint(2, 3))
    return {"prompt": f"Reverse: {' '.join(words)}. Answer:", "answer": " ".join(reversed(words))}


def main():
    out = Path(__file__).resolve().parent.parent / "examples"
    for name, make, seed in (("count_words", count_row, 1), ("reverse_words", reverse_row, 2)):
        rows = distinct_rows(make, random.Random(seed))
        with open(out / f"{name}.jsonl", "w") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")
        print(f"{name}.jsonl: {len(rows)} rows, all prompts distinct")


if __name__ == "__main__":
    main()
