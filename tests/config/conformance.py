#!/usr/bin/env python3
"""Config conformance: `tandem config check` against DeepSpeed and Accelerate.

Every DeepSpeed JSON of the corpus (tests/config/data/ds_*.json) is read by
DeepSpeed's own `DeepSpeedConfig` for world sizes 1, 2, 3, 4 and 8, and by
`tandem config check FILE --world-size N`. Both must accept the file and
resolve the same train batch size, micro-batch size, accumulation steps, ZeRO
stage, precision, offload devices and gradient clipping, or both must refuse
it.

Every Accelerate YAML (tests/config/data/accelerate_*.yaml) is read the way
`accelerate launch` reads it: `load_config_from_file`, the launcher's checks
(mixed precision, distributed type), for DEEPSPEED the worker's
`DeepSpeedPlugin` built from the environment the launcher would export, and
for FSDP the worker's `FullyShardedDataParallelPlugin` (and
`ParallelismConfig`) built from the environment the launcher's own code
exports. The fields both understand must agree, or both must refuse the
file.

A difference that tandem makes on purpose is listed in DELIBERATE below and in
docs/config.md ("Conformance with DeepSpeed and Accelerate"); each rule names
what both sides must say, so an unexpected reason is still a disagreement.

    .venv/bin/python tests/config/conformance.py build/bin/tandem [--data DIR] [--verbose]

Prints one line per case and a JSON summary last. Exit status: 0 when every
case agrees or differs as listed, 1 on any other disagreement, 77 when
deepspeed or accelerate cannot be imported (ctest's SKIP_RETURN_CODE).
"""

import argparse
import contextlib
import copy
import json
import logging
import os
import re
import subprocess
import sys
import tempfile
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peers  # noqa: E402 - next to this file

SKIP = 77
WORLD_SIZES = (1, 2, 3, 4, 8)
BATCH_KEYS = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")
# Compared for DeepSpeed JSON: the batch triple, ZeRO stage, precision,
# offload devices and clipping.
DS_FIELDS = BATCH_KEYS + ("zero_stage", "precision", "offload_optimizer", "offload_param",
                          "gradient_clipping", "steps_per_print")
# What an HF-Trainer-style program puts where a file says "auto": the
# per-device batch 4 and 2 accumulation steps (train = 4 * 2 * world).
TRAINER_MICRO_BATCH = 4
TRAINER_ACCUMULATION = 2


def import_peers():
    """The peers imported quietly; None, or why they could not be."""
    return peers.import_peers(['deepspeed.runtime.config', 'accelerate.commands.config.config_args', 'accelerate.utils'])


def one_line(text, limit=160):
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


# --------------------------------------------------------------------------
# DeepSpeed's side


class FixedWorld:
    """Stands in for deepspeed.comm inside DeepSpeedConfig: rank 0 of `size`.

    DeepSpeedConfig asks dist.get_rank() and dist.get_world_size(); without
    init_process_group both fail and it falls back to a world of 1. Only the
    config module's reference is replaced, and only while one config is read.
    """

    def __init__(self, size):
        self.size = size

    def get_rank(self, group=None):
        return 0

    def get_world_size(self, group=None):
        return self.size


def deepspeed_view(path_or_dict, world_size):
    """DeepSpeed's reading: ("accept", fields) or ("reject", message)."""
    import deepspeed.runtime.config as ds_config

    saved = ds_config.dist
    ds_config.dist = FixedWorld(world_size)
    try:
        with open(os.devnull, "w") as devnull, contextlib.redirect_stdout(devnull):
            config = ds_config.DeepSpeedConfig(path_or_dict)
    except Exception as error:  # pydantic ValidationError, AssertionError, TypeError, ...
        return "reject", f"{type(error).__name__}: {one_line(error, 400)}"
    finally:
        ds_config.dist = saved
    if config.world_size != world_size:
        raise RuntimeError(f"DeepSpeedConfig took world size {config.world_size}, not "
                           f"{world_size}: its module no longer asks `dist` for it; update "
                           f"FixedWorld")
    # deepspeed.initialize's engine refuses it before training
    # (DeepSpeedEngine._configure_basic_optimizer), after the config parsed.
    if "max_grad_norm" in (config.optimizer_params or {}):
        return "reject", "ValueError: 'max_grad_norm' is not supported as an optimizer parameter"
    zero = config.zero_config

    def device(offload):
        return "none" if offload is None else str(getattr(offload.device, "value", offload.device))

    precision = ("fp16" if config.float16_config.enabled else
                 "bf16" if config.bfloat16_config.enabled else "no")
    if config.torch_autocast_enabled:
        # The engine enters torch.autocast(dtype=...); no dtype is the device's
        # default, bf16 on this CPU-only box (the blocks' clash is tandem's).
        import torch
        dtype = config.torch_autocast_dtype or torch.get_autocast_dtype("cpu")
        precision = {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(dtype, precision)
    return "accept", {
        "train_batch_size": config.train_batch_size,
        "train_micro_batch_size_per_gpu": config.train_micro_batch_size_per_gpu,
        "gradient_accumulation_steps": config.gradient_accumulation_steps,
        "zero_stage": int(config.zero_optimization_stage),
        "precision": precision,
        "offload_optimizer": device(zero.offload_optimizer),
        "offload_param": device(zero.offload_param),
        "gradient_clipping": clipping_value(config.gradient_clipping),
        "steps_per_print": config.steps_per_print,
    }


def clipping_value(value):
    return value if value == "auto" else float(value)


# --------------------------------------------------------------------------
# tandem's side


def tandem_views(tandem, paths, world_size=None):
    """tandem config check over many files in one process: for each path,
    ("accept", resolved JSON) or ("reject", message)."""
    command = [tandem, "config", "check", *paths]
    if world_size is not None:
        command += ["--world-size", str(world_size)]
    # The environment must not steer the result (TANDEM_MIXED_PRECISION, ...).
    env = {k: v for k, v in os.environ.items() if not k.startswith("TANDEM_")}
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    if len(paths) == 1:  # one file: the resolved JSON, or the refusal on stderr
        if done.returncode == 0:
            return {paths[0]: ("accept", json.loads(done.stdout))}
        if done.returncode == 2:
            return {paths[0]: ("reject", one_line(done.stderr, 400))}
    elif done.returncode in (0, 2):  # several: one JSON line per file
        views = {}
        for line in done.stdout.splitlines():
            entry = json.loads(line)
            views[entry["file"]] = (("accept", entry["config"]) if entry["valid"] else
                                    ("reject", one_line(entry["error"], 400)))
        if sorted(views) == sorted(paths):
            return views
    raise RuntimeError(f"{' '.join(command)} exited {done.returncode}: {done.stderr}")


def tandem_ds_fields(resolved):
    zero = resolved["zero_optimization"]
    return {
        "train_batch_size": resolved["train_batch_size"],
        "train_micro_batch_size_per_gpu": resolved["train_micro_batch_size_per_gpu"],
        "gradient_accumulation_steps": resolved["gradient_accumulation_steps"],
        "zero_stage": zero["stage"],
        "precision": resolved["mixed_precision"],
        "offload_optimizer": zero["offload_optimizer"]["device"],
        "offload_param": zero["offload_param"]["device"],
        "gradient_clipping": ("auto" if "gradient_clipping" in resolved["auto"]
                              else float(resolved["gradient_clipping"])),
        "steps_per_print": resolved["steps_per_print"],
    }


# --------------------------------------------------------------------------
# Deliberate differences (docs/config.md, "Conformance with DeepSpeed and
# Accelerate"). A rule matches a case only when both sides say what it
# describes: (deepspeed-or-accelerate outcome, tandem outcome, the file).


def load_json_loosely(path):
    """The file as DeepSpeed reads it (hjson: comments allowed), or None."""
    try:
        import hjson
        with open(path) as f:
            return hjson.load(f)
    except Exception:
        return None


def has_auto_batch(document):
    return isinstance(document, dict) and any(document.get(k) == "auto" for k in BATCH_KEYS)


def rule_auto_batch(peer, tandem, document, **_):
    # HF's Trainer (and Accelerate's prepare) fill "auto" before DeepSpeed
    # sees the file; DeepSpeedConfig itself compares "auto" with numbers.
    return (peer[0] == "reject" and tandem[0] == "accept" and has_auto_batch(document)
            and "'>' not supported between instances of 'str' and 'int'" in peer[1])


def rule_batch_from_program(peer, tandem, document, **_):
    # No micro batch anywhere: DeepSpeed needs one in the file, tandem takes
    # it from the program (the first DataLoader passed to prepare()).
    return (peer[0] == "reject" and tandem[0] == "accept"
            and "Either train_batch_size or train_micro_batch_size_per_gpu needs to be provided"
            in peer[1] and tandem[1]["train_micro_batch_size_per_gpu"] is None)


def rule_unknown_top_level_key(peer, tandem, document, **_):
    # DeepSpeed reads its top level with dict.get and ignores other keys;
    # tandem refuses them with a did-you-mean, so a typo cannot pass.
    if not (peer[0] == "accept" and tandem[0] == "reject"):
        return False
    match = re.search(r": ([A-Za-z0-9_]+): unknown key", tandem[1])
    return bool(match) and isinstance(document, dict) and match.group(1) in document


def rule_unsupported_feature(peer, tandem, **_):
    # A setting tandem cannot honour (NVMe offload, Lamb, tensor parallelism,
    # ...) is refused rather than dropped.
    return (peer[0] == "accept" and tandem[0] == "reject"
            and re.search(r"not supported by tandem|is not available in tandem", tandem[1]))


def rule_params_checked_at_load(peer, tandem, **_):
    # DeepSpeed hands optimizer and scheduler params to the constructor at
    # deepspeed.initialize (a misspelt one is a TypeError then); tandem
    # checks the names when it reads the file.
    return (peer[0] == "accept" and tandem[0] == "reject"
            and re.search(r": (optimizer|scheduler)\.params\.\w+: unknown key", tandem[1]))


# Keys that `accelerate config` of earlier releases wrote and Accelerate
# 1.x's loader no longer knows (IPEX, MPS and tensor-parallel settings).
ACCELERATE_LEGACY_KEYS = {"ipex_config", "use_mps_device", "tp_config"}


def rule_accelerate_legacy_key(peer, tandem, **_):
    # tandem still loads a config written by an older Accelerate; those keys
    # mean nothing to it (a tp_config size above 1 is still refused).
    match = re.search(r"had unknown keys \((\[[^]]*\])\)", peer[1]) if peer[0] == "reject" else None
    if not (match and tandem[0] == "accept"):
        return False
    keys = set(re.findall(r"'([^']+)'", match.group(1)))
    return bool(keys) and keys <= ACCELERATE_LEGACY_KEYS


def rule_quoted_value(peer, tandem, **_):
    # pydantic turns "2" into 2 and "true" into True inside DeepSpeed's
    # blocks; tandem refuses a number or boolean in quotes everywhere.
    return peer[0] == "accept" and tandem[0] == "reject" and "write it without quotes" in tandem[1]


# Values DeepSpeed's reader lets through that cannot work or mean nothing:
# sizes of 0, hysteresis 0 (the scale never drops), steps_per_print 0 (a
# modulo by zero in the engine), negative clipping, fractional or boolean
# batch sizes.
STRICTER_KEYS = {
    "train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
    "steps_per_print", "gradient_clipping", "fp16.hysteresis", "fp16.loss_scale_window",
    "fp16.min_loss_scale", "zero_optimization.allgather_bucket_size",
    "zero_optimization.sub_group_size", "zero_optimization.stage3_max_live_parameters",
    "zero_optimization.max_live_parameters",
}


def rule_stricter_value(peer, tandem, **_):
    if not (peer[0] == "accept" and tandem[0] == "reject"):
        return False
    match = re.search(r": ([\w.]+): expected (a positive integer|an integer -?\d+\.\.\d+|"
                      r"a number >= 0|a number > 0), got (-?[\d.eE+-]+|true|false);", tandem[1])
    return bool(match) and match.group(1) in STRICTER_KEYS


def rule_auto_only_where_filled(peer, tandem, **_):
    # DeepSpeed's blocks drop "auto" anywhere and keep the default; tandem
    # takes "auto" where HF's Trainer or Accelerate fill it in (docs/config.md,
    # "auto") and refuses it elsewhere.
    return peer[0] == "accept" and tandem[0] == "reject" and 'got "auto"' in tandem[1]


def rule_accelerate_ds_file_with_section_keys(peer, tandem, **_):
    # Accelerate refuses every deepspeed_config key (and mixed_precision)
    # next to a deepspeed_config_file; tandem refuses only those that
    # disagree with the file.
    return (peer[0] == "reject" and tandem[0] == "accept"
            and "When using `deepspeed_config_file`, the following accelerate config variables "
                "will be ignored" in peer[1])


def rule_fsdp1_reshard_after_forward(peer, tandem, document, differences, **_):
    # `accelerate config` writes FSDP1's sharding strategy as
    # fsdp_reshard_after_forward (the plugin's documented name for it), but
    # Accelerate 1.15's launcher also exports FSDP_SHARDING_STRATEGY, its
    # default FULL_SHARD, which the plugin prefers: the key is dropped.
    # tandem shards as the key says.
    return (peer[0] == "accept" and tandem[0] == "accept" and isinstance(document, dict)
            and document.get("fsdp_version", 1) == 1
            and "fsdp_reshard_after_forward" in document
            and "fsdp_sharding_strategy" not in document
            and peer[1].get("zero_stage") == 3 and peer[1].get("zero_hpz_partition_size") == 1
            and differences and set(differences) <= {"zero_stage", "zero_hpz_partition_size"})


def rule_fsdp_offload_without_sharding(peer, tandem, differences, **_):
    # NO_SHARD with fsdp_offload_params: FSDP keeps the parameters on the
    # CPU; tandem trains NO_SHARD as DDP, which offloads nothing (it warns).
    return (peer[0] == "accept" and tandem[0] == "accept" and differences == ["offload"]
            and peer[1]["zero_stage"] == 0
            and peer[1]["offload"] and not tandem[1]["offload"])


DELIBERATE = {
    "auto-batch": rule_auto_batch,
    "batch-from-program": rule_batch_from_program,
    "unknown-top-level-key": rule_unknown_top_level_key,
    "unsupported-feature": rule_unsupported_feature,
    "params-checked-at-load": rule_params_checked_at_load,
    "accelerate-legacy-key": rule_accelerate_legacy_key,
    "quoted-value": rule_quoted_value,
    "stricter-value": rule_stricter_value,
    "auto-only-where-filled": rule_auto_only_where_filled,
    "accelerate-ds-file-with-section-keys": rule_accelerate_ds_file_with_section_keys,
    "fsdp1-reshard-after-forward": rule_fsdp1_reshard_after_forward,
    "fsdp-offload-without-sharding": rule_fsdp_offload_without_sharding,
}


def classify(peer, tandem, differences, document=None):
    """'agree', 'both-reject', 'deliberate:<rule>' or 'DISAGREE'."""
    if peer[0] == "reject" and tandem[0] == "reject":
        return "both-reject"
    if peer[0] == "accept" and tandem[0] == "accept" and not differences:
        return "agree"
    for name, rule in DELIBERATE.items():
        if rule(peer=peer, tandem=tandem, document=document, differences=differences):
            return "deliberate:" + name
    return "DISAGREE"


def compare(peer, tandem, fields):
    if peer[0] != "accept" or tandem[0] != "accept":
        return []
    return [k for k in fields if peer[1][k] != tandem[1][k]]


# --------------------------------------------------------------------------
# DeepSpeed JSON cases


def filled_like_trainer(document, world_size):
    """The document with its "auto" batch keys filled as HF's Trainer does."""
    filled = copy.deepcopy(document)
    micro = filled.get("train_micro_batch_size_per_gpu")
    accumulation = filled.get("gradient_accumulation_steps")
    if micro in (None, "auto"):
        micro = TRAINER_MICRO_BATCH
    if accumulation in (None, "auto"):
        accumulation = TRAINER_ACCUMULATION
    filled["train_micro_batch_size_per_gpu"] = micro
    filled["gradient_accumulation_steps"] = accumulation
    if filled.get("train_batch_size") == "auto":
        filled["train_batch_size"] = micro * accumulation * world_size
    if filled.get("gradient_clipping") == "auto":
        filled["gradient_clipping"] = 1.0  # TrainingArguments.max_grad_norm
    return filled


def deepspeed_cases(tandem, files, scratch):
    # Each file at each world size, and where it says "auto" for the batch,
    # the same file once the program has filled its "auto"s: the rest of it
    # must then read the same on both sides.
    checks = []  # (case name, path, document, world)
    for path in files:
        document = load_json_loosely(path)
        for world in WORLD_SIZES:
            checks.append((f"{os.path.basename(path)} --world-size {world}", path, document,
                           world))
            if has_auto_batch(document):
                filled = filled_like_trainer(document, world)
                filled_path = os.path.join(
                    scratch, f"{os.path.basename(path)[:-5]}.filled{world}.json")
                with open(filled_path, "w") as f:
                    json.dump(filled, f, indent=2)
                checks.append((f"{os.path.basename(path)} (auto filled) --world-size {world}",
                               filled_path, filled, world))
    mine_by_world = {world: tandem_views(tandem, [c[1] for c in checks if c[3] == world], world)
                     for world in WORLD_SIZES}
    for case, path, document, world in checks:
        peer = deepspeed_view(path, world)
        mine = mine_by_world[world][path]
        if mine[0] == "accept":
            mine = ("accept", tandem_ds_fields(mine[1]))
        differences = compare(peer, mine, DS_FIELDS)
        yield {"case": case, "verdict": classify(peer, mine, differences, document),
               "deepspeed": peer, "tandem": mine, "differences": differences}


# --------------------------------------------------------------------------
# Accelerate YAML cases

ACCELERATE_FIELDS = ("distributed_type", "num_processes", "num_machines", "machine_rank",
                     "main_process_ip", "main_process_port", "gpu_ids", "use_cpu",
                     "rdzv_backend", "precision")
ACCELERATE_DS_FIELDS = ("zero_stage", "offload_optimizer", "offload_param",
                        "gradient_accumulation_steps", "gradient_clipping")
# Under FSDP: the ZeRO stage and HSDP partition its sharding maps to, whether
# anything is offloaded, and activation checkpointing.
ACCELERATE_FSDP_FIELDS = ("zero_stage", "zero_hpz_partition_size", "offload",
                          "activation_checkpointing")


@contextlib.contextmanager
def environment(values, cwd):
    """os.environ with `values` set (ACCELERATE_* cleared first), in `cwd`."""
    saved_env = dict(os.environ)
    saved_cwd = os.getcwd()
    for key in list(os.environ):
        if key.startswith("ACCELERATE_"):
            del os.environ[key]
    os.environ.update(values)
    os.chdir(cwd)
    try:
        yield
    finally:
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)


def deepspeed_worker_env(config):
    """What `accelerate launch` exports to a DeepSpeed worker for this config
    (accelerate.utils.launch.prepare_deepspeed_cmd_env)."""
    section = dict(config.deepspeed_config or {})
    env = {"ACCELERATE_USE_DEEPSPEED": "true"}
    fields = list(section.keys())
    if config.mixed_precision is not None:
        fields.append("mixed_precision")
    env["ACCELERATE_CONFIG_DS_FIELDS"] = ",".join(fields).lower()
    names = {
        "zero_stage": "ACCELERATE_DEEPSPEED_ZERO_STAGE",
        "gradient_accumulation_steps": "ACCELERATE_GRADIENT_ACCUMULATION_STEPS",
        "gradient_clipping": "ACCELERATE_GRADIENT_CLIPPING",
        "offload_optimizer_device": "ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE",
        "offload_param_device": "ACCELERATE_DEEPSPEED_OFFLOAD_PARAM_DEVICE",
        "zero3_init_flag": "ACCELERATE_DEEPSPEED_ZERO3_INIT",
        "zero3_save_16bit_model": "ACCELERATE_DEEPSPEED_ZERO3_SAVE_16BIT_MODEL",
        "deepspeed_config_file": "ACCELERATE_DEEPSPEED_CONFIG_FILE",
    }
    for key, name in names.items():
        if section.get(key) is not None:
            env[name] = str(section[key]).lower() if key != "deepspeed_config_file" else str(
                section[key])
    return env


def fsdp_worker_env(path):
    """What `accelerate launch` exports to an FSDP worker for this config: its
    own argument parsing, config merge and multi-GPU environment."""
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils.launch import prepare_multi_gpu_env

    args = launch_command_parser().parse_args(["--config_file", path, "train.py"])
    with open(os.devnull, "w") as devnull, contextlib.redirect_stdout(devnull):
        args, _, _ = _validate_launch_command(args)
        env = prepare_multi_gpu_env(args)
    return {k: v for k, v in env.items()
            if k.startswith(("FSDP_", "ACCELERATE_USE_", "PARALLELISM_CONFIG_"))}


@contextlib.contextmanager
def cuda_device_stand_in():
    """sync_module_states makes the plugin ask for the current device, which a
    CPU-only peer does not have; device 0 stands in while it is built."""
    import torch
    import accelerate.utils.dataclasses as plugin_module
    saved = (plugin_module.is_cuda_available, torch.cuda.current_device)
    plugin_module.is_cuda_available = lambda: True
    torch.cuda.current_device = lambda: 0
    try:
        yield
    finally:
        plugin_module.is_cuda_available, torch.cuda.current_device = saved


def fsdp_fields(path, num_processes):
    """The worker's FullyShardedDataParallelPlugin (and ParallelismConfig),
    built from the launcher's environment, as tandem's ZeRO settings."""
    from types import SimpleNamespace
    from accelerate.parallelism_config import ParallelismConfig
    from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin
    from torch.distributed.fsdp import CPUOffloadPolicy, ShardingStrategy

    env = fsdp_worker_env(path)
    with environment(env, os.path.dirname(path) or "."), cuda_device_stand_in():
        plugin = FullyShardedDataParallelPlugin()
        mesh = ParallelismConfig()
        mesh._validate_accelerator(SimpleNamespace(
            multi_device=False, is_fsdp2=plugin.fsdp_version == 2, num_processes=num_processes,
            distributed_type=DistributedType.FSDP, is_main_process=True))
    if plugin.fsdp_version == 1:
        # The Accelerator hands FSDP `sharding_strategy or reshard_after_forward`.
        strategy = plugin.sharding_strategy or plugin.reshard_after_forward
        stages = {ShardingStrategy.FULL_SHARD: 3, ShardingStrategy.SHARD_GRAD_OP: 2,
                  ShardingStrategy.NO_SHARD: 0, ShardingStrategy.HYBRID_SHARD: 3,
                  ShardingStrategy._HYBRID_SHARD_ZERO2: 2}
        hybrid = strategy in (ShardingStrategy.HYBRID_SHARD, ShardingStrategy._HYBRID_SHARD_ZERO2)
        return {"zero_stage": stages[strategy],
                "zero_hpz_partition_size": "ranks_per_host" if hybrid else 1,
                "offload": bool(plugin.cpu_offload.offload_params),
                "activation_checkpointing": bool(plugin.activation_checkpointing)}
    return {"zero_stage": 3 if plugin.reshard_after_forward else 2,
            "zero_hpz_partition_size": mesh.dp_shard_size if mesh.dp_replicate_size > 1 else 1,
            "offload": isinstance(plugin.cpu_offload, CPUOffloadPolicy),
            "activation_checkpointing": bool(plugin.activation_checkpointing)}


def accelerate_view(path):
    """Accelerate's reading: ("accept", fields) or ("reject", message)."""
    from accelerate.commands.config.config_args import load_config_from_file
    from accelerate.utils import DeepSpeedPlugin, DistributedType, PrecisionType

    try:
        config = load_config_from_file(path)
        # accelerate launch: PrecisionType(args.mixed_precision.lower()).
        precision = config.mixed_precision if config.mixed_precision is not None else "no"
        precision = PrecisionType(precision.lower()).value
        # A bare NO loads as False; launch_command matches it against no
        # type and takes the simple launcher, as for NO.
        kind = ("NO" if config.distributed_type is False
                else DistributedType(config.distributed_type).value)
        # The launcher runs one process for NO whatever num_processes says;
        # -1 is ClusterConfig's "not set" (the launch must pass a count).
        processes = 1 if kind == "NO" else (None if config.num_processes == -1
                                             else config.num_processes)
        fields = {
            "distributed_type": kind,
            "num_processes": processes,
            "num_machines": config.num_machines,
            "machine_rank": config.machine_rank,
            "main_process_ip": config.main_process_ip,
            "main_process_port": config.main_process_port,
            "gpu_ids": "all" if config.gpu_ids is None else str(config.gpu_ids),
            "use_cpu": bool(config.use_cpu),
            "rdzv_backend": config.rdzv_backend or "static",
            "precision": precision,
        }
        if kind == "DEEPSPEED":
            # The worker: DeepSpeedPlugin from the launcher's environment,
            # then AcceleratorState's set_mixed_precision.
            with environment(deepspeed_worker_env(config), os.path.dirname(path) or "."):
                plugin = DeepSpeedPlugin()
                plugin.set_mixed_precision(precision)
            ds = plugin.deepspeed_config
            zero = ds.get("zero_optimization", {})
            fp16 = ds.get("fp16", {}).get("enabled") is True
            bf16 = ds.get("bf16", {}).get("enabled") is True
            fields["precision"] = "fp16" if fp16 else "bf16" if bf16 else "no"
            # DeepSpeed trains with what the JSON says: stage 0 when absent.
            fields["zero_stage"] = int(zero.get("stage", 0))
            fields["offload_optimizer"] = (zero.get("offload_optimizer") or {}).get("device",
                                                                                    "none")
            fields["offload_param"] = (zero.get("offload_param") or {}).get("device", "none")
            # "auto": the Accelerator's gradient_accumulation_steps, 1 unless
            # the program passes one.
            steps = ds.get("gradient_accumulation_steps")
            fields["gradient_accumulation_steps"] = 1 if steps in (None, "auto") else steps
            # Absent: DeepSpeed's own default; "auto": Accelerator.prepare
            # fills 1.0 (its config_kwargs).
            clip = ds.get("gradient_clipping", deepspeed_clipping_default())
            fields["gradient_clipping"] = 1.0 if clip == "auto" else float(clip)
        if kind == "FSDP":
            fields.update(fsdp_fields(path, processes))
    except Exception as error:
        return "reject", f"{type(error).__name__}: {one_line(error, 400)}"
    return "accept", fields


def deepspeed_clipping_default():
    from deepspeed.runtime.constants import GRADIENT_CLIPPING_DEFAULT
    return GRADIENT_CLIPPING_DEFAULT


def accelerate_ds_document(path):
    """The DeepSpeed settings an Accelerate YAML gives: its deepspeed_config_file's
    top level with the deepspeed_config section's clipping on top (for the rules)."""
    import yaml
    try:
        with open(path) as f:
            section = (yaml.safe_load(f) or {}).get("deepspeed_config") or {}
    except Exception:
        return None
    document = {}
    if section.get("deepspeed_config_file"):
        loaded = load_json_loosely(os.path.join(os.path.dirname(path),
                                                section["deepspeed_config_file"]))
        document.update(loaded if isinstance(loaded, dict) else {})
    if section.get("gradient_clipping") is not None:
        document["gradient_clipping"] = section["gradient_clipping"]
    return document


def accelerate_fsdp_document(path):
    """An Accelerate YAML's fsdp_config, for the rules; None if unreadable."""
    import yaml
    try:
        with open(path) as f:
            return (yaml.safe_load(f) or {}).get("fsdp_config") or {}
    except Exception:
        return None


def tandem_accelerate_fields(resolved, deepspeed, fsdp=False):
    launch = resolved["launch"]
    fields = {
        "distributed_type": resolved["distributed_type"],
        "num_processes": launch["num_processes"],
        "num_machines": resolved["num_machines"],
        "machine_rank": resolved["machine_rank"],
        "main_process_ip": launch["main_process_ip"],
        "main_process_port": launch["main_process_port"],
        "gpu_ids": launch["gpu_ids"],
        "use_cpu": launch["use_cpu"],
        "rdzv_backend": launch["rdzv_backend"],
        "precision": resolved["mixed_precision"],
    }
    if deepspeed:
        zero = resolved["zero_optimization"]
        fields.update({
            "zero_stage": zero["stage"],
            "offload_optimizer": zero["offload_optimizer"]["device"],
            "offload_param": zero["offload_param"]["device"],
            "gradient_accumulation_steps": resolved["gradient_accumulation_steps"],
            # "auto" (the program may fill it) prints as the default, 0.
            "gradient_clipping": float(resolved["gradient_clipping"]),
        })
    if fsdp:
        zero = resolved["zero_optimization"]
        fields.update({
            "zero_stage": zero["stage"],
            "zero_hpz_partition_size": zero["zero_hpz_partition_size"],
            "offload": "cpu" in (zero["offload_optimizer"]["device"], zero["offload_param"]["device"]),
            "activation_checkpointing": resolved["activation_checkpointing"]["enabled"],
        })
    return fields


def accelerate_cases(tandem, files):
    # Without --world-size: the file's num_processes (NO: 1; unset: 1).
    views = tandem_views(tandem, files) if files else {}
    for path in files:
        peer = accelerate_view(path)
        mine = views[path]
        deepspeed = peer[0] == "accept" and peer[1]["distributed_type"] == "DEEPSPEED"
        fsdp = peer[0] == "accept" and peer[1]["distributed_type"] == "FSDP"
        if mine[0] == "accept":
            given = mine[1]["launch"]["num_processes"]
            mine = ("accept", tandem_accelerate_fields(mine[1], deepspeed, fsdp))
            if peer[0] == "accept" and peer[1]["num_processes"] is None:
                mine[1]["num_processes"] = None  # both leave the count to the launch
            elif given is None:
                mine[1]["num_processes"] = None
        fields = (ACCELERATE_FIELDS + (ACCELERATE_DS_FIELDS if deepspeed else ())
                  + (ACCELERATE_FSDP_FIELDS if fsdp else ()))
        differences = compare(peer, mine, fields)
        document = (accelerate_ds_document(path) if deepspeed else
                    accelerate_fsdp_document(path) if fsdp else None)
        yield {"case": os.path.basename(path),
               "verdict": classify(peer, mine, differences, document),
               "accelerate": peer, "tandem": mine, "differences": differences}


# --------------------------------------------------------------------------


def describe(case):
    peer_name = "deepspeed" if "deepspeed" in case else "accelerate"
    peer, mine = case[peer_name], case["tandem"]
    if case["verdict"] == "agree":
        return ""
    if case["differences"]:
        return "; ".join(f"{k}: {peer_name} {peer[1][k]!r}, tandem {mine[1][k]!r}"
                         for k in case["differences"])
    tandem_says = re.sub(r"^tandem config: error: ", "", mine[1]) if mine[0] == "reject" else ""
    return "; ".join([f"{peer_name} " + (peer[1] if peer[0] == "reject" else "accepts"),
                      "tandem " + (tandem_says or "accepts")])


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("tandem", help="the tandem CLI (build/bin/tandem)")
    parser.add_argument("--data", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                       "data"),
                        help="the corpus folder (default: tests/config/data)")
    parser.add_argument("--verbose", action="store_true", help="print the reasons of agreeing "
                        "refusals and deliberate differences too")
    args = parser.parse_args()

    missing = import_peers()
    if missing:
        print(f"conformance: SKIP: deepspeed and accelerate are needed as the reference "
              f"({missing}); install them with `.venv/bin/pip install deepspeed accelerate` "
              f"(scripts/setup.sh does)")
        return SKIP

    data = os.path.abspath(args.data)
    tandem = os.path.abspath(args.tandem)
    names = sorted(os.listdir(data))
    ds_files = [os.path.join(data, n) for n in names if n.startswith("ds_") and n.endswith(".json")]
    acc_files = [os.path.join(data, n) for n in names
                 if n.startswith("accelerate_") and n.endswith(".yaml")]

    counts = {}
    disagreements = []
    with tempfile.TemporaryDirectory(prefix="tandem_conformance_") as scratch:
        cases = list(deepspeed_cases(tandem, ds_files, scratch))
        cases += list(accelerate_cases(tandem, acc_files))
    for case in cases:
        verdict = case["verdict"]
        counts[verdict] = counts.get(verdict, 0) + 1
        detail = describe(case)
        show = verdict == "DISAGREE" or args.verbose or verdict.startswith("deliberate")
        line = f"{verdict:<14} {case['case']}"
        if detail and show:
            line += f": {one_line(detail, 300)}"
        print(line)
        if verdict == "DISAGREE":
            disagreements.append(case["case"])
    summary = {
        "deepspeed_files": len(ds_files),
        "accelerate_files": len(acc_files),
        "cases": len(cases),
        "verdicts": dict(sorted(counts.items())),
        "disagreements": disagreements,
        "deepspeed_version": __import__("deepspeed").__version__,
        "accelerate_version": __import__("accelerate").__version__,
    }
    print(json.dumps(summary, sort_keys=True))
    return 1 if disagreements else 0


if __name__ == "__main__":
    sys.exit(main())
