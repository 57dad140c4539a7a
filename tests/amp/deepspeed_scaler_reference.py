"""DeepSpeed's DynamicLossScaler fed scripted overflow sequences: the
reference for tandem's DeepSpeedLossScaler (test_loss_scaler.cpp).

  deepspeed_scaler_reference.py CASES OUT

Reads lines "POWER WINDOW HYSTERESIS CONSECUTIVE MIN_SCALE SEQUENCE" from
CASES (SEQUENCE: 1 for an overflowing step, 0 for a clean one) and writes a
line to OUT for each: the scales after every update, space-separated
(DeepSpeed logs to stdout, so the results go to a file).
"""
import sys

import deepspeed.runtime.fp16.loss_scaler as loss_scaler


class _Rank0:
    """update_scale asks deepspeed.comm for the rank to log overflows."""

    @staticmethod
    def get_rank():
        return 0


loss_scaler.dist = _Rank0

cases_path, out_path = sys.argv[1], sys.argv[2]
with open(cases_path) as cases:
    lines = cases.read().splitlines()
results = []
for line in lines:
    power, window, hysteresis, consecutive, min_scale, sequence = line.split()
    scaler = loss_scaler.DynamicLossScaler(
        init_scale=2.0 ** int(power), scale_window=int(window), min_scale=float(min_scale),
        delayed_shift=int(hysteresis), consecutive_hysteresis=consecutive == "1",
        raise_error_at_min_scale=False)
    scales = []
    for step in sequence:
        scaler.update_scale(step == "1")
        scales.append(repr(float(scaler.cur_scale)))
    results.append(" ".join(scales))
with open(out_path, "w") as out:
    out.write("\n".join(results) + "\n")
