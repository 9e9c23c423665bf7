"""The `neuronx-cc-lite` command line."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from typing import TYPE_CHECKING, Any, Callable

from neuronx_cc_lite import interrupts, neuronx_cc_flags, progress

if TYPE_CHECKING:
    import numpy as np

    from isa.bundle import TensorInfo
    from isa.target import Target

EXAMPLES = """\
examples:
  neuronx-cc-lite compile models/mlp_small.onnx -o mlp.neff
  neuronx-cc-lite run mlp.neff --inputs in.npz --outputs out.npz
  neuronx-cc-lite run mlp.neff --inputs in.npz --profile trace.json   # open it in ui.perfetto.dev
  neuronx-cc-lite check models/mlp_small.onnx
  neuronx-cc-lite profile mlp.neff --json summary.json
  neuronx-cc-lite info mlp.neff --json
  neuronx-cc-lite disasm mlp.neff --engine PE | head
  neuronx-cc-lite disasm mlp.neff > mlp.s && neuronx-cc-lite asm mlp.s -o again.neff
  neuronx-cc-lite analyze model.onnx
  neuronx-cc-lite generate decoder.onnx --prompt-ids 1,2,3 --max-new-tokens 16 --json out.json

Every failure prints one line, "neuronx-cc-lite: error: CODE: cause", and exits with status 1
(2 for a usage error). Nothing is left half-written.
"""

PROG = "neuronx-cc-lite"
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
# Names neuronx-cc users type for a chip this tool models under another name: a trn1n is a trn1 (same NeuronCore-v2
# chip; only the network between instances differs, which nothing here models).
TARGET_ALIASES = {"trn1n": "trn1"}
# The packages whose log records the command line shows (on stderr) and keeps (in --logfile).
LOGGERS = ("neuronx_cc_lite", "runtime", "isa")
log = logging.getLogger(__name__)


class UsageError(Exception):
    code = "NCC_USAGE"


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one coded line like every other failure (still exit status 2)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{PROG}: error: NCC_USAGE: {message} (see {self.prog} --help)\n")


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Keeps the examples' layout and ends every option's help with its default. argparse's own
    ArgumentDefaultsHelpFormatter also prints the defaults that say nothing (None, False, [])."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if (not action.option_strings or "%(default)" in text
                or action.default in (None, False, [], argparse.SUPPRESS)):
            return text
        return f"{text} (default: %(default)s)"


def _framework_arg(text: str) -> str:
    if text.upper() != "ONNX":
        raise argparse.ArgumentTypeError(
            f"{text!r}: {PROG} compiles ONNX models only; export the model to ONNX first (torch.onnx.export, "
            "tf2onnx)")
    return "ONNX"


def _shape_arg(text: str) -> tuple[str, tuple[int, ...]]:
    name, sep, dims = text.rpartition("=")
    try:
        if not sep or not name:
            raise ValueError
        return name, tuple(int(d) for d in dims.split(",") if d.strip()) if dims.strip() else ()
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected NAME=D0,D1,..., got {text!r}") from None


def _value_arg(text: str) -> tuple[str, Any]:
    name, sep, value = text.partition("=")
    try:
        if not sep or not name:
            raise ValueError
        parsed = json.loads(value)
        if isinstance(parsed, (dict, str)) or parsed is None:
            raise ValueError
        return name, parsed
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE with a number, true/false or a JSON list ([1,2]), got "
                                         f"{text!r}") from None


def _state_arg(text: str) -> tuple[str, str]:
    name, sep, after = text.partition("=")
    if not sep or not name or not after:
        raise argparse.ArgumentTypeError(f"expected INPUT=OUTPUT, got {text!r}")
    return name, after


def _size_arg(text: str) -> int:
    from neuronx_cc_lite.cache import parse_size

    try:
        return parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _add_compile_options(p: argparse.ArgumentParser) -> None:
    from isa.target import TARGETS
    from neuronx_cc_lite.codegen.stages import STAGE_NAMES  # the names only: the stages load when they run
    from neuronx_cc_lite.passes import PASS_NAMES  # the names only: the passes load when they run
    from neuronx_cc_lite.precision import MODES, TYPES

    p.add_argument("--framework", type=_framework_arg, default="ONNX", metavar="ONNX",
                   help="the framework the model comes from: ONNX is the only one")
    p.add_argument("--target", default="trn1", choices=sorted([*TARGETS, *TARGET_ALIASES]),
                   help="chip to compile for (trn1n is compiled as trn1)")
    p.add_argument("-O", "--optlevel", dest="optimize", type=int, choices=(1, 2, 3), default=2, metavar="{1,2,3}",
                   help="1: lowering order, the fastest compile; 2: list scheduling and keeping values on chip; "
                        "3: as 2 today")
    p.add_argument("--model-type", choices=neuronx_cc_flags.MODEL_TYPES, default="generic",
                   help="the kind of model, as neuronx-cc takes it: recorded in the bundle's flags, no effect yet")
    p.add_argument("--workdir", metavar="DIR",
                   help="directory for temporary files, created if missing (default: the system's temporary "
                        "directory)")
    p.add_argument("--auto-cast", choices=MODES, default="none",
                   help="compute in a narrower type: matmul operands only, or every tensor inside the model "
                        "(see neuronx_cc_lite/precision.py for the error each setting meets)")
    p.add_argument("--auto-cast-type", type=neuronx_cc_flags.auto_cast_type, choices=TYPES, default="bf16",
                   help="the type auto-cast uses")
    p.add_argument("--input-shape", type=_shape_arg, action="append", default=[], metavar="NAME=D0,D1,...",
                   help="pin the shape of an input with dynamic dimensions (repeatable)")
    p.add_argument("--input-value", type=_value_arg, action="append", default=[], metavar="NAME=VALUE",
                   help="pin an input to a constant (a flag, a sample rate: 1, 16000.0, true, [1,2]), so that the If "
                        "and Loop nodes it decides fold; the bundle no longer takes it (repeatable)")
    p.add_argument("--state", type=_state_arg, action="append", default=[], metavar="INPUT=OUTPUT",
                   help="device state: keep INPUT in HBM across runs and write OUTPUT (of the same shape and type) "
                        "into it, in place where the op allows; neither is copied to or from the host (repeatable)")
    p.add_argument("--dump-ir-after", action="append", default=[], metavar="PASS",
                   help=f"print the IR after a pass to stderr: the graph after import, {', '.join(PASS_NAMES)}; "
                        f"the tile program after {', '.join(STAGE_NAMES)}; or all")
    p.add_argument("--stop-after", metavar="PASS", help="stop after a pass or stage and print its IR instead of "
                                                        "compiling")
    p.add_argument("--fallback", choices=("none", "host"), default="none",
                   help="host: run what the chip cannot (operators without a lowering, outputs whose size depends on "
                        "the data: NonZero, NonMaxSuppression) on the CPU with onnxruntime, between chip parts; "
                        "none: refuse the model, naming every such node")
    p.add_argument("--tp", type=int, default=1, metavar="N",
                   help="tensor parallelism: shard the model over N ranks, Megatron-style (linear pairs by columns "
                        "then rows, attention by heads, embeddings by vocabulary), with the collectives between them")
    p.add_argument("--dp", type=int, default=1, metavar="N",
                   help="data parallelism: split the batch over N replicas of the --tp ranks")
    p.add_argument("--lnc", "-lnc", "--logical-nc-config", type=int, choices=(1, 2), metavar="{1,2}",
                   help="logical NeuronCore size: physical cores per rank (trn2: 2 by default, 1 exposes each; "
                        "trn1 and inf2: 1)")
    p.add_argument("--cache-dir", metavar="DIR",
                   help="the compile cache: bundles of models compiled before with the same options and compiler "
                        "(default: $NEURONX_CC_LITE_CACHE, else ~/.cache/neuronx-cc-lite)")
    p.add_argument("--no-cache", action="store_true", help="compile without reading or writing the cache")
    neuronx_cc_flags.add_to(p)
    p.add_argument("--cache-size", type=_size_arg, metavar="SIZE",
                   help="the most the compile cache may hold, in bytes or with K, M, G (500M, 4G): the least "
                        "recently used entries go first (default: $NEURONX_CC_LITE_CACHE_SIZE, else 4G)")


def _options(args: argparse.Namespace) -> Any:
    from neuronx_cc_lite.options import Options  # not the compiler: a cache hit needs only the options' flags

    dump = set(args.dump_ir_after)
    if "all" in dump:
        from neuronx_cc_lite.codegen.stages import STAGE_NAMES
        from neuronx_cc_lite.passes import PASS_NAMES

        dump = {"import", *PASS_NAMES, *STAGE_NAMES}
    if args.workdir:
        os.makedirs(args.workdir, exist_ok=True)
    return Options(target=TARGET_ALIASES.get(args.target, args.target), input_shapes=dict(args.input_shape),
                   input_values=dict(args.input_value), state=dict(args.state),
                   dump_ir_after=frozenset(dump), stop_after=args.stop_after, auto_cast=args.auto_cast,
                   auto_cast_type=args.auto_cast_type, tp=args.tp, dp=args.dp, lnc=args.lnc, fallback=args.fallback,
                   optimize=min(args.optimize, 2),  # -O3 is -O2 until some pass runs only at 3
                   model_type=args.model_type)


def _compile_cached(args: argparse.Namespace, options: Any, model: Any, output: str | None = None) -> Any:
    """The bundle for `model`, from the compile cache when it has it; IR dumps need the passes, so they skip it.
    With `output`, the bundle is written there and what `compile` reports of it (compiler.describe) is returned
    instead: a hit then copies the entry's file and loads neither the compiler nor the bundle format's decoder."""
    from neuronx_cc_lite.cache import cached, compile_to, default_dir

    built = []

    def build() -> Any:
        from neuronx_cc_lite.compiler import compile_graph, prepare

        with progress.timed() as seconds:
            b = compile_graph(prepare(model, options, _dump), options, _dump)
        for name, took in seconds.items():
            log.info(f"{name + ':':<14}{took:7.3f} s")
        built.append(b)
        if directory:
            progress.status("storing the bundle in the compile cache")
        return b

    use = not (args.no_cache or options.dump_ir_after)
    directory = (args.cache_dir or default_dir()) if use else None
    if directory:
        progress.status("looking the model up in the compile cache")
    start = time.perf_counter()
    if output is None:
        b = cached(args.model, options.flags(), directory, build, None, args.cache_size)
    else:
        b = compile_to(args.model, options.flags(), directory, build, output, args.cache_size)
    if directory:
        log.debug(f"compile cache {directory}: {'miss, compiled and stored' if built else 'hit'} in "
                  f"{time.perf_counter() - start:.3f} s")
    return b


def _dump(name: str, text: str) -> None:
    print(f"// IR after {name}\n{text}", file=sys.stderr, end="")


def cmd_compile(args: argparse.Namespace) -> int:
    options = _options(args)
    if options.stop_after:
        from neuronx_cc_lite.codegen.stages import STAGE_NAMES, StopAfter
        from neuronx_cc_lite.compiler import compile_graph, prepare
        from neuronx_cc_lite.ir import print_graph

        graph = prepare(args.model, options, _dump)
        if options.stop_after not in STAGE_NAMES:
            sys.stdout.write(print_graph(graph))
            return 0
        try:
            compile_graph(graph, options, _dump)
        except StopAfter as stop:  # the tile program after the stage (rank 0's)
            sys.stdout.write(stop.text)
        return 0
    if args.output is None:
        args.output = _default_output(args.model)
        _check_paths(args)  # the default name, as one given is checked before any work
    summary = _compile_cached(args, options, args.model, args.output)
    log.debug(f"wrote {args.output}: {os.path.getsize(args.output)} bytes")
    for k, part in enumerate(summary["parts"]):
        if part["kind"] == "chip":
            log.info(f"compiled {args.model} -> {args.output} for {summary['target']} in {progress.since_start():.2f} "
                     f"s: {f'chip part {k}: ' if summary['partitioned'] else ''}{part['instructions']} instructions "
                     f"({part['per_engine']}), {part['hbm_size']} bytes of HBM")
    for k, part in enumerate(summary["parts"]):
        if part["kind"] == "host":
            log.info(f"host part {k}: {', '.join(f'{op} x{n}' for op, n in part['ops'].items())} (onnxruntime on "
                     "the CPU)")
    return 0


def _npy_header(f: Any) -> tuple[tuple[int, ...], Any]:
    """The shape and dtype an .npy stream's header declares, read without its data."""
    import numpy as np

    version = np.lib.format.read_magic(f)
    header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
    shape, _, dtype = header(f)
    return tuple(shape), dtype


def _load_npz(path: str, expected: dict[str, TensorInfo]) -> dict[str, np.ndarray]:
    """The arrays of an .npz file (a regular file: a FIFO or a device is refused unread), each one's header checked
    against the shape and type `expected` of it before its data is read, so that a member declaring billions of
    elements costs nothing."""
    import zipfile

    import numpy as np

    from isa.files import open_regular
    from runtime.errors import InputError

    try:
        with open_regular(path) as archive:
            if not zipfile.is_zipfile(archive):
                hint = " (an .npy file holds one array: give it as --input NAME=FILE.npy)" \
                    if path.endswith(".npy") else ""
                raise UsageError(f"cannot read inputs from {path}: not an .npz archive{hint}")
            with zipfile.ZipFile(archive) as z:
                for member in z.namelist():
                    name = member[:-4] if member.endswith(".npy") else member
                    if name not in expected:
                        raise InputError(f"{path}: unknown input(s) {name} (the model takes {', '.join(expected)})")
                    with z.open(member) as f:  # the header only
                        shape, dtype = _npy_header(f)
                    _check_array(path, expected[name], shape, dtype)
            archive.seek(0)
            with np.load(archive, allow_pickle=False) as data:
                return {k: data[k] for k in data.files}
    except FileNotFoundError:  # missing is missing (NCC_IO), not an archive that is no archive
        raise
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as e:
        raise UsageError(f"cannot read inputs from {path}: {getattr(e, 'strerror', None) or e}") from None


def _load_npy(name: str, path: str, expected: dict[str, TensorInfo]) -> np.ndarray:
    """One input from an .npy file, its header checked against the input's shape and type before its data is
    read (an unknown name is the runtime's to name, with the inputs the model takes)."""
    import numpy as np

    from isa.files import open_regular

    try:
        with open_regular(path) as f:
            if name in expected:
                _check_array(path, expected[name], *_npy_header(f))
            f.seek(0)
            return np.load(f, allow_pickle=False)
    except FileNotFoundError:
        raise
    except (OSError, ValueError, EOFError) as e:
        raise UsageError(f"cannot read input {name} from {path}: {getattr(e, 'strerror', None) or e}") from None


def _check_array(path: str, info: TensorInfo, shape: tuple[int, ...], dtype: np.dtype) -> None:
    """An input read from `path` has the model's shape and type for it, or the error names the file."""
    from runtime.errors import InputError

    if shape != tuple(info.shape):
        raise InputError(f"{path}: input {info.name!r}: shape {list(shape)}, expected {list(info.shape)}")
    if dtype.name != info.dtype:
        raise InputError(f"{path}: input {info.name!r}: dtype {dtype.name}, expected {info.dtype} (save it with "
                         f".astype(np.{info.dtype}))")


def cmd_run(args: argparse.Namespace) -> int:
    comm = _mpi_job()
    if comm is None:
        return _run_bundle(args, None)
    from neuronx_cc_lite.mpi_start import partner_lost
    from runtime.errors import RanksError

    try:
        return _run_bundle(args, comm)
    except RanksError as e:
        if getattr(e, "partner_lost", False):  # set by runtime/ranks.py when it gave up on a process
            partner_lost()
        raise


def _run_bundle(args: argparse.Namespace, comm: Any) -> int:
    import numpy as np

    import runtime

    host = None
    if comm is not None:  # every process agrees on the bundle before any of them loads it
        from runtime.ranks import MpiRanks

        _agreed(comm, "the bundle", lambda: {"bundle": _bundle_header(args.bundle).sha256.hex()})
        host = MpiRanks(_bundle_header(args.bundle).num_cores, comm)
    progress.status(f"loading {args.bundle}")
    model = runtime.load(args.bundle, host=host, on_progress=progress.step)
    first = model.host.process == 0  # under mpiexec, the first process writes and reports for the job
    by_name = {i.name: i for i in model.inputs}

    def read_inputs() -> dict[str, np.ndarray]:
        found = _load_npz(args.inputs, by_name) if args.inputs else {}
        for name, path in args.input:
            found[name] = _load_npy(name, path, by_name)
        model.check_inputs(found)  # before the first collective: a process refusing its inputs stops them all
        return found

    if comm is None:
        inputs = read_inputs()
    else:
        holder: dict[str, dict[str, np.ndarray]] = {}
        _agreed(comm, "the inputs", lambda: _digest(holder.setdefault("inputs", read_inputs())))
        inputs = holder["inputs"]
    if args.profile and args.policy != "clock":
        raise UsageError("--profile needs simulated time: use it with --policy clock")
    if (args.state_in or args.state_out) and model.bundle.parts:
        raise UsageError("a bundle with host parts keeps no device state: run it without --state-in/--state-out")
    if args.state_in:
        for name, value in _load_npz(args.state_in, {t.name: t for t in model.bundle.state}).items():
            model.state.write(name, value)
    with progress.simulating(model):
        outputs = model.run(inputs, policy=args.policy, seed=args.seed, trace=bool(args.profile),
                            check_races=args.check_races)
    stats = model.last_run
    if not first:
        return 0
    if args.profile:
        import json

        from runtime.profile import utilization_table

        trace = _trace_module(model).chrome_trace(model)
        _write_atomic(args.profile, lambda f: f.write(json.dumps(trace).encode()))
        if not model.bundle.parts:
            log.info(utilization_table(stats))
    if args.state_out:
        state = {name: model.state.read(name) for name in model.state.names}
        _write_atomic(args.state_out, lambda f: np.savez(f, **state))
    if args.outputs:
        _write_atomic(args.outputs, lambda f: np.savez(f, **outputs))
    else:
        for name, value in outputs.items():
            print(f"{name}: {value.dtype}{list(value.shape)}\n{value}")
    log.info(f"ran {args.bundle}: {stats.instructions} instructions ({args.policy} policy); {_timing(model)}")
    return 0


def _trace_module(model: Any) -> Any:
    """Where the profile of a model's run comes from: runtime/profile.py, or runtime/host_profile.py for a bundle
    with host parts."""
    if model.bundle.parts:
        from runtime import host_profile

        return host_profile
    from runtime import profile

    return profile


def _timing(model: Any) -> str:
    """The last run's simulated latency and end-to-end time, as `run` and `check` report them."""
    stats = model.last_run
    if model.bundle.parts:
        return (f"{stats.device_ns / 1000:.2f} us simulated on the device, {stats.host_ns / 1000:.2f} us on the "
                f"host (onnxruntime, measured), {stats.elapsed_ns / 1000:.2f} us end to end with the launches and "
                f"the {stats.transfer_bytes} B copied between host and device")
    from runtime.profile import host_overhead_us

    host_us = host_overhead_us(model.bundle, model.target)
    return (f"{stats.elapsed_ns / 1000:.2f} us simulated; {stats.elapsed_ns / 1000 + host_us:.2f} us end to end "
            f"with the runtime's launch and input/output copies ({host_us:.2f} us)")


def _mpi_job() -> Any:
    """MPI's COMM_WORLD when mpiexec started this process among others (runtime/ranks.py), else None."""
    from runtime.ranks import launched_by_mpi, rank_timeout

    try:
        if not launched_by_mpi():
            return None
        timeout = rank_timeout()  # a bad $NEURONX_CC_LITE_RANK_TIMEOUT is said before any process waits on another
    except ValueError as e:
        raise UsageError(str(e)) from None
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        raise UsageError("started by mpiexec, but mpi4py is not installed: pip install 'neuronx-cc-lite[mpi]'") \
            from None
    from neuronx_cc_lite.mpi_start import start_world

    return start_world(timeout)  # MPI's own start-up, bounded as every later wait on another process is


def _bundle_header(path: str) -> Any:
    from isa import bundle as bundle_format
    from isa.files import open_regular
    from runtime.errors import LoadError

    try:
        with open_regular(path) as f:
            return bundle_format.read_header(f.read(bundle_format.HEADER_SIZE))
    except OSError as e:
        raise LoadError(f"cannot read {path}: {e.strerror}") from None


def _agreed(comm: Any, what: str, state: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """`state()` of this process, agreed on by every process of the MPI job (runtime.ranks.agree): this process's
    own error, after every process has heard of it, or RanksError when another failed or they differ."""
    from isa.errors import IsaError
    from runtime.errors import NeuronRuntimeError
    from runtime.ranks import agree

    try:
        mine = state()
    except (NeuronRuntimeError, IsaError, UsageError, OSError) as e:
        coded = isinstance(e, (NeuronRuntimeError, IsaError))  # their text starts with the code
        agree(comm, {"error": str(e) if coded else f"{getattr(e, 'code', 'NCC_IO')}: {e}"}, what)
        raise
    agree(comm, mine, what)
    return mine


def _digest(inputs: dict[str, np.ndarray]) -> dict[str, Any]:
    """What identifies a run's inputs: each one's name, dtype, shape and the sha256 of its bytes."""
    import hashlib

    import numpy as np

    return {"inputs": {name: [str(a.dtype), list(a.shape), hashlib.sha256(np.ascontiguousarray(a).tobytes())
                              .hexdigest()] for name, a in sorted(inputs.items())}}


# The arguments that name files a command reads, and those it writes (the log file included), with their flags
_READ_ARGS = ("model", "bundle", "inputs", "listing", "weights_from", "state_in")
_WRITE_ARGS = {"output": "-o", "outputs": "--outputs", "profile": "--profile", "json": "--json", "html": "--html",
               "logfile": "--logfile", "state_out": "--state-out"}


def _check_paths(args: argparse.Namespace) -> None:
    """Refuse, before any work, a command that would write (or append a log line) onto one of its own inputs,
    write two outputs to one file, or replace what is not a regular file (a device, a FIFO, a directory)."""
    import errno

    from isa.files import NotRegularFile, check_replaceable, same_file
    from isa.header import check_output

    reads = [getattr(args, a) for a in _READ_ARGS if isinstance(getattr(args, a, None), str)]
    reads += [path for _, path in getattr(args, "input", [])]
    for path in (*reads, *(getattr(args, a) for a in _WRITE_ARGS if isinstance(getattr(args, a, None), str))):
        if "\0" in path:  # no file has such a name; the OS calls would raise ValueError
            raise UsageError(f"the path {path!r} holds a NUL byte, which no file name can")
    if getattr(args, "logfile", None) and isinstance(getattr(args, "model", None), str):
        reads += _external_data(args.model)
    writes = [(flag, getattr(args, a)) for a, flag in _WRITE_ARGS.items() if isinstance(getattr(args, a, None), str)]
    for k, (flag, path) in enumerate(writes):
        for source in reads:
            if same_file(path, source):
                raise UsageError(f"the output {path} ({flag}) is the input {source}: writing it would destroy the "
                                 "input; choose another output file")
        for other_flag, other in writes[:k]:
            if same_file(path, other):
                raise UsageError(f"{other_flag} and {flag} name the same file {path}: one would destroy the other")
        if flag != "--logfile" and not os.path.isdir(os.path.dirname(os.path.abspath(path))):  # before any work
            raise FileNotFoundError(errno.ENOENT, "No such file or directory (its folder does not exist)", path)
        try:
            check_replaceable(path)
            if flag == "-o":  # a bundle (compile, asm)
                check_output(path)
        except (NotRegularFile, FileExistsError) as e:
            raise UsageError(f"{flag} {path}: {e.strerror}") from None


def _external_data(model: str) -> list[str]:
    """The external data files of a model, or none if it cannot be read (compiling it then says why)."""
    from neuronx_cc_lite.errors import CompileError
    from neuronx_cc_lite.model_files import external_paths, read_model

    try:
        return external_paths(read_model(model), os.path.dirname(os.path.abspath(model)))
    except CompileError:
        return []


def _default_output(model: str) -> str:
    """Where `compile` writes without -o: the model's name with .neff, in the working directory (neuronx-cc writes
    file.neff; a name per model keeps two compiles apart). A file of that name that is not a bundle is the user's:
    refused, as a usage error, rather than replaced."""
    from isa.header import MAGIC

    output = os.path.splitext(os.path.basename(model))[0] + ".neff"
    if os.path.lexists(output):
        try:
            with open(output, "rb") as f:
                ours = f.read(len(MAGIC)) == MAGIC
        except OSError:
            ours = False
        if not ours:
            raise UsageError(f"{output} exists and is not a bundle: give the output file with -o")
    return output


def _write_atomic(path: str, write: Callable[[Any], None]) -> None:
    from isa.files import replacing

    with replacing(path) as f:
        write(f)


def _remove(path: str) -> None:
    if os.path.exists(path):
        os.unlink(path)


def cmd_generate(args: argparse.Namespace) -> int:
    import json

    from neuronx_cc_lite.generate.command import generation

    try:
        result = generation(args)
    except ValueError as e:  # a request the model cannot meet: a prompt longer than the cache, ids past the vocabulary
        raise UsageError(str(e)) from None
    print(" ".join(map(str, result.tokens)))
    log.info(f"{len(result.tokens)} tokens{' (stop token)' if result.stopped else ''}: TTFT {result.ttft_us:.1f} us, "
             f"TPOT {result.tpot_us:.1f} us, {result.tokens_per_s:.1f} tokens/s on {args.target} (chip model plus "
             f"the runtime's overhead); {result.host_device_bytes_per_step} bytes between host and device per step")
    if args.json:
        text = json.dumps(result.to_json(), indent=1)
        _write_atomic(args.json, lambda f: f.write(text.encode()))
    return 0


def cmd_profile(args: argparse.Namespace) -> int:
    import json

    import runtime
    from neuronx_cc_lite.reference import bundle_inputs
    from runtime.profile import summarize, summary_text

    progress.status(f"loading {args.bundle}")
    model = runtime.load(args.bundle, on_progress=progress.step)
    inputs = bundle_inputs(model.bundle, args.seed)
    if args.inputs:
        inputs.update(_load_npz(args.inputs, {i.name: i for i in model.inputs}))
    with progress.simulating(model):
        model.run(inputs, trace=True)
    if model.bundle.parts:
        return _profile_parts(args, model)
    summary = summarize(model, top=args.top)
    print(summary_text(summary))
    if args.json:
        text = json.dumps(summary.to_json(), indent=1)
        _write_atomic(args.json, lambda f: f.write(text.encode()))
    if args.html:
        from runtime.report import render_html

        page = render_html(model.bundle, model.last_run, summary, title=os.path.basename(args.bundle))
        _write_atomic(args.html, lambda f: f.write(page.encode()))
    return 0


def _profile_parts(args: argparse.Namespace, model: Any) -> int:
    """`profile` of a bundle with host parts: each part's figures and the end to end (runtime/host_profile.py)."""
    import json

    from runtime import host_profile

    if args.html:
        raise UsageError("--html draws one chip program's timeline; this bundle has host parts: use run --profile "
                         "TRACE.json for the timeline of every part")
    print(host_profile.summary_lines(model, args.top))
    if args.json:
        text = json.dumps(host_profile.summary(model, args.top), indent=1)
        _write_atomic(args.json, lambda f: f.write(text.encode()))
    return 0


def cmd_disasm(args: argparse.Namespace) -> int:
    from isa import bundle as bundle_format
    from isa.assembly import disassemble
    from isa.operand import Engine
    from isa.streams import StreamId, stream_names

    b = bundle_format.read(args.bundle)
    streams = {name.upper() for name in args.engine} if args.engine else None
    queues = _target_of(b.target).dma_queues
    dma = [StreamId(Engine.DMA, q).name for q in range(queues)]
    unknown = sorted((streams or set()) - {*stream_names(queues), "DMA"})
    if unknown:
        raise UsageError(f"unknown engine {', '.join(unknown)} for --engine: a {b.target} core has "
                         f"{', '.join(stream_names(0))} and {dma[0]}..{dma[-1]} (DMA: every queue)")
    if streams and "DMA" in streams:
        streams |= set(dma)
    cores = set(args.core) if args.core else None
    ranks = max(len(chip.cores) for chip in b.chip_parts)
    if cores and not cores <= set(range(ranks)):
        raise UsageError(f"no core {', '.join(map(str, sorted(cores - set(range(ranks)))))} for --core: "
                         f"the bundle has {ranks} core(s), numbered from 0")
    for k, part in enumerate(b.parts):  # a bundle with host parts: each part in order (a listing to read)
        sys.stdout.write(f".part {k} {part.kind} " + json.dumps({"inputs": part.inputs, "outputs": part.outputs,
                                                                 **({"ops": part.ops} if part.ops else {})}) + "\n")
        if part.bundle is not None:
            sys.stdout.write(disassemble(part.bundle, data=not args.no_data, cores=cores, streams=streams))
    if not b.parts:
        sys.stdout.write(disassemble(b, data=not args.no_data, cores=cores, streams=streams))
    return 0


def cmd_asm(args: argparse.Namespace) -> int:
    from isa import bundle as bundle_format
    from isa.assembly import assemble
    from isa.files import read_regular
    from isa.limits import MAX_LISTING_BYTES
    from isa.validate import ValidationError, problems
    from isa.streams import StreamId

    try:
        text = read_regular(args.listing, MAX_LISTING_BYTES).decode("utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"cannot read {args.listing}: {getattr(e, 'strerror', None) or e}") from None
    weights = bundle_format.read(args.weights_from) if args.weights_from else None
    b = assemble(text, weights)
    target = _target_of(b.target)
    for c, core in enumerate(b.cores):
        for name, s in core.items():
            for i, instr in enumerate(s.instructions):
                found = problems(instr, StreamId.parse(name).engine, target, b.hbm_size)
                if found:
                    raise ValidationError(f"core {c} {name} #{i} {instr.op}: {'; '.join(found)}")
    bundle_format.write(b, args.output)
    log.info(f"assembled {args.listing} -> {args.output}")
    return 0


def _target_of(name: str) -> Target:
    """The target a bundle or listing names; one this tool does not model is a usage error."""
    from isa.target import get_target

    try:
        return get_target(name)
    except KeyError as e:
        raise UsageError(e.args[0]) from None


def bundle_info(path: str) -> dict[str, Any]:
    """What `info` reports of a bundle, as JSON-ready values: the header, the manifest, and what the program
    needs of the chip (SBUF and PSUM high-water marks, semaphores) and how long it runs (the simulator's timing,
    without computing any values)."""
    from isa import bundle as bundle_format
    from isa.files import open_regular
    from isa.operand import Mem
    from runtime.errors import LoadError
    from runtime.profile import estimated_latency_ns, host_overhead_us, on_chip_peak, roofline, semaphores_used

    try:
        with open_regular(path) as f:
            head = f.read(bundle_format.HEADER_SIZE)
    except OSError as e:
        raise LoadError(f"cannot read {path}: {e.strerror}") from None
    header = bundle_format.read_header(head)
    b = bundle_format.read(path)  # streamed, the weights mapped and never touched: a 2 GB bundle costs no 2 GB
    target = _target_of(b.target)
    if b.parts:
        return {"bundle": path, "format_version": header.version, "payload_bytes": header.payload_size,
                "sha256": header.sha256.hex(), "target": header.target, "compiler": b.compiler, "flags": b.flags,
                "stats": b.stats, "inputs": [bundle_format.signature_json(t) for t in b.inputs],
                "outputs": [bundle_format.signature_json(t) for t in b.outputs],
                "parts": [_part_info(k, p, target) for k, p in enumerate(b.parts)]}
    memories = {}
    for mem, capacity in ((Mem.SBUF, target.sbuf_partition_bytes), (Mem.PSUM, target.psum_partition_bytes)):
        row, partitions = on_chip_peak(b, mem)
        memories[mem.name.lower()] = {"peak_bytes_per_partition": row, "bytes_per_partition": capacity,
                                      "partitions_used": partitions, "partitions": target.partitions}
    line = roofline(b, target)
    return {
        "bundle": path,
        "format_version": header.version, "payload_bytes": header.payload_size, "sha256": header.sha256.hex(),
        "target": header.target, "cores": header.num_cores, "hbm_bytes": b.hbm_size,
        "ranks": b.ranks, "lnc": b.lnc, "groups": [list(g) for g in b.groups],
        "chips": -(-b.ranks // target.ranks_per_chip(b.lnc)),
        "compiler": b.compiler, "flags": b.flags, "stats": b.stats,
        "inputs": [t.to_json() for t in b.inputs], "outputs": [t.to_json() for t in b.outputs],
        "state": [t.to_json() for t in b.state],
        "weights": {"bytes": sum(len(s.data) for s in b.weights), "segments": len(b.weights)},
        "streams": [{name: len(s.instructions) for name, s in core.items()} for core in b.cores],
        **memories,
        "semaphores": {"used": semaphores_used(b), "per_core": target.semaphores},
        "estimated_latency_us": estimated_latency_ns(b, target) / 1000,
        "host_overhead_us": host_overhead_us(b, target),
        "roofline_us": line.ns / 1000, "roofline_bound": line.bound,
    }


def _part_info(k: int, part: Any, target: Target) -> dict[str, Any]:
    """A part of a bundle with host parts: what it reads and makes; a chip part's instructions and latency (the
    simulator's timing, no values), a host part's operators."""
    from runtime.profile import estimated_latency_ns, host_overhead_us

    info: dict[str, Any] = {"part": k, "kind": part.kind, "inputs": part.inputs, "outputs": part.outputs}
    if part.bundle is None:
        return {**info, "ops": part.ops, "onnx_bytes": len(part.onnx)}
    return {**info, "streams": [{name: len(s.instructions) for name, s in core.items()} for core in part.bundle.cores],
            "hbm_bytes": part.bundle.hbm_size, "estimated_latency_us": estimated_latency_ns(part.bundle, target) / 1000,
            "host_overhead_us": host_overhead_us(part.bundle, target)}


def _print_parts(info: dict[str, Any]) -> None:
    print(f"bundle        {info['bundle']}")
    print(f"format        version {info['format_version']}, payload {info['payload_bytes']} bytes, sha256 "
          f"{info['sha256']}")
    print(f"target        {info['target']}, {len(info['parts'])} parts run in turn on the chip and the host")
    print(f"compiler      {info['compiler']}")
    print(f"flags         {json.dumps(info['flags'], sort_keys=True)}")
    for kind in ("input", "output"):
        for t in info[f"{kind}s"]:
            shape = "[?]" if t["shape"] is None else str(["?" if n is None else n for n in t["shape"]])
            print(f"{kind:<13} {t['name']}: {t['dtype']}{shape.replace(chr(39), '')}"
                  + (" (its shape depends on the values)" if "?" in shape else ""))
    device = launches = 0.0
    for p in info["parts"]:
        where = f"reads {', '.join(p['inputs'])}; makes {', '.join(p['outputs'])}"
        if p["kind"] == "host":
            print(f"part {p['part']:<8} host (onnxruntime): {', '.join(f'{op} x{n}' for op, n in p['ops'].items())}; "
                  f"{where}")
            continue
        device += p["estimated_latency_us"]
        launches += p["host_overhead_us"]
        counts = ", ".join(f"{name} {n}" for name, n in p["streams"][0].items())
        print(f"part {p['part']:<8} chip: {counts}; {p['estimated_latency_us']:.2f} us estimated + "
              f"{p['host_overhead_us']:.2f} us launch and copies; {where}")
    print(f"latency       {device:.2f} us on the device and {launches:.2f} us of launches and copies, estimated; the "
          "host parts' time is measured when they run (profile)")


def cmd_info(args: argparse.Namespace) -> int:
    import json

    info = bundle_info(args.bundle)
    if args.json:
        print(json.dumps(info, indent=1))
        return 0
    if "parts" in info:
        _print_parts(info)
        return 0
    print(f"bundle        {info['bundle']}")
    print(f"format        version {info['format_version']}, payload {info['payload_bytes']} bytes, sha256 "
          f"{info['sha256']}")
    print(f"target        {info['target']}, {info['ranks']} rank(s) of {info['lnc']} core(s) each on "
          f"{info['chips']} chip(s), {info['hbm_bytes']} bytes of HBM per rank")
    for g, group in enumerate(info["groups"]):
        print(f"group {g:<7} ranks {', '.join(map(str, group))}")
    print(f"compiler      {info['compiler']}")
    print(f"flags         {json.dumps(info['flags'], sort_keys=True)}")
    for kind, key in (("input", "inputs"), ("output", "outputs"), ("state", "state")):
        for t in info[key]:
            where = ", ".join(f"rank {p['rank']} HBM {p['hbm_offset']}" + (
                f" [{p['start']}:{p['stop']} of axis {p['axis']}]" if t["shape"] and
                p["stop"] - p["start"] != t["shape"][p["axis"]] else "") for p in t["placements"])
            print(f"{kind:<13} {t['name']}: {t['dtype']}{t['shape']} (device {t['device_dtype']}) at {where}")
    print(f"weights       {info['weights']['bytes']} bytes in {info['weights']['segments']} segment(s)")
    for c, counts in enumerate(info["streams"]):
        print(f"rank {c:<8} {', '.join(f'{name} {n}' for name, n in counts.items())}")
    for mem in ("sbuf", "psum"):
        m = info[mem]
        share = m["peak_bytes_per_partition"] / m["bytes_per_partition"]
        print(f"{mem.upper():<13} peak {m['peak_bytes_per_partition'] / 1024:.1f} KiB of "
              f"{m['bytes_per_partition'] / 1024:.0f} KiB per partition ({share:.0%}), {m['partitions_used']} of "
              f"{m['partitions']} partitions (the highest byte any instruction touches)")
    sems = info["semaphores"]
    print(f"semaphores    {', '.join(map(str, sems['used']))} of {sems['per_core']} per core")
    print(f"latency       {info['estimated_latency_us']:.2f} us estimated (simulated timing, no values computed); "
          f"roofline {info['roofline_us']:.2f} us, {info['roofline_bound']}-bound")
    print(f"end to end    {info['estimated_latency_us'] + info['host_overhead_us']:.2f} us with the runtime's launch "
          f"and input/output copies ({info['host_overhead_us']:.2f} us)")
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    import tempfile

    import numpy as np

    import runtime
    from isa import bundle as bundle_format
    from neuronx_cc_lite.frontend import input_value_arrays, load_model
    from neuronx_cc_lite.precision import error_bound, the_casts_own
    from neuronx_cc_lite.reference import (bundle_inputs, compare, error_over_rms, onnxruntime_outputs,
                                           special_mismatches, within)

    options = _options(args)
    if options.state:  # onnxruntime would need the state as inputs, and give its next value as outputs
        raise UsageError("check compares one run with onnxruntime, which keeps no device state: compile with "
                         "--state, and check without it")
    proto = load_model(args.model)
    b = _compile_cached(args, options, proto)
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        path = os.path.join(tmp, "model.neff")
        bundle_format.write(b, path)
        model = runtime.load(path, on_progress=progress.step)
    inputs = bundle_inputs(b, args.seed)
    if args.inputs:
        inputs.update(_load_npz(args.inputs, {i.name: i for i in model.inputs}))
    with progress.simulating(model):
        actual = model.run(inputs)
    given = {**inputs, **input_value_arrays(proto, options.input_values)}  # what onnxruntime is given
    expected = onnxruntime_outputs(proto, given)
    bound = error_bound(options.auto_cast, options.auto_cast_type)
    ok = True
    for name, value in expected.items():
        if value.dtype.kind == "f" and not np.isfinite(value).all():
            count = int(np.count_nonzero(~np.isfinite(value)))
            print(f"note: onnxruntime's {name!r} has {count} inf or NaN of {value.size} on these inputs: they are "
                  "compared by position; give inputs that keep it finite with --inputs IN.npz to compare values")
    criterion = (f"max |err| <= {bound:.3g} x rms, the documented {options.auto_cast}/{options.auto_cast_type} "
                 "bound" if bound is not None else f"rtol {args.rtol}, atol {args.atol}")
    own = _cast_own_errors(proto, given, expected, options) if bound is not None else None
    if own is not None:
        print(f"cast own: err / rms of onnxruntime itself with what --auto-cast {options.auto_cast} narrows rounded "
              f"to {options.auto_cast_type} (the operands of MatMul, Gemm, Conv and ConvTranspose"
              + (", every fp32 value inside the model)" if options.auto_cast == "all" else ")"))
    print(f"{'output':<24} {'shape':<18} {'max abs err':>12} {'max rel err':>12} {'err / rms':>10}  "
          + (f"{'cast own':>10}  " if own is not None else "") + f"verdict ({criterion}; inf and NaN by position)")
    explained = []
    for name, value in actual.items():
        abs_err, rel_err = compare(value, expected[name])
        rms_err = error_over_rms(value, expected[name])
        good = within(value, expected[name], args.rtol, args.atol) if bound is None else rms_err <= bound
        ok &= good
        misplaced = special_mismatches(value, expected[name])
        cast_err = own.get(name) if isinstance(own, dict) else None
        column = "" if own is None else f"{cast_err:>10.2e}  " if cast_err is not None else f"{'n/a':>10}  "
        print(f"{name:<24} {str(list(value.shape)):<18} {abs_err:>12.3e} {rel_err:>12.3e} {rms_err:>10.2e}  "
              f"{column}{'ok' if good else 'MISMATCH'}" + (f" ({misplaced} inf or NaN not where onnxruntime has them)"
                                                           if misplaced else ""))
        if not good and cast_err is not None and bound is not None and the_casts_own(rms_err, cast_err, bound):
            explained.append(name)
    if isinstance(own, str):
        print(f"note: no cast's own error: {own}")
    if explained:
        print(f"note: {', '.join(map(repr, explained))} miss{'es' if len(explained) == 1 else ''} the bound by about "
              f"the cast's own error: the model's values do not take {options.auto_cast_type} there, whatever the "
              "compiler does (check without --auto-cast to see the compiler's own error in fp32)")
    print(f"{model.last_run.instructions} instructions; {_timing(model)}")
    return 0 if ok else 1


def _cast_own_errors(proto: Any, inputs: dict[str, Any], expected: dict[str, Any],
                     options: Any) -> dict[str, float] | str:
    """Per output, err / rms of onnxruntime run with what auto-cast narrows rounded to the cast type (reference.py
    cast_only_model), against the fp32 reference; or why there is none."""
    from neuronx_cc_lite.errors import CompileError
    from neuronx_cc_lite.reference import cast_only_model, error_over_rms, onnxruntime_outputs

    rounded = cast_only_model(proto, options.auto_cast, options.auto_cast_type)
    if rounded is None:
        return f"the model's opset has no Cast to {options.auto_cast_type}"
    try:
        found = onnxruntime_outputs(rounded, inputs, optimize=False)
    except CompileError as e:
        return e.message
    return {name: error_over_rms(found[name], value) for name, value in expected.items()
            if name in found and value.dtype.kind == "f"}


def cmd_analyze(args: argparse.Namespace) -> int:
    from neuronx_cc_lite.analyze import analyze, model_nodes, split_text
    from neuronx_cc_lite.frontend import import_file
    from neuronx_cc_lite.partition.host import refusals
    from neuronx_cc_lite.passes import run_pipeline

    options = _options(args)
    with progress.phase("import"):
        imported = import_file(args.model, options.input_shapes, options.input_values)
    nodes = model_nodes(imported)
    with progress.phase("passes"):
        graph = run_pipeline(imported)
    # An op the device has no lowering for is named as such; for the others a shape that is not static comes first,
    # as in compile (their declared checks read static shapes).
    found = refusals(graph)
    report = analyze(nodes, graph, found)
    sys.stdout.write(report.text())
    if options.fallback == "host" and found:
        sys.stdout.write(split_text(graph, found))
        return 0
    return 0 if not report.unsupported else 1


def cmd_list_operators(args: argparse.Namespace) -> int:
    from neuronx_cc_lite.ops.registry import INTERNAL_OPS, lowerings

    registered = lowerings()
    onnx_ops = sorted(op for op in registered if op not in INTERNAL_OPS)  # the compiler's own ops are not ONNX's
    for op in onnx_ops:
        print(f"{op:<28} since opset {registered[op].since}")
    print(f"{len(onnx_ops)} operators. Operators that ONNX defines as a function of others (Attention, the "
          "losses, Swish, ...) are expanded into their definition first and accepted when it uses these.")
    return 0


def cmd_bench_collective(args: argparse.Namespace) -> int:
    import json

    from isa.collectives import topology
    from isa.dtypes import DType
    from neuronx_cc_lite.bench_collective import bench, report

    target = _target_of(TARGET_ALIASES.get(args.target, args.target))
    lnc = target.default_lnc if args.lnc is None else args.lnc
    try:
        rows = bench(args.op, target, args.ranks, lnc, args.algorithm, args.min_bytes, args.max_bytes,
                     DType[args.dtype], args.check_bytes)
    except ValueError as e:
        raise UsageError(str(e)) from None
    done = list(rows)
    print(report(args.op, topology(target, lnc, args.ranks), args.algorithm, done, args.check_bytes))
    if args.json:
        _write_atomic(args.json, lambda f: f.write(json.dumps([r.to_json() for r in done], indent=1).encode()))
    return 0 if all(r.check in ("ok", "model") for r in done) else 1


def _add_logging_options(p: argparse.ArgumentParser, defaults: bool) -> None:
    """-q, --verbose and --logfile. Every subcommand takes them too, so that they may come anywhere on the command
    line; there they default to "not given", so as not to undo what came before the subcommand."""
    keep = {} if defaults else {"default": argparse.SUPPRESS}
    p.add_argument("-q", "--quiet", action="store_true", **keep,
                   help="only warnings and errors on stderr, whatever --verbose says (it still sets --logfile's "
                        "level)")
    p.add_argument("--verbose", type=neuronx_cc_flags.log_level, choices=LOG_LEVELS,
                   metavar="{" + ",".join(LOG_LEVELS) + "}", **keep,
                   help="what to say on stderr and in --logfile, in any case (WARN is warning): summary lines are "
                        "info, debug adds every pass and stage (default: info)")
    p.add_argument("--logfile", metavar="FILE", **keep,
                   help="also append every message at the --verbose level, with its time, to this file")


def build_parser() -> argparse.ArgumentParser:
    from neuronx_cc_lite import __version__

    parser = _Parser(
        prog=PROG,
        description="Compile ONNX models for a simulated Trainium/Inferentia2-class chip, run them, and look "
                    "inside.",
        epilog=EXAMPLES, formatter_class=_HelpFormatter)
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    _add_logging_options(parser, defaults=True)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    common = _Parser(add_help=False)
    _add_logging_options(common, defaults=False)

    def command(name: str, help: str) -> argparse.ArgumentParser:  # noqa: A002 - argparse's name
        return sub.add_parser(name, help=help, parents=[common], formatter_class=_HelpFormatter)

    p = command("compile", "compile an ONNX model to a bundle")
    p.add_argument("model", metavar="MODEL.onnx")
    p.add_argument("-o", "--output", metavar="OUT.neff",
                   help="bundle file to write (default: MODEL.neff in the working directory, the model's name with "
                        ".neff for .onnx; neuronx-cc writes file.neff)")
    _add_compile_options(p)
    p.set_defaults(run=cmd_compile)

    p = command("run", "run a bundle on the simulated chip")
    p.add_argument("bundle", metavar="BUNDLE.neff")
    p.add_argument("--inputs", metavar="IN.npz", help="inputs, keyed by the model's input names")
    p.add_argument("--input", type=_input_file_arg, action="append", default=[], metavar="NAME=FILE.npy",
                   help="one input from a .npy file (repeatable)")
    p.add_argument("--outputs", metavar="OUT.npz", help="write the outputs here (default: print them)")
    p.add_argument("--state-in", metavar="STATE.npz",
                   help="device state to start from, keyed by state name (default: zeros, as at load)")
    p.add_argument("--state-out", metavar="STATE.npz", help="write the device state after the run here")
    p.add_argument("--policy", choices=("clock", "random"), default="clock",
                   help="how engines interleave: simulated time or seeded random order")
    p.add_argument("--seed", type=int, default=0, help="seed of the random policy")
    p.add_argument("--check-races", action="store_true",
                   help="fail on two accesses to the same bytes, one a write, that no semaphore orders (slower)")
    p.add_argument("--profile", metavar="TRACE.json",
                   help="write a Chrome/Perfetto trace of every instruction and print how busy each engine was")
    p.set_defaults(run=cmd_run)

    p = command("profile", "run a bundle on the simulated chip and summarise where the time goes")
    p.add_argument("bundle", metavar="BUNDLE.neff")
    p.add_argument("--inputs", metavar="IN.npz",
                   help="inputs, keyed by the model's input names (default: seeded random ones, integers inside "
                        "the range the compiler recorded for them)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    p.add_argument("--top", type=int, default=8, help="how many tensors and ONNX nodes to list")
    p.add_argument("--json", metavar="OUT.json", help="also write the summary as JSON")
    p.add_argument("--html", metavar="REPORT.html",
                   help="also write a self-contained page: the summary, an engine timeline per core, SBUF and "
                        "PSUM in use over time, the top ONNX nodes")
    p.set_defaults(run=cmd_profile)

    p = command("disasm", "print the instruction listing of a bundle")
    p.add_argument("bundle", metavar="BUNDLE.neff")
    p.add_argument("--engine", action="append", metavar="STREAM",
                   help="only this stream: PE, ACT, DVE, POOL, SP, DMA (all queues) or DMA<n> (repeatable)")
    p.add_argument("--core", type=int, action="append", help="only this core (repeatable)")
    p.add_argument("--no-data", action="store_true", help="leave the weight bytes out")
    p.set_defaults(run=cmd_disasm)

    p = command("asm", "assemble a listing back into a bundle")
    p.add_argument("listing", metavar="LISTING")
    p.add_argument("-o", "--output", required=True, metavar="OUT.neff")
    p.add_argument("--weights-from", metavar="BUNDLE.neff", help="take weights from this bundle when the listing "
                   "was printed with --no-data")
    p.set_defaults(run=cmd_asm)

    p = command("info", "show a bundle's header, inputs, outputs, streams, SBUF/PSUM peaks, semaphores and "
                        "estimated latency")
    p.add_argument("bundle", metavar="BUNDLE.neff")
    p.add_argument("--json", action="store_true", help="print the same as one JSON object")
    p.set_defaults(run=cmd_info)

    p = command("check", "compile, run on the simulated chip and compare with onnxruntime")
    p.description = ("Compile MODEL.onnx, run it on the simulated chip and compare every output with\n"
                     "onnxruntime's: within --rtol and --atol in fp32; under --auto-cast, max |err| / rms\n"
                     "within the documented bound, printed beside the cast's own error (onnxruntime run\n"
                     "with what auto-cast narrows rounded to the type), with a note where a mismatch is\n"
                     "about that large. Exit status 1 on any mismatch.")
    p.add_argument("model", metavar="MODEL.onnx")
    p.add_argument("--rtol", type=float, default=1e-3, help="relative tolerance, when not auto-casting")
    p.add_argument("--atol", type=float, default=1e-4, help="absolute tolerance, when not auto-casting")
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    p.add_argument("--inputs", metavar="IN.npz", help="use these inputs instead of seeded random ones")
    _add_compile_options(p)
    p.set_defaults(run=cmd_check)

    p = command("analyze", "list a model's operators and which the compiler supports")
    p.add_argument("model", metavar="MODEL.onnx")
    _add_compile_options(p)
    p.set_defaults(run=cmd_analyze)

    p = command("bench-collective", "time a collective over many ranks on the simulated chips, as nccl-tests' "
                                    "*_perf does, checking results against numpy")
    p.add_argument("op", choices=("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "permute"))
    p.add_argument("--ranks", type=int, required=True, help="ranks (logical cores) in the group")
    p.add_argument("--target", default="trn1", help="trn1, inf2 or trn2")
    p.add_argument("--lnc", type=int, choices=(1, 2), help="physical cores per rank (default: the target's)")
    p.add_argument("--algorithm", choices=("auto", "ring", "rdh", "hierarchical", "mesh"), default="auto",
                   help="how the collective moves its data; auto: the fastest for each size")
    p.add_argument("--min-bytes", type=int, default=1024, metavar="B", help="first size, per rank")
    p.add_argument("--max-bytes", type=int, default=1 << 28, metavar="B", help="last size: doubled up to it")
    p.add_argument("--dtype", choices=("fp32", "bf16", "fp16", "fp8_e4m3", "fp8_e5m2", "int8", "int16", "int32",
                                       "uint8", "uint16", "uint32"), default="fp32", help="element type")
    p.add_argument("--check-bytes", type=int, default=64 << 20, metavar="B",
                   help="run with data and check against numpy the sizes whose bytes x ranks are at most B; "
                        "larger ones are timed by the cost model alone")
    p.add_argument("--json", metavar="FILE", help="also write the rows as JSON")
    p.set_defaults(run=cmd_bench_collective)

    p = command("generate", "generate tokens with a decoder whose KV cache stays on the device")
    from neuronx_cc_lite.generate.command import add_arguments
    add_arguments(p)
    p.set_defaults(run=cmd_generate)

    p = command("list-operators", "list the supported ONNX operators")
    p.add_argument("--framework", type=_framework_arg, default="ONNX", metavar="ONNX",
                   help="the framework whose operators to list, as neuronx-cc takes it: ONNX is the only one")
    p.set_defaults(run=cmd_list_operators)
    return parser


def _input_file_arg(text: str) -> tuple[str, str]:
    name, sep, path = text.partition("=")
    if not sep or not name or not path:
        raise argparse.ArgumentTypeError(f"expected NAME=FILE.npy, got {text!r}")
    return name, path


class _ConsoleFormatter(logging.Formatter):
    """Messages as they are; warnings and errors start the way every failure line does."""

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        if record.levelno >= logging.WARNING:
            return f"{PROG}: {record.levelname.lower()}: {message}"
        return message


class _LogFile(logging.FileHandler):
    """--logfile. A write that fails (a full disk) is said once on stderr, on one line, and the log file is given
    up; logging's own handler would print a traceback for every record."""

    def handleError(self, record: logging.LogRecord) -> None:  # noqa: N802 - logging's name
        error = sys.exc_info()[1]
        print(f"{PROG}: warning: NCC_IO: cannot write the log file {self.baseFilename}: "
              f"{getattr(error, 'strerror', None) or error}; no more is written to it", file=sys.stderr)
        self.setLevel(logging.CRITICAL + 1)


def _console_handler(args: argparse.Namespace) -> logging.StreamHandler[Any]:
    """The handler of the log records shown on stderr, at the level -q and --verbose ask for."""
    level = getattr(logging, (args.verbose or "info").upper())
    console = logging.StreamHandler(sys.stderr)  # the stderr of now: tests swap it per call
    console.setFormatter(_ConsoleFormatter())
    console.setLevel(max(level, logging.WARNING) if args.quiet else level)
    return console


def _start_logging(args: argparse.Namespace, console: logging.Handler) -> list[logging.Handler]:
    """Send the packages' log records to `console` (stderr) and to --logfile; returns the handlers, for
    _stop_logging."""
    level = getattr(logging, (args.verbose or "info").upper())
    handlers: list[logging.Handler] = [console]
    if args.logfile:
        keep = _LogFile(args.logfile, encoding="utf-8")
        keep.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        keep.setLevel(level)
        handlers.append(keep)
    for name in LOGGERS:
        logger = logging.getLogger(name)
        logger.setLevel(level)
        logger.propagate = False  # the root logger's handlers (an embedding program's) would say it twice
        for h in handlers:
            logger.addHandler(h)
    return handlers


def _stop_logging(handlers: list[logging.Handler]) -> None:
    for name in LOGGERS:
        logger = logging.getLogger(name)
        for h in handlers:
            logger.removeHandler(h)
        logger.setLevel(logging.NOTSET)
        logger.propagate = True
    for h in handlers:
        h.close()


def main(argv: list[str] | None = None) -> int:
    with interrupts.handled():  # from the first line: a signal while parsing or loading gives the coded line too
        try:
            status = _main(argv)
        except BaseException as e:
            if interrupts.interrupted_by(e) is None:
                raise
            print(f"{PROG}: error: {interrupts.message(e)}", file=sys.stderr)
            status = interrupts.status(e)
        mpi = sys.modules.get("neuronx_cc_lite.mpi_start")  # loaded only when mpiexec started this process
        return status if mpi is None else mpi.finish(status)  # MPI_Finalize, bounded, still under the handlers



def _main(argv: list[str] | None) -> int:
    progress.start_command(with_process=argv is None)  # the console script: the process is the command
    args = build_parser().parse_args(argv)
    console = _console_handler(args)
    # The status line shows from here: checking the paths loads the bundle format (numpy and ml_dtypes, a second or
    # more on a busy machine), and a command must say what it does within a second of its start.
    with progress.shown(console, enabled=not args.quiet):  # on a terminal only
        progress.status(f"{args.command}: loading")
        try:
            _check_paths(args)
        except UsageError as e:
            return _say(console, f"{e.code}: {e}", 2)
        except OSError as e:  # an output's folder that does not exist: said before any work
            return _say(console, f"NCC_IO: {e.filename}: {e.strerror}", 1)
        try:
            handlers = _start_logging(args, console)
        except OSError as e:
            return _say(console, f"NCC_IO: cannot open --logfile {args.logfile}: {e.strerror or e}", 1)
        neuronx_cc_flags.say_notes(args)
        try:
            return _run(args)
        finally:
            _stop_logging(handlers)


def _say(console: logging.StreamHandler[Any], message: str, status: int) -> int:
    """A failure before logging is set up: its one line, in the status line's place; returns the exit status."""
    console.stream.write(f"{PROG}: error: {message}\n")
    return status


def _coded_errors() -> tuple[type[Exception], ...]:
    """The errors that carry their code. The runtime's only once the runtime is loaded: importing its package loads
    the simulator (numpy, ml_dtypes: a second), and a command that never loaded it cannot have raised one."""
    from isa.errors import IsaError
    from neuronx_cc_lite.errors import CompileError

    runtime_errors = sys.modules.get("runtime.errors")
    return (CompileError, IsaError) + ((runtime_errors.NeuronRuntimeError,) if runtime_errors is not None else ())


def _run(args: argparse.Namespace) -> int:
    """The command's exit status; a failure is logged as one coded line."""
    try:
        return args.run(args)
    except BaseException as e:
        if interrupts.interrupted_by(e) is None:
            return _failed(e)
        # a signal's exception, or one its unwinding caused (a file closed under a read: EBADF), or one an import
        # turned into its own
        log.error(interrupts.message(e))
        return interrupts.status(e)


def _failed(error: BaseException) -> int:
    """The exit status of a command that failed on its own; its coded line is logged."""
    try:
        raise error  # (to sort it by the clauses below)
    except _coded_errors() as e:
        message = str(e)
    except UsageError as e:
        log.error(f"{e.code}: {e}")
        return 2  # as argparse's own usage errors
    except BrokenPipeError:  # the reader went away (`profile ... | head`): nothing left to say to it
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # as a shell reports a pipeline member that SIGPIPE stopped
    except OSError as e:
        message = f"NCC_IO: {e.filename or ''}: {e.strerror or e}"
    except MemoryError:
        message = ("NCC_HOST_MEMORY: this machine ran out of memory for the command (the model's tensors, or the "
                   "simulated chip's memories, are larger than it can hold)")
    except Exception as e:  # a bug of ours: say so on one line, keep the traceback for those who ask
        if os.environ.get("NCC_TRACEBACK"):
            raise
        message = (f"NCC_INTERNAL: internal error: {type(e).__name__}: {e} (set NCC_TRACEBACK=1 for the "
                   "traceback, and please report it)")
    log.error(message)
    return 1


if __name__ == "__main__":
    sys.exit(main())
