"""The one place edgelm uses onnxruntime's private Python API, and the public IO binding that stands in for it.

The decode loop runs the graph once per token. onnxruntime's public wrappers (InferenceSession.run, OrtValue,
IOBinding) build and unwrap a dozen Python objects on every call, ~0.5 ms a step, 7% of an int8 distilgpt2
step. The C++ session under them (`session._sess`) and the pybind module (`onnxruntime_pybind11_state`) take
OrtValues, and vectors of them, directly: that is the fast path, used wherever these names exist. They are
private, so a new onnxruntime may change them: `private_api_missing` names what is gone, and `runner` then
hands out the IO-binding runner instead, which gives the same results through the public API only.
tests/engine/test_ort_fast_path.py checks every private name against the public API on a tiny graph.

Both runners wrap onnxruntime's own exceptions (Fail, InvalidArgument, RuntimeException, ...) in
InferenceError, so a failed run reaches the user as one line.
"""

import inspect

import numpy as np
import onnxruntime as ort
from onnxruntime.capi import onnxruntime_pybind11_state as ort_c

from ..errors import InferenceError
from ..package.format import LOGITS, PAST
from ..package.onnxruntime_compat import installed_wheel

# Everything onnxruntime raises from C++: its own exception types (all plain Exceptions) and, for errors it
# does not map to one of them, RuntimeError.
ORT_ERRORS = (
    *(kind for kind in vars(ort_c).values() if inspect.isclass(kind) and issubclass(kind, Exception)),
    RuntimeError,
)


def first_line(error: BaseException, limit: int = 300) -> str:
    """onnxruntime's message, first line only (some add a C++ stack trace below it), at most `limit` characters."""
    text = (str(error).strip().splitlines() or [type(error).__name__])[0].rstrip(". ")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def private_api_missing(session: ort.InferenceSession) -> list[str]:
    """The private names the fast path needs that this onnxruntime (or this session) lacks; [] where it works."""
    needed = {
        "InferenceSession._sess": getattr(session, "_sess", None),
        "_sess.run_with_ort_values": getattr(getattr(session, "_sess", None), "run_with_ort_values", None),
        "_sess.run_with_ortvaluevector": getattr(getattr(session, "_sess", None), "run_with_ortvaluevector", None),
        "OrtValueVector.push_back": getattr(getattr(ort_c, "OrtValueVector", None), "push_back", None),
        "OrtValue.ortvalue_from_numpy": getattr(getattr(ort_c, "OrtValue", None), "ortvalue_from_numpy", None),
        "RunOptions": getattr(ort_c, "RunOptions", None),
    }
    device = getattr(ort_c, "OrtDevice", None)
    needed |= {f"OrtDevice.{name}": getattr(device, name, None) for name in ("cpu", "cuda", "default_memory")}
    return [name for name, value in needed.items() if value is None]


def runner(session: ort.InferenceSession, graph: str = "the graph", private: bool | None = None):
    """A runner for `session`: the private fast path where onnxruntime has it (or when `private` is True), else
    the public IO binding. `graph` names the model file in error messages."""
    if private is None:
        missing = private_api_missing(session)
        if missing:
            import logging  # only here: logging costs every start its import

            message = "onnxruntime %s lacks %s: running through the public IO binding"
            logging.getLogger("edgelm").debug(message, ort.__version__, missing)
        private = not missing
    return (PrivateRunner if private else BindingRunner)(session, graph)


class _Runner:
    """What the engine needs from onnxruntime: OrtValues that borrow NumPy arrays, a run that returns the outputs
    as OrtValues, and a run bound to preallocated outputs (written in place). OrtValues of one runner are fed
    back only to that runner."""

    def __init__(self, session: ort.InferenceSession, graph: str):
        self.session, self.graph = session, graph

    def failed(self, error: BaseException) -> InferenceError:
        return InferenceError(
            f"onnxruntime failed while running {self.graph}: {first_line(error)}. If `edgelm verify` passes on the "
            f"package, it may need a newer onnxruntime than {ort.__version__} (pip install -U {installed_wheel()}); "
            "otherwise export it again."
        )


class PrivateRunner(_Runner):
    """The C++ session and the pybind types, called directly."""

    def __init__(self, session: ort.InferenceSession, graph: str):
        super().__init__(session, graph)
        self._sess = session._sess
        self._devices = {
            "cpu": ort_c.OrtDevice(ort_c.OrtDevice.cpu(), ort_c.OrtDevice.default_memory(), 0),
            "cuda": ort_c.OrtDevice(ort_c.OrtDevice.cuda(), ort_c.OrtDevice.default_memory(), 0),
        }

    def value(self, array: np.ndarray, device: str = "cpu"):
        """An OrtValue over `array` (borrowed on the CPU: the array must outlive every run that reads it)."""
        return ort_c.OrtValue.ortvalue_from_numpy(array, self._devices[device])

    def run(self, feeds: dict, output_names: list) -> list:
        """Feed OrtValues by name; returns the outputs as OrtValues (`.numpy()` copies one to the host)."""
        try:
            outputs = self._sess.run_with_ort_values(feeds, output_names, None)
        except ORT_ERRORS as error:
            raise self.failed(error) from None
        return [outputs[i] for i in range(len(output_names))]

    def bind(self, input_names: list, outputs: dict) -> "PrivateBoundRun":
        """A run of `input_names` whose outputs are written into the given arrays {name: array}, in place."""
        return PrivateBoundRun(self, input_names, outputs)


class PrivateBoundRun:
    def __init__(self, runner: PrivateRunner, input_names: list, outputs: dict):
        self.runner, self.input_names, self.output_names = runner, list(input_names), list(outputs)
        self.fetches = ort_c.OrtValueVector()
        for array in outputs.values():
            self.fetches.push_back(runner.value(array))
        self.fetch_devices, self.options = [runner._devices["cpu"]] * len(outputs), ort_c.RunOptions()

    def __call__(self, inputs: list) -> None:
        """Run with `inputs` (OrtValues of this runner, in input_names' order)."""
        feeds = ort_c.OrtValueVector()
        for value in inputs:
            feeds.push_back(value)
        try:
            self.runner._sess.run_with_ortvaluevector(
                self.options, self.input_names, feeds, self.output_names, self.fetches, self.fetch_devices
            )
        except ORT_ERRORS as error:
            raise self.runner.failed(error) from None


class BindingRunner(_Runner):
    """The same runs through onnxruntime's public API (OrtValue, IOBinding): slower per call, same results."""

    def value(self, array: np.ndarray, device: str = "cpu"):
        return ort.OrtValue.ortvalue_from_numpy(array, device, 0)

    def run(self, feeds: dict, output_names: list) -> list:
        binding = self.session.io_binding()
        for name, value in feeds.items():
            binding.bind_ortvalue_input(name, value)
        for name in output_names:
            # The logits come back to the host (the caller reads them); the cache stays where its past was.
            binding.bind_output(name, "cpu" if name == LOGITS else self._device_of(feeds))
        try:
            self.session.run_with_iobinding(binding)
        except ORT_ERRORS as error:
            raise self.failed(error) from None
        return binding.get_outputs()

    def bind(self, input_names: list, outputs: dict) -> "BoundBinding":
        return BoundBinding(self, input_names, outputs)

    def _device_of(self, feeds: dict) -> str:
        past = [value for name, value in feeds.items() if name.startswith(PAST)]
        return past[0].device_name().lower() if past else "cpu"


class BoundBinding:
    def __init__(self, runner: BindingRunner, input_names: list, outputs: dict):
        self.runner, self.input_names = runner, list(input_names)
        self.binding = runner.session.io_binding()
        self.outputs = {name: runner.value(array) for name, array in outputs.items()}  # they borrow the arrays
        for name, value in self.outputs.items():
            self.binding.bind_ortvalue_output(name, value)

    def __call__(self, inputs: list) -> None:
        for name, value in zip(self.input_names, inputs):
            self.binding.bind_ortvalue_input(name, value)  # replaces the previous run's input of that name
        try:
            self.runner.session.run_with_iobinding(self.binding)
        except ORT_ERRORS as error:
            raise self.runner.failed(error) from None
