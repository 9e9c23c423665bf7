"""The profile of a partitioned bundle's run (runtime/host.py): where the time went, part by part.

    summary(model)       per part: a chip part's summary as `profile` gives it for any bundle (runtime/profile.py),
                         with what its launch and copies cost; a host part's operators and measured time; then the
                         end to end: device, host, launches and copies, and the bytes between host and device
    chrome_trace(model)  one trace: each chip part's cores as processes of their own ("part 0: core 0"), and a
                         "host" process with a row for the host parts (onnxruntime) and one for the launches and
                         copies, on one time axis
"""

from __future__ import annotations

from typing import Any

from runtime.host import PartitionedModel, PartitionedRun
from runtime.model import Model
from runtime.profile import chrome_trace as chip_trace, summarize, summary_text

_HOST_PID = 1  # the host process comes first; chip parts' cores after it
_HOST_ROWS = {"host": 1, "launches and copies": 2}


def _finished(model: PartitionedModel) -> PartitionedRun:
    if model.last_run is None:
        raise ValueError("no run to profile: model.run(inputs, trace=True) first")
    return model.last_run


def summary(model: PartitionedModel, top: int = 8) -> dict[str, Any]:
    """JSON-ready: each part's figures, and the end to end."""
    stats = _finished(model)
    parts = []
    for k, (part, run, m) in enumerate(zip(model.bundle.parts, stats.parts, model.parts)):
        row: dict[str, Any] = {"part": k, "kind": part.kind, "inputs": part.inputs, "outputs": part.outputs,
                               "us": run.ns / 1000}
        if isinstance(m, Model):
            row.update(device_us=run.device_ns / 1000, launch_and_copies_us=(run.ns - run.device_ns) / 1000,
                       bytes_in=run.bytes_in, bytes_out=run.bytes_out, summary=summarize(m, top).to_json())
        else:
            row.update(ops=part.ops)
        parts.append(row)
    return {"end_to_end_us": stats.elapsed_ns / 1000, "device_us": stats.device_ns / 1000,
            "host_us": stats.host_ns / 1000,
            "launch_and_copies_us": (stats.elapsed_ns - stats.device_ns - stats.host_ns) / 1000,
            "transfer_bytes": stats.transfer_bytes, "parts": parts}


def summary_lines(model: PartitionedModel, top: int = 8) -> str:
    stats = _finished(model)
    s = summary(model, top)
    lines = []
    for row, m in zip(s["parts"], model.parts):
        if row["kind"] == "chip":
            assert isinstance(m, Model)
            lines.append(f"part {row['part']}: chip, {row['device_us']:.2f} us on the device + "
                         f"{row['launch_and_copies_us']:.2f} us to launch it and copy {row['bytes_in']} B in and "
                         f"{row['bytes_out']} B out")
            lines += ["    " + line for line in summary_text(summarize(m, top)).splitlines()]
        else:
            ops = ", ".join(f"{op} x{n}" for op, n in row["ops"].items())
            lines.append(f"part {row['part']}: host, {row['us']:.2f} us on this machine's CPU (onnxruntime, one "
                         f"thread, measured): {ops}")
    lines.append(f"end to end     {s['end_to_end_us']:.2f} us: device {s['device_us']:.2f} us, host "
                 f"{s['host_us']:.2f} us, launches and copies {s['launch_and_copies_us']:.2f} us "
                 f"({stats.transfer_bytes} B between host and device, {len(stats.parts)} parts)")
    return "\n".join(lines)


def chrome_trace(model: PartitionedModel) -> dict[str, Any]:
    stats = _finished(model)
    events: list[dict[str, Any]] = [
        {"name": "process_name", "ph": "M", "pid": _HOST_PID, "args": {"name": "host"}},
        {"name": "process_sort_index", "ph": "M", "pid": _HOST_PID, "args": {"sort_index": -1}},
        *({"name": "thread_name", "ph": "M", "pid": _HOST_PID, "tid": tid, "args": {"name": name}}
          for name, tid in _HOST_ROWS.items())]
    pid, flow_ids = _HOST_PID + 1, 0
    for k, (part, run, m) in enumerate(zip(model.bundle.parts, stats.parts, model.parts)):
        if not isinstance(m, Model):
            events.append({"name": f"part {k}: host", "cat": "host", "ph": "X", "pid": _HOST_PID,
                           "tid": _HOST_ROWS["host"], "ts": run.start_ns / 1000, "dur": run.ns / 1000,
                           "args": {"ops": part.ops, "inputs": part.inputs, "outputs": part.outputs}})
            continue
        overhead = run.ns - run.device_ns
        events.append({"name": f"part {k}: launch and copies", "cat": "host", "ph": "X", "pid": _HOST_PID,
                       "tid": _HOST_ROWS["launches and copies"], "ts": run.start_ns / 1000, "dur": overhead / 1000,
                       "args": {"bytes_in": run.bytes_in, "bytes_out": run.bytes_out}})
        trace = chip_trace(m)
        shift = (run.start_ns + overhead) / 1000
        most = 0
        for e in trace["traceEvents"]:
            e = {**e, "pid": e["pid"] - 1 + pid}
            if "ts" in e:
                e["ts"] += shift
            if "id" in e:
                e["id"] += flow_ids
                most = max(most, e["id"])
            if e["name"] == "process_name":
                e["args"] = {"name": f"part {k}: {e['args']['name']}"}
            elif e["name"] == "process_sort_index":
                e["args"] = {"sort_index": e["pid"]}
            events.append(e)
        pid += len(m.bundle.cores)
        flow_ids = most
    return {"traceEvents": events, "displayTimeUnit": "ns",
            "otherData": {"elapsed_us": stats.elapsed_ns / 1000, "instructions": stats.instructions,
                          "host_us": stats.host_ns / 1000, "transfer_bytes": stats.transfer_bytes}}
