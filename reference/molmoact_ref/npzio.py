# SPDX-License-Identifier: Apache-2.0
"""Byte-deterministic .npz writing (numpy's savez stamps the current time into the zip)."""

import io
import zipfile

import numpy as np

_EPOCH = (1980, 1, 1, 0, 0, 0)


def save(path, arrays, compress=True):
    """arrays: name -> array-like; entries sorted by name, fixed timestamps."""
    tmp = path + ".tmp"
    method = zipfile.ZIP_DEFLATED if compress else zipfile.ZIP_STORED
    with zipfile.ZipFile(tmp, "w", compression=method) as zf:
        for name in sorted(arrays):
            buf = io.BytesIO()
            np.lib.format.write_array(buf, np.ascontiguousarray(np.asarray(arrays[name])),
                                      allow_pickle=False)
            info = zipfile.ZipInfo(name + ".npy", date_time=_EPOCH)
            info.compress_type = method
            info.external_attr = 0o644 << 16
            zf.writestr(info, buf.getvalue())
    import os
    os.replace(tmp, path)


def load(path):
    with np.load(path, allow_pickle=False) as f:
        return {k: f[k] for k in f.files}
