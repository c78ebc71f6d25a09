"""The launches a step_launches.py walk chose, replayed from its log, also where the walk was cut before it printed
them: each timed launch is kept where the step beats the best so far by more than step_launches.NOISE, as the walk
keeps it. Prints the entries in the form the kernels' per-GPU tables take (pdl=True for every FP8 GEMV of a walk
under --pdl, chosen or not, as the chosen tables were timed), the descent's first and last best, and the confirming
rounds' medians where the log has them.

    python scripts/experiments/h100_walk/replay.py WALK_LOG...
"""
import re
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from step_launches import NOISE  # noqa: E402

# table (N, K, bytes per weight or block format): block_n x block_k, warps[, a block GEMV's way]   ms
TIMED = re.compile(r"^  (\w+) \((\d+), (\d+), (\d+|'\w+')\): (\d+)x(\d+), (\d+) warps(?:, ([\w ]+?))?"
                   r"\s+([\d.]+) ms/token$")
WAYS = {"own int8": ", own_int8=True", "float": ", float_blocks=True", "int8 pass": "", None: ""}
NAMED = re.compile(r"^  (committed, no PDL|committed|chosen)\s+([\d.]+) ms/token$")
MODEL = re.compile(r"^(\S+) (bf16|fp8_\w+|q\d\w*)\b")  # each walked model's log starts with its shape and weights


def sections(lines: list[str]) -> list[tuple[str, list[str]]]:
    """(header, lines) per model walked in one log."""
    out = []
    for line in lines:
        if MODEL.match(line):
            out.append((line, []))
        elif out:
            out[-1][1].append(line)
    return out


def replay(lines: list[str]) -> dict:
    """{'chosen': {(table, key): (block_n, block_k, warps, way)}, 'keys': [(table, key)], 'pdl', 'no_pdl', 'start',
    'best', 'rounds': {'committed': [...], 'chosen': [...]}} from one walk's log."""
    out = {"chosen": {}, "keys": [], "pdl": False, "no_pdl": None, "start": None, "best": None,
           "rounds": {"committed": [], "chosen": []}}
    confirming = False
    for line in lines:
        if line.startswith("chosen"):
            confirming, out["pdl"] = True, out["pdl"] or "under PDL" in line
            continue
        named, timed = NAMED.match(line), TIMED.match(line)
        if named and named[1] == "committed, no PDL":
            out["no_pdl"], out["pdl"] = float(named[2]), True
        elif named and confirming:
            out["rounds"][named[1]].append(float(named[2]))
        elif named and out["start"] is None:
            out["start"] = out["best"] = float(named[2])
        elif timed and out["best"] is not None:
            table, ms = timed[1], float(timed[9])
            key = (int(timed[2]), int(timed[3]), int(timed[4]) if timed[4].isdigit() else timed[4].strip("'"))
            if (table, key) not in out["keys"]:
                out["keys"].append((table, key))
            if ms < out["best"] * (1 - NOISE):
                out["best"], out["chosen"][(table, key)] = ms, (int(timed[5]), int(timed[6]), int(timed[7]), timed[8])
    return out


def entries(walk: dict) -> list[str]:
    """One line per GEMV for its table: the chosen launch, or 'committed' where the walk kept it (under --pdl
    still an entry, with pdl=True)."""
    lines = []
    for table, key in walk["keys"]:
        launch = walk["chosen"].get((table, key))
        pdl = ", pdl=True" if walk["pdl"] and key[2] == 1 else ""
        text = (f"GemvConfig(block_n={launch[0]}, block_k={launch[1]}, num_warps={launch[2]}{WAYS[launch[3]]}{pdl})"
                if launch
                else f"the committed launch{pdl and ' with pdl=True'}")
        lines.append(f"{table:18} {key}: {text}")
    return lines


def main() -> None:
    for path in sys.argv[1:]:
        for header, lines in sections(Path(path).read_text().splitlines()):
            walk = replay(lines)
            print(f"# {path}: {header}")
            print(f"committed {walk['start']}, no PDL {walk['no_pdl']}, best in the walk {walk['best']}")
            print("\n".join(entries(walk)))
            for name, times in walk["rounds"].items():
                if times:
                    print(f"{name}: median {statistics.median(times):.4f} of {times}")


if __name__ == "__main__":
    main()
