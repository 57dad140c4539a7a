#!/usr/bin/env python3
"""Reads a folder of TensorBoard event files with the tensorboard package's own
EventAccumulator and prints what it holds as one JSON object:

  {"scalars": {tag: [[step, value], ...]}, "texts": {tag: [[step, text], ...]},
   "hparams": {...}}

Values are the float32 TensorBoard stored, as Python floats. "hparams" is {}
without hparams plugin data, else (parsed by tensorboard.plugins.hparams.metadata):

  {"session_start_info": {name: {"number_value" | "string_value" | "bool_value": v}},
   "experiment": null | {"hparam_infos": {name: "DATA_TYPE_..."}, "metric_infos": [tag]},
   "session_end_info": null | "STATUS_...",
   "columns": {"hparams": {name: "DATA_TYPE_..."}, "metrics": [tag]}}

"columns" is the table the HParams tab shows, as its backend computes it.
Used by the C++ tests of tandem's TensorBoardWriter and of `--log-with tensorboard`.
  tensorboard_dump.py DIR
"""
import json
import sys

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.hparams import api_pb2, metadata
from tensorboard.util import tensor_util


def hparam_columns(path):
    """The experiment TensorBoard's HParams backend builds for the folder."""
    from tensorboard import context
    from tensorboard.backend.event_processing import data_provider
    from tensorboard.backend.event_processing import plugin_event_multiplexer
    from tensorboard.plugins import base_plugin
    from tensorboard.plugins.hparams import backend_context

    mux = plugin_event_multiplexer.EventMultiplexer()
    mux.AddRunsFromDirectory(path)
    mux.Reload()
    provider = data_provider.MultiplexerDataProvider(mux, path)
    backend = backend_context.Context(
        base_plugin.TBContext(logdir=path, multiplexer=mux, data_provider=provider))
    ctx = context.RequestContext()
    content = backend.hparams_metadata(ctx, "")
    exp = backend.experiment_from_metadata(ctx, "", True, content, [])
    return {"hparams": {h.name: api_pb2.DataType.Name(h.type) for h in exp.hparam_infos},
            "metrics": [m.name.tag for m in exp.metric_infos]}


def hparams(acc, path):
    try:
        content = acc.PluginTagToContent(metadata.PLUGIN_NAME)
    except KeyError:
        return {}
    out = {"session_start_info": None, "experiment": None, "session_end_info": None}
    if metadata.SESSION_START_INFO_TAG in content:
        info = metadata.parse_session_start_info_plugin_data(
            content[metadata.SESSION_START_INFO_TAG])
        values = {}
        for name, value in info.hparams.items():
            kind = value.WhichOneof("kind")
            values[name] = {kind: getattr(value, kind)}
        out["session_start_info"] = values
    if metadata.EXPERIMENT_TAG in content:
        exp = metadata.parse_experiment_plugin_data(content[metadata.EXPERIMENT_TAG])
        out["experiment"] = {
            "hparam_infos": {h.name: api_pb2.DataType.Name(h.type) for h in exp.hparam_infos},
            "metric_infos": [m.name.tag for m in exp.metric_infos]}
    if metadata.SESSION_END_INFO_TAG in content:
        end = metadata.parse_session_end_info_plugin_data(content[metadata.SESSION_END_INFO_TAG])
        out["session_end_info"] = api_pb2.Status.Name(end.status)
    out["columns"] = hparam_columns(path)
    return out


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
    out["hparams"] = hparams(acc, path)
    print(json.dumps(out))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print(__doc__)
        sys.exit(2)
    main(sys.argv[1])
