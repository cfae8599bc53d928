"""Read a spec from YAML with errors that point at the file, line and field.

YAML is parsed with ``yaml.safe_load`` semantics (no arbitrary objects), by a loader that also
refuses what a spec never needs and a hostile file could use: a key given twice (YAML would keep
the last silently), more aliases than a spec could use (an "alias bomb" expands exponentially),
and nesting deeper than any spec section. The composed document also records where each key
sits, so that a pydantic error on ``workload.tool_wait_s.p95`` can be reported as
``coding-agent.yaml:14: workload.tool_wait_s.p95: ...``.
"""

from __future__ import annotations

import codecs
import difflib
import errno
import os
import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from apmw.spec.model import Spec, SpecSource
from apmw.spec.section import line_for, named_field


# A spec is a few dozen keys, at most five levels deep (spec -> hardware -> gpu -> field, or a
# distribution's quantiles); these limits leave ample room and stop a file from making the loader
# expand or recurse without bound.
MAX_ALIASES = 100
MAX_DEPTH = 32
# A file of MAX_SPEC_BYTES writes out well under this many values; more can only come from aliases repeating one
# another (an "alias bomb": nine aliases nine deep expand to 9^10 values), which every reader of the data would walk.
MAX_EXPANDED_VALUES = 1_000_000
# The longest whole number read: Python converts at most 4,300 digits (sys.get_int_max_str_digits); a shorter one
# too large for its field is refused there, by the field's name.
MAX_INT_CHARS = 4000
# Larger than any spec (the bundled ones are 2-3 kB); bigger files are refused before parsing.
MAX_SPEC_BYTES = 1 << 20


class SpecError(ValueError):
    """A spec that cannot be used, with every problem found and where it is."""

    def __init__(self, path: str, problems: list[str], kind: str = "spec"):
        self.path = path
        self.problems = problems
        super().__init__(f"{path}: invalid {kind}\n" + "\n".join(f"  {p}" for p in problems))


def _key_lines(node: yaml.Node, prefix: tuple = (), seen: set[int] | None = None) -> dict[tuple, int]:
    """Map each key path (as tuple of keys / indices) to its 1-based line.

    An aliased node is walked once, where it is defined: walking every place an alias repeats it
    would cost what the aliases expand to."""
    seen = set() if seen is None else seen
    lines: dict[tuple, int] = {}
    if id(node) in seen:
        return lines
    seen.add(id(node))
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            path = prefix + (key_node.value,)
            lines[path] = key_node.start_mark.line + 1
            lines.update(_key_lines(value_node, path, seen))
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            lines[prefix + (i,)] = item.start_mark.line + 1
            lines.update(_key_lines(item, prefix + (i,), seen))
    return lines


_line_for = line_for


# Engine options people copy from a launch command, and the spec field each maps to (vLLM's
# engine arguments, SGLang's server arguments, TensorRT-LLM's LLM API).
ENGINE_SPELLINGS = {
    "tensor_parallel_size": ("hardware.gpus_per_replica", "vLLM"), "tp_size": ("hardware.gpus_per_replica", "SGLang"),
    "tp": ("hardware.gpus_per_replica", "SGLang"),
    "max_num_seqs": ("serving.max_batch", "vLLM"), "max_running_requests": ("serving.max_batch", "SGLang"),
    "max_batch_size": ("serving.max_batch", "TensorRT-LLM"),
    "max_num_batched_tokens": ("serving.max_batched_tokens", "vLLM"),
    "chunked_prefill_size": ("serving.max_batched_tokens", "SGLang"),
    "max_num_tokens": ("serving.max_batched_tokens", "TensorRT-LLM"),
    "gpu_memory_utilization": ("serving.kv_memory_fraction", "vLLM"),
    "mem_fraction_static": ("serving.kv_memory_fraction", "SGLang"),
    "free_gpu_memory_fraction": ("serving.kv_memory_fraction", "TensorRT-LLM"),
    "enable_prefix_caching": ("serving.prefix_caching", "vLLM"),
    "kv_cache_dtype": ("model.kv_dtype", "vLLM"), "dtype": ("model.weight_dtype", "vLLM"),
    "enable_dp_attention": ("serving.attention_data_parallel", "SGLang"),
}


def _section_fields(loc: tuple) -> list[str]:
    """The field names of the section that holds ``loc``'s last key (top-level sections only)."""
    if len(loc) == 1:
        return list(Spec.model_fields)
    info = Spec.model_fields.get(str(loc[0]))
    model = getattr(info, "annotation", None) if info is not None else None
    return list(getattr(model, "model_fields", {})) if len(loc) == 2 else []


def _unknown_field(loc: tuple) -> str:
    name = str(loc[-1]) if loc else ""
    if name in ENGINE_SPELLINGS:
        field, engine = ENGINE_SPELLINGS[name]
        return f"unknown field; did you mean {field}? ({name} is how {engine} spells it)"
    close = difflib.get_close_matches(name, _section_fields(loc), n=1, cutoff=0.6)
    if close:
        return f"unknown field; did you mean {'.'.join(str(p) for p in loc[:-1]) + '.' if len(loc) > 1 else ''}{close[0]}?"
    return "unknown field (check the spelling; see the README's spec reference)"


def _describe(err: dict[str, Any], loc: tuple = ()) -> str:
    if err["type"] == "missing":
        return "missing (required)"
    if err["type"] == "extra_forbidden":
        return _unknown_field(loc)
    if err["msg"].startswith("Value error, "):     # a section's own rule, in its own words
        return err["msg"].removeprefix("Value error, ")
    return f"{err['msg']} (got {_given(err.get('input'))})"


def _given(value: Any) -> str:
    """A value as the user wrote it, for an error beside pydantic's own words."""
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, str):
        return f"the text '{value if len(value) <= 40 else value[:37] + '...'}'"
    return repr(value)


def _clean_loc(loc: tuple) -> tuple:
    # pydantic adds union member names (e.g. 'str', 'GpuOverride') and 'function-before[...]' to locations
    return tuple(
        p for p in loc if not (isinstance(p, str) and (p[:1].isupper() or p.startswith("function-") or p == "str"))
    )


def error_location(err: dict[str, Any]) -> tuple:
    """The key path an error is about: pydantic's location, and below it the field a section's own check named
    (:class:`apmw.spec.section.FieldError`), whose line the error then gives."""
    return _clean_loc(err["loc"]) + named_field(err)


def without_union_noise(errors: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Pydantic's errors less those of a union's other members: where a field takes a name or a mapping
    (``hardware.gpu``) and a mapping was given, "should be a valid string" beside the mapping's own errors."""
    located = [error_location(e) for e in errors]
    return [e for e, loc in zip(errors, located)
            if not (e["type"] == "string_type" and any(len(o) > len(loc) and o[:len(loc)] == loc for o in located))]


def spec_from_dict(data: Any, path: str = "<spec>", lines: dict[tuple, int] | None = None) -> Spec:
    """Validate a parsed document, raising :class:`SpecError` with every problem."""
    if not isinstance(data, dict):
        raise SpecError(path, ["the file must be a YAML mapping with sections workload, model, hardware, slo, cost"])
    if "axes" in data and "workload" not in data:
        raise SpecError(path, ["a search space (a top-level 'axes' map), not a spec: give it with --space, after the "
                               "spec: apmw search SPEC --space SPACE"])
    if "workloads" in data and "workload" not in data:
        raise SpecError(path, ["a fleet file (a top-level 'workloads' list), not one workload's spec: size it with "
                               "apmw fleet FILE; this verb takes a spec such as examples/coding-agent.yaml"])
    try:
        return Spec.model_validate(data)
    except ValidationError as exc:
        problems, seen = [], set()
        for err in without_union_noise(exc.errors()):
            loc = error_location(err)
            field = ".".join(str(p) for p in loc) or "(top level)"
            text = _describe(err, loc)
            if (field, text) in seen:
                continue
            seen.add((field, text))
            line = _line_for(loc, lines or {})
            where = f"line {line}: " if line else ""
            problems.append(f"{where}{field}: {text}")
        raise SpecError(path, problems) from None


class _SpecLoader(yaml.SafeLoader):
    """A safe loader that counts aliases and depth as it composes, and refuses duplicate keys."""

    def __init__(self, stream: str):
        super().__init__(stream)
        self._aliases = 0
        self._depth = 0

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            self._aliases += 1
            if self._aliases > MAX_ALIASES:
                raise _Refused(self.peek_event().start_mark, f"more than {MAX_ALIASES} aliases (*name): a spec "
                               "needs few or none; write the values out")
        self._depth += 1
        if self._depth > MAX_DEPTH:
            raise _Refused(self.peek_event().start_mark, f"nested more than {MAX_DEPTH} levels deep")
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node, deep=False):
        seen: dict = {}
        for key_node, _ in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                raise _Refused(key_node.start_mark, "a key must be a name or a number, not a list or a map "
                               "(a '?' entry or a {...} / [...] before the colon): write it as a plain key")
            # compared as read, so that 0.5 and 0.50 (one quantile written twice) are the same key
            key = self.construct_object(key_node)
            if key in seen:
                raise _Refused(key_node.start_mark, f"'{key_node.value}' is given twice (first on line {seen[key]}); "
                               "YAML would keep the last silently: keep one")
            seen[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep)

    def construct_yaml_int(self, node):
        self._not_base_60(node)
        self._not_yaml_1_1(node)
        if len(str(node.value)) > MAX_INT_CHARS:
            raise _Refused(node.start_mark, f"a whole number written in {len(str(node.value)):,} characters: no field "
                           f"takes one so large (the most read is {MAX_INT_CHARS:,} characters)")
        if re.fullmatch(r"[-+]?0[0-9_]+", str(node.value)):
            # YAML 1.1 reads 010 as octal (8), YAML 1.2 and a reader of the file as 10
            raise _Refused(node.start_mark, f"'{node.value}' has a leading zero, which YAML 1.1 reads as octal "
                           f"({node.value} is {super().construct_yaml_int(node)}): write the number without it")
        return super().construct_yaml_int(node)

    def construct_yaml_float(self, node):
        self._not_base_60(node)
        self._not_yaml_1_1(node)
        return super().construct_yaml_float(node)

    @staticmethod
    def _not_yaml_1_1(node) -> None:
        """YAML 1.1 reads ``1_800`` as 1800 and ``0b11`` as 3; YAML 1.2 and JSON read both as text, so the file
        means one number to apmw and another (or none) to the next tool that reads it."""
        text = str(node.value).lstrip("+-")
        if "_" in text or text.startswith("0b"):
            raise _Refused(node.start_mark, f"'{node.value}' is a number only in YAML 1.1 (digits grouped with '_', "
                           "or binary 0b): write the number in decimal digits alone, as YAML 1.2 and JSON read it")

    @staticmethod
    def _not_base_60(node) -> None:
        """YAML 1.1 reads ``2:30`` as 150 (base 60, for times); YAML 1.2 and JSON do not: a value written so is
        more likely a typo or a time than a count."""
        if ":" in str(node.value):
            raise _Refused(node.start_mark, f"'{node.value}' reads as a base-60 number in YAML 1.1 (2:30 is 150): "
                           "write the number itself, or quote it if it is text")


_SpecLoader.add_constructor("tag:yaml.org,2002:int", _SpecLoader.construct_yaml_int)
_SpecLoader.add_constructor("tag:yaml.org,2002:float", _SpecLoader.construct_yaml_float)

# YAML 1.1 (PyYAML) reads an exponent without a decimal point (1e3, 48e6) as text; YAML 1.2 and JSON read it as a
# number, as a user writing one means.
_SpecLoader.add_implicit_resolver("tag:yaml.org,2002:float", re.compile(r"^[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+$"),
                                  list("-+0123456789"))


class _Refused(yaml.MarkedYAMLError):
    def __init__(self, mark, problem: str):
        super().__init__(problem=problem, problem_mark=mark)


def _recursive_node(node: yaml.Node, stack: set[int] | None = None, done: set[int] | None = None) -> yaml.Node | None:
    """The anchored node an alias inside it points back to (``loop: &a [1, *a]``), or None; each node is explored
    once, however often aliases repeat it."""
    stack = set() if stack is None else stack
    done = set() if done is None else done
    if id(node) in stack:
        return node
    if id(node) in done or not isinstance(node, (yaml.MappingNode, yaml.SequenceNode)):
        return None
    stack.add(id(node))
    children = [n for pair in node.value for n in pair] if isinstance(node, yaml.MappingNode) else node.value
    found = next((r for r in (_recursive_node(c, stack, done) for c in children) if r is not None), None)
    stack.discard(id(node))
    done.add(id(node))
    return found


def _expanded_values(node: yaml.Node, sizes: dict[int, int] | None = None) -> int:
    """How many values ``node`` holds with every alias written out, counting each node once; the first (innermost)
    node past :data:`MAX_EXPANDED_VALUES` is refused at its line. Run after :func:`_recursive_node` (no loops)."""
    sizes = {} if sizes is None else sizes
    if id(node) not in sizes:
        children = [n for pair in node.value for n in pair] if isinstance(node, yaml.MappingNode) else (
            node.value if isinstance(node, yaml.SequenceNode) else [])
        size = 1 + sum(_expanded_values(c, sizes) for c in children)
        if size > MAX_EXPANDED_VALUES:
            raise _Refused(node.start_mark, f"its aliases (*name) repeat one another into more than "
                           f"{MAX_EXPANDED_VALUES:,} values, more than any file apmw reads could write out: write the "
                           "values out, or alias each at most once")
        sizes[id(node)] = size
    return sizes[id(node)]


# YAML reads UTF-16 and UTF-32 files that start with a byte-order mark (YAML 1.2, section 5.2), as Windows tools
# write them (PowerShell's ``>``, Notepad's "Unicode"); the UTF-32 marks first, since UTF-32 LE's starts as UTF-16 LE's.
WIDE_TEXT_MARKS = ((codecs.BOM_UTF32_LE, "utf-32"), (codecs.BOM_UTF32_BE, "utf-32"),
                   (codecs.BOM_UTF16_LE, "utf-16"), (codecs.BOM_UTF16_BE, "utf-16"))


def _read_text(p: Path, kind: str) -> str:
    """The file as text: UTF-8, or UTF-16 or UTF-32 with a byte-order mark; a byte that is not UTF-8 is reported with
    its line."""
    raw = p.read_bytes()
    if len(raw) > MAX_SPEC_BYTES:
        raise SpecError(str(p), [f"the file is {len(raw):,} bytes; a {kind} is a few kB (at most "
                                 f"{MAX_SPEC_BYTES:,} bytes are read)"])
    for bom, codec in WIDE_TEXT_MARKS:
        if raw.startswith(bom):
            try:
                return raw.decode(codec)
            except UnicodeDecodeError:
                raise SpecError(str(p), [f"the file starts with a {codec.upper()} byte-order mark but is not "
                                         f"{codec.upper()} text throughout; save it as UTF-8"]) from None
    if b"\x00" in raw[:4]:
        raise SpecError(str(p), ["the file has NUL bytes beside its first letters: UTF-16 or UTF-32 text without a "
                                 f"byte-order mark, or not text at all; save it as UTF-8, e.g. iconv -f UTF-16LE -t "
                                 f"UTF-8 '{p}' > {p.stem}-utf8{p.suffix}"])
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[:exc.start].count(b"\n") + 1
        raise SpecError(str(p), [f"line {line}: byte 0x{raw[exc.start]:02x} is not UTF-8; save the file as "
                                 "UTF-8"]) from None


# Characters YAML 1.1 reads as line breaks but most editors and terminals do not show as such: a comment with one
# goes on as YAML on what looks like the same line, and every line number after it is off by one.
HIDDEN_BREAKS_NAMED = {"\x85": "next line", "\u2028": "line separator", "\u2029": "paragraph separator"}
HIDDEN_BREAKS = re.compile("[\x85\u2028\u2029]")


def _read_yaml(path: str | Path, what: str) -> tuple[Any, yaml.Node | None]:
    """(data, its node) of a YAML file read safely: UTF-8, no key twice, no alias bombs or recursion. ``what``
    names the kind of file in the errors ("search space"), with a hint after a semicolon ("spec; see examples/")."""
    try:
        return _read_yaml_checked(path, what)
    except SpecError as exc:
        raise SpecError(exc.path, exc.problems, what.split(";")[0]) from None


def is_link_loop(p: Path) -> bool:
    """Whether ``p`` is a symbolic link in a loop of links (resolving it never ends)."""
    try:
        os.stat(p)
    except OSError as exc:
        return exc.errno == errno.ELOOP
    return False


def _read_yaml_checked(path: str | Path, what: str) -> tuple[Any, yaml.Node | None]:
    p = Path(path)
    if p.is_dir():
        yamls = sorted(q.name for q in p.glob("*.y*ml"))[:3]
        hint = f" (in it: {', '.join(str(p / n) for n in yamls)})" if yamls else ""
        raise SpecError(str(path), [f"is a directory, not a file{hint}: give the path of a YAML {what}"])
    if not p.is_file():
        said = ("not a regular file" if p.exists() else
                "a symbolic link that leads back to itself (a loop of links)" if p.is_symlink() and is_link_loop(p) else
                "file not found")
        raise SpecError(str(path), [f"{said} (give the path of a YAML {what})"])
    text = _read_text(p, what.split(";")[0])
    hidden = HIDDEN_BREAKS.search(text)
    if hidden:
        before = text[:hidden.start()]
        where = f"line {before.count(chr(10)) + 1}, column {len(before) - before.rfind(chr(10))}"
        raise SpecError(str(path), [f"{where}: character U+{ord(hidden.group()):04X} "
                                    f"({HIDDEN_BREAKS_NAMED[hidden.group()]}), which YAML reads as a line break though "
                                    "an editor may show none (pasted from a web page or a PDF?): replace it with a "
                                    "newline or a space"])
    try:
        loader = _SpecLoader(text)
        try:
            node = loader.get_single_node()
            looped = _recursive_node(node) if node is not None else None
            if looped is not None:
                raise _Refused(looped.start_mark, "an alias refers to its own anchor (a recursive structure)")
            if node is not None:
                _expanded_values(node)
            data = loader.construct_document(node) if node is not None else None
        finally:
            loader.dispose()
    except _Refused as exc:
        mark = exc.problem_mark
        raise SpecError(str(path), [f"line {mark.line + 1}, column {mark.column + 1}: {exc.problem}"]) from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        if "tag:yaml.org,2002:merge" in str(exc.problem):
            raise SpecError(str(path), [f"{where}a YAML merge key (<<: *name) is not read here: write the keys out "
                                        "(an alias of a whole value, key: *name, is)"]) from None
        raise SpecError(str(path), [f"{where}YAML syntax error: {exc.problem}"]) from None
    except yaml.reader.ReaderError as exc:      # a character YAML does not allow (a NUL, a control byte)
        before = text[:exc.position]
        where = f"line {before.count(chr(10)) + 1}, column {len(before) - before.rfind(chr(10))}"
        code = exc.character if isinstance(exc.character, int) else ord(str(exc.character)[:1] or " ")
        raise SpecError(str(path), [f"{where}: character U+{code:04X} is not allowed in YAML (a binary file, or "
                                    "a control character pasted in): remove it"]) from None
    except yaml.YAMLError as exc:
        raise SpecError(str(path), [f"YAML error: {exc}"]) from None
    return data, node


def load_yaml(path: str | Path, what: str = "file") -> Any:
    """A YAML document other than a spec (a search space), read with the spec loader's safeguards."""
    return _read_yaml(path, what)[0]


def load_yaml_lines(path: str | Path, what: str = "file") -> tuple[Any, dict[tuple, int]]:
    """:func:`load_yaml`, and each key path's 1-based line (for messages that name it)."""
    data, node = _read_yaml(path, what)
    return data, (_key_lines(node) if node is not None else {})


def load_spec(path: str | Path) -> Spec:
    """Load and validate a YAML spec file."""
    if not isinstance(path, (str, os.PathLike)):
        raise SpecError(repr(path), [f"load_spec takes a spec file's path (a str or pathlib.Path), got "
                                     f"{type(path).__name__}; a spec held as a dict is read with "
                                     "apmw.spec.spec_from_dict(document)"])
    data, node = _read_yaml(path, "spec; see examples/")
    lines = _key_lines(node) if node is not None else {}
    spec = config_beside(spec_from_dict(data, str(path), lines), Path(path))
    spec._source = SpecSource(str(path), lines)
    return spec


def config_beside(spec: Spec, path: Path) -> Spec:
    """``spec`` with a relative ``model.config`` path read beside the spec file ``path``, as a fleet file's spec
    paths are read beside it: read from the current folder, it would name a file that is not there, or silently
    another one in that folder. A relative path found only from the current folder is read from there."""
    config = path_beside(spec.model.config, path.parent)
    if config == spec.model.config:
        return spec
    return spec.model_copy(update={"model": spec.model.model_copy(update={"config": config})})


def path_beside(name: str, folder: Path) -> str:
    """A relative path ``name`` written in a file in ``folder``, read from there where it exists (else as given: from
    the current folder, or a bundled model's name such as ``meta-llama/Meta-Llama-3.1-8B``)."""
    text = name.strip()
    if text.startswith("~") or Path(text).is_absolute() or folder == Path("."):
        return name
    beside = folder / text
    try:
        found = beside.exists()
    except (OSError, ValueError):       # a name no file system could hold (too long, a NUL byte)
        found = False
    return str(beside) if found else name
