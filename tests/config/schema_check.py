#!/usr/bin/env python3
"""Schema coverage: tandem's config key table against what DeepSpeed and
Accelerate themselves accept.

`print_config_keys` lists every key tandem's readers know, as
FORMAT<TAB>KEY<TAB>DISPOSITION (implemented, warn or refuse). This check
collects, from the installed packages' own code (no hand-written key lists),
the keys a DeepSpeed JSON and an Accelerate config YAML may hold:

  DeepSpeed (deepspeed_json)
    * the keys DeepSpeedConfig reads, found by building DeepSpeedConfig on
      recording dicts (every get / [] / `in` is noted, level by level), and
      the keys it refuses whatever their value (removed features);
    * the fields (and aliases, deprecated names included) of every pydantic
      model a block is validated with, walked through nested models;
    * the keys deepspeed.initialize reads from the dict before
      DeepSpeedConfig sees it;
    * optimizer.params and scheduler.params for the types tandem accepts:
      the constructor arguments of the classes DeepSpeed builds from them,
      and the keys its engine takes out of params itself (or raises on).
  Accelerate (accelerate_yaml)
    * the ClusterConfig dataclass fields, and the older keys its loader
      converts (process_config);
    * under deepspeed_config and fsdp_config, the keys `accelerate launch`
      has arguments for.
DeepSpeed ignores top-level keys it does not read, and `accelerate launch`
copies any key of a section into its arguments unchecked, so "accepts" here
means "reads and acts on".

Then, per format:
  (a) a key the package accepts that tandem's table lacks is a failure:
      tandem would refuse, as an unknown key, a file the package accepts;
  (b) a key tandem implements or warns about that the package does not know
      is a failure, unless EXTENSIONS below lists it with its reason;
  (c) a key tandem implements or warns about that the package refuses is a
      failure, unless EXTENSIONS lists it.
Keys tandem refuses are fine either way. Where tandem has no key table for a
level (a block it takes, warns about or refuses whole, e.g. `tensorboard` or
`tensor_parallel`), the package's keys below it are covered by the block.
optimizer.params.* and scheduler.params.* are compared as the union over
tandem's types, as print_config_keys prints them.

    .venv/bin/python tests/config/schema_check.py build/bin/print_config_keys [--verbose]

Prints the discrepancies (--verbose: also every key each package accepts)
and a JSON line with counts last; takes about 5 s. Exit status: 0 when
clean, 1 on any failure, 77 when deepspeed or accelerate cannot be imported
(ctest's SKIP_RETURN_CODE).
"""

import argparse
import ast
import contextlib
import dataclasses
import inspect
import json
import logging
import os
import subprocess
import sys
import textwrap
import time
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peers  # noqa: E402 - next to this file

SKIP = 77

# The optimizer and scheduler types tandem's DeepSpeed reader accepts
# (src/config/deepspeed_optim.cpp, optimizer_types() and scheduler_types()).
# It refuses any other type by its value, so other types' params never reach
# a key table. print_config_keys prints optimizer.params.* as the union over
# these types, so the union is what is compared.
TANDEM_OPTIMIZER_TYPES = ("Adam", "AdamW", "SGD", "Adagrad", "RMSprop", "Lion", "Lamb")
TANDEM_SCHEDULER_TYPES = ("WarmupLR", "WarmupDecayLR", "WarmupCosineLR", "OneCycle")

# tandem's own extensions: keys it implements or warns about that the
# installed package does not accept. (format, key) -> the reason.
EXTENSIONS = {
    # Keys that `accelerate config` of earlier releases wrote and Accelerate
    # 1.x's loader no longer knows (conformance.py, ACCELERATE_LEGACY_KEYS):
    # tandem still loads a config written by an older Accelerate.
    ("accelerate_yaml", "ipex_config"):
        "written by earlier Accelerate releases (IPEX); warned and ignored",
    ("accelerate_yaml", "tp_config"):
        "written by earlier Accelerate releases (tensor parallelism, now parallelism_config); "
        "a size above 1 is refused",
    # HF's ALST/Ulysses sequence-parallelism guide puts it in an Accelerate
    # YAML's deepspeed_config section; Accelerate 1.15's launcher copies it
    # into its arguments like any section key and never reads it (in a
    # DeepSpeed JSON it is a DeepSpeed key). tandem warns that it is ignored.
    ("accelerate_yaml", "deepspeed_config.seq_parallel_communication_data_type"):
        "in HF's Ulysses guide; Accelerate drops it silently, tandem warns",
}

# A key in a probe block that no reader knows: it carries the probed path to
# the pydantic model that receives the block (see DeepSpeedModels).
PROBE = "__tandem_schema_probe__"


def import_peers():
    """The peers imported quietly; None, or why they could not be."""
    return peers.import_peers(['deepspeed.runtime.config', 'deepspeed.runtime.engine', 'accelerate.commands.config.config_args', 'accelerate.commands.launch'])


def join(path, key):
    return f"{path}.{key}" if path else key


def parent(path):
    return path.rpartition(".")[0]


class PackageKeys:
    """What a package accepts: key path -> ("accept" or "refuse", where it
    was found), and the levels that take any key (`open`)."""

    def __init__(self):
        self.keys = {}
        self.open = set()

    def add(self, path, origin, status="accept"):
        # A refusal wins: DeepSpeed may test for a removed key before refusing it.
        if path not in self.keys or status == "refuse":
            self.keys[path] = (status, origin)


# --------------------------------------------------------------------------
# tandem's side


def tandem_keys(binary):
    """{format: {key: disposition}} from print_config_keys."""
    done = subprocess.run([binary], capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        raise RuntimeError(f"{binary} exited {done.returncode}: {done.stderr}")
    table = {}
    for line in done.stdout.splitlines():
        fmt, key, disposition = line.split("\t")
        previous = table.setdefault(fmt, {}).get(key)
        # A key printed with two dispositions (two optimizer types): the more
        # permissive one is what a file can get through with.
        order = ("refuse", "warn", "implemented")
        if previous is None or order.index(disposition) > order.index(previous):
            table[fmt][key] = disposition
    return table


# --------------------------------------------------------------------------
# DeepSpeed: the keys DeepSpeedConfig reads
#
# DeepSpeed's top level and several blocks (activation_checkpointing,
# checkpoint, aio, flops_profiler, data_efficiency, ...) are plain dicts read
# with get_scalar_param / dict.get / `in`, and unknown keys are ignored, so
# there is no schema to read there. The constants modules name keys, but also
# values, defaults and keys of other components, and not which are read.
# Recording what DeepSpeedConfig actually asks while it builds itself is
# exact, follows whatever modules it calls, and needs no list here. A reader
# that asks for a key only under some condition is reached by probing every
# key found with several kinds of value (PROBE_VALUES: a block, true, false,
# a string, a number), which takes the branches that matter
# (zero_optimization: true reads the legacy allgather_size; an optimizer type
# reads its params; a `*.enabled` switch reads the rest of its block). As a
# cross-check when this was written, every key-like name in
# deepspeed/runtime/constants.py that DeepSpeed 0.19.8 reads was found.


class RecordingKeys:
    """dict.keys() of a RecordingDict: `in` is noted, listing marks the level open."""

    def __init__(self, owner):
        self.owner = owner

    def __contains__(self, key):
        self.owner.note(key)
        return dict.__contains__(self.owner, key)

    def __iter__(self):
        self.owner.reads.listed.add(self.owner.path)
        return iter(dict.keys(self.owner))

    def __len__(self):
        return dict.__len__(self.owner)


class Reads:
    def __init__(self):
        self.paths = set()   # dotted paths of the keys asked for
        self.listed = set()  # levels whose keys were listed: any key goes there


class RecordingDict(dict):
    """A config level that notes every key asked of it.

    `**block` and dict(block) copy it without asking (CPython's fast path for
    dict subclasses that keep dict's __iter__); that is what pydantic models
    get, and DeepSpeedModels below learns their keys from the model instead.
    """

    def __init__(self, items, path, reads):
        super().__init__(items)
        self.path = path
        self.reads = reads

    def note(self, key):
        if isinstance(key, str) and key != PROBE:
            self.reads.paths.add(join(self.path, key))

    def __getitem__(self, key):
        self.note(key)
        return super().__getitem__(key)

    def __contains__(self, key):
        self.note(key)
        return super().__contains__(key)

    def get(self, key, default=None):
        self.note(key)
        return super().get(key, default)

    def pop(self, key, *default):
        self.note(key)
        return super().pop(key, *default)

    def setdefault(self, key, default=None):
        self.note(key)
        return super().setdefault(key, default)

    def keys(self):
        return RecordingKeys(self)

    def items(self):
        self.reads.listed.add(self.path)
        return super().items()

    def values(self):
        self.reads.listed.add(self.path)
        return super().values()

    def __copy__(self):  # DeepSpeedConfig copies its top level before reading it
        return RecordingDict(dict.items(self), self.path, self.reads)


class FixedWorld:
    """Stands in for deepspeed.comm inside DeepSpeedConfig (rank 0 of 1), so
    that it takes the branch that reads sequence_parallel_size."""

    def get_rank(self, group=None):
        return 0

    def get_world_size(self, group=None):
        return 1


class DeepSpeedModels:
    """While active, notes which pydantic model receives each probe block.

    Every DeepSpeed config model derives from DeepSpeedConfigModel, whose
    __init__ pydantic also calls for nested models. A probe block carries
    PROBE -> its path; the wrapper takes it out (so extra="forbid" models
    accept the block) and notes path -> model class.
    """

    def __init__(self):
        self.by_path = {}

    def __enter__(self):
        from deepspeed.runtime.config_utils import DeepSpeedConfigModel
        self.base = DeepSpeedConfigModel
        self.original = DeepSpeedConfigModel.__init__
        original, by_path = self.original, self.by_path

        def init(model, strict=False, **data):
            if PROBE in data:
                by_path.setdefault(data.pop(PROBE), type(model))
            original(model, strict=strict, **data)

        DeepSpeedConfigModel.__init__ = init
        return self

    def __exit__(self, *exc):
        self.base.__init__ = self.original


def build_deepspeed_config(path, value):
    """DeepSpeedConfig built on {train_batch_size: 1} with `value` at `path`
    (a probe block when value is "block"); (Reads, error message or None)."""
    import deepspeed.runtime.config as ds_config

    reads = Reads()
    root = RecordingDict({"train_batch_size": 1}, "", reads)
    if path:
        node, parts = root, path.split(".")
        for depth, part in enumerate(parts[:-1]):
            child = RecordingDict({}, ".".join(parts[:depth + 1]), reads)
            dict.__setitem__(node, part, child)
            node = child
        if value == "block":
            value = RecordingDict({PROBE: path}, path, reads)
        dict.__setitem__(node, parts[-1], value)
    saved = ds_config.dist
    ds_config.dist = FixedWorld()
    try:
        with open(os.devnull, "w") as devnull, contextlib.redirect_stdout(devnull):
            ds_config.DeepSpeedConfig(root)
        error = None
    except Exception as caught:  # a probe value of the wrong kind fails: expected
        error = f"{type(caught).__name__}: {caught}"
    finally:
        ds_config.dist = saved
    return reads, error


# Values each key found is probed with. A key whose every probe fails with the
# same DeepSpeedConfigError, whatever the value, is refused for being there at
# all (the keys of removed features: _reject_removed_config_keys); a wrong
# value fails with a message naming the value.
PROBE_VALUES = ("block", True, False, "probe", 1)


def deepspeed_config_reads(found, models):
    """Adds to `found` every key DeepSpeedConfig reads; fills `models`
    (path -> pydantic model class of the block there)."""
    with models:
        reads, error = build_deepspeed_config("", None)
    if error:
        raise RuntimeError(f"DeepSpeedConfig refused {{'train_batch_size': 1}}: {error}")
    seen = set(reads.paths)
    queue = sorted(seen)
    listed = set(reads.listed)
    refused = set()
    while queue:
        path = queue.pop(0)
        errors = []
        for value in PROBE_VALUES:
            with models:
                probe_reads, error = build_deepspeed_config(path, value)
            errors.append(error and error.replace(PROBE, ""))
            listed |= probe_reads.listed
            for new in sorted(probe_reads.paths - seen):
                seen.add(new)
                queue.append(new)
        if errors[0] and errors[0].startswith("DeepSpeedConfigError") and len(set(errors)) == 1:
            refused.add(path)
    for path in seen:
        found.add(path, "read by DeepSpeedConfig", "refuse" if path in refused else "accept")
    found.open |= listed


# --------------------------------------------------------------------------
# DeepSpeed: the pydantic models' fields


def union_members(annotation):
    """The types an annotation allows: Optional[X] and Union[X, Y] opened up."""
    import types
    import typing

    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return [m for arg in typing.get_args(annotation) for m in union_members(arg)]
    return [annotation]


def model_classes(annotation):
    """The pydantic model classes a field's annotation allows (nested blocks)."""
    from pydantic import BaseModel

    return [m for m in union_members(annotation)
            if inspect.isclass(m) and issubclass(m, BaseModel)]


def is_mapping(annotation):
    """Whether a field takes a dict of any keys (Dict, Dict[str, Any], ...)."""
    import collections.abc
    import typing

    return any(m in (dict, typing.Dict) or typing.get_origin(m) in (dict, collections.abc.Mapping)
               for m in union_members(annotation))


def field_names(name, field):
    """A field's name and every alias pydantic accepts for it (populate_by_name
    is on in DeepSpeedConfigModel, so both the name and the alias work)."""
    from pydantic import AliasChoices, AliasPath

    names = {name}
    for alias in (field.alias, field.validation_alias):
        choices = alias.choices if isinstance(alias, AliasChoices) else [alias]
        for choice in choices:
            if isinstance(choice, str):
                names.add(choice)
            elif isinstance(choice, AliasPath) and isinstance(choice.path[0], str):
                names.add(choice.path[0])
    return names


def deepspeed_model_fields(found, models):
    """Adds the fields of each block's model, and of the models nested in it."""
    pending = sorted(models.items(), key=lambda item: item[0])
    while pending:
        path, model = pending.pop(0)
        if model.model_config.get("extra") == "allow":
            found.open.add(path)
        for name, field in model.model_fields.items():
            extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
            deprecated = " (deprecated)" if extra.get("deprecated") else ""
            origin = f"{model.__name__} field{deprecated}"
            for key in field_names(name, field):
                found.add(join(path, key), origin)
                for nested in model_classes(field.annotation):
                    pending.append((join(path, key), nested))
                if is_mapping(field.annotation):
                    found.open.add(join(path, key))


# --------------------------------------------------------------------------
# DeepSpeed: keys read by deepspeed.initialize


def function_ast(function):
    return ast.parse(textwrap.dedent(inspect.getsource(function)))


def string_keys_read(tree, variable, resolve):
    """The keys the code in `tree` reads from the dict named `variable`:
    variable[K], variable.get(K), variable.pop(K), K in variable (or
    variable.keys()); K a string, or a name `resolve` turns into one."""

    def is_variable(node):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr == "keys":
            node = node.func.value
        return isinstance(node, ast.Name) and node.id == variable

    keys = []
    for node in ast.walk(tree):
        key = None
        if isinstance(node, ast.Subscript) and is_variable(node.value):
            key = node.slice
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr in ("get", "pop") and is_variable(node.func.value) and node.args:
            key = node.args[0]
        elif isinstance(node, ast.Compare) and len(node.ops) == 1 \
                and isinstance(node.ops[0], (ast.In, ast.NotIn)) \
                and is_variable(node.comparators[0]):
            key = node.left
        if key is not None:
            value = resolve(key)
            if isinstance(value, str):
                keys.append((value, node))
    return keys


def constant_resolver(module):
    """A string literal, or a module-level name bound to one."""
    def resolve(node):
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Name):
            return getattr(module, node.id, None)
        return None
    return resolve


def deepspeed_initialize_reads(found):
    # deepspeed.initialize reads the mesh sizes (data_parallel_size with
    # sequence_parallel_size) and tensor_parallel from the dict itself.
    import deepspeed

    module = sys.modules[deepspeed.initialize.__module__]
    tree = function_ast(deepspeed.initialize)
    for key, _ in string_keys_read(tree, "config", constant_resolver(module)):
        found.add(key, "read by deepspeed.initialize")


# --------------------------------------------------------------------------
# DeepSpeed: optimizer.params and scheduler.params
#
# DeepSpeed hands params to a constructor (`Class(model_parameters,
# **params)`), so the keys it accepts are that constructor's arguments, plus
# what its engine takes out of params first. For Adam and AdamW the engine
# picks the class in get_optimizer_configuration (torch.optim.Adam/AdamW when
# torch_adam, DeepSpeedCPUAdam or ZenFlowCPUAdam when offloading, FusedAdam
# otherwise) and passes some arguments itself; any other torch type is
# getattr(torch.optim, type).


class OptimizerStandIn:
    """The engine's answers get_optimizer_configuration asks for."""

    def __init__(self, cpu_optimizer, zenflow):
        self.cpu_optimizer = cpu_optimizer
        self.zenflow = zenflow
        self.overlap_step = False

    def zero_use_cpu_optimizer(self):
        return self.cpu_optimizer

    def bf16_optimizer_states(self):
        return False


def constructor_arguments(cls):
    """Keyword arguments of cls(...), following **kwargs to the base classes;
    each class's first argument (the parameters or the optimizer) left out."""
    names = []
    for klass in cls.__mro__:
        if "__init__" not in vars(klass):
            continue
        parameters = list(inspect.signature(klass.__init__).parameters.values())[1:]  # self
        if parameters and parameters[0].kind == parameters[0].POSITIONAL_OR_KEYWORD:
            parameters = parameters[1:]
        names += [p.name for p in parameters
                  if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
        if not any(p.kind == p.VAR_KEYWORD for p in parameters):
            break
    return names


def adam_engine_keys(engine_class, engine_module):
    """The keys DeepSpeed's engine takes out of Adam/AdamW params itself
    (popped in _configure_basic_optimizer's Adam branch or in
    get_optimizer_configuration), and those it raises on before it looks at
    the optimizer type (`if KEY in optimizer_parameters: raise`)."""
    resolve = constant_resolver(engine_module)
    configure = function_ast(engine_class._configure_basic_optimizer).body[0]
    adam_branches = [node for node in ast.walk(configure) if isinstance(node, ast.If) and any(
        isinstance(name, ast.Name) and name.id == "ADAM_OPTIMIZER" for name in ast.walk(node.test))]
    if not adam_branches:
        raise RuntimeError("DeepSpeed's _configure_basic_optimizer has no `ADAM_OPTIMIZER` "
                           "branch any more; update adam_engine_keys")
    popped = set()
    for scope in (ast.Module(body=adam_branches[0].body, type_ignores=[]),
                  function_ast(engine_class.get_optimizer_configuration)):
        for key, node in string_keys_read(scope, "optimizer_parameters", resolve):
            if isinstance(node, ast.Call) and node.func.attr == "pop":
                popped.add(key)
    refused = set()
    for statement in configure.body:
        if isinstance(statement, ast.If) and any(isinstance(s, ast.Raise) for s in statement.body):
            refused |= {key for key, _ in string_keys_read(statement.test, "optimizer_parameters",
                                                            resolve)}
    return popped, refused


def class_name(cls):
    return f"torch.optim.{cls.__name__}" if cls.__module__.startswith("torch.") else cls.__name__


def deepspeed_optimizer_params(found):
    import torch
    import deepspeed.runtime.config as ds_config
    import deepspeed.runtime.engine as engine_module
    import deepspeed.runtime.lr_schedules as lr_schedules
    from deepspeed.runtime.engine import DeepSpeedEngine

    from deepspeed.ops.adagrad import DeepSpeedCPUAdagrad
    from deepspeed.ops.lamb import FusedLamb
    from deepspeed.ops.lion import DeepSpeedCPULion, FusedLion

    deepspeed_built = {
        ds_config.ADAGRAD_OPTIMIZER: (torch.optim.Adagrad, DeepSpeedCPUAdagrad),
        ds_config.LAMB_OPTIMIZER: (FusedLamb,),
        ds_config.LION_OPTIMIZER: (FusedLion, DeepSpeedCPULion),
    }
    popped, refused = adam_engine_keys(DeepSpeedEngine, engine_module)
    if not popped:  # adam_w_mode and torch_adam at least
        raise RuntimeError("found no keys DeepSpeed's engine pops from optimizer params: its "
                           "optimizer construction changed; update adam_engine_keys")
    takers = {}  # argument -> {what takes it: {optimizer types}}

    def note(argument, taker, optimizer_type):
        takers.setdefault(argument, {}).setdefault(taker, set()).add(optimizer_type)

    for optimizer_type in TANDEM_OPTIMIZER_TYPES:
        name = optimizer_type.lower()  # DeepSpeedConfig lowercases its own types
        if name in (ds_config.ADAM_OPTIMIZER, ds_config.ADAMW_OPTIMIZER):
            for key in popped:
                note(key, "DeepSpeed's engine", optimizer_type)
            # The classes get_optimizer_configuration picks: torch's (torch_adam:
            # true; Adam or AdamW by adam_w_mode), the CPU Adams (optimizer
            # offload; ZenFlow's with zero_optimization.zenflow), FusedAdam.
            for torch_adam, cpu, zenflow, adam_w_mode in (
                    (True, False, False, True), (True, False, False, False),
                    (False, True, False, True), (False, True, True, True),
                    (False, False, False, True)):
                params = {ds_config.TORCH_ADAM_PARAM: torch_adam}
                cls, engine_kwargs = DeepSpeedEngine.get_optimizer_configuration(
                    OptimizerStandIn(cpu, zenflow), params, adam_w_mode)
                taker = class_name(cls) + (" (torch_adam)" if torch_adam else "")
                for argument in constructor_arguments(cls):
                    # One the engine passes itself would be given twice: a TypeError.
                    if argument not in engine_kwargs:
                        note(argument, taker, optimizer_type)
        elif name in deepspeed_built:
            # _configure_basic_optimizer's own branches: every class one of
            # them may build (the CPU ones with optimizer offload).
            for cls in deepspeed_built[name]:
                for argument in constructor_arguments(cls):
                    note(argument, class_name(cls), optimizer_type)
        elif name in ds_config.DEEPSPEED_OPTIMIZERS:
            raise RuntimeError(f"DeepSpeed builds {optimizer_type} itself; extend "
                               f"deepspeed_optimizer_params for it")
        else:  # the engine's fallback: getattr(torch.optim, type)(params, **params)
            cls = getattr(torch.optim, optimizer_type)
            for argument in constructor_arguments(cls):
                note(argument, class_name(cls), optimizer_type)
    for argument, by_taker in sorted(takers.items()):
        types = sorted({t for ts in by_taker.values() for t in ts},
                       key=TANDEM_OPTIMIZER_TYPES.index)
        found.add(f"optimizer.params.{argument}",
                  f"{'/'.join(types)}: {', '.join(sorted(by_taker))}")
    for key in refused:  # checked before the engine looks at the type
        found.add(f"optimizer.params.{key}", "DeepSpeed's engine raises on it", "refuse")

    scheduler_takers = {}  # argument -> [scheduler types]
    for scheduler_type in TANDEM_SCHEDULER_TYPES:
        # The engine's _scheduler_from_config: DeepSpeed's own, else torch's.
        cls = getattr(lr_schedules, scheduler_type, None) or getattr(
            torch.optim.lr_scheduler, scheduler_type)
        for argument in constructor_arguments(cls):
            scheduler_takers.setdefault(argument, []).append(class_name(cls))
    for argument, classes in sorted(scheduler_takers.items()):
        found.add(f"scheduler.params.{argument}", "/".join(classes) + " constructor")


def deepspeed_keys():
    found = PackageKeys()
    models = DeepSpeedModels()
    deepspeed_config_reads(found, models)
    deepspeed_model_fields(found, models.by_path)
    deepspeed_initialize_reads(found)
    deepspeed_optimizer_params(found)
    # optimizer.params and scheduler.params are handed over whole, so the
    # recording saw no keys there and may have marked them open; their keys
    # are the constructors' (above).
    found.open -= {"optimizer.params", "scheduler.params"}
    return found


# --------------------------------------------------------------------------
# Accelerate


def accelerate_keys():
    from accelerate.commands.config.config_args import ClusterConfig
    from accelerate.commands.launch import launch_command_parser
    import accelerate.commands.launch as launch_module
    import accelerate.utils.launch as launch_utils

    found = PackageKeys()
    # The top level: load_config_from_file takes ClusterConfig's fields (for
    # compute_environment LOCAL_MACHINE; tandem refuses AMAZON_SAGEMAKER by
    # its value, so SageMakerConfig's fields never reach its table) after
    # process_config has converted older keys. A key process_config asks for
    # and removes is such an older key.
    for field in dataclasses.fields(ClusterConfig):
        found.add(field.name, "ClusterConfig field")
    reads = Reads()
    ClusterConfig.process_config(RecordingDict({"distributed_type": "NO"}, "", reads))
    for key in sorted(reads.paths - set(found.keys)):
        converted = ClusterConfig.process_config({"distributed_type": "NO", key: "no"})
        if key not in converted:
            found.add(key, "converted by ClusterConfig.process_config")

    # The sections: _validate_launch_command copies each key of a dict
    # section into the launch arguments (args.KEY; fsdp_config keys get an
    # `fsdp_` prefix when they lack one) without checking it, so what the
    # launcher understands is the arguments it has for them: its parser's
    # DeepSpeed and FSDP groups, and the ones it reads with a default
    # (getattr(args, "fsdp_ignored_modules", None)), which only a config
    # file can set.
    parser = launch_command_parser()
    groups = {group.title: [action.dest for action in group._group_actions]
              for group in parser._action_groups}
    dests = {dest for names in groups.values() for dest in names}
    file_only = {}  # argument -> function that reads it with a default
    for module in (launch_module, launch_utils):
        for name, function in inspect.getmembers(module, inspect.isfunction):
            if function.__module__ != module.__name__:
                continue
            for node in ast.walk(function_ast(function)):
                if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                        and node.func.id == "getattr" and len(node.args) == 3
                        and isinstance(node.args[0], ast.Name) and node.args[0].id == "args"
                        and isinstance(node.args[1], ast.Constant)
                        and node.args[1].value not in dests):
                    file_only.setdefault(node.args[1].value, name)
    for title in ("DeepSpeed Arguments", "FSDP Arguments"):
        if title not in groups:
            raise RuntimeError(f"accelerate launch has no '{title}' group any more; update "
                               f"accelerate_keys")
    for dest in groups["DeepSpeed Arguments"]:
        found.add(f"deepspeed_config.{dest}", f"accelerate launch --{dest}")
    for argument, function in file_only.items():
        if "deepspeed" in function:
            found.add(f"deepspeed_config.{argument}", f"read by accelerate's {function}")
    fsdp = {dest: f"accelerate launch --{dest}" for dest in groups["FSDP Arguments"]}
    for argument, function in file_only.items():
        if argument.startswith("fsdp_"):
            fsdp.setdefault(argument, f"read by accelerate's {function}")
    for argument, origin in fsdp.items():
        found.add(f"fsdp_config.{argument}", origin)
        if argument.startswith("fsdp_"):  # the launcher adds the prefix back
            found.add(f"fsdp_config.{argument[len('fsdp_'):]}", origin + " (without fsdp_)")
    return found


# --------------------------------------------------------------------------
# The comparison


def matches(key, table):
    """Whether tandem's table names `key` (a `prefix*` entry covers a prefix)."""
    return key in table or any(k.endswith("*") and key.startswith(k[:-1]) for k in table)


def covering_block(key, table):
    """The nearest enclosing key tandem's table names, or None."""
    path = parent(key)
    while path:
        if path in table:
            return path
        path = parent(path)
    return None


def under_open_level(key, package):
    path = parent(key)
    while True:
        if path in package.open:
            return True
        if not path:
            return False
        path = parent(path)


def compare(fmt, package, table):
    """The discrepancies between the package's keys and tandem's table."""
    levels = {parent(k) for k in table}  # levels whose keys tandem checks
    result = {"missing": [], "unknown": [], "refused_by_package": [], "extensions": [],
              "covered_by_block": 0, "under_missing_block": 0}
    for key, (status, origin) in sorted(package.keys.items()):
        if status != "accept" or matches(key, table):
            continue
        if parent(key) in levels:
            result["missing"].append((key, origin))
        elif covering_block(key, table):
            # tandem takes, warns about or refuses the enclosing block whole.
            result["covered_by_block"] += 1
        else:
            # Below a block tandem lacks, which is itself listed as missing.
            result["under_missing_block"] += 1
    for key, disposition in sorted(table.items()):
        if disposition == "refuse":
            continue
        known = package.keys.get(key)
        if known and known[0] == "accept":
            continue
        if known is None and (key.endswith("*") or under_open_level(key, package)):
            continue
        if (fmt, key) in EXTENSIONS:
            result["extensions"].append((key, EXTENSIONS[(fmt, key)]))
        elif known:
            result["refused_by_package"].append((key, f"tandem: {disposition}; {known[1]}"))
        else:
            result["unknown"].append((key, f"tandem: {disposition}"))
    return result


def print_list(title, rows):
    if rows:
        print(f"  {title}:")
        width = max(len(key) for key, _ in rows)
        for key, why in rows:
            print(f"    {key:<{width}}  {why}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("print_config_keys", help="path of the print_config_keys binary")
    parser.add_argument("--verbose", action="store_true",
                        help="also list every key each package accepts")
    args = parser.parse_args()

    started = time.monotonic()
    problem = import_peers()
    if problem:
        print(f"SKIP: cannot import deepspeed and accelerate ({problem})")
        print(json.dumps({"skipped": problem}))
        return SKIP

    import accelerate
    import deepspeed
    tandem = tandem_keys(args.print_config_keys)
    packages = {
        "deepspeed_json": (f"DeepSpeed {deepspeed.__version__}", deepspeed_keys()),
        "accelerate_yaml": (f"Accelerate {accelerate.__version__}", accelerate_keys()),
    }

    counts = {}
    failures = 0
    used_extensions = set()
    for fmt, (name, package) in packages.items():
        table = tandem.get(fmt, {})
        result = compare(fmt, package, table)
        accepted = sum(1 for status, _ in package.keys.values() if status == "accept")
        print(f"{fmt}: {name} accepts {accepted} keys (refuses "
              f"{len(package.keys) - accepted}); tandem's table has {len(table)}")
        if args.verbose:
            print_list("the package's keys", [(k, f"{s}: {o}")
                                              for k, (s, o) in sorted(package.keys.items())])
            print_list("levels that take any key",
                       [(k or "(top)", "") for k in sorted(package.open)])
        print_list("MISSING from tandem's table (the package accepts them; tandem refuses them "
                   "as unknown keys)", result["missing"])
        print_list("UNKNOWN to the package (tandem takes them; not in EXTENSIONS)",
                   result["unknown"])
        print_list("REFUSED by the package (tandem takes them; not in EXTENSIONS)",
                   result["refused_by_package"])
        print_list("tandem's extensions (EXTENSIONS)", result["extensions"])
        used_extensions |= {(fmt, key) for key, _ in result["extensions"]}
        failures += sum(len(result[kind]) for kind in ("missing", "unknown", "refused_by_package"))
        counts[fmt] = {"package_keys": accepted, "package_refused": len(package.keys) - accepted,
                       "tandem_keys": len(table), "missing": len(result["missing"]),
                       "unknown": len(result["unknown"]),
                       "refused_by_package": len(result["refused_by_package"]),
                       "extensions": len(result["extensions"]),
                       "covered_by_block": result["covered_by_block"],
                       "under_missing_block": result["under_missing_block"]}
    stale = sorted(set(EXTENSIONS) - used_extensions)
    for fmt, key in stale:
        print(f"note: EXTENSIONS lists {fmt} {key}, which no longer needs it")
    print("PASS" if failures == 0 else f"FAIL: {failures} discrepancies")
    print(json.dumps({"failures": failures, "stale_extensions": len(stale),
                      "seconds": round(time.monotonic() - started, 1), **counts}))
    return 0 if failures == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
