"""A session called through IO bindings, as apps call it (torch-free): a static cache's buffers
bound as both past and present so the model writes them in place, inputs and outputs left on
the device, N calls enqueued without a sync; the run options that keep a CUDA session quiet."""
from __future__ import annotations

import functools

import numpy as np

from ...comparison.runner import Feeds
from ...signature import Signature
from .ort_values import NUMPY_DTYPES, bits_of, device_buffer, host_array, ortvalue, widened


class InPlaceCall:
    """One call through an IO binding, every input an OrtValue (bfloat16 can cross the Python
    API no other way). ``in_place`` (a static cache): past_key/past_value live in OrtValues that
    are also bound as present_key/present_value, so the model writes the app's buffer itself.
    After the run the outputs must BE those buffers (same memory): a copy is an error. Off the
    CPU every input and output is a device buffer, as an app keeps them there (the copies to
    and from the host are the check's, outside the run)."""

    CACHE = {"present_key": "past_key", "present_value": "past_value"}

    def __init__(self, session, signature: Signature, inputs: Feeds, device: str = "cpu",
                 run_options=None, in_place: bool = True):
        self.session, self.signature, self.inputs, self.device = session, signature, inputs, device
        self.run_options = run_options
        self.cache = self.CACHE if in_place else {}
        self.values = {n: ortvalue(a, device) for n, a in inputs.items()}  # CPU: a's memory
        self.buffers = {n: self.values[n] for n in self.cache.values()}
        self.binding = session.io_binding()
        for name, value in self.values.items():  # self.inputs keeps each array alive
            self.binding.bind_ortvalue_input(name, value)
        for name in signature.output_names:
            if name in self.cache:
                self.binding.bind_ortvalue_output(name, self.buffers[self.cache[name]])
            elif device == "cpu" or not self.cache:  # allocated where the session runs
                self.binding.bind_output(name, device)
            else:  # the static step's y: a fixed device buffer (a replayed graph writes it)
                self.values[name] = device_buffer(_static_y_shape(session, name, inputs),
                                                  _output_dtype(session, name), device)
                self.binding.bind_ortvalue_output(name, self.values[name])

    def refresh(self, inputs: Feeds) -> "InPlaceCall":
        """New inputs copied into the same bound buffers (their addresses unchanged; on CPU
        the arrays those buffers share)."""
        for name, array in inputs.items():
            if self.device == "cpu":
                np.copyto(self.inputs[name], array)
            else:
                self.values[name].update_inplace(bits_of(array))
        return self

    def step(self) -> None:
        """The call alone: outputs stay in their bound buffers."""
        self.session.run_with_iobinding(self.binding, self.run_options)

    def queue(self) -> None:
        """The call enqueued where the session runs and not waited for (RunOptions
        ``disable_synchronize_execution_providers``, onnxruntime PR #28686: a replayed graph
        too), as an app steps: N calls back to back, one sync by the caller."""
        self.session.run_with_iobinding(self.binding, _unsynchronized_runs())

    def run(self) -> list[np.ndarray]:
        self.step()
        outs = dict(zip(self.signature.output_names, self.binding.get_outputs()))
        for name, past in self.cache.items():
            if outs[name].data_ptr() != self.buffers[past].data_ptr():
                raise RuntimeError(f"{name} is a copy: the model did not write the bound "
                                   f"{past} buffer in place")
        return [host_array(outs[n]) if n not in self.cache else self._cache(self.cache[n])
                for n in self.signature.output_names]

    def _cache(self, past: str) -> np.ndarray:
        """The buffer after the call: the input array itself on CPU (the OrtValue shares its
        memory), a copy back from the device elsewhere."""
        return self.inputs[past] if self.device == "cpu" else host_array(self.buffers[past])

def _static_y_shape(session, name: str, inputs: Feeds) -> list[int]:
    """A static step's y for these inputs: (B, T) of x and the declared width, (B, T, D)."""
    b, t = inputs["x"].shape[:2]
    return [b, t, *_declared(session, name).shape[2:]]

def _output_dtype(session, name: str) -> np.dtype:
    return np.dtype(NUMPY_DTYPES[_declared(session, name).type])

def _declared(session, name: str):
    """The session's declared output of that name."""
    return next(o for o in session.get_outputs() if o.name == name)

class BoundCache:
    """A static-cache CPU session as an app keeps it: past_key/past_value bound once to the
    caller's arrays (of the model's cache dtype), also as present_key/present_value (the model
    writes them in place); each call binds its other inputs and a new y array, runs, and
    returns y (float32, as ``run`` gives it)."""

    def __init__(self, session, buffers: Feeds, dtypes: dict, run_options=None):
        self.session, self.dtypes, self.run_options = session, dtypes, run_options
        self.binding = session.io_binding()
        y = _declared(session, "y")
        self.width, self.y_dtype = y.shape[-1], NUMPY_DTYPES.get(y.type, np.float32)  # (B, T, D)
        for present, past in InPlaceCall.CACHE.items():
            buffer = buffers[past]
            if buffer.dtype != dtypes[past] or not buffer.flags.c_contiguous:
                raise ValueError(f"{past}: a C-contiguous {np.dtype(dtypes[past]).name} array "
                                 f"is bound in place, got {buffer.dtype}")
            value = ortvalue(buffer)  # shares the array's memory
            self.binding.bind_ortvalue_input(past, value)
            self.binding.bind_ortvalue_output(present, value)

    def __call__(self, feeds: Feeds) -> np.ndarray:
        arrays = {n: np.ascontiguousarray(v, self.dtypes[n]) for n, v in feeds.items()}
        for name, value in arrays.items():  # alive until the run: an OrtValue shares them
            self.binding.bind_ortvalue_input(name, ortvalue(value))
        b, t = feeds["x"].shape[:2]
        y = np.empty((b, t, self.width), self.y_dtype)  # (B, T, D)
        self.binding.bind_ortvalue_output("y", ortvalue(y))
        self.session.run_with_iobinding(self.binding, self.run_options)
        return widened(y)  # as run() gives it

def quiet_runs():
    """RunOptions that log warnings only: a CUDA session loads verbosely (its node placements
    are read from that log) and would otherwise log every kernel of every run."""
    import onnxruntime as ort
    options = ort.RunOptions()
    options.log_severity_level = 3
    return options

@functools.lru_cache(maxsize=None)
def _unsynchronized_runs():
    """Quiet RunOptions whose run returns without waiting for the device."""
    options = quiet_runs()
    options.add_run_config_entry("disable_synchronize_execution_providers", "1")
    return options
