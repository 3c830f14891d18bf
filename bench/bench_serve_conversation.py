"""A conversation's second turn against a running `zaya serve`, as a client times it (wall time
of each HTTP request, one at a time). Six conversations with token-id prompts: turn 1 is a
500-token prompt and a 300-token greedy reply; turn 2 sends back the prompt, the reply and 20 new
tokens (8 tokens generated). Every other conversation alters the reply's first token before
sending it back, so that only the prompt matches what the server kept: that is what a turn cost
before the server kept finished completions (it prefills the reply and the new tokens). After
each, an unrelated prompt of the same length times a full prefill.

    zaya init --preset zaya-60m --out M --seed 3 && zaya serve --model M --port 8732 &
    python3 bench/bench_serve_conversation.py http://localhost:8732
"""
import json
import random
import sys
import time
import urllib.request

URL = sys.argv[1] if len(sys.argv) > 1 else "http://localhost:8732"
VOCAB = 8000  # ids below the 60M preset's vocabulary of 8192


def post(body):
    start = time.perf_counter()
    request = urllib.request.Request(URL + "/v1/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    reply = json.load(urllib.request.urlopen(request))
    return reply, time.perf_counter() - start


def main():
    rng = random.Random(7)
    for k in range(6):
        prompt = [rng.randrange(10, VOCAB) for _ in range(500)]
        out, t1 = post({"prompt": prompt, "max_tokens": 300, "temperature": 0})
        reply = out["choices"][0]["token_ids"]
        new = [rng.randrange(10, VOCAB) for _ in range(20)]
        if k % 2 == 0:
            turn2, kind = prompt + reply + new, "reply kept"
        else:
            turn2, kind = prompt + [reply[0] ^ 1] + reply[1:] + new, "reply altered (prompt only)"
        _, t2 = post({"prompt": turn2, "max_tokens": 8, "temperature": 0})
        unrelated = [rng.randrange(10, VOCAB) for _ in range(len(turn2))]
        _, t3 = post({"prompt": unrelated, "max_tokens": 8, "temperature": 0})
        print(f"turn 2, {kind}: reply {len(reply)} tokens; turn 1 {t1:.2f} s, turn 2 ({len(turn2)} tokens) "
              f"{t2:.3f} s, an unrelated prompt as long {t3:.2f} s", flush=True)


if __name__ == "__main__":
    main()
