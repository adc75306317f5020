#!/usr/bin/env python3
"""Independent checker for record batches written by mirrorguard's tests.

Decodes every file given on the command line with kafka-python's record-batch
reader (kafka.record.MemoryRecords / DefaultRecordBatch), validates each
batch's CRC-32C twice (kafka-python's own check, and the `crc32c` PyPI package
over bytes [21, end) compared with the stored field), decodes control
records, and for MIRROR_PID_RESET (type 7) the MirrorPidResetRecord value.

Prints one JSON object per batch on stdout. Exits 1 if any batch has an
invalid CRC or cannot be decoded, 2 on usage errors.
"""
import json
import struct
import sys

import crc32c
from kafka.record.default_records import DefaultRecordBatch
from kafka.record.memory_records import MemoryRecords


def read_uvarint(buf, pos):
    value, shift = 0, 0
    while True:
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, pos
        shift += 7
        if shift > 28:
            raise ValueError("uvarint too long")


def decode_control_value(ctype, value):
    if ctype in (0, 1):
        if value is None or len(value) < 6:
            raise ValueError("EndTxnMarker value shorter than 6 bytes")
        version, coordinator_epoch = struct.unpack(">hi", value[:6])
        return {"version": version, "coordinator_epoch": coordinator_epoch}
    if ctype == 7:
        version = struct.unpack(">h", value[:2])[0]
        n, pos = read_uvarint(value, 2)
        if n == 0:
            raise ValueError("null SourceClusterId")
        sid = bytes(value[pos:pos + n - 1]).decode("utf-8")
        pos += n - 1
        tags, pos = read_uvarint(value, pos)
        if tags != 0 or pos != len(value):
            raise ValueError("unexpected tagged fields or trailing bytes")
        return {"version": version, "source_cluster_id": sid}
    return {}


def check_file(path):
    ok = True
    data = open(path, "rb").read()
    records = MemoryRecords(data)
    pos = 0
    while records.has_next():
        batch = records.next_batch()
        size = batch.size_in_bytes
        raw = data[pos:pos + size]
        out = {"file": path, "position": pos, "size": size}
        pos += size
        if not isinstance(batch, DefaultRecordBatch):
            out["magic"] = batch.magic
            print(json.dumps(out))
            continue
        stored = struct.unpack(">I", raw[17:21])[0]
        out.update({
            "magic": batch.magic,
            "base_offset": batch.base_offset,
            "leader_epoch": batch.leader_epoch,
            "attributes": batch.attributes,
            "producer_id": batch.producer_id,
            "producer_epoch": batch.producer_epoch,
            "base_sequence": batch.base_sequence,
            "is_transactional": batch.is_transactional,
            "is_control": batch.is_control_batch,
            "crc": stored,
            "crc_valid_kafka_python": batch.validate_crc(),
            "crc_valid_crc32c": crc32c.crc32c(raw[21:]) == stored,
        })
        try:
            recs = list(batch)
            out["records"] = len(recs)
            if batch.is_control_batch and recs:
                r = recs[0]
                ctrl = {"version": r.version, "type": r.type}
                ctrl.update(decode_control_value(r.type, r.value))
                out["control"] = ctrl
            else:
                out["values"] = [None if r.value is None else bytes(r.value).hex() for r in recs]
        except Exception as e:  # noqa: BLE001 - report any decode failure
            out["error"] = repr(e)
            ok = False
        if not (out["crc_valid_kafka_python"] and out["crc_valid_crc32c"]):
            ok = False
        print(json.dumps(out))
    out = {"file": path, "valid_bytes": pos, "total_bytes": len(data)}
    print(json.dumps(out))
    return ok


def main(argv):
    if len(argv) < 2:
        print("usage: check_batches.py FILE...", file=sys.stderr)
        return 2
    ok = all([check_file(p) for p in argv[1:]])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
