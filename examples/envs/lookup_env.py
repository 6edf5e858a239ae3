#!/usr/bin/env python3
"""An environment for `colocated-rl --env "python3 examples/envs/lookup_env.py"`: a copy to start
your own from. It speaks the JSON-lines protocol of docs/multi-turn.md on stdin/stdout, one request
at a time; the job starts one process per infer rank (more with --env-procs) and one on the train
ranks for the SFT warm-up's demonstrations.

The task: "What is the code of the word W?" The model cannot know it; it has a `lookup` tool that
returns it. An episode scores 1 when the model's final answer holds the code. Task `index` picks
the word; the "train" and "eval" splits use different words, so the held-out eval asks about words
never trained on.
"""
import json
import sys

WORDS = ["amber", "birch", "cedar", "delta", "ember", "fjord", "grove", "harbor", "island",
         "juniper", "kestrel", "lagoon", "meadow", "nectar", "orchid", "prairie", "quartz",
         "river", "summit", "tundra", "umber", "valley", "willow", "yarrow", "zephyr"]

TOOLS = [{"type": "function", "function": {
    "name": "lookup",
    "description": "The code of a word.",
    "parameters": {"type": "object", "properties": {"word": {"type": "string"}},
                   "required": ["word"]}}}]


def code(word):
    """A code the model cannot guess: three digits from the word's letters."""
    return str(sum((i + 1) * ord(c) for i, c in enumerate(word)) % 900 + 100)


def word_of(split, index):
    # Every other word for training, the rest held out: the eval asks about words never trained on.
    pool = WORDS[0::2] if split == "train" else WORDS[1::2]
    return pool[index % len(pool)]


def question(word):
    return {"role": "user", "content": f"What is the code of the word {word}? Use the lookup tool."}


def send(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()  # the job waits for each reply: never leave one buffered


episodes = {}  # episode_id -> the word it asks about

for line in sys.stdin:
    req = json.loads(line)
    op, eid = req["op"], req["episode_id"]
    if op == "reset":  # a new episode: the opening messages and the tools
        word = word_of(req["split"], req["index"])
        episodes[eid] = word
        send({"episode_id": eid, "messages": [question(word)], "tools": TOOLS})
    elif op == "step":  # the model's turn: tool calls get results, an answer ends the episode
        word = episodes[eid]
        calls = req["message"].get("tool_calls") or []
        if calls:
            results = []
            for call in calls:
                args = call["function"].get("arguments") or {}
                asked = args.get("word", "") if isinstance(args, dict) else ""
                results.append({"role": "tool", "tool_call_id": call.get("id"),
                                "content": code(asked) if asked in WORDS else "unknown word"})
            send({"episode_id": eid, "messages": results})
        else:
            right = code(word) in (req["message"].get("content") or "")
            del episodes[eid]
            send({"episode_id": eid, "done": True, "reward": 1.0 if right else 0.0,
                  "correct": right})
    elif op == "close":  # the job ended the episode at a cap: forget it, no reply
        episodes.pop(eid, None)
    elif op == "demonstration":  # a worked episode for the SFT warm-up (or null: none)
        word = word_of(req["split"], req["index"])
        call = {"id": "call_0", "type": "function",
                "function": {"name": "lookup", "arguments": {"word": word}}}
        send({"episode_id": eid, "demonstration": {
            "messages": [question(word),
                         {"role": "assistant", "content": "", "tool_calls": [call]},
                         {"role": "tool", "tool_call_id": "call_0", "content": code(word)},
                         {"role": "assistant", "content": f"The code is {code(word)}."}],
            "tools": TOOLS}})
