"""Independent reader for the loader's output (fastavro, not the loader's own code).

Usage: python read_back.py DEST_DIR
Prints one JSON document: every .avro data file under DEST_DIR (outside _fjord), with its
path relative to DEST_DIR, its header metadata, its schema name, and its records. Envelope
records are reduced to [partition, offset, timestamp, value as text]; records of other
schemas are printed whole.
"""
import json
import os
import sys

import fastavro

dest = sys.argv[1]
files = []
for root, dirs, names in os.walk(dest):
    dirs[:] = sorted(d for d in dirs if d != "_fjord")
    for name in sorted(names):
        if not name.endswith(".avro"):
            continue
        path = os.path.join(root, name)
        with open(path, "rb") as f:
            reader = fastavro.reader(f)
            schema = reader.writer_schema
            meta = {k: v.decode() if isinstance(v, bytes) else v for k, v in reader.metadata.items() if k.startswith("fjord.")}
            codec = reader.codec
            records = []
            for r in reader:
                if schema.get("name") == "io.fjord.loader.FjordRecord":
                    value = None if r["value"] is None else r["value"].decode("utf-8", "replace")
                    records.append([r["partition"], r["offset"], r["timestamp"], value])
                else:
                    records.append(r)
        files.append({"path": os.path.relpath(path, dest), "meta": meta, "codec": codec, "schema": schema.get("name"), "records": records})
json.dump({"files": files}, sys.stdout)
