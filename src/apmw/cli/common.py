"""What every verb shares: the typer app, consoles, error exits, JSON output."""

from __future__ import annotations

import json
import os
import signal
import sys
import tempfile
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import NoReturn

import typer
from rich.console import Console
from rich.measure import Measurement
from rich.progress import Progress, ProgressColumn
from rich.table import Table
from rich.text import Text

from apmw.errors import ApmwError

# Exit codes, one meaning each (README, "Exit codes"): 1 bad input (a spec, a trace, a flag: the
# command-line parser's errors too), 2 no number of agents meets the SLO, 3 `plan --verify`'s
# simulator misses the SLO, 70 an internal error (a bug; BSD sysexits EX_SOFTWARE), 130 interrupted.
USER_ERROR_EXIT = 1
INTERNAL_ERROR_EXIT = 70
INTERRUPTED_EXIT = 130

# Help text is printed as written: rich markup would read "a:b:step" as an emoji code.
app = typer.Typer(add_completion=False, no_args_is_help=True, rich_markup_mode=None, pretty_exceptions_enable=False,
                  help="Agents per megawatt: size LLM agent-serving fleets by task-latency SLO.")
out = Console(emoji=False)
err = Console(stderr=True, emoji=False)
# The widest a table is printed into a file or a pipe (print_table): its own width up to this.
MAX_PIPED_WIDTH = 400


def plain_table(title: str, **options) -> Table:
    """A rich Table whose title and cells (:func:`plain_row`) are printed as written: a workload, file or GPU name
    with ``[x]`` in it is text, not a markup tag (``[/]`` in a name was an internal error)."""
    return Table(title=Text(title), **options)


def plain_row(table: Table, *cells: str) -> None:
    """Add ``cells`` to ``table`` as written (:func:`plain_table`)."""
    table.add_row(*(Text(c) for c in cells))


def print_table(table: Table) -> None:
    """Print ``table`` on stdout whole: where stdout is a file or a pipe, which has no width, at the width the table
    needs (past 80 columns, rich cut its figures to '$9,4…'); on a terminal at the terminal's width, or, where the
    terminal is too narrow for it without cutting a word, one row after another (:func:`table_records`)."""
    needed = Measurement.get(out, out.options.update(width=MAX_PIPED_WIDTH), table)
    if out.is_terminal:
        out.print(table if needed.minimum <= out.width else table_records(table))
        return
    Console(file=out.file, emoji=False, width=max(out.width, min(needed.maximum, MAX_PIPED_WIDTH)),
            color_system=out.color_system).print(table)


def table_records(table: Table) -> Text:
    """``table`` as records: its title, then each row's first cell and under it every other column's header and
    cell on a line of its own (a cell of several lines joined by commas; an empty one, '-', left out), in the
    row's style. What a terminal narrower than the table shows instead of cutting its figures."""
    headers = [str(c.header) for c in table.columns]
    cells = [[str(cell).replace("\n", ", ") for cell in c.cells] for c in table.columns]
    pad = max((len(h) for h in headers[1:]), default=0)
    text = Text(f"{table.title}\n" if table.title else "")
    for i, first in enumerate(cells[0] if cells else []):
        style = (table.rows[i].style or "") if i < len(table.rows) else ""
        fields = [f"  {h:<{pad}}  {col[i]}" for h, col in zip(headers[1:], cells[1:]) if col[i] not in ("", "-")]
        text.append("\n".join([first, *fields]) + "\n", style=style)
    text.rstrip()
    return text


class SafeInterrupt:
    """Ctrl-C (SIGINT) held until the work reaches a point where stopping is safe (:meth:`check`, and the end of the
    ``with`` block): Python raises KeyboardInterrupt wherever the signal lands, and one that lands inside a
    finalizer is printed as 'Exception ignored' and lost, so the work ran on to the end as if never interrupted. A
    second Ctrl-C interrupts at once, as usual. Outside the main thread, or with ``hold`` False, it does nothing."""

    def __init__(self, hold: bool = True) -> None:
        self.hold = hold            # False: Ctrl-C acts at once, as without this
        self.pending = False
        self._previous = None

    def __enter__(self) -> "SafeInterrupt":
        if self.hold and threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._held)
        return self

    def _held(self, signum, frame) -> None:
        self.pending = True
        signal.signal(signal.SIGINT, self._previous)      # a second Ctrl-C is not held

    def check(self) -> None:
        """Raise the held Ctrl-C, if any, as KeyboardInterrupt."""
        if self.pending:
            self.pending = False
            raise KeyboardInterrupt

    def __exit__(self, kind, exc, tb) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
        if kind is None:
            self.check()


def progress_bar(*columns: str | ProgressColumn, console: Console, disable: bool = False) -> Progress:
    """A progress bar that leaves nothing behind, drawn only on a terminal: output piped or redirected to a file
    gets no bar, and no blank line where a bar was (rich ends a transient bar on a file with one)."""
    return Progress(*columns, console=console, transient=True, disable=disable or not console.is_terminal)


def fail(message: str, code: int = USER_ERROR_EXIT) -> NoReturn:
    """Print a user error (never a traceback) and exit with ``code``. The message is printed as
    written: no markup or emoji codes are read in it (a file name with ``[x]`` or ``:100:``)."""
    err.print(Text.assemble(("error:", "bold red"), " ", message), highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def file_path(value: str | Path) -> Path:
    """An output option's value as a path (typer's ``parser``), refused where its form names a folder: empty, or
    ending in a slash. ``Path`` drops the slash, so ``-o out/`` for a folder that does not exist yet would be
    written as a file named ``out``. An option's default comes through as the ``Path`` it is."""
    if isinstance(value, Path):
        return value
    if value == "":
        raise typer.BadParameter("the path is empty; give a file path")
    if value.endswith(("/", os.sep)):
        raise typer.BadParameter(f"{value} ends in '/', so it names a folder; give a file path (a name after the "
                                 "slash)")
    return Path(value)


def output_path(path: Path, flag: str, inputs: Iterable[Path | str | None] = (), put_in_place: bool = False,
                example: str = "out") -> Path:
    """``path`` when a file can be written there, else a user error naming ``flag``: checked before
    any work, so that a long run does not end in a failed write, and never one of the command's ``inputs``
    (writing there would replace the spec or trace read). An output ``put_in_place`` (a Parquet file, written
    whole and renamed there, or removed when its write fails) is never a device, pipe or socket either: it
    would replace it (text outputs write into one, such as /dev/stdout). ``example`` names a file for the
    advice when ``path`` is a folder."""
    if str(path) == "-":
        fail(f"{flag} -: this output is written to a file (a file named '-' is not what '-' usually means); give a "
             "file path")
    from apmw.spec.load import is_link_loop

    if is_link_loop(path):
        fail(f"{flag} {path} is a symbolic link that leads back to itself (a loop of links): remove the link or "
             "choose another path")
    if path.is_dir():
        fail(f"{flag} {path} is a folder; give a file path inside it, e.g. {path / example}")
    if not path.parent.is_dir():
        if path.parent.exists():
            fail(f"{flag} {path}: {path.parent} is a file, not a folder; choose a path in a folder")
        fail(f"{flag} {path}: the folder {path.parent} does not exist; create it or choose another path")
    if put_in_place and path.exists() and not path.is_file():
        fail(f"{flag} {path} is not a regular file (a device, pipe or socket), which writing the output would "
             "replace; choose a file path")
    for given in inputs:
        if given is not None and _same_file(path, Path(given)):
            fail(f"{flag} {path} is the input {given}; writing there would replace it: choose another path")
    why = _unwritable(path)
    if why:
        fail(f"{flag} {path}: cannot write there ({why}); choose another path")
    return path


def files_read_by(path: Path | None) -> list[Path]:
    """The files a spec or a fleet file names, which a run reads beside it: a fleet file's workload specs, and each
    spec's ``model.config`` and ``serving.speculative.draft_model`` where they are on disk. An output path must
    replace none of them (:func:`output_path`'s ``inputs``). A file that cannot be read names none: loading it
    reports that."""
    data = _parsed(path) if path is not None else None
    if not isinstance(data, dict):
        return []
    named = []
    workloads = data.get("workloads")
    for w in workloads if isinstance(workloads, list) else []:
        if isinstance(w, dict) and isinstance(w.get("spec"), str):
            spec = path.parent / w["spec"]
            named += [spec, *_model_files(_parsed(spec))]
    return named + _model_files(data)


def _parsed(path: Path) -> object:
    """The YAML document at ``path``, or None where it cannot be read."""
    from apmw.spec import SpecError
    from apmw.spec.load import load_yaml

    try:
        return load_yaml(path) if path.is_file() else None
    except (SpecError, OSError, ValueError):
        return None


def _model_files(spec: object) -> list[Path]:
    """A parsed spec's model files on disk: its config and its draft's (a checkpoint folder's config.json)."""
    from apmw.catalog.models import local_path, on_disk

    sections = spec if isinstance(spec, dict) else {}
    model, serving = sections.get("model"), sections.get("serving")
    speculative = serving.get("speculative") if isinstance(serving, dict) else None
    names = [model.get("config") if isinstance(model, dict) else None,
             speculative.get("draft_model") if isinstance(speculative, dict) else None]
    files = []
    for name in names:
        if isinstance(name, str) and on_disk(name):
            p = local_path(name)
            files.append(p / "config.json" if p.is_dir() else p)
    return files


def _unwritable(path: Path) -> str | None:
    """Why no file can be written at ``path``, found by trying (a permission check passes for root, and some
    folders, /proc's, refuse new files whatever their modes say): an existing file opened for appending, nothing
    written; else a probe file created beside it and removed. None when it can."""
    try:
        if path.exists():
            with open(path, "ab"):
                pass
        else:
            fd, probe = tempfile.mkstemp(dir=path.parent, prefix=".apmw-write-probe-")
            os.close(fd)
            os.unlink(probe)
    except OSError as exc:
        return exc.strerror or str(exc)
    return None


def distinct_outputs(outputs: dict[str, Path | None], json_on_stdout: bool = False) -> None:
    """No two output flags name the same file (the second write would replace the first), nor, with ``--json``
    printing to standard output, that output (/dev/stdout: the file and the JSON would interleave)."""
    given = [(flag, path) for flag, path in outputs.items() if path is not None]
    if json_on_stdout:
        for flag, path in given:
            if _is_stdout(path):
                fail(f"{flag} {path} writes to standard output, where --json prints its document: the two would "
                     f"mix; give {flag} a file, or leave out --json")
    for i, (flag, path) in enumerate(given):
        for other, there in given[i + 1:]:
            if _same_file(path, there):
                fail(f"{flag} and {other} both write {path}; give each its own path")


def _is_stdout(path: Path) -> bool:
    try:
        here, out = os.stat(path), os.fstat(sys.stdout.fileno())
    except (OSError, ValueError):
        return False
    return (here.st_dev, here.st_ino) == (out.st_dev, out.st_ino)


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.exists() and b.exists() and os.path.samefile(a, b) or a.resolve() == b.resolve()
    except (OSError, RuntimeError):     # RuntimeError: a loop of symbolic links (Path.resolve before 3.13)
        return False


def write_text(path: Path, text: str, flag: str) -> None:
    """Write an output file; an OS refusal (permissions, a full disk) is the user's to fix, with the reason."""
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as exc:
        fail(f"{flag} {path}: cannot write it ({exc.strerror or exc})")


def emit_json(obj: object) -> None:
    """One JSON document on stdout (NaN/inf are bugs, so they raise)."""
    sys.stdout.write(json.dumps(obj, indent=2, allow_nan=False) + "\n")


def parse_sweep(text: str, most_agents: int | None = None, most_points: int | None = None,
                also: str | None = None) -> list[int]:
    """``--agents-sweep a:b[:step]`` -> [a, a+step, ..., <= b] (step 1 left out), as simulate and bench read it;
    a clear error otherwise (naming ``also``, a word the verb reads besides), and where a verb bounds them, past
    ``most_agents`` or ``most_points``."""
    try:
        parts = [int(p) for p in text.split(":")]
    except ValueError:
        parts = []
    if len(parts) not in (2, 3) or parts[0] < 1 or parts[1] < parts[0] or (len(parts) == 3 and parts[2] < 1):
        raise ApmwError(f"--agents-sweep {text!r}: give a:b[:step] with whole numbers 1 <= a <= b and step >= 1 "
                        "(1 when left out), e.g. 10:100:10" + (f", or {also}" if also else ""))
    a, b = parts[0], parts[1]
    step = parts[2] if len(parts) == 3 else 1
    if most_agents is not None and b > most_agents:
        raise ApmwError(f"--agents-sweep {text!r}: at most {most_agents:,} agents are simulated; lower b")
    points = (b - a) // step + 1
    if most_points is not None and points > most_points:
        raise ApmwError(f"--agents-sweep {text!r} has {points:,} points; at most {most_points} are simulated "
                        f"(each is a full run): use a step of at least {-(-(b - a + 1) // most_points)}")
    return list(range(a, b + 1, step))


def say(message: str | Text) -> None:
    """A line on stderr, printed as written and never cut by rich: no markup is read in it (a path with ``[/]`` in
    it), and a long line is left for the terminal to wrap, so a path or a ``file:line`` stays whole in a log for
    copying and grep (rich wraps a pipe at 80 columns)."""
    err.print(message, highlight=False, markup=False, soft_wrap=True)


def note(message: str) -> None:
    """A remark on stderr that does not stop the verb (stdout stays clean for --json)."""
    err.print(Text.assemble(("note:", "yellow"), " ", message), highlight=False, soft_wrap=True)


def warn(message: str) -> None:
    """A figure the reader should not trust as printed, on stderr (stdout stays clean for --json)."""
    err.print(Text.assemble(("warning:", "yellow"), " ", message), highlight=False, soft_wrap=True)


def note_gpu_basis(gpu) -> None:
    """Say so when the GPU's step times are least checked (``gpu``: a catalogue name or a spec's GPU entry)."""
    from apmw.errors import ApmwError
    from apmw.perf.efficiency import roofline_caveat
    from apmw.perf.replica import resolve_gpu

    try:
        g = resolve_gpu(gpu)
    except ApmwError:
        return          # the verb reports the bad GPU itself
    caveat = roofline_caveat(g.name, g.vendor)
    if caveat:
        note(caveat)


def note_moe_exchange(step) -> None:
    """Say so when a replica's MoE token exchange is estimated past the EP sizes measured on its system
    (``step``: the replica's step model)."""
    floor = step.moe_exchange_floor_ep
    if floor is not None:
        note(f"the MoE dispatch/combine at EP {step.parallel.ep} on {step.gpu.name} is past the EP sizes measured "
             f"there (up to {floor}): it is priced by the link-bandwidth formula, no faster than EP {floor}'s "
             "measurement, an estimate (sources.step_time in --json names the tables)")


def note_tensor_parallel_scaleout(step) -> None:
    """:func:`note_scaleout` for a replica's step model."""
    lay = step.parallel
    note_scaleout(step.gpu, lay.tp, lay.tp * lay.dp if lay.ep > 1 else 1)


def note_scaleout(gpu, tp: int, expert_gpus: int = 1) -> None:
    """Say so when a replica's tensor-parallel group, or the GPUs its routed experts are spread over
    (``expert_gpus``: tp x dp_attention under expert parallelism, else 1), is larger than its GPU's scale-up
    domain: their all-reduces or token exchange cross the scale-out network
    (:func:`apmw.perf.interconnect.link_bandwidth_bytes_per_s`)."""
    from apmw.perf.interconnect import link_bandwidth_bytes_per_s, scaleup_domain_gpus

    domain = scaleup_domain_gpus(gpu)
    if tp > domain:
        note(f"tensor parallelism over {tp} GPUs crosses the {domain}-GPU scale-up domain of {gpu.name}: its "
             f"all-reduces are priced at the scale-out network's {link_bandwidth_bytes_per_s(gpu, tp) / 1e9:.0f} "
             f"GB/s per GPU, a ring paced by its slowest hop (apmw model --systems lists the links); engines run "
             "tensor parallelism inside a node, and pipeline stages or expert parallelism across nodes")
    elif expert_gpus > domain:
        note(f"expert parallelism over {expert_gpus} GPUs crosses the {domain}-GPU scale-up domain of {gpu.name}: "
             "its MoE dispatch/combine is priced at the scale-out network's "
             f"{link_bandwidth_bytes_per_s(gpu, expert_gpus) / 1e9:.0f} GB/s per GPU (apmw model --systems lists the "
             "links), by the link-bandwidth formula: no table measures an exchange across nodes")


def note_draft_memory(draft: str | None, draft_model: str | None = None) -> None:
    """Say what a separate draft model left unnamed leaves out of memory (a named one, and the model's own MTP
    modules, are counted: apmw.perf.memory)."""
    if draft == "model" and draft_model is None:
        note("speculative decoding with a separate draft model: its weights and KV are not counted in memory "
             "(apmw knows only its cost and acceptance): the KV pool is overstated by their size; name the draft "
             "(serving.speculative.draft_model, --draft-model) to count them")


def note_speculation_loss(figures: dict | None) -> None:
    """Say so where speculative decoding as priced yields fewer tokens an iteration than it multiplies the
    iteration's time by (``figures``: :func:`apmw.capacity.benchmark.speculative_figures`): a draft as large as the
    target, or a low acceptance, makes each token slower than without it."""
    if figures is None:
        return
    tokens, factor = figures["tokens_per_iteration"], 1.0 + figures["draft_cost_fraction"]
    if tokens <= factor:
        note(f"speculative decoding as priced yields {tokens:.2f} tokens an iteration but makes each iteration "
             f"{factor:.2f}x as long (draft_cost_fraction {figures['draft_cost_fraction']:.2f}): decoding is slower "
             "than without it; a smaller draft, or fewer draft tokens, or none")


def note_context_window(model: str) -> None:
    """Say so when the model's config gives no context window, so that prompts past it go unchecked."""
    from apmw.arch import load_architecture
    from apmw.arch.config import UNKNOWN_WINDOW
    from apmw.errors import ApmwError

    try:
        arch = load_architecture(model)
    except ApmwError:
        return          # the verb reports a config it cannot read itself
    if arch.max_context_tokens is None:
        note(f"'{model}': {UNKNOWN_WINDOW}")


def note_checkpoint_dtype(model: str, weight_dtype: str, moe_dtype: str | None = None) -> None:
    """Say so when a checkpoint's name, or else its config.json, states other weights than the dtypes being
    priced ("...-FP8", or DeepSeek-R1's fp8 quantization_config, priced at bf16; DeepSeek-V4's fp4 experts beside
    its fp8 layers, priced at one dtype): the dtypes are the user's to give, but a mismatch is usually a slip."""
    from apmw.arch import load_architecture
    from apmw.catalog.models import checkpoint_weight_dtype, config_weight_dtype
    from apmw.errors import ApmwError
    from apmw.spec.spellings import dtype_key

    named, said, experts = checkpoint_weight_dtype(model), "names {} weights", None
    if named is None:
        named, said = config_weight_dtype(model), "stores {} weights (its config.json's quantization_config)"
        try:        # the experts' dtype where the config says it (a name states one dtype for all)
            experts = load_architecture(model).expert_dtype_in_checkpoint
        except ApmwError:
            pass    # the verb reports a config it cannot read itself
    priced_experts = dtype_key(moe_dtype or weight_dtype)
    if named and experts and experts != named:
        if named != dtype_key(weight_dtype) or experts != priced_experts:
            note(f"'{model}' {said.format(named)} and its routed experts in {experts}, but {weight_dtype} weights "
                 f"and {priced_experts} experts are priced; give --weight-dtype {named} --moe-dtype {experts} "
                 f"(weight_dtype: {named}, moe_dtype: {experts} in a spec) if that is what it serves")
    elif named and named != dtype_key(weight_dtype):
        note(f"'{model}' {said.format(named)}, but {weight_dtype} weights are priced; give "
             f"--weight-dtype {named} (weight_dtype: {named} in a spec) if that is what it serves")
