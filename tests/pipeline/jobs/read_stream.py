"""A spark-submit job for tests/pipeline/test_standalone_cluster.py: reads one stream with the `zonebus` data
source and writes, as JSON, every row it got together with the working directory of the Python worker that
read it (on a standalone cluster: `<worker work dir>/<app id>/<executor id>`) and where that worker imported
zonebus from, plus the application id and
the number of partitions.

    spark-submit [--py-files zonebus.zip] read_stream.py STORE_URL STREAM PARTITION_BYTES OUT.json
"""

from __future__ import annotations

import json
import os
import sys


def _rows(rows):
    import zonebus

    cwd = os.getcwd()  # the executor's directory: Python workers start there
    origin = zonebus.__file__  # where this executor's Python found zonebus
    for r in rows:
        headers = {k: list(v) for k, v in r["headers"].items()} if r["headers"] is not None else None
        yield {"where": cwd, "zonebus": origin, "seq": r["seq"], "subject": r["subject"],
               "data": bytes(r["data"]).hex(), "headers": headers}


def main() -> int:
    store, stream, partition_bytes, out = sys.argv[1:5]
    from zonebus.pipeline.session import build_session

    spark = build_session(None, "zonebus-cluster-read")
    df = (spark.read.format("zonebus").option("store", store).option("stream", stream)
          .option("partitionBytes", partition_bytes).load())
    rows = df.rdd.mapPartitions(_rows).collect()
    result = {"app_id": spark.sparkContext.applicationId, "master": spark.sparkContext.master,
              "partitions": df.rdd.getNumPartitions(), "driver_cwd": os.getcwd(), "rows": rows}
    with open(out, "w") as fh:
        json.dump(result, fh)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
