"""Runs in the jail: scores one answer with a reasoning_gym checker (the `reasoning_gym` reward).

Reads {name, answer, entry, nonce} from stdin and prints the score after the nonce, so an answer
that prints a number and exits cannot pose as the result. The host sends this file's text.
"""

import json
import sys


def main() -> None:
    job = json.loads(sys.stdin.read())
    nonce = job.pop("nonce")
    from reasoning_gym import get_score_answer_fn

    value = float(get_score_answer_fn(job["name"])(job["answer"], job["entry"]))
    sys.stdout.write("\n" + nonce + " " + json.dumps(value) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
