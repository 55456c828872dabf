# SPDX-License-Identifier: Apache-2.0
"""molmoact: the MolmoAct2-LIBERO robot policy from Python, over libmolmoact (ctypes, numpy).

    import molmoact
    with molmoact.Policy("/data/molmoact2-libero") as policy:
        out = policy.infer({
            "observation/image": agent_rgb,          # uint8 [H, W, 3], any size (or PNG/JPEG bytes)
            "observation/wrist_image": wrist_rgb,
            "observation/state": state,              # float32 or float64 [8]
            "prompt": "put the bowl on the plate",
        })
        out["actions"]                               # float32 [10, 7], de-normalised

Keys: openpi's (observation/image, observation/wrist_image, observation/state, prompt) or
MolmoAct2's (image, wrist_image, state, instruction; task is accepted too), plus optional
`noise` (float32 [1, 10, 32]) or `seed` for reproducible runs, and real-time chunking as LeRobot
guides MolmoAct2: `rtc_prefix` (the previous chunk's rows still to run, normalised, float32
[rows, dim] with dim the action dim or max_action_dim; row 0 is the first action returned) with
`rtc_delay`, `rtc_horizon` (0: 10), `rtc_beta` (0: 10) and `rtc_schedule` ("linear", "exp",
"ones", "zeros"). Errors raise MolmoActError with the library's message (it names the field, file
or worker at fault).

The library is $MOLMOACT_LIBRARY when it is set (a path, or a name for the dynamic loader; a
missing, broken or foreign library is an ImportError naming it, never a fallback); otherwise, in
order: next to this package, the build tree of a source checkout (build/), then the dynamic
loader's path (libmolmoact.so.0).
"""
import ctypes
import os
import threading

import numpy as np

__all__ = ["Policy", "MolmoActError", "LeRobotPolicy", "ActionChunkBroker", "library_path", "version"]


class MolmoActError(RuntimeError, ValueError):
    """A failed call or a refused input: `status` is the library's status name (or
    MOLMOACT_ERR_ARG for what the binding refuses itself), the message names what was wrong."""

    def __init__(self, status, message):
        super().__init__(message)
        self.status = status


# ---------------------------------------------------------------------------- the C declarations
# (mirroring include/molmoact.h; struct_size fields let the library check the layout)

class _Error(ctypes.Structure):
    _fields_ = [("code", ctypes.c_int), ("message", ctypes.c_char * 1024)]


class _Options(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_uint32), ("model_dir", ctypes.c_char_p), ("backend", ctypes.c_char_p),
                ("inproc", ctypes.c_int), ("threads", ctypes.c_int), ("norm_tag", ctypes.c_char_p),
                ("vision_suffix", ctypes.c_char_p), ("llm_suffix", ctypes.c_char_p), ("action_suffix", ctypes.c_char_p),
                ("worker_exe", ctypes.c_char_p), ("deadline_ms", ctypes.c_int), ("base_dir", ctypes.c_char_p),
                # since 0.11
                ("kernels", ctypes.c_char_p), ("compute", ctypes.c_char_p), ("gemm_panels", ctypes.c_char_p),
                ("prompt_seq", ctypes.c_int), ("preload", ctypes.c_int), ("verbose", ctypes.c_int), ("progress", ctypes.c_int),
                ("qnn_lib_dir", ctypes.c_char_p), ("qnn_io_map", ctypes.c_char_p), ("qnn_perf", ctypes.c_char_p),
                ("qnn_soc", ctypes.c_long), ("qnn_arch", ctypes.c_long), ("qnn_zero_copy", ctypes.c_int), ("ignore_env", ctypes.c_int)]


class _Image(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("height", ctypes.c_int), ("width", ctypes.c_int), ("stride", ctypes.c_size_t),
                ("encoded", ctypes.c_void_p), ("encoded_len", ctypes.c_size_t)]


class _Observation(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_uint32), ("images", _Image * 2), ("state", ctypes.POINTER(ctypes.c_float)),
                ("state_dim", ctypes.c_int), ("task", ctypes.c_char_p), ("noise", ctypes.POINTER(ctypes.c_float)),
                ("noise_len", ctypes.c_size_t), ("have_seed", ctypes.c_int), ("seed", ctypes.c_uint64),
                ("pixels", ctypes.POINTER(ctypes.c_float)), ("n_pixel_images", ctypes.c_int),
                ("input_ids", ctypes.POINTER(ctypes.c_int64)), ("seq_len", ctypes.c_int64),
                ("norm_tag", ctypes.c_char_p), ("flow_steps", ctypes.c_int), ("rotate180", ctypes.c_int),
                ("reserved", ctypes.c_int * 3),
                # since 0.12
                ("rtc_prefix", ctypes.POINTER(ctypes.c_float)), ("rtc_prefix_rows", ctypes.c_int),
                ("rtc_prefix_dim", ctypes.c_int), ("rtc_delay", ctypes.c_int), ("rtc_horizon", ctypes.c_int),
                ("rtc_beta", ctypes.c_float), ("rtc_schedule", ctypes.c_int)]


class _Timing(ctypes.Structure):
    _fields_ = [("vision", ctypes.c_double), ("llm_split", ctypes.c_double * 4), ("action_context", ctypes.c_double),
                ("action_step", ctypes.c_double), ("transfer", ctypes.c_double), ("host", ctypes.c_double),
                ("total", ctypes.c_double), ("preprocess", ctypes.c_double)]


class _Result(ctypes.Structure):
    _fields_ = [("actions", ctypes.POINTER(ctypes.c_float)), ("n_steps", ctypes.c_int), ("action_dim", ctypes.c_int),
                ("trajectory", ctypes.POINTER(ctypes.c_float)), ("horizon", ctypes.c_int),
                ("max_action_dim", ctypes.c_int), ("timing", _Timing)]


class _Info(ctypes.Structure):
    _fields_ = [("variant", ctypes.c_char * 16), ("action_horizon", ctypes.c_int), ("action_dim", ctypes.c_int),
                ("max_action_dim", ctypes.c_int), ("n_steps", ctypes.c_int), ("state_dim", ctypes.c_int),
                ("flow_steps", ctypes.c_int), ("prompt_seq", ctypes.c_int), ("precision", (ctypes.c_char * 16) * 3),
                ("norm_tag", ctypes.c_char * 64), ("inproc", ctypes.c_int), ("peak_rss_kib", ctypes.c_long),
                ("workers_peak_rss_kib", ctypes.c_long)]


_STATUS = {0: "MOLMOACT_OK", 1: "MOLMOACT_ERR_ARG", 2: "MOLMOACT_ERR_IO", 3: "MOLMOACT_ERR_FORMAT",
           4: "MOLMOACT_ERR_SHAPE", 5: "MOLMOACT_ERR_NOMEM", 6: "MOLMOACT_ERR_UNSUPPORTED", 7: "MOLMOACT_ERR_RANGE",
           9: "MOLMOACT_ERR_WORKER"}


def _candidates():
    here = os.path.dirname(os.path.abspath(__file__))
    env = os.environ.get("MOLMOACT_LIBRARY")
    if env:
        yield env, "$MOLMOACT_LIBRARY"
    for name in ("libmolmoact.so.0", "libmolmoact.so"):
        yield os.path.join(here, name), "next to the package"
    # installed by cmake --install: PREFIX/LIBDIR/python3/dist-packages/molmoact -> PREFIX/LIBDIR
    yield os.path.normpath(os.path.join(here, "..", "..", "..", "libmolmoact.so.0")), "the install prefix (cmake --install)"
    libdir = _pkg_config_libdir()
    if libdir:
        yield os.path.join(libdir, "libmolmoact.so.0"), "pkg-config's molmoact.pc (pip install ./python)"
    for name in ("libmolmoact.so.0", "libmolmoact.so"):
        yield os.path.normpath(os.path.join(here, "..", "..", "build", name)), "the source tree's build/"
    yield "libmolmoact.so.0", "the dynamic loader's path"


def _pkg_config_libdir():
    """the libdir of an installed molmoact.pc (PKG_CONFIG_PATH, or the default search path)"""
    import shutil
    import subprocess
    if not shutil.which("pkg-config"):
        return None
    try:
        p = subprocess.run(["pkg-config", "--variable=libdir", "molmoact"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return p.stdout.strip() if p.returncode == 0 and p.stdout.strip() else None


def _check(lib, path):
    """the library at `path` is libmolmoact: it exports the API this binding declares"""
    for sym in ("molmoact_version", "molmoact_open", "molmoact_infer", "molmoact_close", "molmoact_get_info", "molmoact_get_setting",
                "molmoact_options_init_sized"):
        if not hasattr(lib, sym):
            raise ImportError(f"molmoact: {path} is not libmolmoact (it does not export {sym})")


def _load():
    env = os.environ.get("MOLMOACT_LIBRARY")
    if env:  # an explicit choice: that library or a clear failure, never another one
        if os.path.sep in env and not os.path.exists(env):
            raise ImportError(f"molmoact: MOLMOACT_LIBRARY={env}: no such file")
        try:
            lib = ctypes.CDLL(env)
        except OSError as e:
            raise ImportError(f"molmoact: MOLMOACT_LIBRARY={env}: cannot be loaded ({e})") from None
        _check(lib, env)
        return lib, env
    tried = []
    for path, where in _candidates():
        if where == "$MOLMOACT_LIBRARY":
            continue
        if os.path.sep in path and not os.path.exists(path):
            tried.append(f"{path} ({where}: absent)")
            continue
        try:
            lib = ctypes.CDLL(path)
        except OSError as e:
            tried.append(f"{path} ({where}: {e})")
            continue
        _check(lib, path)
        return lib, path
    raise ImportError("molmoact: libmolmoact.so not found; looked at:\n  " + "\n  ".join(tried) +
                      "\nbuild it (cmake --build build) or set MOLMOACT_LIBRARY to its path")


_lib, library_path = _load()
_lib.molmoact_version.restype = ctypes.c_char_p
# the sized initialisers (0.11): the structs as this binding declares them, whatever the library's
_lib.molmoact_options_init_sized.argtypes = [ctypes.POINTER(_Options), ctypes.c_uint32]
_lib.molmoact_observation_init_sized.argtypes = [ctypes.POINTER(_Observation), ctypes.c_uint32]
_lib.molmoact_open.argtypes = [ctypes.POINTER(_Options), ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(_Error)]
_lib.molmoact_close.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
_lib.molmoact_infer.argtypes = [ctypes.c_void_p, ctypes.POINTER(_Observation), ctypes.POINTER(_Result), ctypes.POINTER(_Error)]
_lib.molmoact_result_free.argtypes = [ctypes.POINTER(_Result)]
_lib.molmoact_get_info.argtypes = [ctypes.c_void_p, ctypes.POINTER(_Info), ctypes.POINTER(_Error)]
_lib.molmoact_get_setting.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.POINTER(_Error)]


def s_bytes(name):
    if not isinstance(name, str):
        raise MolmoActError("MOLMOACT_ERR_ARG", f"setting: expected a name, got {type(name).__name__}")
    return name.encode()
version = _lib.molmoact_version().decode()
__version__ = version  # the library's: the binding is the library's own, released with it


def _raise(rc, err):
    raise MolmoActError(_STATUS.get(rc, str(rc)), err.message.decode(errors="replace"))


_STR_OPTIONS = ("norm_tag", "backend", "vision_suffix", "llm_suffix", "action_suffix", "worker_exe", "kernels", "compute",
                "gemm_panels", "qnn_lib_dir", "qnn_io_map", "qnn_perf")
_INT_OPTIONS = {"threads": (0, 64), "deadline_ms": (0, 2 ** 31 - 1), "prompt_seq": (0, 65536), "qnn_soc": (0, 2 ** 32 - 1),
                "qnn_arch": (0, 2 ** 32 - 1)}
_BOOL_OPTIONS = ("inproc", "preload", "verbose", "progress", "qnn_zero_copy", "ignore_env")
_OPTIONS = set(_STR_OPTIONS) | set(_INT_OPTIONS) | set(_BOOL_OPTIONS) | {"base"}
_KEYS = {  # accepted request keys -> role: openpi's, MolmoAct2's, LeRobot's (as the server takes them)
    "observation/image": "image", "image": "image", "observation.images.image": "image",
    "observation/wrist_image": "wrist_image", "wrist_image": "wrist_image", "observation.images.wrist_image": "wrist_image",
    "images": "images",
    "observation/state": "state", "state": "state", "states": "state", "observation.state": "state",
    "prompt": "task", "instruction": "task", "task": "task", "question": "task",
    "noise": "noise", "seed": "seed",
    "norm_tag": "norm_tag", "tag": "norm_tag", "normalization_tag": "norm_tag",
    "num_steps": "flow_steps", "n_action_steps": "n_action_steps",
    "rtc_prefix": "rtc_prefix", "prev_chunk_left_over": "rtc_prefix", "rtc_delay": "rtc_delay",
    "inference_delay": "rtc_delay", "rtc_horizon": "rtc_horizon", "execution_horizon": "rtc_horizon",
    "rtc_beta": "rtc_beta", "rtc_schedule": "rtc_schedule",
}
_RTC_SCHEDULES = ("linear", "exp", "ones", "zeros")  # MOLMOACT_RTC_* order


def _err(msg):
    return MolmoActError("MOLMOACT_ERR_ARG", msg)


def _array(key, v):
    """numpy arrays, or anything with __array__ (a torch tensor on the CPU) without importing it"""
    if isinstance(v, np.ndarray):
        return v
    if hasattr(v, "detach") and hasattr(v, "cpu"):  # a torch tensor: off the graph and the device first
        v = v.detach().cpu()
    try:
        return np.asarray(v)
    except Exception as e:  # noqa: BLE001
        raise _err(f"{key}: cannot be read as an array ({e})") from None


def _frame(key, v):
    """a frame in any form the CLI takes, as the CLI converts it (src/model/image.c): uint8 as it
    is; float scaled by 255 when its max is <= 1 (in float32 for float32), clipped to [0, 255]
    and truncated; [H, W], [H, W, C] or [C, H, W] with C in 1, 3, 4 (grey repeated, alpha
    dropped); a leading batch dimension of 1 dropped"""
    a = _array(key, v)
    if a.ndim == 4 and a.shape[0] == 1:
        a = a[0]
    if a.ndim == 2:
        a = a[:, :, None]
    if a.ndim != 3:
        raise _err(f"{key}: shape {tuple(a.shape)}, expected [H, W, 3] (or [3, H, W], [H, W], a batch of 1)")
    if a.shape[0] in (1, 3, 4) and a.shape[2] not in (1, 3, 4):
        a = np.moveaxis(a, 0, 2)
    c = a.shape[2]
    if c not in (1, 3, 4):
        raise _err(f"{key}: shape {tuple(a.shape)} has {c} channels (1, 3 or 4)")
    if a.shape[0] < 1 or a.shape[1] < 1:
        raise _err(f"{key}: shape {tuple(a.shape)} is empty")
    if a.dtype == np.uint8:
        u = a
    elif a.dtype.kind == "f":
        f = a.astype(np.float64) if a.dtype != np.float32 else a
        if not np.all(np.isfinite(f)):
            raise _err(f"{key}: the frame has NaN or infinite values")
        if f.max() <= 1.0:
            f = f * (np.float32(255) if f.dtype == np.float32 else 255.0)
        u = np.clip(f, 0, 255).astype(np.uint8)
    elif a.dtype.kind in "iub":
        if a.size and (a.min() < 0 or a.max() > 255):
            raise _err(f"{key}: an integer frame's values must be in [0, 255]")
        u = a.astype(np.uint8)
    else:
        raise _err(f"{key}: dtype {a.dtype}, expected uint8, float or integers")
    if c == 1:
        u = np.repeat(u, 3, axis=2)
    elif c == 4:
        u = u[:, :, :3]
    return np.ascontiguousarray(u)


class Policy:
    """An open engine. `Policy(model_dir, inproc=False, threads=0, norm_tag="libero", ...)`;
    options are those of molmoact_options (include/molmoact.h)."""

    def __init__(self, model_dir, **options):
        unknown = set(options) - _OPTIONS
        if unknown:
            raise TypeError(f"Policy: unknown option(s) {', '.join(sorted(unknown))} (known: {', '.join(sorted(_OPTIONS))})")
        self._h = ctypes.c_void_p()
        # one call into the engine at a time from this object: close() waits for an infer() in
        # another thread, and calls after it raise (issue 36 F13: closing under a running infer
        # freed the engine it was using). ctypes drops the GIL in the call, so a real lock.
        self._lock = threading.Lock()
        opt = _Options()
        _lib.molmoact_options_init_sized(ctypes.byref(opt), ctypes.sizeof(opt))
        self._keep = []

        def s(k, v):
            if v is None:
                return None
            if not isinstance(v, (str, bytes, os.PathLike)):
                raise MolmoActError("MOLMOACT_ERR_ARG", f"{k}: expected a string or path, got {type(v).__name__}")
            try:
                b = os.fsencode(v)
            except UnicodeError as e:
                raise MolmoActError("MOLMOACT_ERR_ARG", f"{k}: cannot be encoded ({e})") from None
            if b"\0" in b:
                raise MolmoActError("MOLMOACT_ERR_ARG", f"{k}: contains a NUL character")
            self._keep.append(b)
            return b

        def i(k, lo, hi):
            v = options.get(k, 0)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not lo <= int(v) <= hi:
                raise MolmoActError("MOLMOACT_ERR_ARG", f"{k}: expected an integer in [{lo}, {hi}], got {v!r}")
            return int(v)
        opt.model_dir = s("model_dir", model_dir)
        for k in _BOOL_OPTIONS:
            v = options.get(k, False)
            if v not in (True, False, 0, 1):
                raise MolmoActError("MOLMOACT_ERR_ARG", f"{k}: expected True or False, got {v!r}")
            setattr(opt, k, 1 if v else 0)
        for k, (lo, hi) in _INT_OPTIONS.items():
            setattr(opt, k, i(k, lo, hi))
        for k in _STR_OPTIONS:
            setattr(opt, k, s(k, options.get(k)))
        opt.base_dir = s("base", options.get("base"))  # a LeRobot policy's HF base directory
        err = _Error()
        rc = _lib.molmoact_open(ctypes.byref(opt), ctypes.byref(self._h), ctypes.byref(err))
        if rc:
            _raise(rc, err)
        self.info = self._info()

    def _info(self):
        info, err = _Info(), _Error()
        with self._lock:
            if not self._h:
                raise MolmoActError("MOLMOACT_ERR_ARG", "the policy is closed")
            rc = _lib.molmoact_get_info(self._h, ctypes.byref(info), ctypes.byref(err))
        if rc:
            _raise(rc, err)
        return {"variant": info.variant.decode(), "action_horizon": info.action_horizon, "action_dim": info.action_dim,
                "max_action_dim": info.max_action_dim, "n_steps": info.n_steps, "state_dim": info.state_dim,
                "flow_steps": info.flow_steps, "prompt_seq": info.prompt_seq,
                "precision": {k: info.precision[i].value.decode() for i, k in enumerate(("vision", "llm", "action"))},
                "norm_tag": info.norm_tag.decode(), "inproc": bool(info.inproc)}

    def setting(self, name):
        """one of the engine's settings as text ("backend", "threads", "kernels", ...): what it and
        its workers run with (molmoact_get_setting)"""
        buf, err = ctypes.create_string_buffer(4096), _Error()
        with self._lock:
            if not self._h:
                raise MolmoActError("MOLMOACT_ERR_ARG", "the policy is closed")
            rc = _lib.molmoact_get_setting(self._h, s_bytes(name), buf, len(buf), ctypes.byref(err))
        if rc:
            _raise(rc, err)
        return buf.value.decode(errors="replace")

    def memory(self):
        """peak RSS in KiB of this process and of the live workers"""
        info, err = _Info(), _Error()
        with self._lock:
            if not self._h:
                raise MolmoActError("MOLMOACT_ERR_ARG", "the policy is closed")
            rc = _lib.molmoact_get_info(self._h, ctypes.byref(info), ctypes.byref(err))
        if rc:
            _raise(rc, err)
        return {"process_kib": info.peak_rss_kib, "workers_kib": info.workers_peak_rss_kib}

    @staticmethod
    def _image(key, v, keep):
        im = _Image()
        if isinstance(v, (bytes, bytearray, memoryview)):
            b = bytes(v)
            keep.append(b)
            im.encoded = ctypes.cast(ctypes.c_char_p(b), ctypes.c_void_p)
            im.encoded_len = len(b)
            return im
        a = _frame(key, v)
        keep.append(a)
        im.data = a.ctypes.data
        im.height, im.width = int(a.shape[0]), int(a.shape[1])
        im.stride = int(a.strides[0])
        return im

    def infer(self, obs):
        """one observation (a dict: see the module doc; keys of openpi, MolmoAct2 or a LeRobot
        batch; other keys are ignored) -> {"actions", "trajectory", "timing"}"""
        if not self._h:
            raise MolmoActError("MOLMOACT_ERR_ARG", "the policy is closed")
        if not isinstance(obs, dict):
            raise _err(f"infer: expected a dict, got {type(obs).__name__}")
        roles = {}
        for k, v in obs.items():
            role = _KEYS.get(k)
            if role is None:
                continue  # LeRobot batches and AllenAI clients carry more (timestamp, index, ...)
            for r in (("image", "wrist_image") if role == "images" else (role,)):
                if r in roles:
                    raise _err(f"keys {roles[r][0]!r} and {k!r} both give the {r.replace('_', ' ')}; give one")
            if role == "images":
                if not isinstance(v, (list, tuple)) and not (hasattr(v, "shape") and len(v.shape) >= 3 and v.shape[0] == 2):
                    raise _err(f"{k}: expected a list of two frames (the agent camera, then the wrist camera)")
                if len(v) != 2:
                    raise _err(f"{k}: expected a list of two frames, got {len(v)}")
                roles["image"], roles["wrist_image"] = (k, v[0]), (k, v[1])
            else:
                roles[role] = (k, v)
        for role in ("image", "wrist_image", "state", "task"):
            if role not in roles:
                names = [k for k, r in _KEYS.items() if r == role] + (["images"] if role in ("image", "wrist_image") else [])
                raise _err(f"missing key for the {role.replace('_', ' ')}: one of {', '.join(names)}")
        keep = []
        o = _Observation()
        _lib.molmoact_observation_init_sized(ctypes.byref(o), ctypes.sizeof(o))
        o.images[0] = self._image(*roles["image"], keep)
        o.images[1] = self._image(*roles["wrist_image"], keep)
        k, st = roles["state"]
        st = _array(k, st)
        if st.ndim == 2 and st.shape[0] == 1:
            st = st[0]
        if st.dtype.kind not in "fiu" or st.ndim != 1:
            raise _err(f"{k}: expected a 1-d float array (or [1, n]), got {st.dtype} {tuple(st.shape)}")
        st = np.ascontiguousarray(st, dtype=np.float32)
        keep.append(st)
        o.state = st.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
        o.state_dim = int(st.shape[0])
        k, task = roles["task"]
        if isinstance(task, np.ndarray) and task.ndim == 0:
            task = task.item()
        if isinstance(task, (list, tuple)) and len(task) == 1:  # a LeRobot batch of one
            task = task[0]
        try:
            if isinstance(task, bytes):
                task = task.decode("utf-8")
            if not isinstance(task, str):
                raise _err(f"{k}: expected a string, got {type(task).__name__}")
            tb = task.encode("utf-8")
        except UnicodeError as e:
            raise MolmoActError("MOLMOACT_ERR_ARG", f"{k}: not valid UTF-8 text ({e.reason} at {e.start})") from None
        if b"\0" in tb:
            raise _err(f"{k}: contains a NUL character")
        keep.append(tb)
        o.task = tb
        if "noise" in roles:
            nz = _array("noise", roles["noise"][1])
            if nz.dtype != np.float32:
                raise _err(f"noise: dtype {nz.dtype}, expected float32 [1, horizon, max_action_dim]")
            H, A = self.info["action_horizon"], self.info["max_action_dim"]
            if tuple(nz.shape) not in ((1, H, A), (H, A)):  # not only its size: [1, 320] or [1, 32, 10] are not it
                raise _err(f"noise has {nz.size} values in shape {list(nz.shape)}, expected [1, {H}, {A}] (or [{H}, {A}])")
            nz = np.ascontiguousarray(nz)
            keep.append(nz)
            o.noise = nz.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
            o.noise_len = int(nz.size)
        if "seed" in roles:
            o.have_seed, o.seed = 1, self._int("seed", roles["seed"][1], 0, 2 ** 64 - 1)
        if "norm_tag" in roles:
            k, tag = roles["norm_tag"]
            if not isinstance(tag, str) or not tag or "\0" in tag:
                raise _err(f"{k}: expected a tag name")
            tb = tag.encode()
            keep.append(tb)
            o.norm_tag = tb
        if "flow_steps" in roles:
            o.flow_steps = self._int(roles["flow_steps"][0], roles["flow_steps"][1], 1, 256)
        self._rtc(o, roles, keep)
        n_keep = None
        if "n_action_steps" in roles:
            n_keep = self._int(roles["n_action_steps"][0], roles["n_action_steps"][1], 1, self.info["n_steps"])
        res, err = _Result(), _Error()
        with self._lock:
            if not self._h:
                raise MolmoActError("MOLMOACT_ERR_ARG", "the policy is closed")
            rc = _lib.molmoact_infer(self._h, ctypes.byref(o), ctypes.byref(res), ctypes.byref(err))
        if rc:
            _raise(rc, err)
        try:
            actions = np.ctypeslib.as_array(res.actions, shape=(res.n_steps, res.action_dim)).copy()
            traj = np.ctypeslib.as_array(res.trajectory, shape=(res.horizon, res.max_action_dim)).copy()
            t = res.timing
            timing = {"vision_ms": t.vision, "llm_split_ms": list(t.llm_split), "action_context_ms": t.action_context,
                      "action_step_ms": t.action_step, "transfer_ms": t.transfer, "host_ms": t.host, "infer_ms": t.total,
                      "preprocess_ms": t.preprocess}
        finally:
            _lib.molmoact_result_free(ctypes.byref(res))
        if n_keep is not None:
            actions = actions[:n_keep].copy()
        return {"actions": actions, "trajectory": traj, "timing": timing}

    def _rtc(self, o, roles, keep):
        """real-time chunking: rtc_prefix (None: none) and its settings, into the 0.12 fields"""
        given = [r for r in ("rtc_delay", "rtc_horizon", "rtc_beta", "rtc_schedule") if r in roles and roles[r][1] is not None]
        pre = roles.get("rtc_prefix", (None, None))
        if pre[1] is None:
            if given:
                raise _err(f"{roles[given[0]][0]}: needs rtc_prefix (the previous chunk's leftover)")
            return
        k, p = pre
        p = _array(k, p)
        if p.ndim == 3 and p.shape[0] == 1:  # a LeRobot batch of one
            p = p[0]
        if p.dtype.kind not in "fiu" or p.ndim != 2:
            raise _err(f"{k}: expected a float array [rows, dim] (or [1, rows, dim]), got {p.dtype} {tuple(p.shape)}")
        p = np.ascontiguousarray(p, dtype=np.float32)
        keep.append(p)
        o.rtc_prefix = p.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
        o.rtc_prefix_rows, o.rtc_prefix_dim = int(p.shape[0]), int(p.shape[1])
        if "rtc_delay" in roles and roles["rtc_delay"][1] is not None:
            o.rtc_delay = self._int(roles["rtc_delay"][0], roles["rtc_delay"][1], 0, 2 ** 31 - 1)
        if "rtc_horizon" in roles and roles["rtc_horizon"][1] is not None:
            o.rtc_horizon = self._int(roles["rtc_horizon"][0], roles["rtc_horizon"][1], 0, 2 ** 31 - 1)
        if "rtc_beta" in roles and roles["rtc_beta"][1] is not None:
            kb, b = roles["rtc_beta"]
            if isinstance(b, bool) or not isinstance(b, (int, float, np.integer, np.floating)) or not np.isfinite(b) or b < 0:
                raise _err(f"{kb}: expected a finite number > 0 (0: 10), got {b!r}")
            o.rtc_beta = float(b)
        if "rtc_schedule" in roles and roles["rtc_schedule"][1] is not None:
            ks, sch = roles["rtc_schedule"]
            name = getattr(sch, "value", sch)  # LeRobot's RTCAttentionSchedule is a str enum
            if not isinstance(name, str) or name.lower() not in _RTC_SCHEDULES:
                raise _err(f"{ks}: one of {', '.join(_RTC_SCHEDULES)}, got {sch!r}")
            o.rtc_schedule = _RTC_SCHEDULES.index(name.lower())

    @staticmethod
    def _int(key, v, lo, hi):
        if isinstance(v, np.ndarray) and v.ndim == 0:
            v = v.item()
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not lo <= int(v) <= hi:
            raise _err(f"{key}: expected an integer in [{lo}, {hi}], got {v!r}")
        return int(v)

    def close(self):
        with self._lock:  # waits for an infer() in another thread
            if not self._h:
                return
            rc = _lib.molmoact_close(ctypes.byref(self._h))
            self._h = ctypes.c_void_p()
            if rc:
                raise MolmoActError(_STATUS.get(rc, str(rc)), "a worker did not shut down cleanly")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            if getattr(self, "_h", None):
                _lib.molmoact_close(ctypes.byref(self._h))
        except Exception:
            pass


# ---------------------------------------------------------------------------- evaluation-loop adapters

class LeRobotPolicy:
    """The policy as LeRobot's evaluation loop drives one (no import of lerobot):
    `select_action(batch)` returns one action, shaped [1, action_dim], from a queue that is
    refilled with the first `n_action_steps` actions of a new chunk whenever it is empty;
    `predict_action_chunk(batch)` returns a whole chunk [1, n_steps, action_dim]; `reset()`
    empties the queue (call it at each episode's start). `batch` is a LeRobot batch
    (observation.images.image, observation.images.wrist_image, observation.state, task; float32
    CHW frames in [0, 1] with a batch dimension of 1, numpy or torch on the CPU) or any
    observation `Policy.infer` takes. The actions are numpy float32."""

    def __init__(self, policy, n_action_steps=None, **options):
        """`policy`: a `Policy`, or a model directory (a str or path) opened as `Policy(policy,
        **options)`, closed by `close()`"""
        self._owned = None
        if isinstance(policy, (str, os.PathLike)):
            policy = self._owned = Policy(policy, **options)
        elif options:
            raise TypeError(f"LeRobotPolicy: options {', '.join(sorted(options))} are for a model directory, not an open Policy")
        elif not hasattr(policy, "infer") or not hasattr(policy, "info"):
            raise TypeError(f"LeRobotPolicy: expected a molmoact.Policy or a model directory, got {type(policy).__name__}")
        self.policy = policy
        n = policy.info["n_steps"] if n_action_steps is None else n_action_steps
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= policy.info["n_steps"]:
            self.close()
            raise _err(f"n_action_steps: expected an integer in [1, {policy.info['n_steps']}], got {n_action_steps!r}")
        self.n_action_steps = n
        self._queue = []

    def reset(self):
        self._queue = []

    def close(self):
        """closes the Policy it opened from a directory (one given to it stays open)"""
        if self._owned is not None:
            self._owned.close()
            self._owned = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def predict_action_chunk(self, batch):
        return self.policy.infer(batch)["actions"][None]

    def select_action(self, batch):
        if not self._queue:
            chunk = self.predict_action_chunk(batch)[0]
            self._queue = [chunk[i:i + 1] for i in range(self.n_action_steps)]
        return self._queue.pop(0)


class ActionChunkBroker:
    """openpi's action chunking for any policy with `infer(obs) -> {"actions": [n, d], ...}` (a
    `Policy`, or a websocket client of `molmoact serve`): `infer` returns the result with
    "actions" one action [d], calling the inner policy again every `action_horizon` calls;
    `reset()` starts over."""

    def __init__(self, policy, action_horizon):
        if isinstance(action_horizon, bool) or not isinstance(action_horizon, int) or action_horizon < 1:
            raise _err(f"action_horizon: expected a positive integer, got {action_horizon!r}")
        self.policy = policy
        self.action_horizon = action_horizon
        self._last = None
        self._step = 0

    def reset(self):
        self._last = None
        self._step = 0

    def infer(self, obs):
        if self._last is None:
            self._last = self.policy.infer(obs)
            self._step = 0
            if len(self._last["actions"]) < self.action_horizon:
                raise _err(f"action_horizon {self.action_horizon}: the policy returned {len(self._last['actions'])} actions")
        out = dict(self._last)
        out["actions"] = self._last["actions"][self._step]
        self._step += 1
        if self._step >= self.action_horizon:
            self._last = None
        return out
