"""MLCommons Chakra execution traces: the protobuf schema and the file's framing, read and written with `protobuf`.

The schema is written here from the format's public definition, mlcommons/chakra schema/protobuf/et_def.proto
(package ChakraProtoMsg; unchanged from May 2024 to May 2026, the same file ASTRA-sim 2.x compiles), as descriptors
built at run time, so that neither protoc nor generated code is needed. A file is a GlobalMetadata message, then
Node messages, each message preceded by its length as a varint (Chakra's protoio framing; ".gz" files gzipped).

`SCHEMA_VERSIONS` are the trace versions whose schema this is: the GlobalMetadata's `version` field, or, where the
Chakra converters leave it empty, the chakra part of its "schema" attribute ("1.0.2-chakra.0.0.4" -> "0.0.4").
"""

from __future__ import annotations

from dataclasses import dataclass

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import DecodeError

from simfog.errors import ConfigError

# Chakra releases whose et_def.proto is the one below (mlcommons/chakra: 0.0.4 as its converter's test traces
# name it, 1.0.0 as its text converter writes it).
SCHEMA_VERSIONS = ("0.0.4", "1.0.0")
WRITTEN_VERSION = "0.0.4"  # what simfog writes: the version ASTRA-sim's examples carry (same schema)
# PyTorch execution-trace schemas of converted traces that name no Chakra version, and the Chakra schema they were
# converted to: "1.0.1" is the PyTorch schema of the converter's output before it appended "-chakra.<version>"
# (mlcommons/chakra tests/data/feeder_tests_trace.tar.gz, June 2024, read by Chakra's feeder tests of this schema).
HOST_SCHEMAS = {"1.0.1": "0.0.4"}

NODE_TYPES = {"INVALID_NODE": 0, "METADATA_NODE": 1, "MEM_LOAD_NODE": 2, "MEM_STORE_NODE": 3, "COMP_NODE": 4,
              "COMM_SEND_NODE": 5, "COMM_RECV_NODE": 6, "COMM_COLL_NODE": 7}
COLLECTIVE_TYPES = {"ALL_REDUCE": 0, "REDUCE": 1, "ALL_GATHER": 2, "GATHER": 3, "SCATTER": 4, "BROADCAST": 5,
                    "ALL_TO_ALL": 6, "REDUCE_SCATTER": 7, "REDUCE_SCATTER_BLOCK": 8, "BARRIER": 9}
NODE_TYPE_NAMES = {v: k for k, v in NODE_TYPES.items()}
COLLECTIVE_TYPE_NAMES = {v: k for k, v in COLLECTIVE_TYPES.items()}

_F = descriptor_pb2.FieldDescriptorProto
# AttributeProto's oneof `value`, in field-number order from 3: (field name, scalar type); each scalar is followed
# by its list message (<Name>List with `repeated <type> values = 1`).
_ATTR_SCALARS = (("double", _F.TYPE_DOUBLE), ("float", _F.TYPE_FLOAT), ("int32", _F.TYPE_INT32),
                 ("int64", _F.TYPE_INT64), ("uint32", _F.TYPE_UINT32), ("uint64", _F.TYPE_UINT64),
                 ("sint32", _F.TYPE_SINT32), ("sint64", _F.TYPE_SINT64), ("fixed32", _F.TYPE_FIXED32),
                 ("fixed64", _F.TYPE_FIXED64), ("sfixed32", _F.TYPE_SFIXED32), ("sfixed64", _F.TYPE_SFIXED64),
                 ("bool", _F.TYPE_BOOL), ("string", _F.TYPE_STRING), ("bytes", _F.TYPE_BYTES))


def _file_descriptor() -> descriptor_pb2.FileDescriptorProto:
    f = descriptor_pb2.FileDescriptorProto(name="simfog_chakra_et_def.proto", package="ChakraProtoMsg",
                                           syntax="proto3")

    def message(name: str, fields) -> descriptor_pb2.DescriptorProto:
        m = f.message_type.add(name=name)
        for number, (field_name, kind, label, type_name) in enumerate(fields, start=1):
            if field_name is None:
                continue
            fd = m.field.add(name=field_name, number=number, type=kind, label=label)
            if type_name:
                fd.type_name = f".ChakraProtoMsg.{type_name}"
        return m

    one, rep = _F.LABEL_OPTIONAL, _F.LABEL_REPEATED
    attr = message("AttributeProto", [("name", _F.TYPE_STRING, one, None), ("doc_string", _F.TYPE_STRING, one, None)])
    attr.oneof_decl.add(name="value")
    number = 3
    for scalar, kind in _ATTR_SCALARS:
        list_name = scalar.capitalize() + "List"
        message(list_name, [("values", kind, rep, None)])
        for field_name, field_kind, type_name in ((f"{scalar}_val", kind, None),
                                                  (f"{scalar}_list", _F.TYPE_MESSAGE, list_name)):
            fd = attr.field.add(name=field_name, number=number, type=field_kind, label=one, oneof_index=0)
            if type_name:
                fd.type_name = f".ChakraProtoMsg.{type_name}"
            number += 1
    message("GlobalMetadata", [("version", _F.TYPE_STRING, one, None),
                               ("attr", _F.TYPE_MESSAGE, rep, "AttributeProto")])
    for enum_name, values in (("NodeType", NODE_TYPES), ("CollectiveCommType", COLLECTIVE_TYPES)):
        e = f.enum_type.add(name=enum_name)
        for value_name, value in values.items():
            e.value.add(name=value_name, number=value)
    message("Node", [("id", _F.TYPE_UINT64, one, None), ("name", _F.TYPE_STRING, one, None),
                     ("type", _F.TYPE_ENUM, one, "NodeType"), ("ctrl_deps", _F.TYPE_UINT64, rep, None),
                     ("data_deps", _F.TYPE_UINT64, rep, None), ("start_time_micros", _F.TYPE_UINT64, one, None),
                     ("duration_micros", _F.TYPE_UINT64, one, None), ("inputs", _F.TYPE_MESSAGE, one, "IOInfo"),
                     ("outputs", _F.TYPE_MESSAGE, one, "IOInfo"), ("attr", _F.TYPE_MESSAGE, rep, "AttributeProto")])
    message("IOInfo", [("values", _F.TYPE_STRING, one, None), ("shapes", _F.TYPE_STRING, one, None),
                       ("types", _F.TYPE_STRING, one, None)])
    message("Tensor", [("tensor_id", _F.TYPE_UINT64, one, None), ("storage_id", _F.TYPE_UINT64, one, None),
                       ("offset", _F.TYPE_UINT64, one, None), ("num_elem", _F.TYPE_UINT64, one, None),
                       ("elem_bytes", _F.TYPE_UINT64, one, None), ("device", _F.TYPE_STRING, one, None)])
    return f


_POOL = descriptor_pool.DescriptorPool()
_POOL.Add(_file_descriptor())
GlobalMetadata = message_factory.GetMessageClass(_POOL.FindMessageTypeByName("ChakraProtoMsg.GlobalMetadata"))
Node = message_factory.GetMessageClass(_POOL.FindMessageTypeByName("ChakraProtoMsg.Node"))
AttributeProto = message_factory.GetMessageClass(_POOL.FindMessageTypeByName("ChakraProtoMsg.AttributeProto"))


def attr(name: str, **value) -> AttributeProto:
    """One attribute: attr("comm_size", int64_val=1024), attr("layers", string_list=["a", "b"]) (a list field
    takes the values)."""
    (key, v), = value.items()
    a = AttributeProto(name=name)
    if key.endswith("_list"):
        getattr(a, key).values.extend(v)
    else:
        setattr(a, key, v)
    return a


def attr_value(a) -> object:
    """The value an attribute holds (a list for the *_list kinds), None when it holds none."""
    key = a.WhichOneof("value")
    if key is None:
        return None
    v = getattr(a, key)
    return list(v.values) if key.endswith("_list") else v


def attributes(message) -> dict[str, object]:
    """name -> value of a node's or the metadata's attributes (the first of a repeated name)."""
    out: dict[str, object] = {}
    for a in message.attr:
        out.setdefault(a.name, attr_value(a))
    return out


@dataclass(frozen=True)
class Stream:
    """A Chakra file's messages: its GlobalMetadata and its Nodes in file order."""

    metadata: object
    nodes: tuple


def _varint(data: bytes, pos: int) -> tuple[int, int] | None:
    """(value, position after it) of the varint at `pos`, None when the bytes end inside it (or it runs over 10
    bytes, which no length can)."""
    value = shift = 0
    for i in range(pos, min(pos + 10, len(data))):
        byte = data[i]
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, i + 1
        shift += 7
    return None


def decode(data: bytes, source: str) -> Stream:
    """The messages of a Chakra file's bytes. Raises ConfigError naming `source` and the last node read for an
    empty file, a length or message cut short (a truncated file), or bytes that are not the schema's messages."""
    messages, pos = [], 0
    while pos < len(data):
        where = ("its GlobalMetadata" if not messages else
                 f"the node after node id {messages[-1].id}" if len(messages) > 1 else "its first node")
        head = _varint(data, pos)
        if head is None or head[1] + head[0] > len(data):
            raise ConfigError("chakra", f"{where} (byte {pos})", "a complete length-delimited message: the file "
                              "is truncated (or not a Chakra execution trace)", source=source)
        size, start = head
        msg = GlobalMetadata() if not messages else Node()
        try:
            msg.ParseFromString(data[start:start + size])
        except DecodeError as e:
            raise ConfigError("chakra", f"{where} (byte {pos})", f"a Chakra {type(msg).__name__} message ({e}): "
                              "not a Chakra execution trace, or a truncated one", source=source) from None
        messages.append(msg)
        pos = start + size
    if not messages:
        raise ConfigError("chakra", "(empty file)", "a Chakra execution trace: a GlobalMetadata message, then nodes",
                          source=source)
    return Stream(messages[0], tuple(messages[1:]))


def _varint_bytes(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def encode(metadata, nodes) -> bytes:
    """A Chakra file's bytes: the GlobalMetadata, then every node, each preceded by its length (deterministic
    serialization, so the same messages give the same bytes)."""
    parts = []
    for msg in (metadata, *nodes):
        body = msg.SerializeToString(deterministic=True)
        parts += [_varint_bytes(len(body)), body]
    return b"".join(parts)


def schema_version(metadata) -> str:
    """The trace's schema version: GlobalMetadata.version, or the chakra part of its "schema" attribute
    ("1.0.2-chakra.0.0.4" -> "0.0.4"; HOST_SCHEMAS for a schema that names none), "" when it has neither."""
    if metadata.version:
        return metadata.version
    schema = attributes(metadata).get("schema")
    if isinstance(schema, str) and "chakra." in schema:
        return schema.rsplit("chakra.", 1)[1]
    return HOST_SCHEMAS.get(schema, "") if isinstance(schema, str) else ""


def check_version(metadata, source: str) -> str:
    """The trace's schema version when it is one of SCHEMA_VERSIONS; ConfigError naming `source` otherwise."""
    version = schema_version(metadata)
    if version not in SCHEMA_VERSIONS:
        raise ConfigError("GlobalMetadata.version", version or "(none)", f"a Chakra schema version simfog reads: "
                          f"{', '.join(SCHEMA_VERSIONS)}", source=source)
    return version
