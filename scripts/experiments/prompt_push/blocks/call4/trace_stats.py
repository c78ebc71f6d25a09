"""What trace.py's chrome traces (not kept: 40 MB) say, per block count and rank, per prompt: the GPU's busiest
kernels, the compute stream's idle gaps, the wait for the last block's copy and the barrier, and how far the host
ran ahead of the GPU (a kernel's start minus the end of the call that launched it).

    python trace_stats.py TRACE_DIR > trace_stats.txt
"""
import collections
import json
import statistics as st
import sys

PROMPTS, COMPUTE, COPY = 6, 7, 21  # profiled prompts; the streams in these traces

for blocks in (2, 4):
    for rank in (0, 1):
        ev = [e for e in json.load(open(f"{sys.argv[1]}/trace_blocks{blocks}_rank{rank}.json"))["traceEvents"]
              if e.get("ph") == "X"]
        gpu = sorted((e for e in ev if e.get("cat") in ("kernel", "gpu_memcpy")), key=lambda e: e["ts"])
        comp = [e for e in gpu if e["args"].get("stream") == COMPUTE]
        by, n = collections.defaultdict(float), collections.Counter()
        for e in gpu:
            by[e["name"][:48]] += e["dur"]
            n[e["name"][:48]] += 1
        idle = sum(g for g in (b["ts"] - a["ts"] - a["dur"] for a, b in zip(comp, comp[1:])) if 0 < g < 5000)
        before = [b["ts"] - a["ts"] - a["dur"] for a, b in zip(comp, comp[1:])
                  if "barrier" in b["name"] and "linear" in a["name"]]
        calls = {e["args"].get("correlation"): e for e in ev if e.get("cat") in ("cuda_runtime", "cuda_driver")}
        lags = [e["ts"] - calls[c]["ts"] - calls[c]["dur"] for e in comp
                if (c := e["args"].get("correlation")) in calls]
        print(f"blocks {blocks}, rank {rank}: compute stream idle {idle / PROMPTS / 1e3:.2f} ms a prompt; "
              f"last copy waited for {st.median(before):.1f} us (median); host ahead by {st.median(lags):.0f} us "
              f"(median), under 20 us for {sum(x < 20 for x in lags)} of {len(lags)} kernels")
        for k, v in sorted(by.items(), key=lambda kv: -kv[1])[:7]:
            print(f"    {v / PROMPTS / 1e3:8.3f} ms  {n[k] // PROMPTS:4} a prompt  {k}")
