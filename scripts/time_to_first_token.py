"""Shell to first token, as a user feels it: starts a command (a new process, Python start-up included) and
times the first byte it writes to stdout (`generate` streams the generated text there and nothing else), and its
exit; median of --reps runs after --warm unreported ones (page cache and Triton's cache warm). The timer of
docs/benchmarks.md's start-up table (`bash scripts/reproduce.sh startup`); any command's start-up can be timed with it.

    python scripts/time_to_first_token.py --reps 3 --out OUT.json -- llamafast generate --model M "Hi" --max-new-tokens 32
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time


def once(cmd: list[str]) -> dict:
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    first = proc.stdout.read(1)
    t_first = time.perf_counter()
    rest, err = proc.communicate()
    t_end = time.perf_counter()
    if proc.returncode != 0 or not first:
        sys.exit(f"{shlex.join(cmd)} failed ({proc.returncode}): {err.decode()[-500:]}")
    return {"first_byte_s": t_first - t0, "exit_s": t_end - t0}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--warm", type=int, default=1)
    parser.add_argument("--out")
    parser.add_argument("cmd", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if cmd[0] == "llamafast":  # the same interpreter, whatever PATH says
        cmd = [sys.executable, "-m", "llamafast", *cmd[1:]]
    for _ in range(args.warm):
        once(cmd)
    runs = [once(cmd) for _ in range(args.reps)]
    median = sorted(runs, key=lambda r: r["first_byte_s"])[len(runs) // 2]
    report = {"command": shlex.join(args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd), "runs": runs,
              "median_first_byte_s": median["first_byte_s"], "median_exit_s": median["exit_s"],
              "host": os.uname().nodename, "env": {k: v for k, v in os.environ.items() if k.startswith("LLAMAFAST_")}}
    env = " ".join(f"{k}={v}" for k, v in report["env"].items())
    print(f"{report['median_first_byte_s']:.3f} s to the first byte, {report['median_exit_s']:.3f} s to exit "
          f"(median of {args.reps}): {env + ' ' if env else ''}{report['command']}")
    if args.out:  # a .jsonl file gets one line appended
        with open(args.out, "a" if args.out.endswith(".jsonl") else "w") as f:
            f.write(json.dumps(report) + "\n" if args.out.endswith(".jsonl") else json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
