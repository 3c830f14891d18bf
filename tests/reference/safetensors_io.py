"""Minimal safetensors reader/writer (no dependency on the `safetensors` package).

File layout:
    u64 little-endian N | N bytes of JSON header | raw tensor data
Header: {"__metadata__": {str: str}, name: {"dtype": D, "shape": [...],
         "data_offsets": [begin, end]}, ...}; offsets are relative to the first
byte after the header. Data is little-endian, C-contiguous.

Supported dtypes: F32, F64, BF16, F16, I32, I64.
Tensors are torch tensors; numpy is only used to turn bytes into arrays.
"""

import json
import struct

import numpy as np
import torch

# safetensors dtype name -> (torch dtype, numpy dtype with the same bit layout)
_DTYPES = {
    "F64": (torch.float64, np.float64),
    "F32": (torch.float32, np.float32),
    "F16": (torch.float16, np.float16),
    "BF16": (torch.bfloat16, np.int16),  # numpy has no bf16: move raw bits as int16
    "I64": (torch.int64, np.int64),
    "I32": (torch.int32, np.int32),
}
_TORCH_TO_NAME = {v[0]: k for k, v in _DTYPES.items()}


def _tensor_bytes(t):
    """Raw little-endian bytes of a tensor (C order)."""
    t = t.detach().contiguous().cpu()
    if t.dtype == torch.bfloat16:
        arr = t.view(torch.int16).numpy()
    else:
        arr = t.numpy()
    return arr.astype(arr.dtype.newbyteorder("<"), copy=False).tobytes(order="C")


def save_file(tensors, path, metadata=None):
    """Write {name: torch.Tensor} to `path`. Tensors are stored sorted by name."""
    header = {}
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    blobs = []
    offset = 0
    for name in sorted(tensors):
        t = tensors[name]
        if t.dtype not in _TORCH_TO_NAME:
            raise ValueError(f"{name}: unsupported dtype {t.dtype}")
        b = _tensor_bytes(t)
        header[name] = {
            "dtype": _TORCH_TO_NAME[t.dtype],
            "shape": list(t.shape),
            "data_offsets": [offset, offset + len(b)],
        }
        blobs.append(b)
        offset += len(b)
    hjson = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hjson += b" " * ((8 - len(hjson) % 8) % 8)  # pad header to 8 bytes (convention)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hjson)))
        f.write(hjson)
        for b in blobs:
            f.write(b)


def load_file(path, with_metadata=False):
    """Read a safetensors file into {name: torch.Tensor} (dtypes preserved)."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n].decode("utf-8"))
    base = 8 + n
    meta = header.pop("__metadata__", {}) or {}
    out = {}
    for name, info in header.items():
        tdt, ndt = _DTYPES[info["dtype"]]
        b, e = info["data_offsets"]
        shape = tuple(info["shape"])
        count = int(np.prod(shape)) if shape else 1
        arr = np.frombuffer(data, dtype=np.dtype(ndt).newbyteorder("<"), count=count,
                            offset=base + b)
        if (e - b) != arr.nbytes:
            raise ValueError(f"{name}: data_offsets size {e - b} != {arr.nbytes}")
        t = torch.from_numpy(arr.astype(np.dtype(ndt), copy=True)).reshape(shape)
        if tdt == torch.bfloat16:
            t = t.view(torch.bfloat16)
        out[name] = t
    return (out, meta) if with_metadata else out
