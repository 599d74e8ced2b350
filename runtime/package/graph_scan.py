"""What the loader checks inside model.onnx before onnxruntime opens it, read from the protobuf wire format
(the runtime has no `onnx` package): the files the graph's external data names, how many positions its
position table has, the operators and attributes it uses (which onnxruntime it needs), and the external tensors
stored in byte regions the caller names (the int8 token table, which the LM head's tensors must tile).

onnxruntime opens external data itself. Version 1.32 already refuses a location that is absolute, has '..',
or is a link leading out of the model's folder, and one that is not a regular file; the loader adds that
every file it names is one the manifest lists (so it was checked against its sha256).

Field numbers are onnx.proto3's: ModelProto.graph 7; GraphProto node 1, initializer 5, sparse_initializer 15;
NodeProto input 1, op_type 4, attribute 5; AttributeProto name 1, i 3, t 5, g 6, tensors 10, graphs 11;
TensorProto dims 1, data_type 2, name 8, external_data 13 (StringStringEntryProto key 1, value 2);
SparseTensorProto values 1, indices 2. Groups (wire types 3 and 4, deprecated) are skipped, as onnxruntime skips
an unknown one.
"""

import math
import mmap
import re
from dataclasses import dataclass, field
from pathlib import Path

from .files import open_regular
from .format import POSITION_IDS

MAX_DEPTH = 16  # subgraphs in subgraphs; a real decoder has none


class ScanError(ValueError):
    """The bytes are not an ONNX model this scan can read; onnxruntime will say what is wrong with them."""


class TooDeep(ScanError):
    """Graphs or protobuf groups nested past MAX_DEPTH: valid protobuf that no decoder graph is, and whose checks
    this scan cannot make, so the loader refuses it rather than leave it unchecked."""


@dataclass
class GraphFacts:
    external_files: set = field(default_factory=set)  # every external data `location` in the model
    position_rows: int | None = None  # rows of the table read with position_ids (Gather, RotaryEmbedding); or None
    # (op_type, None) per operator, (op_type, attribute name) per attribute, and (op_type, "name=value") per
    # integer attribute (a negative one reads as its 64-bit two's complement)
    uses: set = field(default_factory=set)
    regions: tuple = ()  # (location, start, end) byte ranges asked about
    stored: list = field(default_factory=list)  # the external tensors (Stored) whose bytes overlap one of them
    # files of the regions where a tensor's offset or length is not a plain decimal (onnxruntime reads "+5", " 5")
    odd_numbers: set = field(default_factory=set)


@dataclass(frozen=True)
class Stored:
    """A tensor stored in an external file: where, how many bytes (None where its type is not one of DTYPES and
    no length is given), its dims and its element type (DTYPES' name, or None)."""

    location: str
    offset: int
    nbytes: int | None
    dims: tuple
    dtype: str | None

    @property
    def end(self) -> float:
        return self.offset + self.nbytes if self.nbytes is not None else math.inf  # unknown: to the file's end


DTYPES = {1: ("float32", 4), 2: ("uint8", 1), 3: ("int8", 1), 10: ("float16", 2), 7: ("int64", 8)}  # TensorProto
DECIMAL = re.compile(r"0|[1-9][0-9]{0,19}")  # how the exporter writes offsets and lengths (str of an int)
MAX_DIMS = 8  # a tensor with more dims has no size this scan computes (a decoder's have at most 4)


def scan_model(path: Path, regions=()) -> GraphFacts:
    """Read model.onnx's external data locations and position-table size, and the external tensors overlapping
    `regions` ((location, start, end) byte ranges); ScanError if it is not protobuf."""
    with open_regular(path) as f:
        size = f.seek(0, 2)
        if size == 0:
            raise ScanError("empty file")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buffer:
            facts, tensors, gathers = GraphFacts(regions=tuple(regions)), {}, []
            view = memoryview(buffer)
            try:
                for number, value in _fields(view, 0, len(view)):
                    if number == 7 and isinstance(value, tuple):
                        _graph(view, value, facts, tensors, gathers, 0)
            finally:
                view.release()
    rows = [tensors.get(table) for table, indices in gathers if indices == POSITION_IDS]
    facts.position_rows = next((r for r in rows if r), None)
    return facts


def _graph(view, span, facts, tensors, gathers, depth):
    if depth > MAX_DEPTH:
        raise TooDeep("graphs nested too deeply")
    for number, value in _fields(view, *span):
        if number == 5 and isinstance(value, tuple):
            _tensor(view, value, facts, tensors)
        elif number == 15 and isinstance(value, tuple):
            for part, inner in _fields(view, *value):
                if part in (1, 2) and isinstance(inner, tuple):
                    _tensor(view, inner, facts, tensors)
        elif number == 1 and isinstance(value, tuple):
            _node(view, value, facts, tensors, gathers if depth == 0 else [], depth)


def _node(view, span, facts, tensors, gathers, depth):
    inputs, op_type, attributes = [], "", []
    for number, value in _fields(view, *span):
        if number == 1 and isinstance(value, tuple):
            inputs.append(_text(view, value))
        elif number == 4 and isinstance(value, tuple):
            op_type = _text(view, value)
        elif number == 5 and isinstance(value, tuple):
            name, integer = None, None
            for part, inner in _fields(view, *value):
                if part == 1 and isinstance(inner, tuple):
                    name = _text(view, inner)
                elif part == 3 and isinstance(inner, int):
                    integer = inner
                elif part in (5, 10) and isinstance(inner, tuple):
                    _tensor(view, inner, facts, {})
                elif part in (6, 11) and isinstance(inner, tuple):
                    _graph(view, inner, facts, {}, [], depth + 1)
            if name is not None:
                attributes += [name] if integer is None else [name, f"{name}={integer}"]
    facts.uses |= {(op_type, None)} | {(op_type, name) for name in attributes}
    if op_type == "Gather" and len(inputs) >= 2:
        gathers.append((inputs[0], inputs[1]))
    elif op_type == "RotaryEmbedding" and len(inputs) >= 3:  # (x, position_ids, cos_cache, ...): a row per position
        gathers.append((inputs[2], inputs[1]))


def _tensor(view, span, facts, tensors):
    dims, name, external, data_type = [], "", {}, None
    for number, value in _fields(view, *span):
        if number == 1:
            dims += [value] if isinstance(value, int) else [v for v in _packed(view, value)]
        elif number == 2 and isinstance(value, int):
            data_type = value
        elif number == 8 and isinstance(value, tuple):
            name = _text(view, value)
        elif number == 13 and isinstance(value, tuple):
            entry = {k: _text(view, v) for k, v in _fields(view, *value) if isinstance(v, tuple)}
            if entry.get(1) == "location":
                facts.external_files.add(entry.get(2, ""))
            external[entry.get(1)] = entry.get(2, "")
    if "location" in external and facts.regions:
        _stored(facts, external, tuple(dims), data_type)
    if name and dims:
        tensors[name] = dims[0]


def _stored(facts, external: dict, dims: tuple, data_type):
    """Record the external tensor if its bytes overlap one of the regions the caller asked about."""
    location = external["location"]
    if not any(location == where for where, _, _ in facts.regions):
        return
    offset, length = external.get("offset", ""), external.get("length", "")
    if any(value and not DECIMAL.fullmatch(value) for value in (offset, length)):
        facts.odd_numbers.add(location)
        return
    dtype, item = DTYPES.get(data_type, (None, None))
    if length:  # onnxruntime skips an empty value: an empty offset is 0, an empty length none
        nbytes = int(length)
    else:
        nbytes = math.prod(dims) * item if item and len(dims) <= MAX_DIMS else None
    tensor = Stored(location, int(offset or 0), nbytes, dims, dtype)
    if any(location == where and tensor.offset < stop and tensor.end > start for where, start, stop in facts.regions):
        facts.stored.append(tensor)


def _packed(view, span):
    start, end = span
    while start < end:
        value, start = _varint(view, start, end)
        yield value


def _text(view, span) -> str:
    return bytes(view[span[0] : span[1]]).decode("utf-8", "replace")


def _fields(view, start, end):
    """(field number, value) of one message: an int for varints, (start, end) for length-delimited fields."""
    pos = start
    while pos < end:
        key, pos = _varint(view, pos, end)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(view, pos, end)
            yield number, value
        elif wire == 2:
            length, pos = _varint(view, pos, end)
            if pos + length > end:
                raise ScanError("a field runs past the end of its message")
            yield number, (pos, pos + length)
            pos += length
        elif wire in (1, 5):
            pos += 8 if wire == 1 else 4
        elif wire == 3:  # a group: deprecated, still valid protobuf, and onnxruntime skips an unknown one
            pos = _skip_group(view, pos, end, number, 0)
        else:
            raise ScanError(f"wire type {wire}")
    if pos != end:
        raise ScanError("a field runs past the end of its message")


def _skip_group(view, pos, end, number, depth):
    """The position after the end-group of the group `number` that starts at pos."""
    if depth > MAX_DEPTH:
        raise TooDeep("groups nested too deeply")
    while pos < end:
        key, pos = _varint(view, pos, end)
        inner, wire = key >> 3, key & 7
        if wire == 4:
            if inner != number:
                raise ScanError("a group ends with another group's number")
            return pos
        if wire == 0:
            _, pos = _varint(view, pos, end)
        elif wire == 2:
            length, pos = _varint(view, pos, end)
            pos += length
        elif wire in (1, 5):
            pos += 8 if wire == 1 else 4
        elif wire == 3:
            pos = _skip_group(view, pos, end, inner, depth + 1)
        else:
            raise ScanError(f"wire type {wire}")
    raise ScanError("a group runs past the end of its message")


def _varint(view, pos, end):
    value = shift = 0
    while True:
        if pos >= end or shift > 63:
            raise ScanError("bad varint")
        byte = view[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7
