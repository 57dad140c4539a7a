#!/usr/bin/env python3
"""Reads a folder of TensorBoard event files with the tensorboard package's own
EventAccumulator and prints what it holds as one JSON object:

  {"scalars": {tag: [[step, value], ...]}, "texts": {tag: [[step, text], ...]}}

Values are the float32 TensorBoard stored, as Python floats. Used by the C++
tests of tandem's TensorBoardWriter and of `--log-with tensorboard`.
  tensorboard_dump.py DIR
"""
import json
import sys

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.util import tensor_util


def main(path):
    acc = EventAccumulator(path, size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    tags = acc.Tags()
    out = {"scalars": {}, "texts": {}}
    for tag in tags.get("scalars", []):
        out["scalars"][tag] = [[e.step, e.value] for e in acc.Scalars(tag)]
    for tag in tags.get("tensors", []):
        texts = []
        for e in acc.Tensors(tag):
            value = tensor_util.make_ndarray(e.tensor_proto)
            texts.append([e.step, value.item().decode("utf-8")])
        out["texts"][tag] = texts
    print(json.dumps(out))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print(__doc__)
        sys.exit(2)
    main(sys.argv[1])
