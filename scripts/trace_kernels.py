"""Where a profiled step's device time goes: the GPU kernels of a Chrome
trace (tandem's Accelerator::profile, Kineto), summed by name.

    python scripts/trace_kernels.py TRACE.json [--steps N] [--top 30]

Prints the device time in all, per step (--steps: how many steps the trace
holds), and the top kernels by total time with their count and share.
"""
import argparse
import collections
import json


def main():
    p = argparse.ArgumentParser()
    p.add_argument("trace")
    p.add_argument("--steps", type=int, default=1)
    p.add_argument("--top", type=int, default=30)
    a = p.parse_args()
    events = json.load(open(a.trace)).get("traceEvents", [])
    total = collections.Counter()
    count = collections.Counter()
    for e in events:
        if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"):
            total[e["name"]] += e.get("dur", 0)
            count[e["name"]] += 1
    device_us = sum(total.values())
    print(f"device time: {device_us / 1000:.2f} ms in all, {device_us / 1000 / a.steps:.2f} ms "
          f"per step over {a.steps} steps; {sum(count.values())} kernels and copies")
    print(f"{'ms/step':>9} {'share':>6} {'count':>6}  name")
    for name, us in total.most_common(a.top):
        print(f"{us / 1000 / a.steps:9.3f} {us / device_us:6.1%} {count[name]:6d}  {name[:110]}")


if __name__ == "__main__":
    main()
